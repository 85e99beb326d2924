"""A real Docker with CDI for lab hosts: Debian forky's docker.io (dockerd, its CLI and docker-init), one dockerd
per CDI host beside the machine's, which it never touches.

The machine's Docker (Debian 12's docker.io 20.10) has no CDI, so a unit's `--device nvidia.com/gpu=N` never ran
there. A host the scenario's cdi names at `lab up` gets its own dockerd 28: the .debs fetched once with apt from forky
into the lab state (their declared dependencies, containerd and runc, are the machine's bookworm packages),
its own data root (.lab/hosts/<host>/docker), exec root and socket (/run/modelfleet-lab/<id>: a unix socket's
path must stay under 108 bytes), no iptables rules or forwarding (lab engines use the host network) and the
default bridge left to the machine's dockerd (a dockerd told `bridge: none` deletes docker0 at start, which the
machine's dockerd and its containers use), CDI on, and the host's
/etc/cdi (.lab/hosts/<host>/cdi) as its spec directory. The host's GPUs are character device nodes in
.lab/hosts/<host>/dev (NVIDIA's majors and minors: 195:N per GPU, 195:255 nvidiactl; no driver answers them, so
an open that the device cgroup allows fails with ENXIO and one it refuses with EPERM). The host sees them in
its /dev, and the spec is written on the host by the toolkit's `nvidia-ctk cdi generate --dev-root=...`
(lab/apt/nvidia-ctk), as on a real host.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

from lab import daemons

SUITE = "forky"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("docker.io", "docker-cli", "tini-static")
RUN_ROOT = Path("/run/modelfleet-lab")
NVIDIA_MAJOR = 195
UVM_MAJOR = 509  # the driver's nvidia-uvm gets a dynamic major; one that nothing here registers
COMMON_NODES = {"nvidia-modeset": (NVIDIA_MAJOR, 254), "nvidia-uvm": (UVM_MAJOR, 0),
                "nvidia-uvm-tools": (UVM_MAJOR, 1), "nvidiactl": (NVIDIA_MAJOR, 255)}
MIN_MAJOR = 25  # Docker's first release with CDI device requests (`--device vendor/class=name`)


def tree(state: Path) -> Path:
    return state / "docker-cdi" / "root"


def cli(state: Path) -> Path:
    return tree(state) / "usr" / "bin" / "docker"


def ensure_docker(state: Path) -> str:
    """forky's docker.io, docker-cli and tini-static unpacked under the lab state (once: ~5 s, 28 MB of .debs);
    returns its version.
    apt runs with its own sources, lists and cache there: the machine's apt sources and packages stay as
    they are."""
    root = tree(state)
    if not (root / "usr" / "sbin" / "dockerd").exists():
        base = state / "docker-cdi"
        apt_dir = base / "apt"
        for sub in ("lists/partial", "archives/partial", "debs"):
            (apt_dir / sub).mkdir(parents=True, exist_ok=True)
        (apt_dir / "sources.list").write_text(
            f"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {MIRROR} {SUITE} main\n")
        # As lab/build-llama-server.sh: a Release past its Valid-Until is still signature-checked.
        opts = [f"-oDir::Etc::SourceList={apt_dir / 'sources.list'}", "-oDir::Etc::SourceParts=/nonexistent",
                f"-oDir::State::Lists={apt_dir / 'lists'}", f"-oDir::Cache={apt_dir}",
                f"-oDir::Cache::Archives={apt_dir / 'archives'}", "-oAcquire::Check-Valid-Until=false",
                "-oAPT::Sandbox::User=root", "-qq"]
        _run(["apt-get", *opts, "update"])
        debs = apt_dir / "debs"
        for old in debs.glob("*.deb"):
            old.unlink()
        _run(["apt-get", *opts, "download", *PACKAGES], cwd=debs)
        unpacked = root.with_name("root.partial")
        subprocess.run(["rm", "-rf", str(unpacked)], check=True)
        for deb in sorted(debs.glob("*.deb")):
            _run(["dpkg-deb", "-x", str(deb), str(unpacked)])
        unpacked.rename(root)
        subprocess.run(["rm", "-rf", str(apt_dir)], check=True)  # forky's lists: ~50 MB the lab no longer needs
    version = _run([str(root / "usr" / "sbin" / "dockerd"), "--version"]).stdout.strip()
    found = re.search(r"version (\d+)\.", version)
    if not found or int(found.group(1)) < MIN_MAJOR:
        raise RuntimeError(f"lab CDI: {SUITE}'s dockerd is '{version}'; CDI needs Docker {MIN_MAJOR} or later")
    return version


def _run(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()[-800:]
        raise RuntimeError(f"lab CDI: {' '.join(argv[:3])} ... failed: {said}")
    return done


def run_dir(home: Path) -> Path:
    """The host's dockerd's exec root (socket, pidfile, containerd's sockets), one per host folder."""
    return RUN_ROOT / hashlib.sha256(str(home).encode()).hexdigest()[:12]


def socket_path(home: Path) -> Path:
    return run_dir(home) / "docker.sock"


def gpu_nodes(home: Path, gpus: int) -> dict[str, Path]:
    """The host's GPU device nodes (name in /dev -> node under the host's folder), made when missing."""
    dev = Path(home) / "dev"
    dev.mkdir(parents=True, exist_ok=True)
    wanted = {f"nvidia{i}": (NVIDIA_MAJOR, i) for i in range(gpus)} | COMMON_NODES
    for name, (major, minor) in wanted.items():
        node = dev / name
        try:
            if os.stat(node).st_rdev == os.makedev(major, minor):
                continue
            node.unlink()
        except FileNotFoundError:
            pass
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(major, minor))
    return {name: dev / name for name in wanted}


def answers(sock: Path) -> bool:
    """Does a dockerd answer /_ping on this socket?"""
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            s.connect(str(sock))
            s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            return b"\r\n\r\nOK" in s.recv(4096)
    except OSError:
        return False


def _pidfile(state: Path, name: str) -> Path:
    return state / f"dockerd-{name}.pid"


def start(state: Path, name: str, home: Path) -> bool:
    """The host's dockerd, started unless it already answers; True when started now (the host's container then
    needs the new socket)."""
    home, run = Path(home), run_dir(Path(home))
    if answers(socket_path(home)) and _pidfile(state, name).exists():
        return False
    stop(state, name, home)
    run.mkdir(parents=True, exist_ok=True)
    (home / "cdi").mkdir(parents=True, exist_ok=True)
    root = tree(state)
    config = home / "dockerd.json"
    config.write_text(json.dumps({
        "data-root": str(home / "docker"), "exec-root": str(run), "pidfile": str(run / "docker.pid"),
        "hosts": [f"unix://{socket_path(home)}"], "features": {"cdi": True},
        "cdi-spec-dirs": [str(home / "cdi")],
        "init-path": str(root / "usr" / "bin" / "tini-static"), "iptables": False, "ip-forward": False,
        "ip-masq": False, "ip6tables": False, "storage-driver": "overlay2", "log-level": "warn"}, indent=2) + "\n")
    log = open(state / f"dockerd-{name}.log", "a")
    # Its own session (stopped by process group); containerd, runc and their shims are the machine's.
    path = (f"{root / 'usr' / 'sbin'}:{root / 'usr' / 'bin'}:"
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    proc = subprocess.Popen([str(root / "usr" / "sbin" / "dockerd"), f"--config-file={config}"], stdout=log,
                            stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "PATH": path})
    _pidfile(state, name).write_text(str(proc.pid))
    for _ in range(300):
        if answers(socket_path(home)):
            return True
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    tail = (state / f"dockerd-{name}.log").read_text()[-1500:]
    raise RuntimeError(f"lab CDI: {name}'s dockerd did not answer on {socket_path(home)}:\n{tail}")


def stop(state: Path, name: str, home: Path) -> bool:
    """Stop the host's dockerd (its containers first), unmount what it left, remove its exec root. True when one
    was running."""
    home, run, pidfile = Path(home), run_dir(Path(home)), _pidfile(state, name)
    sock, was = socket_path(home), False
    if answers(sock) and cli(state).exists():
        docker = [str(cli(state)), "-H", f"unix://{sock}"]
        ids = subprocess.run([*docker, "ps", "-aq"], capture_output=True, text=True).stdout.split()
        if ids:
            subprocess.run([*docker, "rm", "-f", *ids], capture_output=True)
    try:
        pid = int(pidfile.read_text())
        os.killpg(pid, signal.SIGTERM)
        was = True
        # dockerd stops its containers (SIGTERM, then SIGKILL after its own timeout) before it exits
        daemons.wait_gone(pid, timeout_s=30)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        pass
    pidfile.unlink(missing_ok=True)
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for point in sorted((m for m in mounts if m.startswith((f"{run}/", f"{home / 'docker'}/"))), key=len,
                        reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)
    subprocess.run(["rm", "-rf", str(run)], capture_output=True)
    try:
        RUN_ROOT.rmdir()  # the last one's
    except OSError:
        pass
    return was


def stop_all(state: Path) -> list[str]:
    """Stop every CDI dockerd this lab started; returns the hosts' names."""
    names = [p.name[len("dockerd-"):-len(".pid")] for p in sorted(state.glob("dockerd-*.pid"))]
    for name in names:
        stop(state, name, state / "hosts" / name)
    return names


def host_args(state: Path, home: Path, gpus: int) -> tuple[list[str], list[str]]:
    """The host container's mounts and devices: its dockerd's socket and forky's CLI where the machine's would
    be, the toolkit's nvidia-ctk, /etc/cdi (the dockerd's spec directory), the device nodes' folder (at the
    same path inside, as --dev-root names it) and the nodes themselves in /dev."""
    home = Path(home)
    nodes = gpu_nodes(home, gpus)
    mounts = [f"{socket_path(home)}:/var/run/docker.sock", f"{cli(state)}:/usr/bin/docker:ro",
              f"{Path(__file__).resolve().parent / 'apt' / 'nvidia-ctk'}:/usr/bin/nvidia-ctk:ro",
              f"{home / 'cdi'}:/etc/cdi", f"{home / 'dev'}:{home / 'dev'}:ro"]
    devices = [f"{node}:/dev/{name}" for name, node in nodes.items()]
    return mounts, devices


def generate_spec(host: str, home: Path) -> None:
    """On the host, as its toolkit would: `nvidia-ctk cdi generate --dev-root=<its device folder's root>`."""
    done = subprocess.run(["docker", "exec", host, "nvidia-ctk", "cdi", "generate", f"--dev-root={home}",
                           "--output=/etc/cdi/nvidia.yaml"], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"lab CDI: nvidia-ctk cdi generate on {host} failed: {done.stderr.strip()[-800:]}")
