"""The command line through click's runner, against an inventory written for the test (tests/unit/test_cli*.py)."""

from click.testing import CliRunner

from modelfleet.cli import main

PIN = "0123456789abcdef0123456789abcdef01234567"
H200 = {"hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm", "gpu_stack": False,
        "revision": PIN}


def inventory(tmp_path, hosts: dict[str, dict], group: str = "gpus") -> str:
    path = tmp_path / "inv.py"
    path.write_text(f"{group} = {[(name, data) for name, data in hosts.items()]!r}\n")
    return str(path)


def run(*argv: str):
    return CliRunner().invoke(main, [str(a) for a in argv])
