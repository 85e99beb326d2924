"""The real vLLM's and SGLang's own argument parsers, asked about modelfleet's command lines.

Runs inside the engine-parsers environment (`make engine-parsers`, lab/engine_parsers/requirements.txt), never
inside modelfleet's: it imports vllm and sglang, and nothing of modelfleet (the argv come in as JSON).

    python check.py argvs < [{"id": ..., "engine": "vllm"|"sglang", "argv": [...], "files": {path: text}}]
        each argv (what follows the engine's entrypoint: `serve ...`) parsed as `vllm serve` / `sglang serve`
        parse it, plus vLLM's own pre-start checks, plus every --tool-call-parser / --reasoning-parser name
        looked up in that version's registries; `files` stand in for files the argv names (SGLang's --config).
        An item with "command": "weight-cache" is the engine's weight cache daemon instead (the restart tier):
        `vllm preload ...` or `python -m sglang.srt.weight_cache.daemon ...` (what follows the entrypoint).
        Prints {"versions": {...}, "results": [{"id", "engine", "ok", "error"}]}.
    python check.py routes
        vLLM's own route table, read from its installed source without importing it: every path its API server
        registers (`@router.post("/x")`, `add_api_route`, `Mount("/metrics")`, ...) and the prefixes its --api-key
        guards (GUARDED_PREFIX). Prints {"version": ..., "routes": {path: [file, ...]}, "guarded_prefixes": [...]}.
    python check.py flags FLAGS_JSON
        rewrites the vllm and sglang sections of the engine double's flag list
        (modelfleet/plan/catalog/engine_flags.json) from the parsers: every option, whether it takes a value, the short
        forms, the default port.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import json
import logging
import os
import sys
import tempfile
import warnings

ENGINES = ("vllm", "sglang")
# vLLM builds some option defaults from the current platform and finds none on a machine without a GPU; its CPU
# platform has the same options.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def vllm_serve_parser():
    """`vllm serve`'s parser, built as vllm/entrypoints/cli/main.py builds it, and the subcommand that checks
    parsed arguments before the server starts."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(prog="vllm")
    command = ServeSubcommand()
    serve = command.subparser_init(top.add_subparsers(dest="subparser"))
    return top, serve, command


def sglang_serve_parser() -> argparse.ArgumentParser:
    """`sglang serve`'s parser, as sglang/srt/server_args.py's prepare_server_args builds it."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return parser


def vllm_registries() -> dict[str, list[str]]:
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    return {"tool_call_parser": sorted(ToolParserManager.list_registered()),
            "reasoning_parser": sorted(ReasoningParserManager.list_registered())}


def sglang_registries() -> dict[str, list[str]]:
    from sglang.srt.function_call.function_call_parser import FunctionCallParser
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    return {"tool_call_parser": sorted(FunctionCallParser.ToolCallParserEnum),
            "reasoning_parser": sorted(ReasoningParser.DetectorMap)}


def _parse(parse, argv: list[str]):
    """argparse reports a bad command line on stderr and exits 2: keep its message instead."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parse(argv), None
    except SystemExit as exc:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        return None, lines[-1] if lines else f"parser exited {exc.code}"


def check_vllm(argv: list[str], registries: dict) -> str | None:
    top, _, command = vllm_serve_parser()
    args, error = _parse(top.parse_args, argv)
    if error:
        return error
    if args.subparser != "serve":
        return f"not a serve command line: {argv[:1]}"
    try:
        command.validate(args)
        if args.load_format != "auto":
            _vllm_loader(args)
    except (TypeError, ValueError) as exc:
        return str(exc)
    return _unknown_parser_names(vars(args), registries)


def _vllm_loader(args) -> None:
    """The parser takes any --load-format word: the loader registry must hold it, and the loader must take its
    --model-loader-extra-config (IpcModelLoader refuses a key it does not know)."""
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader

    get_model_loader(LoadConfig(load_format=args.load_format,
                                model_loader_extra_config=args.model_loader_extra_config or {}))


def check_vllm_preload(argv: list[str]) -> str | None:
    """`vllm preload`'s parser (the weight cache daemons: entrypoints/cli/preload.py), built as `vllm` builds
    its subcommands; the daemon itself must load from disk (its own check, before it loads anything)."""
    from vllm.entrypoints.cli.preload import PreloadSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(prog="vllm")
    PreloadSubcommand().subparser_init(top.add_subparsers(dest="subparser"))
    args, error = _parse(top.parse_args, argv)
    if error:
        return error
    if args.subparser != "preload":
        return f"not a preload command line: {argv[:1]}"
    return "the daemon must load from disk (--load-format ipc_cache)" if args.load_format == "ipc_cache" else None


def check_sglang_daemon(argv: list[str]) -> str | None:
    """`python -m sglang.srt.weight_cache.daemon ...` as its __main__ reads it: its own flags, then the rest
    as the server's arguments (sglang's prepare_server_args parser)."""
    if argv[:2] != ["-m", "sglang.srt.weight_cache.daemon"]:
        return f"not the weight cache daemon: {argv[:2]}"
    from sglang.srt.weight_cache.daemon import WeightCacheDaemonArgs

    own = argparse.ArgumentParser(add_help=False)
    WeightCacheDaemonArgs.add_cli_args(own)
    parsed, error = _parse(own.parse_known_args, argv[2:])
    if error:
        return error
    _, server_argv = parsed
    args, error = _parse(sglang_serve_parser().parse_args, server_argv)
    if error:
        return error
    return None if args.weight_cache_mode == "off" else "the daemon's server arguments must not ask for a cache"


def check_sglang(argv: list[str], registries: dict) -> str | None:
    if argv[:1] != ["serve"]:
        return f"not a serve command line: {argv[:1]}"
    argv = argv[1:]
    parser = sglang_serve_parser()
    if "--config" in argv:  # as prepare_server_args: the file's keys become flags ahead of the command line's
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

        try:
            argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
        except (OSError, ValueError) as exc:
            return f"--config: {exc}"
    args, error = _parse(parser.parse_args, argv)
    if error:
        return error
    return _unknown_parser_names(vars(args), registries)


def _unknown_parser_names(args: dict, registries: dict) -> str | None:
    for dest, names in registries.items():
        value = args.get(dest)
        if value and value not in names:
            flag = "--" + dest.replace("_", "-")
            return f"{flag} {value!r} is not in this version's registry ({len(names)} names)"
    return None


def _with_files(item: dict, folder: str) -> list[str]:
    """The argv with each path of `files` replaced by a file of that content in `folder`."""
    argv = list(item["argv"])
    for i, (path, text) in enumerate(sorted(item.get("files", {}).items())):
        local = os.path.join(folder, f"file-{i}{os.path.splitext(path)[1]}")
        with open(local, "w") as f:
            f.write(text)
        argv = [local if a == path else a for a in argv]
    return argv


# engine -> (its command-line check, its parser-name registries)
ENGINE_CHECKS = {"vllm": (check_vllm, vllm_registries), "sglang": (check_sglang, sglang_registries)}


# engine -> the check of its weight cache daemon's command line (an item with "command": "weight-cache")
WEIGHT_CACHE_CHECKS = {"vllm": check_vllm_preload, "sglang": check_sglang_daemon}


def check_argvs(items: list[dict]) -> dict:
    serving = {item["engine"] for item in items if item.get("command", "serve") == "serve"}
    registries = {engine: ENGINE_CHECKS[engine][1]() for engine in serving}
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for item in items:
            if item.get("command") == "weight-cache":
                error = WEIGHT_CACHE_CHECKS[item["engine"]](item["argv"])
            else:
                error = ENGINE_CHECKS[item["engine"]][0](_with_files(item, folder), registries[item["engine"]])
            results.append({"id": item["id"], "engine": item["engine"], "ok": error is None, "error": error})
    return {"versions": versions(), "results": results}


def versions() -> dict[str, str]:
    return {engine: importlib.metadata.version(engine) for engine in ENGINES}


def option_table(parser: argparse.ArgumentParser, source: str) -> dict:
    """Every option of the parser as the engine double reads it: `bool` (takes nothing), `value` (one) or
    `values` (one or more), under the name its destination gives (`--tp-size`) with its other spellings (`-tp`,
    `--tensor-parallel-size`) as aliases. A switch's long spellings are flags of their own: `--no-x` and
    `--disable-x` share x's destination and mean the opposite."""
    flags, aliases = {}, {}
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        kind = "bool" if action.nargs == 0 else "values" if action.nargs in ("+", "*") else "value"
        canonical = "--" + action.dest.replace("_", "-")
        if canonical not in action.option_strings:
            canonical = next((s for s in action.option_strings if s.startswith("--")), action.option_strings[0])
        flags[canonical] = kind
        for name in action.option_strings:
            if kind == "bool" and name.startswith("--"):
                flags[name] = kind
            elif name != canonical:
                aliases[name] = canonical
    return {"source": source, "default_port": parser.get_default("port"), "aliases": dict(sorted(aliases.items())),
            "flags": dict(sorted(flags.items()))}


def write_flags(path: str) -> None:
    with open(path) as f:
        table = json.load(f)
    found = versions()
    _, vllm_serve, _ = vllm_serve_parser()
    generated = {
        "vllm": option_table(vllm_serve, f"generated by lab/engine_parsers/check.py from vllm {found['vllm']}'s "
                                         "`vllm serve` parser (make engine-flags)"),
        "sglang": option_table(sglang_serve_parser(), f"generated by lab/engine_parsers/check.py from sglang "
                                                      f"{found['sglang']}'s ServerArgs parser (make engine-flags)"),
    }
    for engine, options in generated.items():
        options["registries"] = ENGINE_CHECKS[engine][1]()
    table.update(generated)
    with open(path, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")


# What registers a path on a FastAPI/Starlette app or router: a decorator or call on it, or a route object.
ROUTE_CALLS = {"get", "post", "put", "delete", "patch", "api_route", "add_api_route", "websocket", "mount",
               "add_route", "websocket_route", "route", "Mount", "Route", "APIRoute", "WebSocketRoute"}
# The routes a FastAPI(...) app serves by default unless its keyword turns them off (`openapi_url=None` ...).
FASTAPI_DEFAULTS = {"openapi_url": ["/openapi.json"], "docs_url": ["/docs", "/docs/oauth2-redirect"],
                    "redoc_url": ["/redoc"]}


def vllm_routes() -> dict:
    """vLLM's route table from its source (the files of vllm/entrypoints), as `routes` prints it."""
    import ast
    import importlib.util
    from pathlib import Path

    package = Path(importlib.util.find_spec("vllm").submodule_search_locations[0])
    routes: dict[str, list[str]] = {}
    guarded = None
    for path in sorted((package / "entrypoints").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                first = node.args[0] if node.args else None
                found = [first.value] if name in ROUTE_CALLS and isinstance(first, ast.Constant) \
                    and isinstance(first.value, str) and first.value.startswith("/") else []
                if name == "FastAPI":
                    off = {k.arg for k in node.keywords if isinstance(k.value, ast.Constant) and k.value.value is None}
                    found += [r for kw, defaults in FASTAPI_DEFAULTS.items() if kw not in off for r in defaults]
                for route in found:
                    routes.setdefault(route, []).append(str(path.relative_to(package.parent)))
            elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "GUARDED_PREFIX"
                                                      for t in node.targets):
                guarded = ast.literal_eval(node.value)
    if guarded is None:
        raise SystemExit("vllm: no GUARDED_PREFIX in vllm/entrypoints: the key's middleware moved")
    return {"version": importlib.metadata.version("vllm"), "routes": routes,
            "guarded_prefixes": [guarded] if isinstance(guarded, str) else list(guarded)}


def main() -> None:
    # The engines log and warn while importing (no GPU, no CUDA runtime); only the JSON belongs on stdout.
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    with contextlib.redirect_stdout(sys.stderr):
        if sys.argv[1:2] == ["argvs"]:
            out = json.dumps(check_argvs(json.load(sys.stdin)), indent=1)
        elif sys.argv[1:2] == ["routes"]:
            out = json.dumps(vllm_routes(), indent=1)
        elif sys.argv[1:2] == ["flags"] and len(sys.argv) == 3:
            write_flags(sys.argv[2])
            out = None
        else:
            sys.exit(__doc__)
    if out:
        print(out)


if __name__ == "__main__":
    main()
