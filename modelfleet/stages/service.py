"""Stage service: systemd unit + 0600 env file per service; restart only on change; wait until ready."""

from __future__ import annotations

from dataclasses import replace
from io import StringIO

from pyinfra.api import deploy
from pyinfra.operations import files, systemd
from pyinfra.operations.util import any_changed

from modelfleet import render
from modelfleet.operations.secrets import secret_file
from modelfleet.operations.service import wait_ready
from modelfleet.stages import host_plan
from modelfleet.stages.images import pinned_image

UNIT_DIR = "/etc/systemd/system"


@deploy("modelfleet service")
def run():
    plan = host_plan()
    files.directory(name=f"Config directory {plan.config_dir} (0700)", path=plan.config_dir, mode="0700",
                    user="root", group="root")
    for svc in plan.services:
        svc = replace(svc, image=pinned_image(svc))
        files.directory(name=f"Model directory {svc.model_dir}", path=svc.model_dir)
        changed = [
            files.put(name=f"Unit {svc.unit_name}", src=StringIO(render.render_unit(svc)),
                      dest=f"{UNIT_DIR}/{svc.unit_name}", mode="0644"),
            secret_file(name=f"Env file {svc.env_file} (0600)", dest=svc.env_file, content=render.render_env(svc)),
        ]
        secrets_yaml = render.render_secrets_config(svc)
        if secrets_yaml:
            changed.append(secret_file(name=f"Engine secrets {svc.secrets_config_file} (0600)",
                                       dest=svc.secrets_config_file, content=secrets_yaml))
        key = render.api_key(svc)
        if key:
            secret_file(name=f"Client auth header {svc.auth_file} (0600)", dest=svc.auth_file,
                        content=f"Authorization: Bearer {key}\n")
        edited = any_changed(*changed)
        systemd.daemon_reload(name="systemctl daemon-reload", _if=edited)
        started = systemd.service(name=f"Run {svc.unit_name}", service=svc.unit_name, running=True, enabled=True)
        # A unit that was just started already runs the new config: restart only one that kept running.
        systemd.service(name=f"Restart {svc.unit_name} (unit or env changed)", service=svc.unit_name,
                        restarted=True, _if=lambda edited=edited, started=started: edited() and not
                        started.did_change())
        wait_ready(name=f"Wait until {svc.served_name} answers at {svc.base_url}", unit=svc.unit_name,
                   base_url=svc.base_url, served_name=svc.served_name, timeout_s=svc.recipe.ready_timeout_s,
                   auth_file=svc.auth_file if key else None, _if=any_changed(*changed, started))
