"""The real `tokenspeed serve` parsers, asked about modelfleet's command lines (TokenSpeed 0.1.1).

Runs inside the TokenSpeed parser environment (`make engine-parsers`, tokenspeed_requirements.txt), never inside
modelfleet's: it imports tokenspeed and smg, and nothing of modelfleet (the argv come in as JSON).

`tokenspeed serve ARGS` is three parsers (tokenspeed/cli/serve_smg.py run_smg_from_args): the `tokenspeed`
command's own (the `serve` subcommand), the argv splitter (cli/_argsplit.py split_argv: orchestrator flags, flags
of both halves, engine flags by ServerArgs' option names, the rest to the gateway), then the engine's
ServerArgs parser (prepare_server_args: argparse, allow_abbrev off) and the smg gateway's (smg.launch_router
parse_router_args, as `python -m smg launch` gets it, whose --tool-call-parser / --reasoning-parser choices are
its Rust registries'). Each is the package's own code; only tokenspeed-kernel (GPU kernels that refuse to import
without a GPU) is stood in for, by names that raise when called: a parser that called one fails the check.

    python tokenspeed_check.py argvs < [{"id": ..., "engine": "tokenspeed", "argv": ["serve", ...]}]
        prints {"versions": {...}, "results": [{"id", "engine", "ok", "error"}]}
    python tokenspeed_check.py flags FLAGS_JSON
        rewrites the tokenspeed section of the engine double's flag list (modelfleet/plan/catalog/engine_flags.json):
        the orchestrator's, the engine's and the gateway's options together
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import io
import json
import logging
import sys
import types
import warnings

from check import option_table  # lab/engine_parsers/check.py: the same reading of an argparse parser

KERNEL = "tokenspeed_kernel"
GATEWAY_FIXED = ["--worker-urls", "grpc://127.0.0.1:1", "--disable-retries", "--disable-circuit-breaker"]


class KernelCalled(RuntimeError):
    pass


class _Missing:
    """A name of tokenspeed-kernel: importable, raises when used as a function."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise KernelCalled(f"{self._name}: a GPU kernel of tokenspeed-kernel, called by the parser")

    def __getattr__(self, attr: str):
        return _Missing(f"{self._name}.{attr}")

    def __mro_entries__(self, bases):
        return (object,)

    def __getitem__(self, key):
        return self


class _KernelModule(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self.__name__}.{attr}")


class _KernelFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == KERNEL or name.startswith(KERNEL + "."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _KernelModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []


sys.meta_path.insert(0, _KernelFinder())


def top_level(argv: list[str]) -> tuple[argparse.Namespace | None, list[str] | None, str | None]:
    """`tokenspeed ARGV` through the command's own main() up to the point it hands `serve` its raw argv."""
    import tokenspeed.cli.__main__ as cli

    seen: dict = {}
    err = io.StringIO()
    saved, sys.argv = sys.argv, ["tokenspeed", *argv]
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
            original = cli._serve
            cli._serve = lambda args, raw: seen.update(args=args, raw=raw)
            try:
                parser_main = cli.main
                parser_main()
            finally:
                cli._serve = original
    except SystemExit as exc:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        return None, None, lines[-1] if lines else f"tokenspeed exited {exc.code}"
    finally:
        sys.argv = saved
    if "raw" not in seen:
        return None, None, f"not a serve command line: {argv[:1]}"
    return seen["args"], seen["raw"], None


def engine_parser() -> argparse.ArgumentParser:
    """The engine's parser as prepare_server_args builds it (runtime/utils/server_args.py)."""
    from tokenspeed.runtime.utils.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="tokenspeed engine", allow_abbrev=False)
    ServerArgs.add_cli_args(parser)
    return parser


def gateway_parser() -> argparse.ArgumentParser:
    """The gateway's parser as smg.launch_router.parse_router_args builds it."""
    from smg.router_args import RouterArgs

    parser = argparse.ArgumentParser(prog="smg launch")
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace | None, str | None]:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(argv), None
    except SystemExit as exc:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        return None, lines[-1] if lines else f"parser exited {exc.code}"


def check(argv: list[str]) -> str | None:
    from smg.router_args import RouterArgs
    from tokenspeed.cli import serve_smg
    from tokenspeed.cli._argsplit import split_argv, split_headless_argv

    args, raw, error = top_level(argv)
    if error:
        return error
    if args.headless or split_headless_argv(raw) is not None:
        return "--headless: the engine without its gateway (modelfleet runs the whole server)"
    try:
        split = split_argv(raw)
        engine_args, gateway_args = serve_smg._args_with_default_model_parsers(split.engine, split.gateway)
        gateway_args = serve_smg._gateway_args_with_defaults(gateway_args)
    except (ValueError, KernelCalled) as exc:
        return str(exc)
    _, error = _parse(engine_parser(), engine_args)
    if error:
        return f"engine: {error}"
    parsed, error = _parse(gateway_parser(), GATEWAY_FIXED + gateway_args)
    if error:
        return f"gateway: {error}"
    try:
        RouterArgs.from_cli_args(parsed, use_router_prefix=False)
    except (ValueError, KernelCalled) as exc:
        return f"gateway: {exc}"
    return None


def versions() -> dict[str, str]:
    return {"tokenspeed": importlib.metadata.version("tokenspeed"),
            "tokenspeed-smg": importlib.metadata.version("tokenspeed-smg")}


def check_argvs(items: list[dict]) -> dict:
    engine_parser(), gateway_parser()  # both import, even for no items (the environment's build asks that)
    results = []
    for item in items:
        error = check(item["argv"])
        results.append({"id": item["id"], "engine": item["engine"], "ok": error is None, "error": error})
    return {"versions": versions(), "results": results}


def registries() -> dict[str, list[str]]:
    from smg.smg_rs import get_available_reasoning_parsers, get_available_tool_call_parsers

    return {"tool_call_parser": sorted(get_available_tool_call_parsers()),
            "reasoning_parser": sorted(get_available_reasoning_parsers())}


def write_flags(path: str) -> None:
    """The double reads one list: the `serve` subcommand's, the orchestrator's (_argsplit._ORCH_FLAGS, each a
    value), the engine's and the gateway's options. The gateway's --port default is 30000 (smg's); `tokenspeed
    serve` puts its own, 8000 (serve_smg.DEFAULT_GATEWAY_PORT), when none is given."""
    from tokenspeed.cli import _argsplit, serve_smg

    with open(path) as f:
        table = json.load(f)
    found = versions()
    engine = option_table(engine_parser(), "")
    gateway = option_table(gateway_parser(), "")
    flags = {**gateway["flags"], **engine["flags"], "--headless": "bool",
             **{flag: "value" for flag in _argsplit._ORCH_FLAGS}}
    aliases = {**gateway["aliases"], **engine["aliases"], **_argsplit._ALIASES}
    table["tokenspeed"] = {
        "source": f"generated by lab/engine_parsers/tokenspeed_check.py from tokenspeed {found['tokenspeed']}'s "
                  f"`tokenspeed serve` parsers (its engine's ServerArgs and tokenspeed-smg "
                  f"{found['tokenspeed-smg']}'s gateway; make engine-flags)",
        "default_port": serve_smg.DEFAULT_GATEWAY_PORT,
        "aliases": dict(sorted((a, t) for a, t in aliases.items() if a not in flags)),
        "flags": dict(sorted(flags.items())),
        "registries": registries(),
    }
    with open(path, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")


def main() -> None:
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    with contextlib.redirect_stdout(sys.stderr):
        if sys.argv[1:2] == ["argvs"]:
            out = json.dumps(check_argvs(json.load(sys.stdin)), indent=1)
        elif sys.argv[1:2] == ["flags"] and len(sys.argv) == 3:
            write_flags(sys.argv[2])
            out = None
        else:
            sys.exit(__doc__)
    if out:
        print(out)


if __name__ == "__main__":
    main()
