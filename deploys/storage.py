"""NVMe for model_root alone: `pyinfra INVENTORY deploys/storage.py` (refuses devices that hold data)."""

from modelfleet.deploys import run_stages
from modelfleet.stages import storage

run_stages(storage)
