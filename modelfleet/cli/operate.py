"""What changes hosts or the control node's files: converge, admit, upgrade, retire, drain, mirror, prometheus."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import click
import yaml

from modelfleet.base import targets as targeting
from modelfleet.base.commands import inventory_args, run_pyinfra
from modelfleet.cli.common import emit, inventory_options, limit_option, main, resolved_or_exit, selected
from modelfleet.fleet import shards as sharding
from modelfleet.host.operations.report import report_path
from modelfleet.plan.inventory.door import whole
from modelfleet.plan.prometheus import KEY_DIR, notes, scrape_config


def yes_option(command):
    return click.option("-y", "--yes", "yes", is_flag=True,
                        help="Go ahead without asking (pyinfra's -y); needed where stdin is not a terminal.")(command)


def stdin_is_terminal() -> bool:
    return sys.stdin.isatty()


def can_ask(command: str) -> None:
    """Where stdin is not a terminal nobody can answer: refused (exit 2) before anything is done or connected."""
    if not stdin_is_terminal():
        click.echo(f"modelfleet {command}: stdin is not a terminal, so it cannot ask before acting: pass -y (--yes) "
                   "to go ahead, or --dry to see the plan", err=True)
        sys.exit(2)


def asked(command: str, plan: str, question: str, yes: bool) -> None:
    """pyinfra's habit: say what will be done, then ask (unless -y); no answer but yes does nothing (exit 1)."""
    if yes:
        return
    can_ask(command)
    click.echo(plan, err=True)
    if not click.confirm(question, default=False, err=True):
        click.echo(f"modelfleet {command}: nothing done", err=True)
        sys.exit(1)


@main.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@click.option("--parallel", type=click.IntRange(min=1), default=1, show_default=True,
              help="Single-node hosts switched at once.")
@click.option("--min-healthy", type=click.IntRange(min=0),
              help="Never leave fewer healthy endpoints than this while a batch switches (default: every model "
                   "served by hosts outside the batch keeps one of them healthy).")
@click.option("--allow-outage", is_flag=True, help="Accept a batch that takes every endpoint of a model down at "
              "once, also a model's only endpoint (a single host, a single multi-node pool); refused otherwise.")
@click.option("--limit", "limit", multiple=True, metavar="HOST|GROUP",
              help="Only these hosts (a name, a glob or a group, as pyinfra's --limit), with the rest of their "
                   "pools (repeatable).")
@click.option("--dry", is_flag=True, help="Print the batches (JSON), each host's changes (image, revision, driver: "
              "what it runs now, read from it, and what the inventory says) and each batch's drain; run nothing.")
@yes_option
@inventory_options
def upgrade(inventory: str, parallel: int, min_healthy: int | None, allow_outage: bool, limit, dry: bool, yes: bool,
            group_data, data) -> None:
    """Rolling upgrade to what INVENTORY now says (image, revision, driver release): batch by batch (JSON)."""
    # rollout loads every stage and fabric's SSH client: only upgrade needs them
    from modelfleet.fleet.rollout import batches, endpoints, outages, rollout

    # Ctrl-C or `kill -INT` stops the rollout where it is and reports how to finish it, also when a shell
    # started this command in the background (which starts it with SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)

    result = resolved_or_exit(inventory, group_data, data)
    everything, result = result, whole(result, selected(result, limit), checkpoint_groups=False)
    served = sum(len(heads) for heads in endpoints(everything).values())
    if min_healthy is not None and min_healthy > served:
        raise click.BadParameter(f"{min_healthy} is more than the {served} endpoint(s) {inventory} serves: no "
                                 "batch could ever start", param_hint="--min-healthy")
    planned = batches(result, parallel)
    down = outages(everything, planned)  # endpoints outside --limit keep serving
    if down and not allow_outage:
        several = any(len(heads) > 1 and set(heads) <= set(batch) for batch in planned
                      for heads in endpoints(everything).values())  # a smaller batch would keep one serving
        raise click.BadParameter("; ".join(down) + (": lower --parallel, or pass --allow-outage" if several else
                                 ": pass --allow-outage to accept that outage"),
                                 param_hint="--parallel" if several else "--allow-outage")
    if dry:
        # upgrade_dry loads every stage and fabric's SSH client: only upgrade --dry needs them
        from modelfleet.fleet.upgrade_dry import preview

        emit(preview(result, everything, parallel), True, "")
        return
    asked("upgrade", upgrade_plan(everything, planned, down), f"Upgrade these {len(result.hosts)} host(s)?", yes)
    report = rollout(inventory, result, parallel, min_healthy, env=dict(os.environ),
                     log=lambda line: click.echo(line, err=True), limit=tuple(limit),
                     inventory_args=inventory_args(group_data, data), everything=everything,
                     allow_outage=allow_outage)
    click.echo(json.dumps(report, indent=2))
    sys.exit(0 if not report["stopped"] else 1)


def upgrade_plan(everything, planned: list[list[str]], down: list[str]) -> str:
    """What `upgrade` will do, said before it asks: its batches in order, each one's front doors, the outages
    accepted (`upgrade --dry` adds each host's changes, read from the hosts)."""
    # fleet loads fabric's SSH client: only the commands that reach hosts pay for it
    from modelfleet.fleet import status as fleet_status

    lines = [f"modelfleet upgrade: {len(planned)} batch(es), one after another; each is prefetched while it "
             "serves, switched, verified, and rolled back if its gate fails:"]
    for number, batch in enumerate(planned, 1):
        doors = sorted({rp.name for rp, _ in fleet_status.behind_front_doors(everything, batch)})
        lines.append(f"  batch {number}: {', '.join(batch)}" + (f" (out of {', '.join(doors)} while it switches)"
                                                               if doors else ""))
    lines += [f"  outage accepted (--allow-outage): {line}" for line in down]
    return "\n".join(lines)


@main.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@click.option("--dcgm", is_flag=True, help="Scrape a DCGM exporter on every NVIDIA host (:9400).")
@click.option("--node-exporter", is_flag=True, help="Scrape a node exporter on every host (:9100).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write here instead of stdout.")
@click.option("--on", "on", metavar="HOST", help="For a Prometheus (or agent) on HOST: that host's targets, those "
              "on its loopback included.")
@click.option("--key-dir", default=KEY_DIR, show_default=True,
              help="Where the Prometheus host keeps the key of each api_key_env a keyed /metrics asks for.")
@inventory_options
def prometheus(inventory: str, dcgm: bool, node_exporter: bool, output: str | None, on: str | None, key_dir: str,
               group_data, data) -> None:
    """A Prometheus scrape configuration for the fleet, labelled by pool, host and model: each engine's and each
    front door's metrics where they listen; what it cannot scrape is said on stderr."""
    result = resolved_or_exit(inventory, group_data, data)
    if on and on not in result.hosts:
        raise click.UsageError(f"--on {on}: no such host in {inventory}")
    text = yaml.safe_dump(scrape_config(result, dcgm, node_exporter, on=on, key_dir=key_dir), sort_keys=False)
    if output:
        with open(output, "w") as f:
            f.write(text)
    else:
        click.echo(text, nl=False)
    for line in notes(result, on, key_dir):
        click.echo(f"note: {line}", err=True)


@main.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@limit_option
@inventory_options
def admit(inventory: str, limit, hosts, group_data, data) -> None:
    """GPU admission on every host (pyinfra, nothing changed): each host's checks as JSON; exit 1 if one is
    refused. Reports: reports/admission/<host>.json."""
    # modelfleet.run.deploys loads every stage: only the commands that name a deploy pay for it
    from modelfleet.run.deploys import deploy

    result = resolved_or_exit(inventory, group_data, data)
    chosen = selected(result, limit, hosts)
    started = time.time()
    run = run_pyinfra(inventory, deploy("admission"), limit=chosen if (limit or hosts) else (), timeout=600,
                      extra=inventory_args(group_data, data))

    def this_runs(kind: str, name: str) -> dict | None:
        """The host's report of this run (an older one says nothing about this run)."""
        path = report_path(kind, name)
        return json.loads(path.read_text()) if path.exists() and path.stat().st_mtime >= started else None

    reports = []
    for name in chosen:
        preflight = this_runs("preflight", name)
        if preflight and not preflight["ok"]:  # preflight stops a host (e.g. a GPU short) before admission
            report = {"host": name, "ok": False, "refused_by": "preflight", "checks": [],
                      "reasons": preflight["problems"]}
        else:
            report = this_runs("admission", name) or {
                "host": name, "ok": False, "checks": [], "reasons": ["not judged in this run (see pyinfra's output)"]}
        reports.append(report)
    click.echo(json.dumps(reports, indent=2))
    if run.returncode:
        click.echo((run.stdout + run.stderr)[-3000:], err=True)
    sys.exit(0 if run.returncode == 0 and all(r["ok"] for r in reports) else 1)


@main.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@click.argument("deploy", default="modelfleet.run.deploys.serve")
@click.option("--shards", type=click.IntRange(min=1, max=256), default=1, show_default=True,
              help="pyinfra processes at once, each converging whole pools and checkpoint groups.")
@click.option("--shard", "slice_", metavar="K/N",
              help="Only slice K of N (whole pools and checkpoint groups, the same slices on every control node "
                   "reading this inventory): N control nodes or CI jobs each run one K.")
@click.option("--dry", is_flag=True, help="Print the shards (JSON) and run nothing.")
@click.option("--limit", "limit", multiple=True, metavar="HOST|GROUP",
              help="Only these hosts (a name, a glob or a group, as pyinfra's --limit), with the rest of their "
                   "pools and checkpoint groups (repeatable).")
@yes_option
@inventory_options
def converge(inventory: str, deploy: str, shards: int, slice_: str | None, dry: bool, limit, yes: bool, group_data,
             data) -> None:
    """Run DEPLOY on every host of INVENTORY in SHARDS pyinfra processes at once (a pool or checkpoint group is
    never split), or only slice K/N of them (--shard); each shard's output in reports/converge/shard-<k>.log,
    the summary as JSON; exit 1 if a shard failed."""
    result = resolved_or_exit(inventory, group_data, data)
    chosen = whole(result, selected(result, limit))
    numbers = of = None
    if slice_:
        if shards != 1:
            raise click.UsageError("--shard K/N runs one slice: leave out --shards")
        try:
            number, of, hosts = sharding.slice_of(chosen, slice_)
        except ValueError as error:
            raise click.UsageError(str(error)) from None
        if (empty := sharding.empty_slices(chosen, slice_)):
            click.echo(f"warning: {empty}", err=True)
        split, numbers = ([hosts], [number]) if hosts else ([], [])
    else:
        split = sharding.split(chosen, shards)
    if dry or not split:
        named = zip(numbers or range(1, len(split) + 1), split, strict=True)
        click.echo(json.dumps({"shards": [{"shard": n, "hosts": hosts} for n, hosts in named]}, indent=2))
        return
    count = sum(len(hosts) for hosts in split)
    plan = "\n".join([f"modelfleet converge: {deploy} on {count} host(s) in {len(split)} pyinfra process(es):",
                      *(f"  shard {n}: {', '.join(hosts)}" for n, hosts in zip(numbers or range(1, len(split) + 1),
                                                                             split, strict=True))])
    asked("converge", plan, f"Run {deploy} on these {count} host(s)?", yes)
    summary = sharding.converge(inventory, deploy, split, progress=lambda line: click.echo(line, err=True),
                                options=inventory_args(group_data, data), numbers=numbers, of=of)
    click.echo(json.dumps(summary, indent=2))
    sys.exit(0 if summary["ok"] else 1)


@main.command("retire")
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@click.argument("targets", nargs=-1, required=True, metavar="HOST...")
@click.option("--dry", is_flag=True, help="Say what would be retired on each host and change nothing.")
@click.option("--remove-checkpoints", is_flag=True, help="Remove the retired engines' checkpoints too (kept "
              "by default).")
@click.option("--ssh-user", help="SSH user, as pyinfra's --ssh-user.")
@click.option("--ssh-port", type=click.IntRange(min=1, max=65535), help="SSH port, as pyinfra's --ssh-port.")
@click.option("--ssh-key", type=click.Path(exists=True, dir_okay=False), help="SSH key, as pyinfra's --ssh-key.")
@click.option("--known-hosts", type=click.Path(exists=True, dir_okay=False),
              help="known_hosts file for these hosts (pyinfra's ssh_known_hosts_file).")
@click.option("--json", "as_json", is_flag=True, help="Print what was (or would be) retired as JSON.")
@yes_option
@inventory_options
def retire_cmd(inventory: str, targets, dry: bool, remove_checkpoints: bool, ssh_user, ssh_port, ssh_key,
               known_hosts, as_json: bool, yes: bool, group_data, data) -> None:
    """Retire HOSTs that left INVENTORY (one host per argument: a name or address, @ssh/HOST, @local): every unit
    modelfleet wrote there is stopped, disabled and removed with its container and files; units it did not
    write are left alone; checkpoints stay unless --remove-checkpoints. Each HOST is resolved as pyinfra would
    connect to it (SSH config, getaddrinfo) and refused (exit 2), before anything connects, when it reaches a
    host INVENTORY still serves: a converge retires what its inventory drops. Shows what it will retire and asks
    unless -y. Exit 1 when a host could not be retired (not reached: name not resolving, connection refused)."""
    # retire loads the registry and checkpoint clients (urllib), deploys every stage: only retire needs them
    from modelfleet.run import retire
    from modelfleet.run.deploys import deploy

    result = resolved_or_exit(inventory, group_data, data)
    try:
        chosen = [targeting.target(t) for t in targets]
    except targeting.TargetError as error:
        click.echo(f"modelfleet retire: {error}", err=True)
        sys.exit(2)
    served = targeting.served(result)
    refused = targeting.still_served(result, chosen) + targeting.same_machine(chosen)
    if refused:
        click.echo("\n".join(f"modelfleet retire: {line}" for line in refused), err=True)
        sys.exit(2)
    options = [*(["--ssh-user", ssh_user] if ssh_user else []), *(["--ssh-port", str(ssh_port)] if ssh_port else []),
               *(["--ssh-key", ssh_key] if ssh_key else []),
               *(["--data", f"ssh_known_hosts_file={known_hosts}"] if known_hosts else [])]

    def retired(dry: bool) -> dict:
        return retire.run(chosen, served, deploy("retire"), dry, remove_checkpoints, options)

    out = None
    if not dry and not yes:
        can_ask("retire")  # before the dry pass connects
        seen = retired(True)
        if any(row["retired"] for row in seen["hosts"]):
            said = "\n".join(_retire_lines(seen, True)) + ("\n(checkpoints are removed too: --remove-checkpoints)"
                                                           if remove_checkpoints else "")
            asked("retire", f"modelfleet retire: what each host holds now:\n{said}", "Retire these units?", yes=False)
        else:  # nothing to retire anywhere: nothing to ask, and the run would change nothing
            out = {**seen, "dry": False, "checkpoints_removed": False}
    out = out or retired(dry)
    output = out.pop("output")
    if not out["ok"] and output:
        click.echo(output[-3000:], err=True)
    emit(out, as_json, "\n".join(_retire_lines(out, dry)))
    sys.exit(0 if out["ok"] else 1)


@main.command("drain")
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@click.argument("hosts", nargs=-1, required=True, metavar="HOST|GROUP...")
@click.option("--allow-outage", is_flag=True, help="Accept a drain that leaves a model with no endpoint (refused "
              "otherwise).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@inventory_options
def drain_cmd(inventory: str, hosts, allow_outage: bool, as_json: bool, group_data, data) -> None:
    """Take HOSTs of INVENTORY out of service for maintenance (names, globs or groups, as pyinfra's --limit; a
    multi-node pool's member takes its pool along): their replicas out of their front doors, then their engines
    and weight caches stopped and disabled. Nothing is removed; `modelfleet undrain` (or a converge) brings them
    back. Exit 1 if a step failed (a front door that refuses stops the drain before any engine stops)."""
    # drain loads every stage and fabric's SSH client: only drain and undrain need them
    from modelfleet.fleet import drain

    result = resolved_or_exit(inventory, group_data, data)
    chosen = drain.with_pools(result, selected(result, hosts))
    down = drain.outages(result, chosen)
    if down and not allow_outage:
        raise click.BadParameter("; ".join(down) + ": pass --allow-outage to accept that outage",
                                 param_hint="--allow-outage")
    report = drain.drain(result, chosen)
    emit(report, as_json, "\n".join(drain.lines(report, undo=False)))
    sys.exit(0 if report["ok"] else 1)


@main.command("undrain")
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@click.argument("hosts", nargs=-1, required=True, metavar="HOST|GROUP...")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@inventory_options
def undrain_cmd(inventory: str, hosts, as_json: bool, group_data, data) -> None:
    """Bring drained HOSTs back: their weight caches and engines enabled and started, their replicas back into
    their front doors once they answer /health from the router host. Exit 1 if a step failed."""
    # drain loads every stage and fabric's SSH client: only drain and undrain need them
    from modelfleet.fleet import drain

    result = resolved_or_exit(inventory, group_data, data)
    report = drain.undrain(result, drain.with_pools(result, selected(result, hosts)))
    emit(report, as_json, "\n".join(drain.lines(report, undo=True)))
    sys.exit(0 if report["ok"] else 1)


def _retire_lines(out: dict, dry: bool) -> list[str]:
    lines = []
    for row in out["hosts"]:
        if row.get("error"):
            lines.append(f"{row['host']}: {row['error']}")
        for r in row["retired"] or []:
            lines.append(f"{row['host']}: {'would retire' if dry else 'retired'} {r['unit']} ({r['what']})"
                         + (f", container {r['container']}" if r["container"] else "")
                         + (f", port {r['port']}" if r["port"] else ""))
        if row["retired"] == []:
            lines.append(f"{row['host']}: no unit modelfleet wrote")
    return lines


@main.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--limit", "limit", multiple=True, metavar="HOST|GROUP",
              help="Only the revisions these hosts serve: a name, a glob or a group, as pyinfra's --limit "
                   "(repeatable; default: every host).")
@click.option("--from-host", "from_host", metavar="HOST",
              help="Copy from this host of INVENTORY, which holds the revisions verified (SFTP over the "
                   "inventory's SSH settings), instead of the hub.")
@inventory_options
def mirror(inventory: str, dest: str, limit, from_host: str | None, group_data, data) -> None:
    """Write into DEST the checkpoint mirror that `model_source` reads: every revision INVENTORY's hosts serve,
    as DEST/<hub repo>/<commit>/ with its manifest, each file verified before it is renamed into place. From
    the hub (hf_endpoint, the token hf_token_env names), or --from-host. A re-run copies nothing already
    verified. Progress on stderr, a JSON summary on stdout; exit 1 on failure."""
    # mirror loads the checkpoint client (urllib) and fabric's SSH client: only mirror needs them
    from modelfleet.fleet.mirror import MirrorError, build

    result = resolved_or_exit(inventory, group_data, data)
    try:
        summary = build(result, selected(result, limit), Path(dest), from_host,
                        log=lambda line: click.echo(line, err=True))
    except MirrorError as error:
        click.echo(f"modelfleet mirror: {error}", err=True)
        sys.exit(1)
    click.echo(json.dumps(summary, indent=2))
