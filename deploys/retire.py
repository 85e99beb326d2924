"""Every unit modelfleet wrote on the hosts given (a host that left the inventory): `modelfleet retire
INVENTORY HOST...` runs it as `pyinfra HOST... modelfleet.run.deploys.retire`."""

from modelfleet.run.deploys import retire

retire()
