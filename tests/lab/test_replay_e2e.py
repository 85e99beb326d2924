"""lab/replay.py on the session's lab: a no-op converge recorded over SSH replays as a no-op on more simulated hosts
than were recorded, with no SSH; a host whose recorded state differs (a unit file changed on it) makes the replay
fail rather than pass, so the simulation measures the run that was recorded."""

import json

import pytest

from lab import replay
from modelfleet.base.commands import run_pyinfra

pytestmark = pytest.mark.lab


def sim(recording, hosts: int) -> dict:
    return replay.pyinfra("replay", recording, "lab/replay_inventory.py", "deploys/serve.py",
                          env={"MODELFLEET_REPLAY": str(recording), "MODELFLEET_REPLAY_HOSTS": str(hosts)})


def test_a_recorded_noop_replays_on_simulated_hosts_and_a_changed_host_does_not(lab_hosts, scenario, tmp_path):
    scenario(checkpoint_group=None)  # each host its own pool and checkpoint group, as the bench's copies are
    run = run_pyinfra("inventories/lab.py", "deploys/serve.py", timeout=900)
    assert run.returncode == 0, run.stdout[-3000:]
    recording = tmp_path / "replay.json"
    replay.record(recording)
    assert oct(recording.stat().st_mode & 0o777) == "0o600"
    saved = json.loads(recording.read_text())
    assert sorted(saved["hosts"]) == sorted(s["name"] for s in lab_hosts)

    replayed = sim(recording, 7)  # more hosts than recorded: copies of each
    assert replayed["returncode"] == 0, replayed["output"][-3000:]
    total = next(line for line in replayed["output"].splitlines() if "Grand total" in line).split()
    assert total[3] == "-"  # nothing changed
    assert all(f"[sim-{i:05d}]" in replayed["output"] for i in range(7))

    # The first recorded host's unit as if edited by hand: its copies now differ from what the control node
    # renders, so the replay asks to write it, which no recording holds.
    first = sorted(saved["hosts"])[0]
    [unit] = [p for p in saved["contents"][first] if p.endswith(".service")]
    saved["contents"][first][unit] += "# edited\n"
    recording.write_text(json.dumps(saved))
    broken = sim(recording, 2)
    assert broken["returncode"] != 0
    assert "takes no file" in broken["output"] and "modelfleet-tiny-sim-00000.service" in broken["output"]
