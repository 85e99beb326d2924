import pytest

from modelfleet import router


@pytest.fixture(autouse=True)
def _runtime_root_restored():
    """start_front_door points the router's runtime directory into the test's folder; later tests see /run again."""
    saved = router.RUNTIME_ROOT
    yield
    router.RUNTIME_ROOT = saved
