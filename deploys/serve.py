"""All stages for every host of the inventory, in modelfleet.run.pipeline.SERVE's order (the one list):
`pyinfra INVENTORY deploys/serve.py`."""

from modelfleet.run.deploys import serve

serve()
