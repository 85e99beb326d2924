"""README's quickstart, followed step by step against a fresh lab host as if it were one's own: copy the example
inventory and its group_data, keep one group with one's host, set what it serves, pin the revision, export the
token, validate, show, render, dry-run (nothing changes), run, and the endpoint answers."""

import json
import os
import re
import shutil

import pytest
from openai import OpenAI

import lab
from modelfleet import REPO_ROOT
from modelfleet.base.commands import run_modelfleet, run_pyinfra
from modelfleet.plan.checkpoint import snapshot

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def own_host(lab_hosts):
    """A bare-of-services host of the lab (a pre-built H200), as a site's own server."""
    personas = [s["persona"] for s in lab_hosts] + ["h200x1"]
    spec = lab.up(len(personas), personas=personas, disks=1)[-1]  # the session's hosts keep their disks
    yield spec
    lab.remove([spec["name"]])


def test_the_quickstart_ends_with_an_answering_endpoint(own_host, tmp_path):
    state = json.loads((lab.STATE / "hosts.json").read_text())
    token = open(state["hub"]["token_file"]).read().strip()
    name, address = own_host["name"], own_host["address"]
    # 1. Copy the example inventory and its group_data, beside each other.
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(REPO_ROOT / "inventories" / "prod.py", site / "prod.py")
    shutil.copytree(REPO_ROOT / "inventories" / "group_data", site / "group_data")
    # 2. Keep one group with one's host; delete the other groups and their group_data; set hardware, model,
    #    engine in the group's file. (The site's own details, SSH key, registry mirror, hub, directories, go
    #    where a site puts them: all.py and host data.)
    text = (site / "prod.py").read_text()
    groups = re.compile(r"^(\w+) = \[\n.*?^\]\n", re.S | re.M)
    assert {m.group(1) for m in groups.finditer(text)} == {"b300_kimi", "gb300_kimi", "mi355x"}
    host_data = {"ssh_hostname": address, "gpu_count": own_host["gpu_count"], "bind_address": address,
                 "config_dir": own_host["config_dir"], "model_root": own_host["model_root"]}
    text = groups.sub(lambda m: f"b300_kimi = [\n    ({name!r}, {host_data!r}),\n]\n"
                      if m.group(1) == "b300_kimi" else "", text)
    (site / "prod.py").write_text(text)
    for other in ("gb300_kimi", "mi355x"):
        (site / "group_data" / f"{other}.py").unlink()
    group = site / "group_data" / "b300_kimi.py"
    served = group.read_text()
    for key, value in (("hardware", own_host["hardware"]), ("model", "tiny-lab"), ("engine", "vllm")):
        served, count = re.subn(rf'^{key} = ".*"$', f"{key} = {value!r}", served, flags=re.M)
        assert count == 1, key
    group.write_text(served + 'recipe = "tiny-lab-vllm"  # several recipes serve the model on this board\n')
    with open(site / "group_data" / "all.py", "a") as all_py:
        all_py.write(f"ssh_key = {state['key']!r}\nssh_known_hosts_file = {state['known_hosts']!r}\n"
                     f"image_registry = {state['registry']!r}\nhf_endpoint = {state['hub']['endpoint']!r}\n"
                     "gpu_stack = False\nadmission = False\ngpu_passthrough = False\n")
    # 3. Pin the revision: the 40-hex commit in place of the placeholder.
    env = {**os.environ, "HF_TOKEN": token, "MODELFLEET_REPORTS": str(tmp_path / "reports")}
    os.environ["HF_TOKEN"] = token  # 4. export HF_TOKEN (the pin below asks the hub with it too)
    try:
        commit = snapshot("modelfleet/tiny-lab", "main", state["hub"]["endpoint"], "HF_TOKEN").commit
    finally:
        del os.environ["HF_TOKEN"]
    pinned, count = re.subn(r'^revision = "0{40}"$', f'revision = "{commit}"', group.read_text(), flags=re.M)
    assert count == 1
    group.write_text(pinned)
    inventory = str(site / "prod.py")
    # 5. Check, preview, dry-run, then run (from the clone's root).
    validated = run_modelfleet("validate", inventory, env=env, cwd=REPO_ROOT)
    assert validated.returncode == 0, validated.stdout + validated.stderr
    assert "ok: 1 host(s), 1 pool(s)" in validated.stdout and "placeholder" not in validated.stdout
    shown = run_modelfleet("show", "--json", inventory, name, env=env, cwd=REPO_ROOT)
    rows = {r["key"]: r for r in json.loads(shown.stdout)}
    assert rows["model"]["value"] == "tiny-lab" and rows["model"]["from"].endswith("group_data/b300_kimi.py")
    rendered = run_modelfleet("render", "--json", "--pin", inventory, name, env=env, cwd=REPO_ROOT)
    assert rendered.returncode == 0, rendered.stderr
    [unit] = [f for f in json.loads(rendered.stdout)["files"] if f["path"].endswith(".service")]
    assert unit["path"] == "/etc/systemd/system/modelfleet-kimi-k31-b300.service"
    dry = run_pyinfra(inventory, "deploys/serve.py", extra=["--dry"], env=env, cwd=REPO_ROOT, timeout=600)
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-2000:]
    assert lab.ssh(own_host, f"test -e {unit['path']} || echo none").stdout.strip() == "none"
    run = run_pyinfra(inventory, "deploys/serve.py", env=env, cwd=REPO_ROOT, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    # The unit on the host is, byte for byte, the one `render --pin` showed.
    assert lab.ssh(own_host, f"cat {unit['path']}").stdout == unit["content"]
    # 6. status shows the endpoint; the openai client gets an answer.
    status = run_modelfleet("status", "--json", inventory, env=env, cwd=REPO_ROOT)
    [row] = json.loads(status.stdout)
    assert [s["health"] for s in row["services"]] == ["200"], row
    reply = OpenAI(base_url=f"http://{address}:8000/v1", api_key="unused").chat.completions.create(
        model="kimi-local", messages=[{"role": "user", "content": "hello"}], max_tokens=64)
    assert reply.choices[0].message.content
