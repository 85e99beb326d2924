"""All stages for every host of the inventory: `pyinfra INVENTORY deploys/serve.py`."""

from modelfleet.pipeline import serve

serve()
