hardware = "mi355x"
pool = "kimi-k3-mi355x"
model = "kimi-k3"
engine = "vllm"
served_name = "kimi-k3"
port = 8000
revision = "0000000000000000000000000000000000000000"  # placeholder: pin the commit you reviewed
