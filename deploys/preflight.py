"""Read-only checks alone: `pyinfra INVENTORY deploys/preflight.py` (reports in reports/preflight/)."""

from modelfleet.run.deploys import preflight

preflight()
