"""Stage images through pyinfra's @fake connector: each service's image pulled by its digest when the host lacks
it, nothing when an image of that digest is there, and the image read is what the stage declares."""

import pytest

from modelfleet.plan.inventory import resolve
from modelfleet.run.pipeline import run_stages
from modelfleet.run.stages import images
from tests.helpers.fake_hosts import IMAGE, b300_host


@pytest.fixture(autouse=True)
def reports(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))


def test_an_absent_image_is_pulled_by_its_digest(fake):
    state = fake.run_fake([("b1", b300_host())], lambda: run_stages(images))
    assert f"docker pull --quiet {IMAGE}" in fake.executed(state, "b1")


def test_an_image_of_that_digest_on_the_host_is_left_alone(fake):
    present = {"@@modelfleet-state": [f"@@modelfleet-state image {IMAGE}", "id=sha256:" + "1" * 64]}
    state = fake.run_fake([("b1", {**b300_host(), "fake_responses": present})], lambda: run_stages(images))
    assert not any(c.startswith("docker pull") for c in fake.executed(state, "b1"))


def test_it_declares_the_pinned_references_it_reads():
    plan = resolve([("b1", b300_host())]).hosts["b1"]
    assert images.wants(plan, {}) == {"images": [IMAGE]}
