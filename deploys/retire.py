"""Every unit modelfleet wrote on the hosts given (a host that left the inventory): `modelfleet retire
INVENTORY HOST...` runs it as `pyinfra HOST... modelfleet.deploys.retire`."""

from modelfleet.deploys import retire

retire()
