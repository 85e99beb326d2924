"""Checkpoints alone: `pyinfra INVENTORY deploys/model.py` (one hub download per checkpoint group, peers copy,
every host verifies; `--data model_reverify=true` hashes everything again)."""

from modelfleet.run.deploys import model

model()
