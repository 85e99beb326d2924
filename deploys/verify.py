"""The acceptance gate alone, against what is already serving: `pyinfra INVENTORY deploys/verify.py`."""

from modelfleet.deploys import run_stages
from modelfleet.stages import verify

run_stages(verify)
