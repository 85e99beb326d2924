"""The acceptance gate alone, against what is already serving: `pyinfra INVENTORY deploys/verify.py`."""

from modelfleet.run.deploys import verify

verify()
