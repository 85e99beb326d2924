"""The inventory's grammar (grammar.py) on values sites write and values that would break a rendered file or
leak a secret: each rule accepts the real forms and refuses the broken ones with a message that says why.
(Which directories modelfleet may own: test_owned_dirs.py.)"""

import secrets

import pytest

from modelfleet.base import grammar

DIGEST = "@sha256:" + "a" * 64


@pytest.mark.parametrize("value", ["vllm/vllm-openai:v0.34.0", "lmsysorg/sglang:v0.5.2-cu129",
                                   "nvcr.io/nvidia/k8s/dcgm-exporter:4.4.2-4.7.1-ubuntu22.04" + DIGEST,
                                   "localhost:5000/lab/tiny" + DIGEST, "registry.lab:5000/vllm:v1"])
def test_real_image_references_pass(value):
    assert grammar.image(value) is None


@pytest.mark.parametrize("value, says", [
    ("vllm/vllm-openai", "has no tag or digest"),
    ("vllm/vllm-openai@sha256:abc", "is not an image reference"),
    ("VLLM/Upper:v1", "is not an image reference"),
    ("vllm/vllm-openai:v1\nExecStartPre=/bin/sh", "control character"),
])
def test_broken_image_references_say_why(value, says):
    assert says in grammar.image(value)


def test_a_secret_variable_is_a_name_and_a_pasted_token_is_not_echoed():
    assert grammar.secret_variable("HF_TOKEN") is None
    token = "hf_" + secrets.token_hex(8)  # made here: nothing token-like is committed
    said = grammar.secret_variable(token)
    assert "looks like a secret" in said and token[:7] not in said
    assert "not an environment variable name" in grammar.secret_variable("hf-token")


def test_names_revisions_and_addresses():
    assert grammar.name("k31") is None and "not a valid name" in grammar.name("k31/../etc")
    assert grammar.revision("e" * 40) is None and grammar.revision("v1.0") is None
    assert grammar.revision("../main") and grammar.revision("-rf") and grammar.revision("main/")
    assert grammar.host_address("10.0.0.1") is None and grammar.host_address("gpu-01.dc1.example") is None
    assert grammar.host_address("gpu 01") == "is neither an IP address nor a host name"
    assert grammar.address("gpu-01") == "is not an IP address"
    assert grammar.interfaces("^lo,docker0") is None and grammar.ib_hca("mlx5_0:1,mlx5_1") is None
    assert grammar.env_value("a\tb") and grammar.env_value("plain value") is None


def test_slug_and_flag_name():
    assert grammar.slug("moonshotai/Kimi K3.1") == "moonshotai_Kimi_K3.1"
    assert [grammar.flag_name(t) for t in ["--port=8000", "-tp", "8000", "-", "-1.5"]] == \
        ["--port", "-tp", None, None, None]
