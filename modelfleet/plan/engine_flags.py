"""Flags as each engine's own parser reads them, from the flag lists recorded from the real parsers
(catalog/engine_flags.json, `make engine-flags`; the lab's engine double reads the same file).

An argparse parser (vLLM, SGLang) takes any unambiguous prefix of a long option (`--ho` is `--host`), an
option's other spellings (`-tp`), `--flag=value`, a short option glued to its value (`-p8000`); vLLM's also
reads `--a_b` as `--a-b`, `--json-arg.key value` as `--json-arg`, and whole command lines from `--config FILE`.
llama-server's parser (common/arg.cpp) matches whole names only. So a flag modelfleet or the recipe sets is
protected by every token the parser would read as it, not by its written name: `reach` answers, for one token,
which options the parser could take it for.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from modelfleet.base import grammar

FLAGS_FILE = Path(__file__).resolve().parent / "catalog" / "engine_flags.json"
# How each engine's parser reads a token (engines.yaml says which engine uses which; unknown: the strictest).
PARSERS = ("argparse", "vllm", "exact")


@dataclass(frozen=True)
class FlagTable:
    engine: str
    version: str | None  # the engine version the list was recorded from
    canonical: dict[str, str]  # every spelling -> the option it is
    parser: str

    def reach(self, token: str) -> set[str]:
        """The options the parser could read TOKEN as (empty: none, the parser refuses it)."""
        name = token.split("=", 1)[0]
        if self.parser == "vllm":
            if re.match(r"^-O.", name) or name == "-O":
                return {self.canonical.get("--optimization-level", "--optimization-level")}
            if name.startswith("--"):
                name = "--" + name[2:].split(".", 1)[0].replace("_", "-")
        if name in self.canonical:
            return {self.canonical[name]}
        if self.parser == "exact":
            return set()
        found = {c for spelling, c in self.canonical.items() if spelling.startswith(name)}
        if not name.startswith("--") and len(name) > 2 and name[:2] in self.canonical:
            found.add(self.canonical[name[:2]])  # -p8000: a short option and its value
        return found

    def options(self, flags) -> set[str]:
        """The options a list of written flags stands for (a prefix counts for what it reaches)."""
        return {option for flag in flags for option in self.reach(flag)}


def _version(source: str) -> str | None:
    build = re.search(r"build ([0-9]+)'s", source)
    if build:
        return f"b{build.group(1)}"
    version = re.search(r" v?([0-9][0-9.]*[0-9])'s ", source)
    return version.group(1) if version else None


@lru_cache(maxsize=None)  # package data, read once per engine and parser
def table(engine_name: str, parser: str = "argparse") -> FlagTable | None:
    spec = json.loads(FLAGS_FILE.read_text()).get(engine_name)
    if spec is None:
        return None
    canonical = {flag: flag for flag in spec["flags"]}
    canonical.update({alias: canonical.get(target, target) for alias, target in spec.get("aliases", {}).items()})
    return FlagTable(engine_name, _version(spec.get("source", "")), canonical, parser)


def reads_as(engine_name: str, parser: str, token: str) -> set[str]:
    """The options the engine's parser reads TOKEN as (`--load_format=x` is vLLM's `--load-format`): every
    check of one flag against another asks this, never the written text. Its written name where the engine has
    no recorded list; empty for a value."""
    if not is_flag(token) or token == "--":  # `--` ends the options: it is none of them
        return set()
    flags = table(engine_name, parser)
    found = flags.reach(token) if flags is not None else set()
    return found or {grammar.flag_name(token)}


def is_flag(token: str) -> bool:
    return grammar.flag_name(token) is not None


def problems(args, flags: FlagTable | None, protected: dict[str, str], check_unknown: bool) -> list[str]:
    """Where ARGS would set a protected option (option -> why it is protected) by any spelling the engine's
    parser accepts, or (with check_unknown) name a flag the recorded parser does not have."""
    out = []
    for token in args:
        if token == "--":
            out.append("`--` ends the engine's options: what follows would be read as positional arguments")
            continue
        if not is_flag(token) or flags is None:
            continue
        written = token.split("=", 1)[0]
        hits = flags.reach(token)
        if not hits and check_unknown:
            out.append(f"{written} is not a flag of {flags.engine} {flags.version}'s parser (recorded in "
                       "catalog/engine_flags.json)")
        for option in sorted(hits & set(protected)):
            spelled = "" if written == option else f" (the engine's parser reads {written} as {option})" \
                if len(hits) == 1 else f" (a prefix the engine's parser may read as {option})"
            out.append(f"{written}{spelled}: {protected[option]}")
    return out


def check_claim(recipe, engine_name: str, flags: FlagTable | None, site: bool) -> str:
    """What `render` may say about the recipe's flags: only a check that happened."""
    if not site:
        return f"{engine_name} flags checked with {engine_name} {recipe.engine_version}'s parser"
    if flags is not None and flags.version == recipe.engine_version.lstrip("v"):
        return f"{engine_name} flags checked against {engine_name} {flags.version}'s recorded flag list (site recipe)"
    return "flags not checked (site recipe)"


# Flags a recipe may set although modelfleet manages them elsewhere: its parallel sizes (held to its layout)
# and --trust-remote-code (held to the model's need).
RECIPE_SETS = ("--trust-remote-code",)


def managed(engine, flags: FlagTable) -> dict[str, str]:
    """Options modelfleet sets itself (engines.yaml `managed_flags` and the address, port and name flags)."""
    multinode = [f for mode in engine.multinode.values() for f in mode.all + mode.workers if f.startswith("-")]
    own = [engine.host_flag, engine.port_flag, engine.served_name_flag]  # none where the environment says them
    written = [*engine.managed_flags, *[flag for flag in own if flag], *multinode]
    return {option: "set by modelfleet (address, port, key, names, layout): use the inventory's own field or a "
                    "site recipe" for option in flags.options(written)}


def recipe_protected(engine, flags: FlagTable) -> dict[str, str]:
    """What a recipe's args and parameters may not set: modelfleet's own flags, less the layout's sizes and
    --trust-remote-code (a recipe says those, checked against its layout and its model)."""
    own = flags.options([f for fs in engine.parallel_flags.values() for f in fs] + list(RECIPE_SETS))
    return {option: "set by modelfleet itself (address, port, key, names, multi-node): a recipe may not set it"
            for option, _ in managed(engine, flags).items() if option not in own}


def extra_protected(engine, flags: FlagTable, recipe) -> dict[str, str]:
    """What `extra_args` may not set: modelfleet's flags and every option the recipe already sets."""
    out = dict(managed(engine, flags))
    written = [a for a in recipe.args if is_flag(a)] + [p.flag for p in recipe.parameters.values()]
    if engine.memory_fraction_flag:
        written.append(engine.memory_fraction_flag)
    for option in flags.options(written):
        out.setdefault(option, f"already set by recipe {recipe.id}: use a site recipe to change it")
    return out
