"""GPU admission alone: `pyinfra INVENTORY deploys/admission.py` (also `modelfleet admit INVENTORY`). Nothing
is changed; reports/admission/<host>.json holds every check, and a refused host fails the run."""

from modelfleet.run.deploys import admission

admission()
