"""Example production inventory (documented): `modelfleet validate inventories/prod.py`.

Each module-level list is a pyinfra group; group_data/<group>.py holds the pool's settings and host data
overrides them (precedence: catalog defaults < group_data < host data). Addresses are documentation
addresses (RFC 5737): replace them with yours.

Pools:
- b300_kimi:  one 8x B300 host serving Kimi K3.1 Pro with vLLM (the guide's single-node recipe).
- gb300_kimi: Kimi K3.1 Pro over two GB300 trays (4 GPUs each, TP8 across both: a 2-node pool).
- mi355x:     one 8x MI355X host serving Kimi K3 with vLLM on ROCm.
"""

b300_kimi = [
    ("b300-01", {"ssh_hostname": "192.0.2.11"}),
]

gb300_kimi = [
    # Host order is rank order: the first host is the head (rank 0).
    ("gb300-tray-a", {"ssh_hostname": "192.0.2.21"}),
    ("gb300-tray-b", {"ssh_hostname": "192.0.2.22"}),
]

mi355x = [
    ("mi355x-01", {"ssh_hostname": "192.0.2.31"}),
]

# Every host, group_data file and recipe is validated here, before pyinfra connects to any host (exit 2).
from modelfleet.plan.inventory import refuse_invalid as _refuse_invalid  # noqa: E402

_refuse_invalid(__file__)
