"""modelfleet.base.keys: the one reader of keys from the control node's environment; set, empty and unset told apart."""

import pytest

from modelfleet.base import keys
from tests.helpers.made_keys import made_key


def test_a_set_key_is_read_as_set_and_stripped_on_request(monkeypatch):
    key = made_key()
    monkeypatch.setenv("MF_TEST_KEY", f"  {key} \n")
    assert keys.from_env("MF_TEST_KEY") == f"  {key} \n"
    assert keys.stripped("MF_TEST_KEY") == keys.required("MF_TEST_KEY") == key


def test_unset_empty_and_no_name_are_told_apart(monkeypatch):
    monkeypatch.delenv("MF_TEST_KEY", raising=False)
    monkeypatch.setenv("MF_TEST_EMPTY", "   ")
    assert keys.from_env("MF_TEST_KEY") is None and keys.from_env(None) is None and keys.from_env("") is None
    assert keys.from_env("MF_TEST_EMPTY") == "   " and keys.stripped("MF_TEST_EMPTY") == ""
    assert keys.stripped("MF_TEST_KEY") == "" and keys.stripped(None) == ""
    with pytest.raises(KeyError, match="MF_TEST_KEY"):
        keys.required("MF_TEST_KEY")


def test_no_other_module_reads_a_key_variable_from_the_environment():
    # The inventory's key variables (api_key_env, router_client_keys_env) are read through modelfleet.base.keys only.
    import re

    from modelfleet import PACKAGE_DIR

    pattern = re.compile(r"os\.environ(\.get)?[\[(][^\])]*(api_key_env|client_keys_env|model_key_env)")
    readers = [str(p.relative_to(PACKAGE_DIR)) for p in PACKAGE_DIR.rglob("*.py") if pattern.search(p.read_text())]
    assert readers == []
