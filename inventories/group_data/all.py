# Defaults for every host of inventories/prod.py (the catalog fills anything not set here).
ssh_user = "root"
model_root = "/srv/models"
hf_token_env = "HF_TOKEN"  # name of the control-node variable; the token itself never lands in a file here
