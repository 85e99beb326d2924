"""All stages for every host of the inventory, in modelfleet.pipeline.SERVE's order (the one list):
`pyinfra INVENTORY deploys/serve.py`."""

from modelfleet.deploys import serve

serve()
