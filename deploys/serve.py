"""All stages for every host of the inventory: `pyinfra INVENTORY deploys/serve.py`."""

from modelfleet.deploys import run_stages
from modelfleet.stages import (
    admission,
    engine_cache,
    exporters,
    gpu_stack,
    images,
    imex,
    model,
    netcheck,
    preflight,
    retire,
    router,
    service,
    storage,
    verify,
)

run_stages(preflight, gpu_stack, admission, storage, model, engine_cache, images, imex, netcheck, service, router,
           retire, verify, exporters)
