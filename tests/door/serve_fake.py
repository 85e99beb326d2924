"""serve.py without the verify gate and the exporters: a @fake host has no endpoint to ask."""

from modelfleet.deploys import run_stages
from modelfleet.stages import images, preflight, service

run_stages(preflight, images, service)
