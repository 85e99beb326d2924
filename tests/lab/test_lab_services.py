"""The lab's stand-ins for the outside world, exercised with the real clients: apt (signed repository) on a
lab host, huggingface_hub against the hub double, and validate refusing an open endpoint without a key."""

import hashlib
import json
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.errors import GatedRepoError

import lab
from lab import STATE, daemons, hub, ssh
from modelfleet.base.commands import modelfleet_argv, run_pyinfra

pytestmark = pytest.mark.lab
REPO = "modelfleet/tiny-lab"


def lab_json():
    return json.loads((STATE / "hosts.json").read_text())


def apt_get(spec, sources: str, *args: str):
    """apt-get with only the given sources file (the hosts' own Debian sources are not under test)."""
    opts = f"-o Dir::Etc::SourceList={sources} -o Dir::Etc::SourceParts=/nonexistent -o Acquire::Retries=0"
    return ssh(spec, f"DEBIAN_FRONTEND=noninteractive apt-get {opts} {' '.join(args)}")


def test_signed_apt_repository_installs_the_keyring_package_then_verifies_with_it(lab_hosts):
    spec, apt = lab_hosts[0], lab_json()["apt"]
    key = Path(apt["keyring"]).read_bytes()
    subprocess.run(["scp", "-q", "-i", str(STATE / "id_ed25519"), "-o", f"UserKnownHostsFile={STATE / 'known_hosts'}",
                    apt["keyring"], f"root@{spec['address']}:/tmp/lab-bootstrap.gpg"], check=True)
    ssh(spec, f"echo 'deb [signed-by=/tmp/lab-bootstrap.gpg] {apt['url']} /' > /tmp/lab-bootstrap.list")
    update = apt_get(spec, "/tmp/lab-bootstrap.list", "update")
    assert update.returncode == 0, update.stdout + update.stderr
    install = apt_get(spec, "/tmp/lab-bootstrap.list", "install", "-y", "cuda-keyring")
    assert install.returncode == 0, install.stdout + install.stderr
    installed = ssh(spec, "sha256sum < /usr/share/keyrings/cuda-archive-keyring.gpg").stdout.split()[0]
    assert installed == hashlib.sha256(key).hexdigest()
    listed = ssh(spec, "cat /etc/apt/sources.list.d/cuda-debian12-x86_64.list").stdout
    assert apt["url"] in listed and "signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg" in listed
    # The source list the package installed is the one that works from now on, as with NVIDIA's cuda-keyring.
    again = apt_get(spec, "/etc/apt/sources.list.d/cuda-debian12-x86_64.list", "update")
    assert again.returncode == 0, again.stderr
    shown = apt_get(spec, "/etc/apt/sources.list.d/cuda-debian12-x86_64.list", "-s", "install",
                    "nvidia-driver-580-open")
    assert "Inst nvidia-driver-580-open (580.159.04-1" in shown.stdout
    # The same repository against another key must be refused: the signature is checked, not decorative.
    ssh(spec, f"echo 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {apt['url']} /' "
              "> /tmp/lab-wrongkey.list")
    wrong = apt_get(spec, "/tmp/lab-wrongkey.list", "update")
    assert "NO_PUBKEY" in wrong.stdout + wrong.stderr or "not signed" in wrong.stdout + wrong.stderr
    ssh(spec, "apt-get purge -y -qq cuda-keyring >/dev/null; rm -f /tmp/lab-*")


@pytest.fixture()
def hub_env(monkeypatch, lab_hosts):
    token = (STATE / "hf-token").read_text().strip()
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    hub.reset_stats()
    return {"endpoint": hub.ENDPOINT, "token": token}


def test_hub_double_serves_pinned_snapshots_counts_bytes_and_ranges(hub_env, tmp_path):
    api = HfApi(endpoint=hub_env["endpoint"], token=hub_env["token"])
    main, v1 = (api.model_info(REPO, revision=r, files_metadata=True) for r in ("main", "v1.0"))
    assert main.sha != v1.sha and len(main.sha) == 40
    sizes = {s.rfilename: s.size for s in v1.siblings}
    index = [n for n in sizes if n.endswith(".index.json")]
    assert index and {"config.json", "tokenizer.json", "tokenizer_config.json"} <= set(sizes)

    path = Path(snapshot_download(REPO, revision=v1.sha, local_dir=tmp_path / "a", endpoint=hub_env["endpoint"],
                                  token=hub_env["token"]))
    weight_map = json.loads((path / index[0]).read_text())["weight_map"]
    assert all((path / shard).stat().st_size == sizes[shard] for shard in set(weight_map.values()))
    assert hub.stats()["bytes_served"] == sum(sizes.values())

    snapshot_download(REPO, revision=v1.sha, local_dir=tmp_path / "a", endpoint=hub_env["endpoint"],
                      token=hub_env["token"])
    assert hub.stats()["bytes_served"] == sum(sizes.values()), "a complete local copy is not fetched again"

    # Range requests (what http_get sends to resume within a process after a dropped connection): 206 with
    # only the missing bytes, and only those counted. (huggingface_hub 2.x no longer resumes another
    # process's partial file: it skips complete files and re-fetches incomplete ones whole.)
    shard = sorted(set(weight_map.values()))[0]
    data = (path / shard).read_bytes()
    hub.reset_stats()
    request = urllib.request.Request(f"{hub_env['endpoint']}/{REPO}/resolve/{v1.sha}/{shard}",
                                     headers={"Authorization": f"Bearer {hub_env['token']}",
                                              "Range": f"bytes={len(data) // 2}-"})
    with urllib.request.urlopen(request) as response:
        assert response.status == 206
        assert response.headers["Content-Range"] == f"bytes {len(data) // 2}-{len(data) - 1}/{len(data)}"
        assert response.read() == data[len(data) // 2:]
    assert hub.stats()["bytes_served"] == len(data) - len(data) // 2


def test_hub_double_is_gated_without_the_token(hub_env, tmp_path):
    with pytest.raises(GatedRepoError):
        snapshot_download(REPO, local_dir=tmp_path, endpoint=hub_env["endpoint"], token=False)


def test_validate_refuses_an_open_endpoint_without_a_key_before_touching_a_host(lab_hosts, scenario):
    scenario(bind_address="0.0.0.0")
    check = subprocess.run(modelfleet_argv("validate", "inventories/lab.py"), capture_output=True, text=True)
    assert check.returncode == 2
    assert f"{lab_hosts[0]['name']}" in check.stdout + check.stderr and "bind_address" in check.stdout + check.stderr
    run = run_pyinfra("inventories/lab.py", "deploys/serve.py", timeout=300)
    assert run.returncode != 0 and "bind_address" in run.stdout + run.stderr
    assert "Starting operation" not in run.stdout + run.stderr  # refused while preparing: nothing ran


def test_a_host_container_left_by_another_lab_is_replaced_not_trusted(lab_hosts):
    """dockerd's restart policy brings back hosts of a lab whose folder is gone (an earlier CI clone): their host
    keys are not this lab's, so `lab up` replaces them instead of writing a known_hosts they would fail."""
    assert lab._claim(lab_hosts[0]) is True  # this lab's own host stays
    stray = {"name": f"{lab.PREFIX}99", "home": str(STATE / "hosts" / f"{lab.PREFIX}99")}
    subprocess.run(["docker", "run", "-d", "--name", stray["name"], "--label", f"{lab.HOME_LABEL}=/tmp/gone/.lab",
                    lab.base_image(), "sleep", "300"], check=True, capture_output=True)
    try:
        assert lab._claim(stray) is False
        gone = subprocess.run(["docker", "container", "inspect", stray["name"]], capture_output=True)
        assert gone.returncode != 0
    finally:
        subprocess.run(["docker", "rm", "-f", stray["name"]], capture_output=True)


def test_a_service_address_held_by_another_process_is_refused(tmp_path):
    """The apt repository, hub or registry of another lab would answer with other keys and files."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        listen = f"127.0.0.1:{other.getsockname()[1]}"
        with pytest.raises(RuntimeError, match="held by a process this lab .* did not start"):
            daemons.start(tmp_path, "registry", ["sleep", "30"], listen)
    assert not (tmp_path / "registry.pid").exists()
