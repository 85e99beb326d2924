"""Retiring what the inventory no longer names, on the lab (#42 item 3, #46's third class): a host serving two
pools has one taken out of its `services`: the next plain converge names the retired unit and leaves it stopped,
disabled and removed, its container gone, its port closed, its env file gone and its checkpoint kept, while the
other pool still answers and a unit a user wrote under a modelfleet-like name runs on; the run after changes
nothing. Then the host leaves the inventory: `modelfleet retire --dry` says what would go and changes nothing,
`modelfleet retire` retires it."""

import ipaddress
import json
import os
import shutil
import socket
import subprocess
import urllib.request

import pytest

import lab
from modelfleet import REPO_ROOT
from modelfleet.base.commands import run_modelfleet, run_pyinfra

pytestmark = pytest.mark.lab

HANDMADE = "modelfleet-handmade.service"
# A unit a user wrote, named like modelfleet's and running a container like one of its engines.
HANDMADE_UNIT = """[Unit]
Description=the site's own sidecar, not modelfleet's
[Service]
ExecStart=/bin/sleep infinity
[Install]
WantedBy=multi-user.target
"""

# An inventory made from the lab's: its hosts as inventories/lab.py has them, less some pools or hosts.
DERIVED = """import importlib.util as _util
_spec = _util.spec_from_file_location("_lab_inventory", {lab!r})
_lab = _util.module_from_spec(_spec)
_spec.loader.exec_module(_lab)
_drop_pools, _drop_hosts = {pools!r}, {hosts!r}
lab_hosts = [(_name, {{**_data, **({{"services": [_s for _s in _data["services"] if _s["pool"] not in _drop_pools]}}
                                  if "services" in _data else {{}})}})
             for _name, _data in _lab.lab_hosts if _name not in _drop_hosts]
"""


def derived(tmp_path, pools=(), hosts=()) -> str:
    folder = tmp_path / f"inv-{len(list(tmp_path.glob('inv-*')))}"
    shutil.copytree(REPO_ROOT / "inventories" / "group_data", folder / "group_data")
    path = folder / "lab.py"
    path.write_text(DERIVED.format(lab=str(REPO_ROOT / "inventories" / "lab.py"), pools=set(pools), hosts=set(hosts)))
    return str(path)


def serve(inventory: str, tmp_path):
    """serve.py over the inventory, its reports under the test's folder."""
    return run_pyinfra(inventory, "deploys/serve.py", cwd=REPO_ROOT, timeout=600,
                       env={"MODELFLEET_REPORTS": str(tmp_path / "reports")})


def on_host(spec, command: str) -> str:
    done = lab.ssh(spec, command)
    return done.stdout.strip()


def unit_state(spec, unit: str) -> tuple[str, str, str]:
    return (on_host(spec, f"systemctl is-active {unit}"), on_host(spec, f"systemctl is-enabled {unit}"),
            on_host(spec, f"test -e /etc/systemd/system/{unit} && echo file || echo none"))


def container_exists(name: str) -> bool:
    return subprocess.run(["docker", "container", "inspect", name], capture_output=True).returncode == 0


def answers(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=3).close()
        return True
    except OSError:
        return False


def served(address: str, port: int) -> list[str]:
    with urllib.request.urlopen(f"http://{address}:{port}/v1/models", timeout=10) as reply:
        return [m["id"] for m in json.load(reply)["data"]]


def no_changes(run) -> bool:
    import re

    total = re.search(r"Grand total\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)", run.stdout + run.stderr)
    return bool(total) and total.group(2) == "-" and total.group(4) == total.group(1)


def test_a_host_moved_out_of_a_multi_node_pool_keeps_no_unit_of_it(lab_hosts, tmp_path, scenario):
    """docs/multi-node.md had it unbuilt: the third host of a data-parallel pool leaves it (the pool shrinks to
    two): its worker unit of the pool is retired, the two members serve on with the new size."""
    names = [s["name"] for s in lab_hosts]
    scenario(only=names, gate_hosts=3)
    grown = serve("inventories/lab.py", tmp_path)
    assert grown.returncode == 0, (grown.stdout + grown.stderr)[-4000:]
    third = lab_hosts[2]
    assert unit_state(third, "modelfleet-gate.service") == ("active", "enabled", "file")

    scenario(only=names, gate_hosts=2)
    shrunk = serve("inventories/lab.py", tmp_path)
    out = shrunk.stdout + shrunk.stderr
    assert shrunk.returncode == 0, out[-4000:]
    assert f"[{third['name']}]" in out and "retiring modelfleet-gate.service (pool gate" in out, out[-4000:]
    active, enabled, file = unit_state(third, "modelfleet-gate.service")
    assert (active, file) == ("inactive", "none") and enabled != "enabled", (active, enabled, file)
    assert not container_exists(f"modelfleet-gate-{third['name']}")
    for spec in lab_hosts[:2]:
        assert unit_state(spec, "modelfleet-gate.service") == ("active", "enabled", "file")
        assert "--data-parallel-size 2" in on_host(spec, "cat /etc/systemd/system/modelfleet-gate.service")
    # The host serves its own pool again, outside the multi-node one.
    assert unit_state(third, f"modelfleet-tiny-{third['name']}.service") == ("active", "enabled", "file")


@pytest.fixture(scope="module")
def two_pools(pair_host, tmp_path_factory):
    """The pair host converged with both pools, and a unit of the site's own beside them."""
    tmp = tmp_path_factory.mktemp("retire")
    name = pair_host["name"]
    lab.scenario.write(only=[name], two_pools=name)
    first = serve("inventories/lab.py", tmp)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    assert served(pair_host["address"], 8001) == ["tiny-lab"]
    lab.ssh(pair_host, f"cat > /etc/systemd/system/{HANDMADE} <<'EOF'\n{HANDMADE_UNIT}EOF\n"
                       f"systemctl daemon-reload && systemctl enable --now {HANDMADE}")
    assert unit_state(pair_host, HANDMADE) == ("active", "enabled", "file")
    return pair_host, tmp


def test_a_pool_taken_out_of_services_is_retired_on_the_next_converge(two_pools, scenario):
    spec, tmp = two_pools
    name, address = spec["name"], spec["address"]
    scenario(only=[name], two_pools=name)
    container = f"modelfleet-pair-b-{name}"
    assert container_exists(container) and answers(address, 8001)
    inventory = derived(tmp, pools={"pair-b"})

    # Without -y, pyinfra prints each operation it would run (with -y it skips change detection).
    dry = run_pyinfra(inventory, "deploys/serve.py", extra=["--dry"], yes=False, cwd=REPO_ROOT, timeout=600)
    assert dry.returncode == 0, (dry.stdout + dry.stderr)[-3000:]
    assert "Retire modelfleet-pair-b.service (not in the inventory)" in dry.stdout + dry.stderr
    assert container_exists(container) and answers(address, 8001)  # --dry changed nothing

    run = serve(inventory, tmp)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "retiring modelfleet-pair-b.service (pool pair-b" in out and f"container {container}" in out, out[-4000:]
    active, enabled, file = unit_state(spec, "modelfleet-pair-b.service")
    assert (active, file) == ("inactive", "none") and enabled != "enabled", (active, enabled, file)
    assert not container_exists(container)
    assert not answers(address, 8001)
    assert not os.path.exists(f"{spec['config_dir']}/pair-b.env")  # its env file went with it
    assert any(os.scandir(spec["model_root"]))  # the checkpoint stays
    # The other pool and the site's own unit are untouched.
    assert served(address, 8000) == ["tiny-lab"]
    assert unit_state(spec, "modelfleet-pair-a.service") == ("active", "enabled", "file")
    assert unit_state(spec, HANDMADE) == ("active", "enabled", "file")
    report = json.loads((tmp / "reports" / "retired" / f"{name}.json").read_text())
    assert [r["unit"] for r in report["retired"]] == ["modelfleet-pair-b.service"]

    again = serve(inventory, tmp)
    assert again.returncode == 0 and no_changes(again), (again.stdout + again.stderr)[-3000:]


def test_a_host_that_left_the_inventory_is_retired_by_the_command(two_pools, scenario, lab_hosts):
    spec, tmp = two_pools
    name, address = spec["name"], spec["address"]
    scenario(two_pools=name)
    key, known = str(lab.STATE / "id_ed25519"), str(lab.STATE / "known_hosts")
    ssh = ["--ssh-user", "root", "--ssh-key", key, "--known-hosts", known]
    env = {"MODELFLEET_REPORTS": str(tmp / "reports")}

    # Still in the inventory: refused under every spelling of its name and address, nothing touched.
    number = int(ipaddress.ip_address(address))
    spellings = (name, name.upper() + ".", address, f"@ssh/{address}", hex(number), str(number), f"::ffff:{address}",
                 f"[::ffff:{address}]")
    for target in spellings:
        held = run_modelfleet("retire", "inventories/lab.py", target, "-y", *ssh, cwd=REPO_ROOT, env=env)
        assert held.returncode == 2 and f"reaches host {name} of the inventory" in held.stderr, held.stderr
        assert "Traceback" not in held.stderr
    assert unit_state(spec, "modelfleet-pair-a.service") == ("active", "enabled", "file")

    inventory = derived(tmp, pools={"pair-b"}, hosts={name})
    dry = run_modelfleet("retire", inventory, address, "--dry", "--json", *ssh, cwd=REPO_ROOT, env=env)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    said = json.loads(dry.stdout)
    assert said["dry"] and [[r["unit"] for r in h["retired"]] for h in said["hosts"]] == [["modelfleet-pair-a.service"]]
    assert unit_state(spec, "modelfleet-pair-a.service") == ("active", "enabled", "file")
    assert served(address, 8000) == ["tiny-lab"]

    done = run_modelfleet("retire", inventory, address, "-y", *ssh, cwd=REPO_ROOT, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{address}: retired modelfleet-pair-a.service (pool pair-a)" in done.stdout
    active, enabled, file = unit_state(spec, "modelfleet-pair-a.service")
    assert (active, file) == ("inactive", "none") and enabled != "enabled", (active, enabled, file)
    assert not container_exists(f"modelfleet-pair-a-{name}") and not answers(address, 8000)
    assert unit_state(spec, HANDMADE) == ("active", "enabled", "file")
    assert any(os.scandir(spec["model_root"]))  # checkpoints stay without --remove-checkpoints

    nothing = run_modelfleet("retire", inventory, address, "--json", "-y", *ssh, cwd=REPO_ROOT, env=env)
    assert nothing.returncode == 0 and json.loads(nothing.stdout)["hosts"][0]["retired"] == []

    # A host that cannot be reached (nothing listens on that port) is not retired: exit 1, "ok": false.
    with socket.socket() as closed:
        closed.bind((address, 0))
        port = closed.getsockname()[1]
    lost = run_modelfleet("retire", inventory, address, "--json", "-y", "--ssh-port", str(port), *ssh,
                          cwd=REPO_ROOT, env=env)
    said = json.loads(lost.stdout)
    assert lost.returncode == 1 and said["ok"] is False and said["hosts"][0]["retired"] is None, lost.stdout
