"""The hub client a host installs (stages/model.py) comes from a lock with the sha256 of every file pip may take
(modelfleet/files/hub_client.txt): an index, mirror or proxy on the way that serves its own wheel under the pinned
name and version gets nothing installed on the host."""

import os
import re
import subprocess
import zipfile

from modelfleet.host.transfer import VENV
from modelfleet.run.stages import model


def test_the_lock_pins_every_requirement_with_hashes():
    lock = model.HUB_CLIENT_LOCK.read_text()
    entries = re.split(r"\n(?=[a-z0-9])", lock.split("\n", 2)[2].strip())  # after uv's two header lines
    assert any(e.startswith("huggingface-hub==") for e in entries) and any(e.startswith("hf-xet==") for e in entries)
    for entry in entries:
        assert re.match(r"^[a-z0-9-]+==\S+", entry) and "--hash=sha256:" in entry, entry
    # pyyaml is built per Python and machine: the lock holds the files of every host's (x86_64, aarch64...).
    assert len(re.findall(r"--hash", entries[[e.split("==")[0] for e in entries].index("pyyaml")])) >= 8


def fake_wheel(folder, name: str, version: str) -> None:
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{name}/__init__.py", "import os\nos.system('id > /tmp/pwned')\n")
        whl.writestr(f"{name}-{version}.dist-info/METADATA",
                     f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        whl.writestr(f"{name}-{version}.dist-info/WHEEL",
                     "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{name}-{version}.dist-info/RECORD", "")


def test_a_wheel_served_in_place_of_the_pinned_one_is_refused(tmp_path):
    lock = model.HUB_CLIENT_LOCK.read_text()
    entry = re.search(r"^huggingface-hub==(\S+) \\\n(?:    --hash=\S+(?: \\)?\n)+", lock, re.M)
    index = tmp_path / "index"
    index.mkdir()
    fake_wheel(index, "huggingface_hub", entry.group(1))
    commands = list(model.hf_client_installed._inner(built=None, needed=True))
    upload, build = commands[1], commands[2].get_raw_value()
    uploaded = tmp_path / "lock.txt"
    uploaded.write_text(entry.group(0))  # the product's own entry (its other pins need the real index)
    assert upload.src.getvalue().decode() == lock
    venv = tmp_path / "venv"
    build = build.replace(upload.dest, str(uploaded)).replace(VENV, str(venv))
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index)}
    done = subprocess.run(["sh", "-c", build], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "DO NOT MATCH THE HASHES" in done.stderr, done.stdout + done.stderr
    assert not list(venv.glob("lib/python*/site-packages/huggingface_hub*"))  # nothing of theirs installed
    assert not (venv / "modelfleet-hub-client.txt").exists()  # the next run builds the venv again
