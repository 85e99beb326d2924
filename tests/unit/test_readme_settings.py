"""README's settings tables are generated from the schema, and stay equal to it."""

import ast
from pathlib import Path

import pytest

from modelfleet.plan import settings_doc
from modelfleet.plan.inventory.schema import HostData, ServiceData

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"


def _rows(block: str) -> dict[str, list[str]]:
    """key -> [type, default, meaning] of every table row of the block."""
    out = {}
    for line in block.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            out[cells[0].strip("`")] = cells[1:]
    return out


def test_readme_block_equals_the_schema():
    text = README.read_text()
    assert text.count(settings_doc.BEGIN) == 1 and text.count(settings_doc.END) == 1
    assert settings_doc.current_block(text) == settings_doc.table(), (
        "README.md's settings tables differ from the schema: "
        "run `python -m modelfleet.plan.settings_doc --write README.md`")


@pytest.mark.parametrize("model", [HostData, ServiceData])
def test_every_field_has_a_one_line_meaning(model):
    for name, field in model.model_fields.items():
        assert field.description and field.description.strip(), f"{model.__name__}.{name} has no description"
        assert "\n" not in field.description, f"{model.__name__}.{name}: description is more than one line"


def test_one_row_per_field_in_schema_order_with_its_default():
    block = settings_doc.table()
    host, service = block.split("**Service settings**")
    for model, part in ((HostData, host), (ServiceData, service)):
        rows = _rows(part)
        assert list(rows) == list(model.model_fields)
        for name, (_type, default, meaning) in rows.items():
            field = model.model_fields[name]
            if field.default is None:
                assert default == "unset"
            else:
                assert ast.literal_eval(default.strip("`")) == field.default, name
            assert meaning == field.description.replace("|", "\\|") + settings_doc._applies(model, name)


def test_types_come_from_the_annotations():
    rows = {**_rows(settings_doc.table())}
    assert rows["ssh_port"][0] == "int 1-65535"
    assert rows["model_filesystem"][0] == "`xfs` or `ext4`"
    assert rows["model_keep_revisions"][0] == "int 0-100"
    assert rows["netcheck_min_busbw_gbps"][0] == "number >0-10000"
    assert rows["gpu_indices"][0] == "list of int 0-71"
    assert rows["model_root"][0] == "path"
    assert rows["api_key_env"][0] == "variable name"
    assert rows["hf_endpoint"][0] == "URL"
    assert rows["assess_models"][0] == "list of name"
    assert rows["env"][0] == "map of text to text"


def test_pyinfra_keys_are_named_as_passing_through():
    block = settings_doc.table()
    passing = block.rsplit("pyinfra's own keys pass through", 1)[1]
    for key in ("`_sudo`", "`ssh_password`", "`_serial`"):
        assert key in passing
    assert "`ssh_port`" not in passing  # a schema field: it has its own row


def test_service_keys_are_the_service_fields_and_no_key_is_both():
    from modelfleet.plan.inventory.schema import SERVICE_KEYS

    assert sorted(SERVICE_KEYS) == sorted(ServiceData.model_fields)
    assert not set(HostData.model_fields) & set(ServiceData.model_fields)
