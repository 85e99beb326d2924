"""The inventory's schema (inventory/schema.py) as pydantic applies it: strict types, each value held to its
grammar with the grammar's reason as the error (never the value), list entries named by their place, unknown
keys refused in a service and left to the resolver on a host."""

from __future__ import annotations

import secrets

import pytest
from pydantic import ValidationError

from modelfleet.plan.inventory.schema import HostData, ServiceData


def errors(model, **data) -> list[tuple[tuple, str]]:
    """[(where, message)] pydantic reports for `data`; [] when it validates."""
    try:
        model.model_validate(data)
    except ValidationError as error:
        return [(e["loc"], e["msg"].removeprefix("Value error, ")) for e in error.errors()]
    return []


@pytest.mark.parametrize("value", [True, "8000", 8000.0])
def test_a_port_is_an_integer_and_nothing_that_passes_for_one(value):
    assert [where for where, _ in errors(ServiceData, port=value)] == [("port",)]


@pytest.mark.parametrize("port, ok", [(1, True), (65535, True), (0, False), (65536, False)])
def test_a_port_is_one_tcp_has(port, ok):
    assert (errors(ServiceData, port=port) == []) is ok
    assert (errors(HostData, ssh_port=port) == []) is ok


def test_a_grammar_reason_is_the_error_and_the_value_is_not_echoed():
    secret_looking = f"https://user:hf_{secrets.token_hex(8)}@hub.example/ path"  # made here, never committed
    [(where, message)] = errors(HostData, hf_endpoint=secret_looking)
    assert where == ("hf_endpoint",) and message == "may not contain spaces or control characters"
    pasted = "sk-live-" + secrets.token_hex(8)
    [(where, message)] = errors(ServiceData, api_key_env=pasted)
    assert where == ("api_key_env",) and pasted[8:] not in message and "(value not shown)" in message


@pytest.mark.parametrize("url, reason", [
    ("https://hub.example", None), ("http://10.0.0.2:8080/hub", None), ("file:///srv/mirror", None),
    ("ftp://hub.example", "is not an http(s):// or file:// URL"),
    ("hub.example", "is not an http(s):// or file:// URL"),
    ("https://hub.example/a\tb", "may not contain spaces or control characters"),
])
def test_urls_are_http_https_or_file(url, reason):
    assert errors(HostData, model_source=url) == ([] if reason is None else [(("model_source",), reason)])


@pytest.mark.parametrize("prefix, ok", [("registry.lab:5000", True), ("registry.lab:5000/mirror/", True),
                                        ("mirror.example/a/b", True), ("https://registry.lab", False),
                                        ("registry.lab/Upper", False)])
def test_an_image_registry_is_a_host_port_and_path_prefix(prefix, ok):
    assert (errors(HostData, image_registry=prefix) == []) is ok


def test_list_entries_are_named_by_their_place():
    assert errors(ServiceData, extra_args=["--enforce-eager", "--x\n--y"]) == [
        (("extra_args",), "entry 2 contains a control character (newline, tab, NUL...): it would add lines to a "
                          "rendered file")]
    [(where, message)] = errors(HostData, nvme_devices=["/dev/nvme0n1", "nvme1n1"])
    assert where == ("nvme_devices",) and message.startswith("entry 2 ")


def test_a_list_of_gpus_or_disks_may_not_name_one_twice():
    assert errors(ServiceData, gpu_indices=[0, 1, 1]) == [(("gpu_indices",), "lists the same entry twice")]
    assert errors(HostData, nvme_devices=["/dev/nvme0n1", "/dev/nvme0n1"]) == [
        (("nvme_devices",), "lists the same entry twice")]
    assert errors(ServiceData, gpu_indices=[0, 72]) != []  # past the largest NVLink domain's GPU count
    assert errors(HostData, nvme_devices=["auto"]) == []


def test_the_endpoint_binds_to_an_address_or_localhost():
    assert errors(ServiceData, bind_address="localhost") == []
    assert errors(ServiceData, bind_address="::1") == []
    assert errors(ServiceData, bind_address="gpu-01.example") == [(("bind_address",), "is not an IP address")]


@pytest.mark.parametrize("router, ok", [("@local", True), ("@fake/router-1", True), ("router-1.example", True),
                                        ("10.0.0.5", True), ("not a host!", False)])
def test_the_router_is_named_as_pyinfra_names_a_host(router, ok):
    assert (errors(ServiceData, router=router) == []) is ok


def test_env_names_and_recipe_params_are_checked_key_and_value():
    assert errors(ServiceData, env={"NCCL_DEBUG": "INFO"}, recipe_params={"mamba_full_memory_ratio": 0.9}) == []
    assert [where for where, _ in errors(ServiceData, env={"not a name": "x"})] == [("env", "not a name", "[key]")]
    assert [where for where, _ in errors(ServiceData, recipe_params={"ratio": "0.9\n--x"})] == [
        ("recipe_params", "ratio")]


def test_a_service_refuses_unknown_keys_and_a_host_leaves_them_to_the_resolver():
    assert errors(ServiceData, modle="qwen3-8b") == [(("modle",), "Extra inputs are not permitted")]
    host = HostData.model_validate({"modle": "qwen3-8b", "ssh_password": "x", "_sudo": True})
    assert not hasattr(host, "modle")


def test_model_root_is_a_directory_of_its_own():
    [(where, message)] = errors(HostData, model_root="/")
    assert where == ("model_root",) and "system directory" in message
    assert errors(HostData, model_root="/srv/models") == []


@pytest.mark.parametrize("field, value, ok", [
    ("driver_version", "580.95.05", True), ("driver_version", "580.159.04", True), ("driver_version", "580", False),
    ("driver_branch", "580", True), ("driver_branch", "r580", False),
    ("cuda_toolkit", "13-0", True), ("cuda_toolkit", "13.0", False),
    ("unit_dropins", "keep", True), ("unit_dropins", "ignore", False),
])
def test_the_gpu_stack_settings_take_the_forms_the_package_names_use(field, value, ok):
    assert (errors(HostData, **{field: value}) == []) is ok
