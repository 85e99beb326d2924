"""Stages, one @deploy per module, run in pipeline order by deploys/serve.py. Each stage's `run(ctx)` takes the
host's run context (modelfleet.context.HostRun) and its `wants(plan, probe)` says what it reads from the host."""

# Where stages put the scripts they run on hosts (the fetch script, the NCCL check).
TOOLS_BIN = "/opt/modelfleet/bin"
