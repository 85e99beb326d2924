"""The acceptance gate alone, against what is already serving: `pyinfra INVENTORY deploys/verify.py`."""

from modelfleet.deploys import verify

verify()
