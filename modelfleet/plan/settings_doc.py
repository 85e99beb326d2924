"""The inventory's settings as Markdown tables, made from the schema (the one home of each setting's type,
default and meaning). README.md holds the output between its `settings:begin` and `settings:end` markers;
`python -m modelfleet.plan.settings_doc` prints it, `--write README.md` puts it there."""

from __future__ import annotations

import argparse
import json
import sys
import types
import typing
from pathlib import Path

import annotated_types
from pydantic import AfterValidator, BaseModel
from pydantic.fields import FieldInfo

from modelfleet.plan.inventory import applies, resolver, schema

BEGIN, END = "<!-- settings:begin -->", "<!-- settings:end -->"

# Strings held to a grammar rule, named by what they are rather than `str`.
_KINDS = {typing.get_args(alias)[1].func: kind for alias, kind in (
    (schema.Name, "name"), (schema.SecretVar, "variable name"), (schema.Image, "image"), (schema.Url, "URL"),
    (schema.OwnedDir, "path"))}


def _bounds(metadata: list) -> str:
    low = high = None
    for item in metadata:
        if isinstance(item, FieldInfo):
            item_low, item_high = _bounds(item.metadata).partition("|")[::2]
            low, high = item_low or low, item_high or high
        elif isinstance(item, annotated_types.Ge):
            low = str(item.ge)
        elif isinstance(item, annotated_types.Gt):
            low = f">{item.gt}"
        elif isinstance(item, annotated_types.Le):
            high = str(item.le)
    return f"{low or ''}|{high or ''}"


def _kind(metadata: list) -> str | None:
    return next((_KINDS[m.func] for m in metadata if isinstance(m, AfterValidator) and m.func in _KINDS), None)


def type_name(annotation, metadata: list = ()) -> str:
    """A setting's type in the user's words: `int 1-65535`, `list of name`, `xfs` or `ext4`, ..."""
    metadata = list(metadata)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0], metadata + list(args[1:]))
    if origin in (typing.Union, types.UnionType):
        names = [type_name(a, metadata) for a in args if a is not type(None) and not (a is int and float in args)]
        return " or ".join(names)
    if origin is typing.Literal:
        return " or ".join(f"`{value}`" for value in args)
    if origin is list:
        return f"list of {type_name(args[0])}"
    if origin is dict:
        return f"map of {type_name(args[0])} to {type_name(args[1])}"
    if annotation is bool:
        return "bool"
    if annotation in (int, float):
        low, high = _bounds(metadata).split("|")
        word = "int" if annotation is int else "number"
        if low and high:
            return f"{word} {low}-{high}"
        if low:
            return f"{word} {low}+" if not low.startswith(">") else f"{word} {low}"
        return f"{word} up to {high}" if high else word
    if annotation is str:
        return _kind(metadata) or "text"
    if annotation is typing.Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> str:
    """The default as a group_data file writes it; `unset` where the meaning says what happens then."""
    if field.default is None:
        return "unset"
    return f"`{json.dumps(field.default) if isinstance(field.default, str) else repr(field.default)}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def rows(model: type[BaseModel]) -> list[str]:
    """One Markdown row per field, in the schema's order; a field without a meaning is refused."""
    missing = [name for name, field in model.model_fields.items() if not (field.description or "").strip()]
    if missing:
        raise ValueError(f"{model.__name__}: no description for {', '.join(missing)} (give each field "
                         "Field(..., description=...))")
    return [f"| `{name}` | {_cell(type_name(field.annotation, field.metadata))} | {_cell(_default(field))} | "
            f"{_cell(field.description.strip())}{_applies(model, name)} |"
            for name, field in model.model_fields.items()]


def _applies(model: type[BaseModel], name: str) -> str:
    """Where a setting can apply (elsewhere it is refused), from its declaration."""
    scope = applies.scope_of(model, name)
    return f" Only for {applies.SCOPES[scope]}." if scope else ""


def _pyinfra_keys() -> list[str]:
    return sorted(resolver._pyinfra_keys() - set(schema.HostData.model_fields))


def table() -> str:
    """The block README.md holds between its markers (markers excluded)."""
    head = ["| key | type | default | meaning |", "|---|---|---|---|"]
    passing = ", ".join(f"`{key}`" for key in _pyinfra_keys())
    return "\n".join([
        "**Host settings** (host data or group_data):", "", *head, *rows(schema.HostData), "",
        "**Service settings**: at host or group level for a host's one service, or in each entry of "
        "`services`:", "", *head, *rows(schema.ServiceData), "",
        f"pyinfra's own keys pass through to pyinfra untouched: {passing}. Any other key is an error.",
    ])


def replace_block(text: str, block: str) -> str:
    """`text` with what stands between the markers replaced by `block`."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return f"{text[:start]}\n{block}\n{text[end:]}"


def current_block(text: str) -> str:
    """What stands between the markers of `text` (a missing marker raises ValueError)."""
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modelfleet.plan.settings_doc", description=__doc__)
    parser.add_argument("--write", metavar="FILE", type=Path,
                        help="replace the block between FILE's settings markers instead of printing")
    args = parser.parse_args(argv)
    block = table()
    if args.write is None:
        print(block)
        return 0
    text = args.write.read_text()
    if BEGIN not in text or END not in text:
        print(f"{args.write}: no {BEGIN} / {END} markers", file=sys.stderr)
        return 2
    args.write.write_text(replace_block(text, block))
    return 0


if __name__ == "__main__":
    sys.exit(main())
