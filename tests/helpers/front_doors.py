"""Front doors of a small fleet for the router's tests (tests/unit/test_router.py, test_inventory_routed.py,
test_catalog_routers.py): three lab hosts behind a front door on r1, and the real routers' recorded outputs."""

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "router"
KEY = "lab-front-door-key-0123"


def recorded(name: str) -> str:
    return (FIXTURES / name).read_text().split("# ---\n", 1)[1]


def host(address: str, fabric: str, engine: str = "sglang", **extra) -> dict:
    return {"hardware": "lab-cpu", "model": "tiny-lab", "engine": engine, "recipe": f"tiny-lab-{engine}",
            "ssh_hostname": address, "fabric_address": fabric, "router": "r1", "api_key_env": "MF_ROUTER_KEY",
            **extra}


def fleet(engine: str = "sglang", **extra) -> list:
    """Three replicas behind a front door on r1; vLLM's only on r1 (elsewhere it is refused, as below)."""
    hosts = [("r1", host("10.0.0.1", "10.1.0.1", engine, **extra)),
             ("a", host("10.0.0.2", "10.1.0.2", engine, **extra)),
             ("b", host("10.0.0.3", "10.1.0.3", engine, **extra))]
    return hosts[:1] if engine == "vllm" else hosts
