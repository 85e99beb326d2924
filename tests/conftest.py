"""The suite's lab is its own: state in .lab-test/, addresses 127.0.2.x, its own ports and container names
(MODELFLEET_LAB_NET=1), so the tests never touch, and never tear down, a lab a user or `make demo` started.
Set here, before anything imports the lab, and inherited by every pyinfra run the tests start."""

import os
from pathlib import Path

# MODELFLEET_TEST_LAB_NET=2 (3...) runs a second suite beside a first one (e.g. beside CI on the same machine).
_net = os.environ.get("MODELFLEET_TEST_LAB_NET", "1")
assert _net != "0", "the suite never runs on the user's lab (net 0)"
os.environ["MODELFLEET_LAB_STATE"] = str(Path(__file__).resolve().parent.parent
                                        / f".lab-test{'' if _net == '1' else _net}")
os.environ["MODELFLEET_LAB_NET"] = _net


import ipaddress  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

# `make test` runs the suite as two pytest processes side by side, each on its own lab net: the lab's end-to-end
# tests mostly wait on their hosts. MODELFLEET_TEST_SHARD=b runs every test outside tests/lab and the lab modules
# named here (the real vLLM's, whose checks of the machine's /dev/shm and /tmp must see no other vLLM, and the
# longest others); =a runs the rest of tests/lab. One predicate decides both: no test falls between them.
SHARD_B_LAB = {"test_real_vllm_e2e.py", "test_real_vllm_pool_e2e.py", "test_real_vllm_router_e2e.py",
               "test_venv_e2e.py", "test_retire_e2e.py", "test_swarm_e2e.py", "test_installed_e2e.py"}


if os.environ.get("MODELFLEET_TEST_SHARD") or os.environ.get("MODELFLEET_TEST_HALF"):
    # make starts one of the two in the background, where the shell leaves SIGINT ignored: Ctrl-C (sent to both)
    # then stops each as it stops one pytest, its lab torn down, instead of leaving one running alone.
    signal.signal(signal.SIGINT, signal.default_int_handler)


def shard_of(path: Path) -> str:
    in_lab = ROOT / "tests" / "lab" in Path(path).resolve().parents
    return "a" if in_lab and Path(path).name not in SHARD_B_LAB else "b"


def pytest_collection_modifyitems(config, items):
    """MODELFLEET_TEST_SHARD (a, b: `make test`'s shards) and MODELFLEET_TEST_HALF (0/2, 1/2: `make test-fast`'s two
    processes, every other test) keep their part of the collected tests."""
    shard, half = os.environ.get("MODELFLEET_TEST_SHARD"), os.environ.get("MODELFLEET_TEST_HALF")
    assert shard in (None, "a", "b"), f"MODELFLEET_TEST_SHARD={shard!r}: a or b"
    keep = [item for item in items if shard is None or shard_of(item.path) == shard]
    if half:
        index, count = map(int, half.split("/"))
        keep = keep[index::count]
    kept = set(keep)
    config.hook.pytest_deselected(items=[item for item in items if item not in kept])
    items[:] = keep


@pytest.fixture(autouse=True, scope="session")
def connectors_read_once():
    """pyinfra reads its connectors' entry points (every installed distribution's metadata) afresh for each
    Inventory it builds, 5 ms a time; the suite builds thousands, and no test installs a connector. Set after
    collection, so what the test modules import (and pyinfra_cli's gevent patches) comes in the order it did."""
    import functools

    from pyinfra.api import connectors, inventory

    saved = connectors.get_all_connectors
    read = functools.cache(saved)
    for module in (connectors, inventory):  # inventory holds the function under its own name
        module.get_all_connectors = lambda: dict(read())
    yield
    for module in (connectors, inventory):
        module.get_all_connectors = saved


@pytest.fixture(scope="session")
def installed(tmp_path_factory):
    """modelfleet as a user installs it: a wheel built from this checkout, in a fresh virtual environment, and
    a working directory outside the checkout holding only a copy of inventories/. The environment sees this
    suite's dependencies (same versions, nothing downloaded) through a path entry, but not the checkout: the
    package can only come from the wheel. Returns (bin dir, working directory)."""
    top = tmp_path_factory.mktemp("installed")
    # Built from a copy of the files git would clone (an ignored build/ of the checkout never reaches the wheel).
    source = top / "source"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.splitlines()
    for rel in listed:
        if (ROOT / rel).is_file():
            (source / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, source / rel)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(top / "dist"), str(source)],
                   check=True, capture_output=True)
    venv = top / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    deps = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site / "zz-suite-deps.pth").write_text("\n".join(deps) + "\n")  # after the venv's own site-packages
    wheel = next((top / "dist").glob("modelfleet-*.whl"))
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                   check=True, capture_output=True)
    work = top / "site"
    shutil.copytree(ROOT / "inventories", work / "inventories")
    return venv / "bin", work


def _fake_harness():
    """tests/helpers/fake_harness.py, loaded once by its path: test modules reach it through the fixtures below."""
    import importlib.util

    name = "modelfleet_fake_harness"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "helpers" / "fake_harness.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture
def fake():
    """Stages run through pyinfra's @fake connector (tests/helpers/fake_harness.py): run_fake, executed, planned,
    finish, probe_reply, recorded and the recorded H200 host's directory."""
    return _fake_harness()


@pytest.fixture
def uploads(monkeypatch):
    """What the stages of a @fake run would have uploaded, by remote path."""
    return _fake_harness().Uploads(monkeypatch)


@pytest.fixture(autouse=True)
def no_run_left_current():
    """pyinfra's ctx_state.use() does not restore the outer state when the block raises (a refused @fake run
    raising PyinfraError), so a later test would read that run's store as its own: each test starts outside one."""
    from pyinfra.context import ctx_host, ctx_state

    ctx_state.reset()
    ctx_host.reset()
    yield


@pytest.fixture(autouse=True)
def router_runtime_root_restored():
    """A front door started on this machine (tests/router/front_door.py, also from lab tests) points the router's
    runtime directory into its test's folder; every later test sees /run again."""
    from modelfleet.plan import router

    saved = router.RUNTIME_ROOT
    yield
    router.RUNTIME_ROOT = saved


_connect = socket.socket.connect


def _loopback_only(sock, address, *args):
    """Tests reach only loopback (and unix sockets): the documentation addresses the unit tests' inventories name
    (192.0.2.x, 10.x) are never dialled, even by a command that would read a host (e.g. `upgrade --dry`)."""
    if sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple):
        try:
            ip = ipaddress.ip_address(address[0])
        except ValueError:
            ip = None  # a name: resolved by the caller's own lookup, which only tests on loopback use
        if ip is not None and not ip.is_loopback and not ip.is_unspecified:
            raise ConnectionRefusedError(f"tests reach only loopback, not {address[0]}")
    return _connect(sock, address, *args)


socket.socket.connect = _loopback_only
