"""Read-only checks alone: `pyinfra INVENTORY deploys/preflight.py` (reports in reports/preflight/)."""

from modelfleet.deploys import run_stages
from modelfleet.stages import preflight

run_stages(preflight)
