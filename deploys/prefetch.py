"""What an upgrade needs, fetched while the old revision and image keep serving: the storage and model stages
(the new revision beside the old one) and the images stage (the new image pulled). No unit is touched."""

from modelfleet.run.deploys import prefetch

prefetch()
