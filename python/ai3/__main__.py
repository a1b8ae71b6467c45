"""The command line, ``python -m ai3``: ``demo``, ``algorithms`` and ``test``
(see :data:`DESCRIPTION`, which is what ``--help`` prints)."""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import ai3
from ai3 import testing

#: The help text of ``python -m ai3`` (plain text: argparse prints it as it is).
DESCRIPTION = "ai3: choose, per layer, the algorithm that runs each operation of a PyTorch network."

#: The examples under ``python -m ai3 --help``, laid out by hand.
EPILOG = """\
examples:
  python -m ai3 demo                  convert and swap small networks, compare with PyTorch
  python -m ai3 algorithms            every operation's algorithms, and why any is unavailable
  python -m ai3 test --quick          a quick run of the correctness suite
  python -m ai3 test --help           the suite's options
"""


class ConvNet(nn.Module):
    """The small network of the ai3 paper's first listing."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, kernel_size=3, padding=1)
        self.maxpool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = self.maxpool(x)
        x = torch.relu(self.conv2(x))
        return torch.flatten(x, 1)


def _report(title: str, net: nn.Module, algos: dict, shape: tuple[int, ...]) -> bool:
    net = net.eval()
    x = torch.randn(shape)
    with torch.inference_mode():
        expected = net(x)
    model = ai3.convert(net, algos, dtype=torch.float32)
    got = model(x)
    err = (got - expected).abs().max().item() / max(expected.abs().max().item(), 1e-12)
    print(f"\n== {title}: convert, input {list(shape)}")
    for line in str(model.summary(shape)).splitlines():
        print(f"  {line}")
    ok = err < 1e-4
    print(f"  max |ai3 - torch| / max |torch| = {err:.2e}  {'OK' if ok else 'MISMATCH'}")
    return ok


def demo() -> int:
    """Runs the demo; returns a process exit code."""
    torch.manual_seed(0)
    ok = _report(
        "ConvNet (paper listing 1)", ConvNet(), {"conv2d": ["direct", "smm"]}, (2, 3, 32, 32)
    )
    try:
        import torchvision
    except ImportError:
        print("\ntorchvision is not installed: pip install 'aithree[examples]' for the VGG16 part")
        return 0 if ok else 1
    vgg = torchvision.models.vgg16(weights=None)
    ok &= _report("torchvision vgg16 (random weights)", vgg, {"conv2d": "winograd"}, (1, 3, 64, 64))
    net = ConvNet()
    x = torch.randn(2, 3, 32, 32)
    expected = net(x)
    ai3.swap_conv2d(net, ["gemm", "winograd"])
    err = (net(x) - expected).abs().max().item()
    print(f"\n== ConvNet: swap_conv2d in place -> {net.conv1}\n  max abs difference {err:.2e}")
    return 0 if ok and err < 1e-4 else 1


def algorithms() -> int:
    """Prints the algorithm registry, each unavailability reason once under the table."""
    table = ai3.algorithm_table()
    note_of, notes = testing._reason_notes(
        (row["op"], row["unavailable"]) for row in table if row["unavailable"]
    )
    print(f"{'operation':<18} {'algorithm':<10} {'device':<6} summary")
    for row in table:
        why = ""
        if row["unavailable"]:
            why = f"  [unavailable, note {note_of[(row['op'], row['unavailable'])]}]"
        print(f"{row['op']:<18} {row['algorithm']:<10} {row['device']:<6} {row['summary']}{why}")
    if notes:
        print("\nunavailable in this build:")
        for note in notes:
            print(f"  {note}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m ai3``."""
    parser = argparse.ArgumentParser(
        prog="python -m ai3",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")
    commands.add_parser("demo", help="convert and swap small networks, compare with PyTorch")
    commands.add_parser(
        "algorithms", help="list the algorithm registry and why an algorithm is unavailable"
    )
    test = commands.add_parser(
        "test",
        help="run the correctness suite against PyTorch",
        description=testing.DESCRIPTION,
        epilog=testing.EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    testing.add_arguments(test)
    args = parser.parse_args(argv)
    if args.command == "test":
        return testing.run_cli(args)
    return demo() if args.command == "demo" else algorithms()


if __name__ == "__main__":
    sys.exit(main())
