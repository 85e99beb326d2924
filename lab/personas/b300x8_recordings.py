"""Writes the synthetic B300 persona's `nvidia-smi -q -x`, `nvlink -s` and `nvlink -e` (no 8-GPU host was ever
recorded here): each GPU of its query CSV as the recorded H200's <gpu> element with that GPU's bus id, UUID,
minor number, name and memory, and the fabric registered (`Completed` / `Success`, what a finished Fabric Manager
shows: NVIDIA's Fabric Manager user guide); NVLink status in the format of the public B300 sample
(tests/fixtures/public-samples/b300x7-nvidia-smi-nvlink-status.txt: 18 links at 53.125 GB/s per GPU); NVLink
error counters in the format of the public H100 sample (tests/fixtures/public-samples/
h100-nvidia-smi-nvlink-e-excerpt.txt: replay, recovery and CRC per link, a blank line between links), all 0.
Run from the checkout root; the outputs are committed beside the persona's other recordings (its SOURCE)."""

from __future__ import annotations

import re
from pathlib import Path

PERSONAS = Path(__file__).resolve().parent
H200 = (PERSONAS / "h200x1" / "nvidia-smi-q-x.txt").read_text()
B300 = PERSONAS / "b300x8-synthetic"
LINKS, LINK_SPEED = 18, "53.125 GB/s"


def gpu_element(index: int, name: str, uuid: str, bus_id: str, memory: str) -> str:
    element = H200[H200.index("\t<gpu id="):H200.index("\t</gpu>\n") + len("\t</gpu>\n")]
    bus = bus_id.split(":")[1]
    replacements = [
        ('id="00000000:00:06.0"', f'id="{bus_id}"'), ("<pci_bus_id>00000000:00:06.0<", f"<pci_bus_id>{bus_id}<"),
        ("<pci_bus>00<", f"<pci_bus>{bus}<"), ("<pci_device>06<", "<pci_device>00<"),
        ("<product_name>NVIDIA H200<", f"<product_name>{name}<"),
        ("<product_architecture>Hopper<", "<product_architecture>Blackwell<"),
        ("<serial>1653824070535<", f"<serial>{1653824070600 + index}<"),
        ("<uuid>GPU-c637b75d-bccc-0cab-3f64-9c4fb3bf5eaf<", f"<uuid>{uuid}<"),
        ("<minor_number>0<", f"<minor_number>{index}<"), ("<module_id>6<", f"<module_id>{index + 1}<"),
        ("<total>143771 MiB<", f"<total>{memory}<"), ("<free>143156 MiB<", "<free>274424 MiB<"),
        ("<fabric>\n\t\t\t<state>N/A</state>\n\t\t\t<status>N/A</status>",
         "<fabric>\n\t\t\t<state>Completed</state>\n\t\t\t<status>Success</status>"),
    ]
    for old, new in replacements:
        assert old in element, old
        element = element.replace(old, new, 1)
    return element


def main() -> None:
    rows = [[c.strip() for c in line.split(",")]
            for line in (B300 / "nvidia-smi-query-gpu.txt").read_text().splitlines()]
    gpus = "".join(gpu_element(int(r[0]), r[1], r[2], r[3], r[4]) for r in rows)
    head = H200[:H200.index("\t<gpu id=")].replace("<attached_gpus>1<", f"<attached_gpus>{len(rows)}<")
    head = re.sub(r"<driver_version>[^<]*<", f"<driver_version>{rows[0][5]}<", head)
    (B300 / "nvidia-smi-q-x.txt").write_text(head + gpus + H200[H200.index("\t</gpu>\n") + len("\t</gpu>\n"):])
    (B300 / "nvidia-smi-nvlink-s.txt").write_text("".join(
        f"GPU {r[0]}: {r[1]} (UUID: {r[2]})\n" + "".join(f"         Link {n}: {LINK_SPEED}\n" for n in range(LINKS))
        for r in rows))
    (B300 / "nvidia-smi-nvlink-e.txt").write_text("".join(
        f"GPU {r[0]}: {r[1]} (UUID: {r[2]})\n" + "\n".join(
            "".join(f"         Link {n}: {name} Errors: 0\n" for name in ("Replay", "Recovery", "CRC"))
            for n in range(LINKS))
        for r in rows))


if __name__ == "__main__":
    main()
