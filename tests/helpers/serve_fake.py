"""serve.py without the verify gate and the exporters: a @fake host has no endpoint to ask."""

from modelfleet.run.deploys import run_stages
from modelfleet.run.stages import images, preflight, service

run_stages(preflight, images, service)
