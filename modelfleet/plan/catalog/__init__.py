"""The catalog: models, hardware, engines and recipes as YAML data with provenance, read and checked (their types
are catalog/types.py), and a site's own boards and recipes over the shipped ones."""

from __future__ import annotations

import difflib
import re
from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import ValidationError

from modelfleet.base.errors import ModelfleetError
from modelfleet.plan import engine_flags
from modelfleet.plan.catalog.types import (  # noqa: F401  (the catalog's types, imported from here by every reader)
    BYTES_PER_PARAM,
    BootLog,
    Catalog,
    Engine,
    EngineMetrics,
    ExpertOffload,
    Hardware,
    LayerOffload,
    Layout,
    Model,
    MultinodeFlags,
    ProbeSettings,
    ReadyBudget,
    Recipe,
    RecipeParameter,
    Registration,
    WeightCache,
)

CATALOG_DIR = Path(__file__).parent


class CatalogError(ModelfleetError):
    """A catalog (or site recipe) file that cannot be used: `where` is `path[:line]`."""

    def __init__(self, where: str, message: str):
        self.where, self.message = where, message
        super().__init__(f"{where}: {message}")


# libyaml's loader where PyYAML was built with it: the same safe subset, read in C. Every run (a converge, each
# shard) reads the whole catalog before its first host; in Python that was a tenth of a no-op converge's CPU.
class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """The safe subset, with a key written twice in one mapping refused (YAML says keys are unique; PyYAML would
    keep the last without a word)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is written twice in one mapping",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_yaml(text: str):
    """YAML's safe subset, read with libyaml where there is one (every catalog file goes through here); a key
    written twice is an error."""
    return yaml.load(text, Loader=_StrictLoader)


YAML_SUFFIXES = (".yaml", ".yml")


def yaml_files(folder: Path) -> list[Path]:
    """A catalog or site folder's YAML files (`.yaml` and `.yml`, any case, sorted); anything else named like one (a
    folder, a link to nowhere) is an error naming it, not a file skipped or a traceback."""
    out = []
    for path in sorted(p for p in folder.iterdir() if p.suffix.lower() in YAML_SUFFIXES):
        if not path.is_file():
            kind = "a folder" if path.is_dir() else "not a regular file"
            raise CatalogError(str(path), f"is {kind}, but its name says it is a YAML file of {folder.name}/: "
                                          "rename or remove it")
        out.append(path)
    return out


def _read(path: Path, cls):
    try:
        data = read_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise CatalogError(str(path), "is not UTF-8 text") from None
    except OSError as error:
        raise CatalogError(str(path), f"cannot be read ({error.strerror})") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise CatalogError(where, f"not valid YAML: {getattr(error, 'problem', None) or error}") from None
    if not isinstance(data, dict):
        raise CatalogError(str(path), f"must be a mapping of fields, got {type(data).__name__}")
    try:
        return cls(**data)
    except ValidationError as error:
        raise CatalogError(str(path), validation_message(error, cls)) from None


def validation_message(error: ValidationError, cls) -> str:
    """The first problem as `field: reason`; an unknown key first, by its own name with the nearest known key
    (a misspelt required key would otherwise be reported as missing)."""
    problems = sorted(error.errors(), key=lambda e: e["type"] != "extra_forbidden")
    first = problems[0]
    where = ".".join(map(str, first["loc"]))
    if first["type"] == "extra_forbidden":
        near = difflib.get_close_matches(str(first["loc"][-1]), list(cls.model_fields), n=1, cutoff=0.6)
        return f"{where}: unknown key" + (f" (did you mean {near[0]!r}?)" if near and len(first["loc"]) == 1 else "")
    return f"{where}: {first['msg'].removeprefix('Value error, ')}"


def _flag_value(args: list[str], flags: list[str], engine_name: str = "", parser: str = "argparse") -> str | None:
    """The value ARGS give one of FLAGS, read as the engine's parser reads them (`--tensor_parallel_size=2`)."""
    wanted = {o for f in flags for o in engine_flags.reads_as(engine_name, parser, f)}
    for i, arg in enumerate(args):
        _, eq, value = arg.partition("=")
        if engine_flags.reads_as(engine_name, parser, arg) & wanted:
            return value if eq else (args[i + 1] if i + 1 < len(args) else "")
    return None


def layout_problems(recipe: "Recipe", engine: "Engine") -> list[str]:
    """Where a recipe's args contradict its layout: a parallel size set to another value, or a size the layout
    needs that no flag sets (the engine would run with 1 while holding the layout's GPUs)."""
    out = []
    for dim, flags in engine.parallel_flags.items():
        wanted, given = getattr(recipe.layout, dim), _flag_value(recipe.args, flags, recipe.engine,
                                                                 engine.flag_parser)
        if given is not None and given != str(wanted):
            out.append(f"args set {flags[0]} {given} but layout says {dim} {wanted}")
        elif given is None and wanted > 1 and not (recipe.layout.nodes > 1 and dim in engine.multinode):
            out.append(f"layout says {dim} {wanted} but args set no {flags[0]}: the engine would run {dim} 1")
    return out


def args_problems(recipe: "Recipe", engine: "Engine", engine_name: str) -> list[str]:
    """A recipe's args and parameter flags read as its engine's parser reads them: none may set a flag
    modelfleet sets (by any prefix or alias), and each must be one of the engine's flags where the recorded
    flag list is of the recipe's engine version."""
    flags = engine_flags.table(engine_name, engine.flag_parser)
    if flags is None:
        return []
    same = flags.version == recipe.engine_version.lstrip("v")
    protected = engine_flags.recipe_protected(engine, flags)
    out = [f"args: {p}" for p in engine_flags.problems(recipe.args, flags, protected, check_unknown=same)]
    for name, parameter in recipe.parameters.items():
        out += [f"parameters.{name}.flag: {p}" for p in engine_flags.problems([parameter.flag], flags, protected,
                                                                               check_unknown=same)]
    return out


# A part of a split GGUF (llama.cpp's gguf-split names): an engine that loads one file cannot load it.
SPLIT_GGUF = re.compile(r"-(\d{5}|\*)-of-(\d{5}|\*)\.gguf$")
OLLAMA_SPLIT_ISSUE = "https://github.com/ollama/ollama/issues/5245"
# llama.cpp's tensor placement, which keeps chosen tensors (MoE experts) in host RAM: -ot/--override-tensor.
TENSOR_PLACEMENT = ("-ot", "--override-tensor")


def arg_refusals(args, engine_name: str, engine: "Engine", engines: dict) -> list[str]:
    """Arguments an engine cannot take: any, for one configured only through its environment (Ollama's `serve`
    takes none); MoE experts in host RAM, for one that places whole layers."""
    out = []
    experts = {f for e in engines.values() if e.expert_offload for f in e.expert_offload.all +
               e.expert_offload.layers + e.expert_offload.fit} | set(TENSOR_PLACEMENT)
    asked = sorted({str(a).split("=", 1)[0] for a in args} & experts)
    if engine.layer_offload and asked:
        out.append(f"{', '.join(asked)} keep MoE experts in host RAM, which {engine_name} cannot do: it offloads "
                   f"whole layers ({engine.layer_offload.parameter}); serve this with engine llama.cpp (its "
                   "--cpu-moe recipes, e.g. kimi-k3-llamacpp-q4-k-xl-1gpu-ram)")
    elif engine.address_env and args:
        out.append(f"{engine_name}'s server takes no arguments ({engine.source}): its settings are the recipe's env")
    return out


def engine_problems(recipe: "Recipe", engine: "Engine", engines: dict) -> list[str]:
    """What a recipe asks of an engine that cannot do it: arguments it cannot take (arg_refusals); a split GGUF
    for one that registers a single file (Ollama)."""
    out = [f"args: {p}" for p in arg_refusals(recipe.args, recipe.engine, engine, engines)]
    if engine.registration and recipe.model_file and SPLIT_GGUF.search(recipe.model_file):
        out.append(f"model_file: {recipe.model_file} is one part of a split GGUF, and {recipe.engine} loads a "
                   f"single file only ({OLLAMA_SPLIT_ISSUE}): merge the parts first (llama-gguf-split --merge) "
                   "and name the merged file, or serve it with engine llama.cpp")
    return out


def _check_layouts(recipes: dict, engines: dict, where) -> None:
    for recipe in recipes.values():
        engine = engines.get(recipe.engine)
        problems = [f"layout: {p}" for p in layout_problems(recipe, engine)] + \
            args_problems(recipe, engine, recipe.engine) + engine_problems(recipe, engine, engines) if engine else []
        if problems:
            raise CatalogError(where(recipe), "; ".join(problems) + f" (recipe {recipe.id})")


def _load_dir(folder: Path, cls):
    items: dict = {}
    for path in yaml_files(folder):
        item = _read(path, cls)
        if item.id in items:
            raise CatalogError(str(path), f"id {item.id} is already defined by another file of {folder}")
        items[item.id] = item
    return items


class SiteRecipe(Recipe):
    """A site's own recipe (a `recipes/` folder beside the inventory): a new id, or `overrides: <id>` to replace
    a shipped recipe on purpose."""

    overrides: str | None = None


def _with_site(folder: Path, cls, shipped: dict, kind: str, check=None) -> tuple[dict, dict[str, str]]:
    """Shipped items plus a site's (each file of `folder`, read as `cls`), and the file of each site item: an id
    that shadows a shipped one without `overrides`, or that two site files define, is an error."""
    items, files = dict(shipped), {}
    for path in yaml_files(folder):
        site = _read(path, cls)
        if site.overrides and site.overrides not in shipped:
            raise CatalogError(str(path), f"overrides: no shipped {kind} {site.overrides!r}")
        if site.id in shipped and site.overrides != site.id:
            raise CatalogError(str(path), f"id: {site.id} is a shipped {kind}: pick a new id, or say "
                                          f"`overrides: {site.id}` to replace it")
        if site.overrides and site.overrides != site.id:
            items.pop(site.overrides)
        if site.id in files:
            raise CatalogError(str(path), f"id: {site.id} is already defined by another file of {folder}")
        if check:
            check(str(path), site)
        items[site.id] = cls.__mro__[1](**site.model_dump(exclude={"overrides"}))
        files[site.id] = str(path)
    return items, files


def _known(where: str, fld: str, values: list[str], table: dict) -> None:
    for value in values:
        if value not in table:
            near = difflib.get_close_matches(value, list(table), n=1, cutoff=0.6)
            raise CatalogError(where, f"{fld}: unknown {fld} {value!r}" + (
                f" (did you mean {near[0]!r}?)" if near else f" (known: {', '.join(sorted(table))})"))


def with_site_recipes(catalog: "Catalog", folder: Path) -> "Catalog":
    """The catalog plus a site's recipes, each naming a model, an engine and boards the catalog has."""

    def check(where: str, site: "SiteRecipe") -> None:
        _known(where, "model", [site.model], catalog.models)
        _known(where, "engine", [site.engine], catalog.engines)
        _known(where, "hardware", site.hardware, catalog.hardware)

    recipes, files = _with_site(folder, SiteRecipe, catalog.recipes, "recipe", check)
    for recipe_id, where in files.items():
        recipes[recipe_id]._site = where
        _check_layouts({recipe_id: recipes[recipe_id]}, catalog.engines, lambda _, where=where: where)
    return catalog.model_copy(update={"recipes": recipes})


class SiteHardware(Hardware):
    """A site's own board (a `hardware/` folder beside the inventory): a new id, or `overrides: <id>` to replace
    a shipped board on purpose."""

    overrides: str | None = None


def with_site_hardware(catalog: "Catalog", folder: Path) -> "Catalog":
    """The catalog plus a site's boards."""
    boards, _ = _with_site(folder, SiteHardware, catalog.hardware, "board")
    return catalog.model_copy(update={"hardware": boards})


def _load_engines(path: Path) -> dict[str, Engine]:
    """engines.yaml: engine name -> its entry; a bad entry is named with the field at fault."""
    engines = {}
    for name, spec in (read_yaml(path.read_text()) or {}).items():
        if not isinstance(spec, dict):
            raise CatalogError(str(path), f"engine {name}: must be a mapping of fields, got {type(spec).__name__}")
        try:
            engines[name] = Engine(**spec)
        except ValidationError as error:
            first = error.errors()[0]
            raise CatalogError(str(path), f"engine {name}: {'.'.join(map(str, first['loc']))}: "
                                          f"{first['msg']}") from None
    return engines


@lru_cache(maxsize=None)
def load_catalog(root: Path = CATALOG_DIR) -> Catalog:
    engines = _load_engines(root / "engines.yaml")
    recipes = _load_dir(root / "recipes", Recipe)
    _check_layouts(recipes, engines, lambda recipe: next(
        str(p) for p in yaml_files(root / "recipes") if _read(p, Recipe).id == recipe.id))
    return Catalog(
        models=_load_dir(root / "models", Model),
        hardware=_load_dir(root / "hardware", Hardware),
        engines=engines,
        recipes=recipes,
    )
