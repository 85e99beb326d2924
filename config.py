# pyinfra runs this file before it loads the inventory: a modelfleet inventory that does not resolve is refused
# here (every error at once, exit 2), before any host is connected to.
from modelfleet.plan.inventory import guard

guard()
