"""NVMe for model_root alone: `pyinfra INVENTORY deploys/storage.py` (refuses devices that hold data)."""

from modelfleet.run.deploys import storage

storage()
