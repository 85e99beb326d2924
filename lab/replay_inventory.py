"""N simulated hosts answering from a recording (lab/replay.py): MODELFLEET_REPLAY names the recording,
MODELFLEET_REPLAY_HOSTS how many hosts. Host i copies recorded host i mod R, each in its own pool: its data is the
recorded host's with the recorded host's name replaced by its own (sim-<i>, so the pools, directories and units
differ as they would on distinct hosts; the replay connector reads its name back as the recorded one's).
"""

import json
import os

from lab.replay import recorded_host

_recording = json.loads(open(os.environ["MODELFLEET_REPLAY"]).read())
_count = int(os.environ["MODELFLEET_REPLAY_HOSTS"])
_recorded = sorted(_recording["data"])
_hosts = []
for _i in range(_count):
    _name = f"sim-{_i:05d}"
    _of = recorded_host(_recorded, _name)
    _data = json.loads(json.dumps(_recording["data"][_of]).replace(_of, _name))
    # An SSH port of its own (never dialled: the replay connector answers), as the inventory's rules want; the
    # address stays the recorded host's, whose engine answers the readiness check the verify stage makes.
    _hosts.append((_name, {**_data, "ssh_port": 10000 + _i}))
replay_hosts = _hosts
# The hosts copy the lab's, whose hub double wants the token `lab up` made (as inventories/lab.py reads it).
_lab = json.loads(open(os.path.join(os.environ.get("MODELFLEET_LAB_STATE", ".lab"), "hosts.json")).read())
if _lab.get("hub"):
    os.environ.setdefault("MODELFLEET_LAB_HF_TOKEN", open(_lab["hub"]["token_file"]).read().strip())

from modelfleet.inventory import refuse_invalid as _refuse_invalid  # noqa: E402

_refuse_invalid(__file__)
