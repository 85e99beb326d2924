"""The lab: a rehearsal fleet of GPU-host doubles on one machine (systemd + sshd containers on 127.0.1.N).

State lives in .lab/ (git-ignored): the SSH key pair and host keys made at `lab up`, per-host sshd config,
the registry's config and data, and hosts.json, which inventories/lab.py reads.

Not part of the shipped package: it runs from a checkout (`modelfleet lab ...`, `make demo`, the tests).
A second lab can run beside the first: MODELFLEET_LAB_STATE names its folder and MODELFLEET_LAB_NET=N (1-9)
gives it its own addresses (127.0.(1+N).x), ports and container names; the test suite uses N=1 so it never
touches the lab a user (or `make demo`) started. Everything else the lab's runs vary is its scenario
(lab/scenario.py, scenario.json in the state folder).

The scenario's cdi (mflab-4,... or `all`) at `lab up`: those pre-built NVIDIA hosts get a Docker with CDI of their
own (lab/cdi.py: Debian forky's dockerd 28 beside the machine's 20.10), their GPUs as device nodes and the CDI
spec nvidia-ctk writes for them; the inventory then hands their services the GPUs (gpu_passthrough).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import yaml

from lab import apt, cdi, daemons, fabric, hub, scenario, secure_boot

LAB_DIR = Path(__file__).resolve().parent
REPO_ROOT = LAB_DIR.parent
STATE = scenario.STATE


def _tagged(repository: str, *files: Path) -> str:
    """An image's tag from the hash of what builds it: a changed script or file builds a new image."""
    return f"{repository}-{hashlib.sha256(b''.join(path.read_bytes() for path in files)).hexdigest()[:10]}"


# The lab's own images, tagged when first asked (importing the lab reads no file). The base (and the engine
# double on it) from its build script; the real llama-server (Debian's build); the real vLLM's CPU build, from
# lab/build-vllm.sh and lab/vllm's files.
@functools.cache
def base_image() -> str:
    return _tagged("modelfleet-lab/base:bookworm", LAB_DIR / "build-base.sh")


@functools.cache
def llama_server_image() -> str:
    return _tagged("modelfleet-lab/llama-server:forky", LAB_DIR / "build-llama-server.sh")


@functools.cache
def vllm_image() -> str:
    return _tagged("modelfleet-lab/vllm-cpu:0.32.0", LAB_DIR / "build-vllm.sh", *sorted((LAB_DIR / "vllm").iterdir()))


NET = daemons.NET
REGISTRY = f"127.0.0.1:{5000 + NET}"
PREFIX = f"mflab{NET or ''}-"
INSTANCE_LABEL = f"modelfleet-lab.net={NET}"
HOME_LABEL = "modelfleet-lab.home"  # the host's folder under the lab state that started it
DOCKER_LABEL = "modelfleet-lab.docker"  # whose dockerd the host's engines run on: the machine's, or its own (cdi)
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
TORCH = "torch==2.13.0"  # the engine double's PyTorch (a CPU build), downloaded as a wheel for its image
# persona -> (hardware, GPUs, recorded outputs, bare). A bare host has the GPUs but no driver, Docker or
# toolkit: the GPU stack stages install them from the lab's apt repositories. The others come pre-built.
BUILT_PERSONAS = {"h200x1": ("h200", 1, "h200x1", False), "b300x8-synthetic": ("b300", 8, "b300x8-synthetic", False),
                  "h200x1-bare": ("h200", 1, "h200x1", True), "b300x8-bare": ("b300", 8, "b300x8-synthetic", True),
                  "mi355x8-synthetic": ("mi355x", 8, "mi355x8-synthetic", False),
                  "mi355x8-bare": ("mi355x", 8, "mi355x8-synthetic", True)}


@functools.cache
def faults() -> dict:
    """Fault personas (lab/personas/faults.yaml): a base persona's recordings with one fault each, for admission."""
    return yaml.safe_load((LAB_DIR / "personas" / "faults.yaml").read_text())


@functools.cache
def personas() -> dict[str, tuple]:
    """Every persona: the built ones, the fault personas, the fabric personas (lab/fabric.py: hosts whose
    /sys/class/infiniband, netdevs, routes and IMEX state are a synthetic B300 (RoCE, two route groups; its worker
    also with one fault each), GB300 tray or InfiniBand H100) and the Secure Boot ones (lab/secure_boot.py: a bare
    H200 presenting as Ubuntu with Secure Boot on)."""
    found = dict(BUILT_PERSONAS)
    found.update({name: (*BUILT_PERSONAS[fault["base"]][:2], name, False) for name, fault in faults().items()})
    found.update({name: (p.hardware, p.gpus, name, False) for name, p in fabric.PERSONAS.items()})
    found.update({name: ("h200", 1, "h200x1", True) for name in secure_boot.KERNELS})
    return found


# The real images the lab's recipes name: the registry serves the engine double under the vLLM and SGLang tags,
# and the real llama-server (Debian's build, lab/build-llama-server.sh) under the llama.cpp one.
ENGINE_IMAGES = ("vllm/vllm-openai:v0.34.0", "lmsysorg/sglang:v0.5.18", "ghcr.io/ggml-org/llama.cpp:server-cuda13")
# The real vLLM's tag (recipe tiny-llama-vllm-cpu; the scenario's real_vllm host serves it).
REAL_VLLM_TAG = "vllm/vllm-openai-cpu:v0.32.0"
DOUBLE_IMAGE = "modelfleet-lab/engine-double:latest"  # local only: tests run it in llama.cpp mode beside the real one
ENGINES = ("vllm", "sglang", "llama.cpp")
# Rollout rehearsal images: a newer vLLM tag (its own digest) and one whose engine never gets ready.
UPGRADE_IMAGE = "vllm/vllm-openai:v0.35.0"
BROKEN_IMAGE = "vllm/vllm-openai:v0.35.0-broken"


def sh(*argv: str, check: bool = True, capture: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, text=True, capture_output=capture)


def address(index: int) -> str:
    return f"127.0.{1 + NET}.{10 + index}"


def _seed_registry(data: Path) -> None:
    """A new lab's registry starts from another lab's of this checkout (the suite's after `make demo`'s): its blobs
    hard-linked (content-addressed, never rewritten), its repositories' link files copied, so pushing the same
    images again sends no layer (the real vLLM's is 1.5 GB compressed: minutes of gzip on two cores)."""
    if (data / "docker").exists():
        return
    others = [o for o in REPO_ROOT.glob(".lab*/registry/docker/registry/v2")
              if STATE not in o.parents and (o / "blobs" / "sha256").is_dir()]
    for other in sorted(others, key=lambda o: -len(list((o / "blobs" / "sha256").iterdir())))[:1]:  # the fullest
        v2 = data / "docker" / "registry" / "v2"
        v2.parent.mkdir(parents=True, exist_ok=True)
        staging = v2.with_name("v2.seeding")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        sh("cp", "-a", "--link", str(other / "blobs"), str(staging / "blobs"))
        if (other / "repositories").is_dir():
            sh("cp", "-a", str(other / "repositories"), str(staging / "repositories"))
        staging.rename(v2)
        return


def ensure_registry() -> None:
    """Debian's docker-registry on 127.0.0.1:5000, data under .lab/registry."""
    data = STATE / "registry"
    data.mkdir(parents=True, exist_ok=True)
    _seed_registry(data)
    config = STATE / "registry.yml"
    config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {data}\n"
                      f"  delete:\n    enabled: true\nhttp:\n  addr: {REGISTRY}\nlog:\n  level: warn\n")
    daemons.start(STATE, "registry", ["docker-registry", "serve", str(config)], REGISTRY)


def ensure_images() -> None:
    """The lab's images, each built once per machine: the three root filesystems (build_images), then the engine
    double; a line per image on stderr (commands that print JSON on stdout, bench-* and demo, call this too) with
    its time, or `present`."""
    build_images()
    _double_images()


def build_images() -> None:
    """The three root filesystems, at once (each spends its time waiting on Debian's mirror and PyPI more than on a
    core), those missing only. `make test` calls it before its two shards start, which would otherwise build
    each missing one twice at once (python -c 'import lab; lab.build_images()')."""
    logs = STATE / "build-logs"
    logs.mkdir(parents=True, exist_ok=True)
    builds = {base_image(): "build-base.sh", llama_server_image(): "build-llama-server.sh",
              vllm_image(): "build-vllm.sh"}
    missing = [image for image in builds if not _image_present(image)]
    started, running = time.monotonic(), {}
    for image in missing:
        log = logs / f"{builds[image]}.log"
        running[image] = (subprocess.Popen([str(LAB_DIR / builds[image]), image], stdout=log.open("w"),
                                           stderr=subprocess.STDOUT, env={**os.environ, "PYTHON": sys.executable}),
                          log)
    if missing:
        print(f"lab: building {len(missing)} image(s) once for this machine ({', '.join(missing)}; logs in {logs})",
              file=sys.stderr, flush=True)
    for image, (process, log) in running.items():
        if process.wait():
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            raise RuntimeError(f"lab: building {image} failed ({builds[image]}, exit {process.returncode}); "
                               f"the end of {log}:\n{tail}")
        print(f"lab: {image} built ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)


def _double_images() -> None:
    """The engine double's images on the base (a fault and an upgrade variant), and every image the lab's recipes
    name, in the lab's registry."""
    local = DOUBLE_IMAGE
    # Build context: the double, and the PyTorch CPU wheels (for the netcheck gate) fetched once into .lab/.
    wheels = STATE / "wheels"
    if not list(wheels.glob("torch-*.whl")):
        sh(sys.executable, "-m", "pip", "download", "-q", "-d", str(wheels), TORCH, capture=True)
    context = STATE / "engine-build"
    shutil.rmtree(context, ignore_errors=True)
    shutil.copytree(LAB_DIR / "engine_double", context)
    shutil.copy(LAB_DIR.parent / "modelfleet" / "plan" / "catalog" / "engine_flags.json", context / "flags.json")
    shutil.copytree(wheels, context / "wheels", copy_function=os.link)
    sh("docker", "build", "-q", "--build-arg", f"BASE={base_image()}", "-t", local, str(context), capture=True)
    sh("docker", "build", "-q", "--build-arg", f"BASE={base_image()}", "--label", "modelfleet.lab.version=0.35.0",
       "-t", f"{local}-0.35", str(context), capture=True)
    sh("docker", "build", "-q", "--build-arg", f"BASE={base_image()}", "--build-arg", "DOUBLE_FAULT=1",
       "-t", f"{local}-broken", str(context), capture=True)
    sources = {image: local for image in ENGINE_IMAGES[:2]}
    sources[ENGINE_IMAGES[2]] = llama_server_image()
    sources.update({UPGRADE_IMAGE: f"{local}-0.35", BROKEN_IMAGE: f"{local}-broken", REAL_VLLM_TAG: vllm_image()})
    started = time.monotonic()
    for image, source in sources.items():
        sh("docker", "tag", source, f"{REGISTRY}/{image}")
        _publish(source, image)
    print(f"lab: images in the lab's registry {REGISTRY} ({time.monotonic() - started:.0f} s)",
          file=sys.stderr, flush=True)


def _registry_v2() -> Path:
    return STATE / "registry" / "docker" / "registry" / "v2"


def _publish(source: str, image: str) -> None:
    """Put a local image into the lab's registry under `image` as `docker push` would, but with its layers as
    `docker save` writes them, uncompressed: `docker push` spends minutes gzipping the real vLLM's 3.4 GB on two
    cores. The registry serves it as any other (a real docker-registry); a host's `docker pull` by digest finds
    the image's config already in the machine's dockerd and fetches nothing, and a host with a dockerd of its own
    (CDI) downloads the layers uncompressed (dockerd detects the compression of what it is given)."""
    repo, tag = image.rsplit(":", 1)
    v2 = _registry_v2()
    image_id = sh("docker", "image", "inspect", "-f", "{{.Id}}", source, capture=True).stdout.strip()
    if _published_config(v2, repo, tag) == image_id:
        return
    blobs: dict[str, tuple[str, int]] = {}  # path in the saved archive -> (digest, size)
    links: dict[str, str] = {}  # a layer saved twice links to its first copy
    saved = subprocess.Popen(["docker", "save", source], stdout=subprocess.PIPE)
    with tarfile.open(fileobj=saved.stdout, mode="r|") as archive:
        for member in archive:
            if member.issym():
                links[member.name] = posixpath.normpath(posixpath.join(posixpath.dirname(member.name),
                                                                       member.linkname))
            elif member.islnk():
                links[member.name] = member.linkname
            elif member.isfile():
                blobs[member.name] = _store_blob(v2, archive.extractfile(member))
    blobs.update({name: blobs[target] for name, target in links.items() if target in blobs})
    if saved.wait():
        raise RuntimeError(f"lab: docker save {source} failed (exit {saved.returncode})")
    manifest_in = json.loads(_blob_path(v2, blobs["manifest.json"][0]).read_bytes())[0]
    config = blobs[manifest_in["Config"]]
    layers = [blobs[layer] for layer in manifest_in["Layers"]]
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": config[1],
                   "digest": config[0]},
        "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar", "size": size, "digest": digest}
                   for digest, size in layers]}, indent=3).encode()
    manifest_digest, _ = _store_blob(v2, io.BytesIO(manifest))
    repository = v2 / "repositories" / repo
    for digest, _ in [config, *layers]:
        _link(repository / "_layers" / "sha256" / digest.split(":")[1] / "link", digest)
    hexdigest = manifest_digest.split(":")[1]
    _link(repository / "_manifests" / "revisions" / "sha256" / hexdigest / "link", manifest_digest)
    _link(repository / "_manifests" / "tags" / tag / "index" / "sha256" / hexdigest / "link", manifest_digest)
    _link(repository / "_manifests" / "tags" / tag / "current" / "link", manifest_digest)


def _blob_path(v2: Path, digest: str) -> Path:
    hexdigest = digest.split(":")[1]
    return v2 / "blobs" / "sha256" / hexdigest[:2] / hexdigest / "data"


def _store_blob(v2: Path, stream) -> tuple[str, int]:
    """One content-addressed blob, written once (a blob already there is kept: its name is its content)."""
    (v2 / "blobs").mkdir(parents=True, exist_ok=True)
    digest, size = hashlib.sha256(), 0
    with tempfile.NamedTemporaryFile(dir=v2 / "blobs", delete=False) as out:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
    name = f"sha256:{digest.hexdigest()}"
    final = _blob_path(v2, name)
    if final.exists():
        os.unlink(out.name)
    else:
        final.parent.mkdir(parents=True, exist_ok=True)
        os.rename(out.name, final)
    return name, size


def _link(path: Path, digest: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(digest)


def _published_config(v2: Path, repo: str, tag: str) -> str | None:
    """The config digest (= the local image ID) the registry's tag points at, or None."""
    try:
        current = (v2 / "repositories" / repo / "_manifests" / "tags" / tag / "current" / "link").read_text()
        return json.loads(_blob_path(v2, current).read_bytes())["config"]["digest"]
    except (OSError, ValueError, KeyError):
        return None


def _image_present(image: str) -> bool:
    return sh("docker", "image", "inspect", image, check=False, capture=True).returncode == 0


def _keys() -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    key = STATE / "id_ed25519"
    if not key.exists():
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "modelfleet-lab", "-f", str(key))


def persona_dir(recordings: str) -> Path:
    """A persona's recordings: in lab/personas, or built under the lab's state for a fault or fabric persona."""
    if recordings in fabric.PERSONAS:
        base = fabric.PERSONAS[recordings].recordings
        return fabric.build(recordings, STATE / "personas" / recordings, base and LAB_DIR / "personas" / base)
    if recordings not in faults():
        return LAB_DIR / "personas" / recordings
    fault, out = faults()[recordings], STATE / "personas" / recordings
    # Files are rewritten in place, never the folder replaced: a running host has it mounted.
    out.mkdir(parents=True, exist_ok=True)
    for recording in (LAB_DIR / "personas" / fault["base"]).iterdir():
        (out / recording.name).write_text(recording.read_text())
    for name, edits in (fault.get("edits") or {}).items():
        text = (out / name).read_text()
        for old, new in edits:
            if old not in text:
                raise ValueError(f"fault persona {recordings}: {name} has no {old!r}")
            text = text.replace(old, new, 1)
        (out / name).write_text(text)
    if fault.get("kernel_log"):
        (out / "kernel-log.txt").write_text("\n".join(fault["kernel_log"]) + "\n")
    if fault.get("drop_gpus"):
        _drop_last_gpus(out, fault["drop_gpus"])
    return out


def _drop_last_gpus(recordings: Path, count: int) -> None:
    """The persona's last `count` GPUs not enumerated, as a host whose GPU fell off before boot reports it: absent
    from every nvidia-smi listing (topo -m is left as recorded: it only feeds placement)."""
    smi = recordings / "nvidia-smi-q-x.txt"
    text = smi.read_text()
    starts = [m.start() for m in re.finditer(r"\t<gpu id=", text)]
    end = text.rindex("\t</gpu>\n") + len("\t</gpu>\n")
    text = text[:starts[-count]] + text[end:]
    smi.write_text(re.sub(r"<attached_gpus>\d+<", f"<attached_gpus>{len(starts) - count}<", text))
    for name in ("nvidia-smi-L.txt", "nvidia-smi-query-gpu.txt"):
        lines = (recordings / name).read_text().splitlines(keepends=True)
        (recordings / name).write_text("".join(lines[:-count]))
    for nvlink in (recordings / "nvidia-smi-nvlink-s.txt", recordings / "nvidia-smi-nvlink-e.txt"):
        if nvlink.exists():
            blocks = re.split(r"(?m)^(?=GPU \d+:)", nvlink.read_text())
            nvlink.write_text("".join(blocks[:-count]))


def _host_files(index: int, persona: str) -> dict:
    name = f"{PREFIX}{index}"
    home = STATE / "hosts" / name
    home.mkdir(parents=True, exist_ok=True)
    hostkey = home / "ssh_host_ed25519_key"
    if not hostkey.exists():
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(hostkey))
    hostkey.chmod(0o600)
    (home / "sshd.conf").write_text(
        f"ListenAddress {address(index)}\nHostKey /etc/ssh/ssh_host_ed25519_key\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\n")
    models = home / "models"
    models.mkdir(exist_ok=True)
    config = home / "etc-modelfleet"
    config.mkdir(mode=0o700, exist_ok=True)
    hardware, gpus, recordings, bare = personas()[persona]
    # Admission reads `nvidia-smi -q -x` or `amd-smi metric`: judged where the persona has one, skipped elsewhere.
    admission = any((persona_dir(recordings) / name).exists()
                    for name in ("nvidia-smi-q-x.txt", "amd-smi-metric.json"))
    return {"name": name, "address": address(index), "persona": persona, "hardware": hardware,
            "gpu_count": gpus, "recordings": recordings, "bare": bare, "admission": admission,
            "model_root": str(models), "config_dir": str(config), "home": str(home),
            "host_key_pub": (home / "ssh_host_ed25519_key.pub").read_text().split()[:2],
            # A fabric persona's address on its pool network and its pool's first member (inventories/lab.py).
            **({"fabric": {"address": fabric.PERSONAS[persona].address, "head": fabric.PERSONAS[persona].head}}
               if persona in fabric.PERSONAS else {})}


def _host_mounts(spec: dict) -> list[str]:
    """Pre-built hosts get the driver's tools and the docker CLI mounted; bare hosts get only what a fresh
    install has: the GPUs (the persona's recordings) and the distribution's archive (the lab's stand-in)."""
    docker_cli = shutil.which("docker") or "/usr/bin/docker"
    persona = LAB_DIR / "personas"
    if spec.get("bare"):
        (STATE / "debian-lab.list").write_text(apt.DISTRO_LIST)
        return [f"{docker_cli}:/opt/modelfleet-lab/docker-cli:ro",
                f"{STATE / 'apt-archive-keyring.gpg'}:/usr/share/keyrings/modelfleet-lab-archive.gpg:ro",
                f"{STATE / 'debian-lab.list'}:/etc/apt/sources.list.d/debian-lab.list:ro",
                *secure_boot.mounts(spec, STATE)]
    recordings = persona_dir(spec["recordings"])
    if spec.get("cdi"):  # its own dockerd, forky's CLI, nvidia-ctk, /etc/cdi and the GPUs' nodes (lab/cdi.py)
        docker_cli = str(cdi.cli(STATE))
    if (recordings / "amd-smi-static.json").exists():  # a pre-built AMD host: ROCm's tool
        return [f"{docker_cli}:/usr/bin/docker:ro", f"{persona / 'amd-smi'}:/usr/local/bin/amd-smi:ro"]
    dcgm = ([f"{persona / 'dcgmi'}:/usr/local/bin/dcgmi:ro"]
            if (recordings / "dcgmi-diag.json").exists() else [])  # DCGM where it is recorded
    return [f"{docker_cli}:/usr/bin/docker:ro", f"{persona / 'nvidia-smi'}:/usr/local/bin/nvidia-smi:ro",
            f"{persona / 'nv-fabricmanager'}:/usr/local/bin/nv-fabricmanager:ro", *dcgm]


def _claim(spec: dict) -> bool:
    """Is the host's container already running for this lab? One left by another lab state (another checkout,
    an earlier CI clone, brought back by dockerd's restart policy) has other host keys and mounts: it is
    replaced, with its engine containers, rather than trusted."""
    labels = sh("docker", "container", "inspect", "-f",
                '{{index .Config.Labels "%s"}}\n{{index .Config.Labels "%s"}}' % (HOME_LABEL, DOCKER_LABEL),
                spec["name"], check=False, capture=True)
    if labels.returncode != 0:
        return False
    owner, docker = (labels.stdout.splitlines() + ["", ""])[:2]
    docker = "cdi" if docker == "cdi" else "machine"  # a host without the label runs on the machine's
    if owner == spec["home"] and docker == _docker(spec):
        return True
    if owner == spec["home"]:
        print(f"lab: {spec['name']} ran its engines on the {docker} dockerd, now on the {_docker(spec)} one; "
              "replacing it", file=sys.stderr)
    else:
        print(f"lab: {spec['name']} belonged to another lab ({owner or 'unlabelled'}); replacing it",
              file=sys.stderr)
    sh("docker", "rm", "-f", spec["name"], *engine_containers([spec["name"]]), capture=True)
    return False


def _docker(spec: dict) -> str:
    return "cdi" if spec.get("cdi") else "machine"


def start_host(spec: dict) -> None:
    home = Path(spec["home"])
    devices, socket, cdi_mounts = list(spec.get("disks", [])), "/var/run/docker.sock", []
    if spec.get("cdi"):  # the host's own dockerd's socket, and its GPUs (lab/cdi.py)
        socket = str(cdi.socket_path(home))
        cdi_mounts, gpu_devices = cdi.host_args(STATE, home, spec["gpu_count"])
        devices += gpu_devices
    mounts = [
        f"{home / 'sshd.conf'}:/etc/ssh/sshd_config.d/modelfleet-lab.conf:ro",
        f"{home / 'ssh_host_ed25519_key'}:/etc/ssh/ssh_host_ed25519_key:ro",
        f"{home / 'ssh_host_ed25519_key.pub'}:/etc/ssh/ssh_host_ed25519_key.pub:ro",
        f"{STATE / 'id_ed25519.pub'}:/root/.ssh/authorized_keys:ro",
        f"{socket}:/var/run/docker.sock",
        f"{persona_dir(spec['recordings'])}:/opt/modelfleet-lab/persona:ro",
        f"{LAB_DIR / 'personas' / 'journalctl'}:/usr/local/bin/journalctl:ro",
        *_host_mounts(spec),
        *(fabric.mounts(persona_dir(spec["recordings"]), LAB_DIR / "personas")
          if spec["recordings"] in fabric.PERSONAS else []),
        # Same path inside and out: the machine's dockerd resolves the unit's -v mounts on the machine.
        f"{spec['model_root']}:{spec['model_root']}",
        f"{spec['config_dir']}:{spec['config_dir']}",
        "/sys/fs/cgroup:/sys/fs/cgroup:rw",
        *cdi_mounts,
    ]
    # The machine's trust store (it may hold a site's proxy CA) and a pip.conf that uses it, as a site image
    # would: the model stage's venv pip reaches PyPI through whatever the machine goes through.
    if Path(CA_BUNDLE).exists():
        (STATE / "pip.conf").write_text(f"[global]\ncert = {CA_BUNDLE}\n")
        mounts += [f"{CA_BUNDLE}:{CA_BUNDLE}:ro", f"{STATE / 'pip.conf'}:/etc/pip.conf:ro"]
    argv = ["docker", "run", "-d", "--name", spec["name"], "--hostname", spec["name"], "--network", "host",
            "--restart", "always", "--cap-add", "SYS_ADMIN", "--tmpfs", "/run", "--tmpfs", "/run/lock",
            "-e", "container=docker", "--label", "modelfleet-lab=host", "--label", INSTANCE_LABEL,
            "--label", f"{HOME_LABEL}={home}", "--label", f"{DOCKER_LABEL}={_docker(spec)}"]
    for mount in mounts:
        argv += ["-v", mount]
    for device in devices:
        argv += ["--device", device]
    sh(*argv, base_image(), "/sbin/init", capture=True)


def wait_ssh(spec: dict, timeout_s: float = 60) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if daemons.port_open(f"{spec['address']}:22"):
            return
        time.sleep(0.3)
    logs = sh("docker", "logs", "--tail", "30", spec["name"], check=False, capture=True)
    raise RuntimeError(f"{spec['name']}: sshd did not answer on {spec['address']}:22\n{logs.stdout}{logs.stderr}")


DISK_SIZE = "512M"  # sparse; XFS wants at least 300 MB


def _disks(spec: dict, count: int) -> list[str]:
    """Loop devices standing in for NVMe drives: sparse image files under the host's lab folder."""
    paths = []
    for i in range(count):
        image = Path(spec["home"]) / f"disk-{i}.img"
        if not image.exists():
            sh("truncate", "-s", DISK_SIZE, str(image))
        attached = sh("losetup", "-j", str(image), capture=True).stdout.split(":")[0]
        paths.append(attached or sh("losetup", "--find", "--show", str(image), capture=True).stdout.strip())
    return paths


def _detach_disks(pattern: str = "*") -> None:
    for image in (STATE / "hosts").glob(f"{pattern}/disk-*.img"):
        for line in sh("losetup", "-j", str(image), capture=True, check=False).stdout.splitlines():
            sh("losetup", "-d", line.split(":")[0], check=False, capture=True)


def _cdi_hosts(cdi_hosts: list[str] | None) -> set[str]:
    """The hosts to get a Docker with CDI: `cdi_hosts`, else the scenario's cdi (names, or `all`)."""
    if cdi_hosts is None:
        cdi_hosts = scenario.load().cdi
    return set(cdi_hosts)


def _cdi_capable(spec: dict) -> bool:
    """A pre-built NVIDIA host: its toolkit is there to write the spec (bare hosts install theirs; AMD has none)."""
    return not spec["bare"] and spec["hardware"] != "mi355x"


def up(hosts: int = 3, personas: list[str] | None = None, disks: int = 0,
       cdi_hosts: list[str] | None = None) -> list[dict]:
    """`cdi_hosts`: the hosts (names, or ["all"]) that get a Docker with CDI (default: the scenario's cdi)."""
    _keys()
    ensure_registry()
    ensure_images()
    apt_repo = apt.ensure(STATE, LAB_DIR)
    hub_double = hub.ensure(STATE, LAB_DIR, vllm_image())
    personas = personas or ["h200x1"]
    wanted_cdi = _cdi_hosts(cdi_hosts)
    specs = []
    for i in range(1, hosts + 1):
        spec = _host_files(i, personas[(i - 1) % len(personas)])
        # The lab's SGLang and llama.cpp recipes are NVIDIA-only; an AMD persona serves with vLLM.
        spec["engine"] = "vllm" if spec["hardware"] == "mi355x" else ENGINES[(i - 1) % len(ENGINES)]
        spec["disks"] = _disks(spec, disks)
        spec["cdi"] = spec["name"] in wanted_cdi or ("all" in wanted_cdi and _cdi_capable(spec))
        if spec["cdi"] and not _cdi_capable(spec):
            raise ValueError(f"lab: {spec['name']} ({spec['persona']}) cannot have CDI: only pre-built NVIDIA "
                             "personas carry the container toolkit")
        home, fresh = Path(spec["home"]), False
        if spec["cdi"]:
            spec["docker_version"] = cdi.ensure_docker(STATE)
            fresh = cdi.start(STATE, spec["name"], home)
            spec["docker_host"] = f"unix://{cdi.socket_path(home)}"
        if fresh or not _claim(spec):
            # A host whose dockerd started now is made again: its container holds the old socket.
            sh("docker", "rm", "-f", spec["name"], check=False, capture=True)
            if not spec["cdi"]:
                cdi.stop(STATE, spec["name"], home)  # one it had before, with its engines
            start_host(spec)
        if spec["cdi"] and not (home / "cdi" / "nvidia.yaml").exists():
            cdi.generate_spec(spec["name"], home)
        specs.append(spec)
    known = [f"{s['address']} {' '.join(s['host_key_pub'])}" for s in specs]
    (STATE / "known_hosts").write_text("\n".join(known) + "\n")
    (STATE / "hosts.json").write_text(json.dumps({"key": str(STATE / "id_ed25519"),
                                                  "known_hosts": str(STATE / "known_hosts"),
                                                  "registry": REGISTRY, "apt": apt_repo, "hub": hub_double,
                                                  "scenario_module": scenario.__file__,
                                                  "hosts": specs}, indent=2))
    for spec in specs:
        wait_ssh(spec)
    return specs


def remove(names: list[str]) -> None:
    """Take some hosts out of the lab (their containers, engine containers and lab folders)."""
    data = json.loads((STATE / "hosts.json").read_text())
    sh("docker", "rm", "-f", *names, *engine_containers(names), check=False, capture=True)
    for spec in [s for s in data["hosts"] if s["name"] in names]:
        cdi.stop(STATE, spec["name"], Path(spec["home"]))  # a CDI host's dockerd, with its engine containers
        _detach_disks(spec["name"])
        shutil.rmtree(spec["home"], ignore_errors=True)
    data["hosts"] = [s for s in data["hosts"] if s["name"] not in names]
    (STATE / "hosts.json").write_text(json.dumps(data, indent=2))


def restarts(name: str) -> int:
    """How often docker restarted a lab host's container: its reboots (`--restart always`)."""
    return int(sh("docker", "inspect", "-f", "{{.RestartCount}}", name, capture=True).stdout.strip())


def ssh(spec: dict, command: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """Run `command` on a lab host over its real sshd, with the lab's key and known_hosts."""
    return subprocess.run(["ssh", "-i", str(STATE / "id_ed25519"), "-o", f"UserKnownHostsFile={STATE / 'known_hosts'}",
                           f"root@{spec['address']}", command], capture_output=True, text=True, timeout=timeout_s)


def _containers(*labels: str) -> list[str]:
    filters = [arg for label in labels for arg in ("--filter", f"label={label}")]
    out = sh("docker", "ps", "-aq", *filters, check=False, capture=True).stdout
    return out.split()


def engine_containers(hosts: list[str] | None = None) -> list[str]:
    """The engine containers of this lab's hosts (of `hosts` only, when given): their names end in the host's."""
    out = sh("docker", "ps", "-a", "--format", "{{.Names}}", check=False, capture=True).stdout
    names = [n for n in out.split() if n.startswith("modelfleet-") and PREFIX in n]
    return names if hosts is None else [n for n in names if any(n.endswith(host) for host in hosts)]


def down() -> dict:
    """Remove lab hosts, their engine containers and the registry process; keep images and keys."""
    engines = engine_containers()
    hosts = _containers("modelfleet-lab=host", INSTANCE_LABEL)
    if engines or hosts:
        sh("docker", "rm", "-f", *engines, *hosts, capture=True)
    cdi_dockerds = cdi.stop_all(STATE)  # CDI hosts' own dockerds, with their engine containers
    services = daemons.stop_all(STATE)
    _detach_disks()
    shutil.rmtree(STATE / "hosts", ignore_errors=True)
    shutil.rmtree(STATE / "personas", ignore_errors=True)
    (STATE / "hosts.json").unlink(missing_ok=True)
    return {"removed_hosts": len(hosts), "removed_engines": len(engines), "stopped_services": services,
            "stopped_cdi_dockerds": cdi_dockerds}


def status() -> dict:
    if not (STATE / "hosts.json").exists():
        return {"up": False, "hosts": []}
    data = json.loads((STATE / "hosts.json").read_text())
    rows = []
    for spec in data["hosts"]:
        state = sh("docker", "inspect", "-f", "{{.State.Status}}", spec["name"], check=False, capture=True)
        rows.append({"name": spec["name"], "address": spec["address"], "persona": spec["persona"],
                     "engine": spec["engine"], "container": state.stdout.strip() or "absent",
                     "docker": _docker(spec),
                     "ssh": daemons.port_open(f"{spec['address']}:22")})
    return {"up": True, "registry": daemons.port_open(REGISTRY),
            "apt": daemons.port_open(apt.LISTEN), "hub": daemons.port_open(hub.LISTEN),
            "hosts": rows}
