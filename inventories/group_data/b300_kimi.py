hardware = "b300"
pool = "kimi-k31-b300"
model = "kimi-k3.1-pro"
engine = "vllm"
served_name = "kimi-local"
port = 8000
# trust_remote_code models must be pinned to the 40-hex commit you reviewed (placeholder: replace it).
revision = "0000000000000000000000000000000000000000"
