"""The machine pyinfra runs on, as a 1x H200 host (`make hw-preflight`): serves the small model and asks
preflight whether Kimi K3.1 Pro would fit the GPUs it measures."""

hosts = [
    ("@local", {
        "hardware": "h200",
        "gpu_count": 1,
        "model": "qwen3-8b",
        "engine": "vllm",
        "pool": "qwen3-8b",
        "assess_models": ["kimi-k3.1-pro", "qwen3-8b"],
    }),
]

# Every host, group_data file and recipe is validated here, before pyinfra connects to any host (exit 2).
from modelfleet.plan.inventory import refuse_invalid as _refuse_invalid  # noqa: E402

_refuse_invalid(__file__)
