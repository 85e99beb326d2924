"""`make lab-verify`: on the lab, the verify gate (inside serve.py and as `modelfleet verify`), a short bench,
and cost per successful task side by side (self-hosted prices vs a hosted API's, on lab endpoints). JSON."""

import json
import sys

import lab
from modelfleet.base.commands import run_modelfleet, run_pyinfra


def main() -> int:
    specs = lab.up(3)
    serve = run_pyinfra("inventories/lab.py", "deploys/serve.py")
    if serve.returncode:
        print(serve.stdout[-4000:], serve.stderr[-2000:], file=sys.stderr)
        return serve.returncode
    verify = run_modelfleet("verify", "inventories/lab.py")
    head, other = specs[0], specs[1]
    common = ["--concurrency", "1,4,8", "--num-prompts", "16", "--input-len", "128", "--output-len", "64",
              "--out", "reports/bench"]
    self_hosted = run_modelfleet("bench", "inventories/lab.py", "--host", head["name"], *common)
    # The side-by-side row: the same bench against an OpenAI-compatible base URL, priced per token as a hosted
    # API would be (here a second lab endpoint stands in for the provider: the lab reaches no outside API).
    hosted = run_modelfleet("bench", "--base-url", f"http://{other['address']}:30000", "--model", "tiny-lab", *common)
    benches = [json.loads(b.stdout)[0] for b in (self_hosted, hosted)]
    cost = run_modelfleet("cost", "--json",
               "--run", f"self-hosted={benches[0]['json']}:lab/prices/self-hosted-h200.yaml",
               "--run", f"hosted-api={benches[1]['json']}:lab/prices/hosted-api-example.yaml")
    print(json.dumps({"verify": json.loads(verify.stdout), "bench": benches, "cost": json.loads(cost.stdout)},
                     indent=2))
    assert other["engine"] == "sglang"
    return verify.returncode or cost.returncode


if __name__ == "__main__":
    sys.exit(main())
