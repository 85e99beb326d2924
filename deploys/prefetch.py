"""What an upgrade needs, fetched while the old revision and image keep serving: the storage and model stages
(the new revision beside the old one) and the images stage (the new image pulled). No unit is touched."""

from modelfleet.stages import deployed_of, images, model, storage, use_stages

STAGES = (storage, model, images)
use_stages(STAGES)
deployed = deployed_of()
for stage in STAGES:
    stage.run(deployed=deployed)
