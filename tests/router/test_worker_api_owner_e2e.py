"""The router's worker API as a local attacker meets it: the real vllm-router 0.1.17 run as the router's user
(its launcher reading the unit's copies of its files), Debian's nginx with its workers as the door's user, and the
nftables rule the router's unit loads, all in a private network namespace (the lab's hosts share the machine's,
and have no NET_ADMIN). A process of user nobody, or root, posts its own worker to the router's port: refused,
never listed, and it receives none of the clients' requests; modelfleet's own call (as the router's user)
registers a replica; the verify gate's look passes, and fails once the rule is gone."""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from modelfleet.plan import render, router
from modelfleet.plan.inventory.plan import RouterPlan, Worker
from tests.router.front_door import (
    KEY,
    SERVED,
    Clients,
    Replica,
    free_base_port,
    listed,
    nginx_binary,
    router_venv,
    sh,
    stop_all,
    wait_for,
)

pytestmark = pytest.mark.slow
CLONE_NEWNET = 0x40000000
NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--")

if os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "nft", "setpriv", "useradd", "curl")):
    pytestmark = [pytestmark, pytest.mark.skip(reason="needs root, ip, nft, setpriv, useradd and curl")]


def _setns(fd: int) -> None:
    if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns")


@contextlib.contextmanager
def _entered(path: str):
    """This thread (and what it starts) in the network namespace at `path`, then back."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        theirs = os.open(path, os.O_RDONLY)
        _setns(theirs)
        os.close(theirs)
        yield
    finally:
        _setns(home)
        os.close(home)


@pytest.fixture
def netns():
    """A network namespace of its own, with only loopback, entered."""
    name = f"mf-router-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        with _entered(f"/run/netns/{name}"):
            subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
            yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def _curl(*prefix: str, url: str, method: str = "GET") -> tuple[int, str]:
    """(curl's exit status, the HTTP status it got) for a request made by `prefix`'s user."""
    done = subprocess.run([*prefix, "curl", "-sS", "-m", "5", "-o", "/dev/null", "-w", "%{http_code}", "-X", method,
                           url], capture_output=True, text=True)
    return done.returncode, done.stdout


def _start_router(rp: RouterPlan, workdir: Path) -> subprocess.Popen:
    """The launcher as the unit starts it: as the router's user, reading its config, replicas and key from
    copies in a directory only that user reads (the unit's runtime directory)."""
    venv = workdir / "venv"
    shutil.copytree(router_venv(router.spec(rp)), venv, symlinks=True)
    copies = workdir / "copies"
    copies.mkdir(mode=0o700)
    p = router.paths(rp)
    for path, content in ((p["config"], router.launcher_config(rp)), (p["workers"], router.workers_file(rp)),
                          (p["key"], KEY + "\n")):
        (copies / Path(path).name).write_text(content)
    shutil.chown(copies, router.ROUTER_USER, router.ROUTER_USER)
    for f in copies.iterdir():
        shutil.chown(f, router.ROUTER_USER, router.ROUTER_USER)
        f.chmod(0o400)
    launcher = workdir / "modelfleet_router.py"
    launcher.write_text(router.launcher())
    argv = ["setpriv", f"--reuid={router.ROUTER_USER}", f"--regid={router.ROUTER_USER}", "--clear-groups", "--",
            str(venv / "bin" / "python"), str(launcher), p["config"]]  # as ExecStart names it
    return subprocess.Popen(argv, env={**os.environ, "MODELFLEET_ROUTER_FILES": str(copies)},
                            stdout=(workdir / "router.log").open("w"), stderr=subprocess.STDOUT)


def _start_door(rp: RouterPlan, tmp_path: Path) -> subprocess.Popen:
    p, runtime = router.paths(rp), tmp_path / "door"
    runtime.mkdir()
    Path(p["proxy_key"]).write_text(router.proxy_key_conf(KEY))
    Path(p["proxy"]).write_text(router.render_proxy(rp, runtime=str(runtime)))
    conf = ["-e", "stderr", "-p", str(runtime), "-c", p["proxy"]]
    nginx = nginx_binary()
    sh(f"{nginx} -t -q {' '.join(conf)}")
    return subprocess.Popen([str(nginx), *conf], stdout=(tmp_path / "nginx.log").open("w"), stderr=subprocess.STDOUT)


def test_only_the_door_and_modelfleet_reach_the_routers_worker_api(tmp_path, netns):
    sh(router.users_script())
    workdir = Path(tempfile.mkdtemp(prefix="mf-router-"))
    workdir.chmod(0o755)  # the router's user reads its venv and launcher here
    replicas = [Replica("vllm", tmp_path, i) for i in range(2)]
    attacker_worker, late = Replica("vllm", tmp_path, 8), Replica("vllm", tmp_path, 9)
    base = free_base_port(3)
    rp = RouterPlan(name=SERVED, host="local", engine_name="vllm", served_name=SERVED, bind_address="127.0.0.1",
                    port=base, policy="round_robin", api_key_env="UNUSED", config_dir=str(tmp_path),
                    workers=tuple(Worker(f"r{i}", "local", r.url) for i, r in enumerate(replicas)))
    assert router.firewalled(rp)
    rule = Path(router.paths(rp)["rule"])
    rule.write_text(router.render_rule(rp))
    procs = []
    try:
        # ExecStartPre, then the router; loaded twice, as a restart after a crash would (no ExecStopPost ran).
        sh(f"nft -f {rule} && nft -f {rule}")
        assert sh(f"nft list table inet {router.nft_table(rp)}").count("reject") == 1
        procs = [_start_router(rp, workdir), _start_door(rp, tmp_path)]
        wait_for(lambda: set(listed(rp)) == {r.url for r in replicas}, 60,
                 f"the router lists its replicas ({(workdir / 'router.log').read_text()[-2000:]})")
        backend = router.local_url(rp)
        add = f"{backend}/add_worker?url={attacker_worker.url}"
        # The attack: a local process (an engine container on the host network is one) registers its own worker.
        assert _curl(*NOBODY, url=add, method="POST") == (7, "000")
        assert _curl(url=add, method="POST") == (7, "000")  # root too: only the door's and the router's users
        assert _curl(*NOBODY, url=f"{backend}/v1/models") == (7, "000")  # nor the model, key-less
        with Clients(rp.base_url) as clients:
            wait_for(lambda: clients.ok >= 20, 60, "clients served through the door")
        assert clients.failed == []
        assert attacker_worker.url not in listed(rp) and attacker_worker.served() == 0
        # modelfleet's own call, as the stage runs it (as the router's user): taken.
        sh(router.add_script(rp, late.url))
        assert late.url in listed(rp)
        gate = subprocess.run(router.worker_guard_script(rp), shell=True, capture_output=True, text=True)
        assert gate.returncode == 0 and gate.stdout.strip() == f"refused nobody {backend}/workers", gate.stderr
        # Without the rule (ExecStopPost drops it; today's main never had it) the attack works, and the gate
        # fails the door naming what nobody got.
        sh(f"nft delete table inet {router.nft_table(rp)}")
        assert _curl(*NOBODY, url=add, method="POST") == (0, "200")
        assert attacker_worker.url in listed(rp)
        gate = subprocess.run(router.worker_guard_script(rp), shell=True, capture_output=True, text=True)
        assert gate.returncode == 1 and gate.stderr.strip() == (
            f"modelfleet: front door {SERVED}: a process of user nobody got 200 from the router's worker API "
            f"{backend}/workers (want the connection refused): any local process can register a worker; is its owner "
            f"rule loaded? (nft list table inet {router.nft_table(rp)}; restarting {router.nft_table(rp)}.service "
            "loads it)")
    finally:
        stop_all(procs)
        for replica in [*replicas, attacker_worker, late]:
            replica.stop()
        subprocess.run(["nft", "delete", "table", "inet", router.nft_table(rp)], capture_output=True)
        shutil.rmtree(workdir, ignore_errors=True)


def test_an_engine_container_on_the_host_network_cannot_pose_as_the_routers_user(tmp_path):
    """The attacker is root in a container on the router's network, as an engine's (a model's own code runs
    there). Started as modelfleet starts engines (render.CONTAINER_UIDS_FIXED), it can neither take the router's
    uid (setpriv) nor run a setuid file of that uid it made: refused, never listed. A container with Docker's
    default capabilities beside it (as engines ran before) takes the uid and registers its worker."""
    import lab

    if subprocess.run(["docker", "image", "inspect", lab.base_image()], capture_output=True).returncode:
        pytest.skip(f"the lab's base image {lab.base_image()} is not built (make lab-setup)")
    sh(router.users_script())
    engine_like, default_caps = f"mf-engine-like-{os.getpid()}", f"mf-default-caps-{os.getpid()}"
    sh(f"docker run -d --rm --network none --name {engine_like} {' '.join(render.CONTAINER_UIDS_FIXED)} "
       f"{lab.base_image()} sleep infinity >/dev/null")
    sh(f"docker run -d --rm --network container:{engine_like} --name {default_caps} {lab.base_image()} "
       "sleep infinity >/dev/null")
    pid = sh(f"docker inspect -f '{{{{.State.Pid}}}}' {engine_like}").strip()
    workdir = Path(tempfile.mkdtemp(prefix="mf-router-"))
    workdir.chmod(0o755)
    procs, replicas = [], []
    try:
        with _entered(f"/proc/{pid}/ns/net"):
            replicas = [Replica("vllm", tmp_path, 0), Replica("vllm", tmp_path, 8)]
            rp = RouterPlan(name=SERVED, host="local", engine_name="vllm", served_name=SERVED,
                            bind_address="127.0.0.1", port=free_base_port(3), policy="round_robin",
                            api_key_env="UNUSED", config_dir=str(tmp_path), workers=(Worker("r0", "local",
                                                                                          replicas[0].url),))
            rule = Path(router.paths(rp)["rule"])
            rule.write_text(router.render_rule(rp))
            sh(f"nft -f {rule}")
            procs = [_start_router(rp, workdir)]
            wait_for(lambda: set(listed(rp)) == {replicas[0].url}, 60, "the router lists its replica")
            user = pwd.getpwnam(router.ROUTER_USER)
            add = f"{router.local_url(rp)}/add_worker?url={replicas[1].url}"
            ask = f"-sS -m 5 -o /dev/null -w %{{http_code}} -X POST '{add}'"
            pose = f"setpriv --reuid={user.pw_uid} --regid={user.pw_gid} --clear-groups -- curl {ask}"
            setuid_file = (f"cp /usr/bin/curl /tmp/c && chown {user.pw_uid}:{user.pw_gid} /tmp/c && chmod 6755 /tmp/c "
                           f"&& /tmp/c {ask}")

            def attack(container: str, script: str) -> tuple[int, str]:
                done = subprocess.run(["docker", "exec", container, "sh", "-c", script], capture_output=True,
                                      text=True)
                return done.returncode, done.stdout.strip()

            assert attack(engine_like, f"curl {ask}") == (7, "000")  # root: refused by the rule
            got = attack(engine_like, pose)
            assert got[0] != 0 and got[1] == "", got  # setpriv: no CAP_SETUID
            assert attack(engine_like, setuid_file) == (7, "000")  # no-new-privileges: it runs as root
            assert replicas[1].url not in listed(rp)
            assert attack(default_caps, pose) == (0, "200")  # what Docker's defaults let an engine do
            assert replicas[1].url in listed(rp)
    finally:
        stop_all(procs)
        for replica in replicas:
            replica.stop()
        subprocess.run(["docker", "rm", "-f", engine_like, default_caps], capture_output=True)
        shutil.rmtree(workdir, ignore_errors=True)
