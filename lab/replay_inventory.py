"""N simulated hosts answering from a recording (lab/replay.py): MODELFLEET_REPLAY names the recording,
MODELFLEET_REPLAY_HOSTS how many hosts; MODELFLEET_REPLAY_STOCK=1 leaves out modelfleet's validation (stock
pyinfra's runs, which load no modelfleet code). Host i copies recorded host i mod R, each in its own pool: its
data is the recorded host's with the recorded host's name replaced by its own (sim-<i>, so the pools,
directories and units differ as they would on distinct hosts; the replay connector reads its name back as the
recorded one's).
"""

import importlib.util
import json
import os
import sys

# The replay module pyinfra's process loaded by its path (lab/replay.py RUNNER); by its path too elsewhere.
_replay = sys.modules.get("modelfleet_lab_replay")
if _replay is None:
    _spec = importlib.util.spec_from_file_location(
        "modelfleet_lab_replay", os.path.join(os.path.dirname(os.path.abspath(__file__)), "replay.py"))
    _replay = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_replay)

_recording = json.loads(open(os.environ["MODELFLEET_REPLAY"]).read())
_count = int(os.environ["MODELFLEET_REPLAY_HOSTS"])
_recorded = sorted(_recording["data"])
_hosts = []
for _i in range(_count):
    _name = f"sim-{_i:05d}"
    _of = _replay.recorded_host(_recorded, _name)
    _data = json.loads(json.dumps(_recording["data"][_of]).replace(_of, _name))
    # An SSH port of its own (never dialled: the replay connector answers), as the inventory's rules want; the
    # address stays the recorded host's, whose engine answers the readiness check the verify stage makes.
    _hosts.append((_name, {**_data, "ssh_port": 10000 + _i}))
replay_hosts = _hosts
# The hosts copy the lab's, whose hub double wants the token `lab up` made (as inventories/lab.py reads it).
_lab = json.loads(open(os.path.join(os.environ.get("MODELFLEET_LAB_STATE", ".lab"), "hosts.json")).read())
if _lab.get("hub"):
    os.environ.setdefault("MODELFLEET_LAB_HF_TOKEN", open(_lab["hub"]["token_file"]).read().strip())

if not os.environ.get("MODELFLEET_REPLAY_STOCK"):
    from modelfleet.plan.inventory import refuse_invalid as _refuse_invalid

    _refuse_invalid(__file__)
