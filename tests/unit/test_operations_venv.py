"""The venv engine's host-side operations (operations/venv.py) through pyinfra's @fake connector: a finished venv,
an existing user and a root holding only what is kept send nothing; otherwise the user is made, the lock and the
wheelhouse's files are pushed to the root-only staging directory before the build, and the extra venvs pruned."""

from __future__ import annotations

from modelfleet.host.operations.venv import engine_user, venv_built, venvs_pruned
from modelfleet.plan import venvs
from tests.helpers.fake_harness import planned

VENV = venvs.VenvPlan(path=f"{venvs.VENV_ROOT}/vllm-0.34.0-abcdefabcdef", engine="vllm", version="0.34.0",
                      lock_file="site/kimi.lock", lock_digest="abcdef" * 10, python="python3.12",
                      wheelhouse="site/wheels", wheels=("vllm-0.34.0-cp312-cp312-linux_x86_64.whl",),
                      entrypoint=("vllm",))


def plan(fake, deploy) -> list[str]:
    return planned(fake.run_fake([("gpu-01", {})], deploy, dry=True), "gpu-01")


def test_a_built_venv_an_existing_user_and_a_tidy_root_send_nothing(fake):
    def deploy():
        engine_user(present=True)
        venv_built(venv=VENV, built=True)
        venvs_pruned(entries=[VENV.name, "vllm-0.33.0-000000000000"], in_use={VENV.name})

    assert plan(fake, deploy) == []


def test_an_unbuilt_venv_is_pushed_then_built_and_the_extra_venvs_pruned(fake):
    def deploy():
        engine_user(present=False)
        venv_built(venv=VENV, built=False)
        venvs_pruned(entries=[VENV.name, "vllm-0.33.0-000000000000", "vllm-0.32.0-111111111111"],
                     in_use={VENV.name})

    user, staging, lock, wheel, build, prune = plan(fake, deploy)
    assert "useradd --system --gid modelfleet-engine --no-create-home" in user
    assert staging.endswith(f"rm -rf --one-file-system {VENV.staging} && mkdir -m 0700 {VENV.staging}")
    assert lock == f"<upload {VENV.staging}/requirements.txt>"
    assert wheel == f"<upload {VENV.staging}/{VENV.wheels[0]}>"
    assert build == venvs.build_command(VENV)
    assert "--no-index --find-links" in build and "--require-hashes" in build and build.index("touch") > \
        build.index("pip install")  # the marker only once pip finished
    assert prune == venvs.prune_command({VENV.name})
