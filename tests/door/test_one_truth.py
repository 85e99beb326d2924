"""The preview is what the run does: `modelfleet render` and the real `pyinfra` command, started the same way
(working directory, --group-data, --data, site recipes), write byte-identical unit and env files."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # pyinfra's own CLI in child processes, one run per case

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
HELPERS = HERE.parent / "helpers"
PIN = "e" * 40
IMAGE = "vllm/vllm-openai:v0.34.0@sha256:" + "f" * 64
B300_GPUS = [f"{i}, NVIDIA B300 SXM6 AC, GPU-0000000{i}-synthetic, 00000000:{i:02X}:00.0, 275040 MiB, 580.95.05, 10.3"
             for i in range(8)]
# What the probe finds on the host, part by part (the harness's probe_reply prints it as the host would).
PROBE_PARTS = {
    "nvidia_gpus": B300_GPUS,
    "nvidia_versions": ["NVIDIA-SMI version  : 580.95.05", "DRIVER version      : 580.95.05",
                        "CUDA Version        : 13.0"],
    "disk": ["Filesystem 1-blocks Used Available Capacity Mounted on",
             "/dev/md0 30000000000000 1000000000 29000000000000 1% /srv"],
    "ports": [], "fabric_manager": ["nvswitches=0", "Fabric Manager version is : 580.95.05"]}
GROUP = {"hardware": "b300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": PIN, "pool": "k31",
         "image": IMAGE, "gpu_stack": False}
SITE_RECIPE = (ROOT / "modelfleet/plan/catalog/recipes/kimi-k3.1-pro-vllm-b300.yaml").read_text()


def py(data: dict) -> str:
    return "".join(f"{key} = {value!r}\n" for key, value in data.items())


def inventory(path: Path, probe: list[str], host_data: dict | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"fake_responses": {"@@modelfleet-probe": probe}, "fake_delay": 0, "fake_delay_jitter": 0,
            **(host_data or {})}
    path.write_text(f"gpus = [('@fake/b300-01', {data!r})]\n")
    return path


def group_data(folder: Path, data: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpus.py").write_text(py(data))


def site_override(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    text = SITE_RECIPE.replace('--max-model-len, "32768"', '--max-model-len, "8192"')
    assert text != SITE_RECIPE
    (folder / "short-context.yaml").write_text(text + "overrides: kimi-k3.1-pro-vllm-b300\n")


def site_new_id(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    text = SITE_RECIPE.replace("id: kimi-k3.1-pro-vllm-b300", "id: site-k31-short")
    (folder / "site.yaml").write_text(text.replace('--max-model-len, "32768"', '--max-model-len, "4096"'))


def case_site_override(tmp, probe):
    inv = inventory(tmp / "inv.py", probe)
    group_data(tmp / "group_data", GROUP)
    site_override(tmp / "recipes")
    return tmp, inv, [], "--max-model-len 8192"


def case_site_new_id(tmp, probe):
    inv = inventory(tmp / "inv.py", probe, {"recipe": "site-k31-short"})
    group_data(tmp / "group_data", GROUP)
    site_new_id(tmp / "recipes")
    return tmp, inv, [], "--max-model-len 4096"


def case_group_data_beside_cwd(tmp, probe):
    work = tmp / "work"
    group_data(work / "group_data", GROUP)  # beside the working directory, not the inventory
    inv = inventory(tmp / "elsewhere" / "inv.py", probe)
    return work, inv, [], "--served-model-name kimi-k3.1-pro"


def case_two_folders_deep(tmp, probe):
    inv = inventory(tmp / "sites" / "dc1" / "inv.py", probe)
    group_data(tmp / "sites" / "dc1" / "group_data", {**GROUP, "served_name": "dc1-kimi"})
    return tmp, inv, [], "--served-model-name dc1-kimi"


def case_data_and_group_data_option(tmp, probe):
    inv = inventory(tmp / "inv.py", probe)
    group_data(tmp / "shared-data", GROUP)
    return tmp, inv, ["--group-data", str(tmp / "shared-data"), "--data", "port=8123"], "--port 8123"


CASES = [case_site_override, case_site_new_id, case_group_data_beside_cwd, case_two_folders_deep,
         case_data_and_group_data_option]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__.removeprefix("case_") for c in CASES])
def test_render_equals_what_the_run_uploads(fake, tmp_path, case, monkeypatch):
    cwd, inv, options, expected = case(tmp_path, fake.probe_reply(PROBE_PARTS))
    shown = subprocess.run([sys.executable, "-m", "modelfleet.cli", "render", "--json", str(inv), "@fake/b300-01",
                            *options], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    preview = {f["path"]: f["content"] for f in json.loads(shown.stdout)["files"]}
    uploads = tmp_path / "uploads.json"
    run = subprocess.run([sys.executable, str(HELPERS / "pyinfra_fake_cli.py"), "-y", *options, str(inv),
                          str(HELPERS / "serve_fake.py")], cwd=cwd, capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "MODELFLEET_TEST_UPLOADS": str(uploads),
                              "MODELFLEET_REPORTS": str(tmp_path / "reports"), "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    written = json.loads(uploads.read_text())
    assert preview and set(preview) <= set(written), (sorted(preview), sorted(written))
    for path, content in preview.items():
        assert written[path] == content, path
    unit = preview["/etc/systemd/system/modelfleet-k31.service"]
    assert expected in unit
