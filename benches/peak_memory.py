"""Peak resident memory of one forward pass: ai3 against PyTorch eager.

Each measurement runs in a fresh process: build the network, warm up once at
a small size (so libraries are loaded), record the resident-set high-water
mark, run one forward pass at the measured size, and report how much the
high-water mark grew. Linux only (reads /proc/self/status).

    python benches/peak_memory.py --model resnet50 --batch 10
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, sys, torch, torchvision, ai3

def hwm_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM")

def reset_hwm():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")

name, batch, which = sys.argv[1], int(sys.argv[2]), sys.argv[3]
net = getattr(torchvision.models, name)(weights=None).eval()
run = net if which == "torch" else ai3.convert(net)
x = torch.randn(batch, 3, 224, 224)
with torch.inference_mode():
    run(torch.randn(1, 3, 64, 64))
    reset_hwm()
    before = hwm_kib()
    run(x)
    after = hwm_kib()
print(json.dumps({"which": which, "peak_growth_mib": (after - before) / 1024}))
"""


def measure(model: str, batch: int, which: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, model, str(batch), which],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_growth_mib"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=10)
    args = parser.parse_args()
    torch_mib = measure(args.model, args.batch, "torch")
    ai3_mib = measure(args.model, args.batch, "ai3")
    print(f"{args.model} batch {args.batch}, 224x224: peak memory growth of one forward pass")
    print(
        f"| PyTorch eager | {torch_mib:.0f} MiB |\n| ai3 | {ai3_mib:.0f} MiB |\n| ratio | {ai3_mib / torch_mib:.2f} |"
    )


if __name__ == "__main__":
    main()
