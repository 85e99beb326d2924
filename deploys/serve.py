"""All stages for every host of the inventory: `pyinfra INVENTORY deploys/serve.py`."""

from modelfleet.deploys import run_stages
from modelfleet.stages import (
    admission,
    container_runtime,
    engine_cache,
    exporters,
    gpu_driver,
    images,
    imex,
    model,
    netcheck,
    os_base,
    preflight,
    router,
    service,
    storage,
    verify,
)

run_stages(preflight, os_base, gpu_driver, container_runtime, admission, storage, model, engine_cache, images, imex,
           netcheck, service, router, verify, exporters)
