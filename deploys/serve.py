"""All stages for every host of the inventory: `pyinfra INVENTORY deploys/serve.py`."""

from modelfleet.deploys import serve

serve()
