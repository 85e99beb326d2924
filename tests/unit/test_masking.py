"""The one mask: known secrets (also escaped and line by line), URL credentials and named values replaced; a
stream that masks a secret split across writes; `logs` masks the key an engine logs about itself."""

import io
import json
import secrets

import pytest

from modelfleet.base import masking
from modelfleet.base.masking import MASK
from modelfleet.fleet import status as fleet_status
from modelfleet.host import ssh
from tests.helpers.made_keys import made_key


@pytest.fixture(autouse=True)
def fresh():
    masking.forget()
    yield
    masking.forget()


def test_known_secret_masked_raw_escaped_and_line_by_line():
    first, second = made_key("first"), made_key("second")
    key = f"{first}\n{second}"
    masking.learn(key)
    for shown in (key, repr(key), json.dumps(key), f"first: {first}", f"then {second} alone"):
        assert first not in masking.mask(shown) and second not in masking.mask(shown), shown


@pytest.mark.parametrize("text,kept", [
    ("https://user:pw-123456@mirror.example/m", "https://********@mirror.example/m"),
    ("http://tok3n@host:8080/x", "http://********@host:8080/x"),
    ("server_args=ServerArgs(api_key='k-123456', port=30000)", "api_key='********', port=30000)"),
    ('{"api-key": "k-123456"}', '{"api-key": "********"}'),
    ("curl -H 'Authorization: Bearer abc123456'", "Authorization: Bearer ********'"),
    ("--api-key abcdef12", "--api-key ********"),
])
def test_unknown_secrets_masked_by_form(text, kept):
    assert kept in masking.mask(text)
    assert masking.mask(masking.mask(text)) == masking.mask(text)


@pytest.mark.parametrize("text", [
    "host h1:\n  env.MY_API_KEY: looks like a secret", "api_key_env: MY_KEY is not set",
    "hf_token_env  \"HF_TOKEN\"  (default)", "the hub token (reaches only the downloading host)",
    "--api-key-env KEYVAR"])
def test_ordinary_messages_untouched(text):
    assert masking.mask(text) == text


def test_short_values_not_learned():
    masking.learn("ab", None, "", "   ")
    assert masking.mask("ab cd") == "ab cd"


def test_structures_masked_by_key_name_and_value():
    masking.learn("hunter2-long")
    out = masking.masked({"_sudo_password": "x-secret", "ssh_key": "/root/.ssh/id", "port": 22,
                          "env": {"DB_PASSWORD": "pw-999999", "OK": "said hunter2-long"},
                          "rows": [{"key": "hardware", "value": "b300"}]})
    assert out == {"_sudo_password": MASK, "ssh_key": "/root/.ssh/id", "port": 22,
                   "env": {"DB_PASSWORD": MASK, "OK": f"said {MASK}"},
                   "rows": [{"key": "hardware", "value": "b300"}]}


@pytest.mark.parametrize("name", ["API_KEY", "HF_TOKEN", "CLIENT_SECRET", "db_password", "X_KEY"])
def test_env_names_like_secrets_refused(name):
    assert "api_key_env" in masking.env_name_problem(name)


@pytest.mark.parametrize("name", ["NCCL_IB_HCA", "VLLM_USE_V2_MODEL_RUNNER", "KEYBOARD", "TOKENIZERS_PARALLELISM"])
def test_other_env_names_pass(name):
    assert masking.env_name_problem(name) is None


def test_learn_data_and_inventory(monkeypatch):
    from modelfleet.plan.inventory.resolver import resolve

    monkeypatch.setenv("MY_KEY_VAR", "key-value-123")
    token = "hf_" + secrets.token_hex(6)
    monkeypatch.setenv("HF_TOKEN", token)
    data = {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm",
            "api_key_env": "MY_KEY_VAR", "_sudo_password": "sudo-pw-55",
            "model_source": "https://u:url-pw-66@m.example/x", "revision": "c" * 40}
    result = resolve([("h1", data)])
    assert not result.errors, result.errors
    result.data = {"h1": data}
    masking.learn_inventory(result)
    text = f"key-value-123 {token} sudo-pw-55 url-pw-66"
    assert masking.mask(text) == " ".join([MASK] * 4)


def test_stream_masks_a_secret_split_across_writes():
    masking.learn("split-secret-value")
    sink = io.StringIO()
    stream = masking.MaskedStream(sink)
    stream.write("a split-sec")
    stream.write("ret-value b\nnext ")
    stream.flush()
    assert sink.getvalue() == f"a {MASK} b\nnext "


def test_logs_mask_the_key_an_engine_logs(monkeypatch):
    """SGLang prints its server arguments, the key among them: `modelfleet logs` shows the line masked (the
    key known from the inventory's variable, or recognised by its form when the control node lacks it)."""
    masking.learn("known-key-1234567")

    class Conn:
        def __init__(self, lines):
            self.client = self
            self.lines = lines

        def exec_command(self, command):
            return None, iter(self.lines), None

        def close(self):
            pass

    lines = ["server_args=ServerArgs(api_key='known-key-1234567', host='0.0.0.0')\n",
             "server_args=ServerArgs(api_key='unknown-key-7654321')\n", "ready\n"]
    monkeypatch.setattr(ssh, "connect", lambda plan: Conn(lines))
    monkeypatch.setattr(ssh, "open_checked", lambda conn, plan: None)

    class Plan:
        name = "h1"
        services = [type("S", (), {"unit_name": "modelfleet-x.service"})()]

    sink = io.StringIO()
    fleet_status.logs([Plan()], sink=sink)
    out = sink.getvalue()
    assert "known-key-1234567" not in out and "unknown-key-7654321" not in out
    assert out.count(MASK) == 2 and "[h1] ready" in out


def test_converge_shard_logs_are_masked(tmp_path, monkeypatch):
    """A shard's log is a report: what its pyinfra process printed is masked there too (the child masks its
    own streams; this holds also for a child that could not)."""
    from modelfleet.fleet import shards

    masking.learn("shard-known-secret-42")
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    monkeypatch.setattr(shards, "pyinfra_argv", lambda *a, **k: [
        "sh", "-c", "echo pw shard-known-secret-42; echo https://u:url-pw-77@mirror.example/x"])
    summary = shards.converge("inv.py", "deploy.py", [["h1"]], progress=lambda line: None)
    text = (tmp_path / "converge" / "shard-1.log").read_text()
    assert summary["ok"] and "shard-known-secret-42" not in text and "url-pw-77" not in text
    assert text.count(MASK) == 2


def test_the_programs_and_templates_modelfleet_writes_to_hosts_pass_the_mask_unchanged():
    """render previews them byte for byte through the CLI's masked streams: no placeholder in them may look like a
    secret's value to the mask."""
    from modelfleet import PACKAGE_DIR

    sources = [*(PACKAGE_DIR / "templates").glob("*.j2"), *(PACKAGE_DIR / "files").glob("*.py"),
               *(PACKAGE_DIR / "shell").glob("*.sh")]
    assert sources
    changed = [p.name for p in sources if masking.mask(p.read_text()) != p.read_text()]
    assert changed == []


def test_front_door_client_keys_masked_where_the_run_prints_them(monkeypatch):
    """The keys a front door's clients use (router_client_keys_env) are known to the mask: the nginx map that
    holds them (the 0600 file a `--diff` or a failing upload would print) reaches a reader masked."""
    from modelfleet.plan import router
    from modelfleet.plan.inventory import resolve
    from tests.helpers.front_doors import KEY, fleet

    client = "client-" + secrets.token_hex(8)
    monkeypatch.setenv("MF_ROUTER_KEY", KEY)
    monkeypatch.setenv("MF_CLIENT_ONE", client)
    result = resolve(fleet("vllm", router_client_keys_env=["MF_CLIENT_ONE"]))
    assert result.errors == []
    masking.learn_inventory(result)
    rp = result.routers["tiny-lab"]
    sink = io.StringIO()
    stream = masking.MaskedStream(sink)
    stream.write(router.proxy_key_conf(router.client_keys(rp), KEY) + f"curl -H 'x-key: {client}'\n")
    stream.flush()
    assert client in router.proxy_key_conf(router.client_keys(rp), KEY)  # the file itself holds the key
    assert client not in sink.getvalue() and KEY not in sink.getvalue(), sink.getvalue()
    assert MASK in sink.getvalue()
