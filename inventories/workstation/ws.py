"""A workstation of this site's own: 2x RTX PRO 6000 (96 GB each) and 768 GB of RAM, serving the Kimi K3 GGUF
(UD-IQ1_M) with llama.cpp, the MoE experts that do not fit the GPUs kept in RAM. The board is in
`hardware/` and the recipe in `recipes/` beside this file: `modelfleet plan inventories/workstation/ws.py ws`
shows the split between the GPUs and RAM."""

hosts = [
    ("ws", {
        "ssh_hostname": "192.0.2.50",
        "hardware": "rtx-pro-6000-ws",
        "model": "kimi-k3",
        "engine": "llama.cpp",
        "recipe": "kimi-k3-llamacpp-iq1-m-rtx-pro-6000-ws",
        "image": "ghcr.io/ggml-org/llama.cpp:server-cuda13-b11669",
        # The GGUF repository's commit (unsloth/Kimi-K3-GGUF, which `modelfleet urls` names): pin the one you
        # checked. This placeholder is refused by --strict.
        "revision": "0000000000000000000000000000000000000000",
    }),
]

from modelfleet.plan.inventory import refuse_invalid as _refuse_invalid  # noqa: E402

_refuse_invalid(__file__)
