"""The NCCL/RCCL/Gloo gate alone, over every pool of the inventory: `pyinfra INVENTORY deploys/netcheck.py`."""

from modelfleet.run.deploys import netcheck

netcheck()
