"""NVMe for model_root alone: `pyinfra INVENTORY deploys/storage.py` (refuses devices that hold data)."""

from modelfleet.deploys import storage

storage()
