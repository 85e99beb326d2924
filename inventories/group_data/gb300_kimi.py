hardware = "gb300"
pool = "kimi-k31-gb300"
model = "kimi-k3.1-pro"
engine = "vllm"
served_name = "kimi-local"
port = 8000
revision = "0000000000000000000000000000000000000000"  # placeholder: pin the commit you reviewed
