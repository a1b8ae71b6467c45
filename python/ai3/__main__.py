"""The command line, ``python -m ai3``: ``explore``, ``demo``, ``algorithms``
and ``test`` (see :data:`DESCRIPTION`, which is what ``--help`` prints)."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import torch
from torch import nn

import ai3
from ai3 import testing

#: The help text of ``python -m ai3`` (plain text: argparse prints it as it is).
DESCRIPTION = "ai3: choose, per layer, the algorithm that runs each operation of a PyTorch network."

#: The examples under ``python -m ai3 --help``, laid out by hand.
EPILOG = """\
examples:
  python -m ai3 explore               time every algorithm of a small network's layers
  python -m ai3 explore resnet50 --batch 1 --out resnet50/
                                      ... of torchvision's resnet50 (random weights); writes
                                      the table as CSV, the plan as JSON and a PNG into resnet50/
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
    width = max(len(row["algorithm"]) for row in table)
    print(f"{'operation':<18} {'algorithm':<{width}} {'device':<6} summary")
    for row in table:
        why = ""
        if row["unavailable"]:
            why = f"  [unavailable, note {note_of[(row['op'], row['unavailable'])]}]"
        print(
            f"{row['op']:<18} {row['algorithm']:<{width}} {row['device']:<6} {row['summary']}{why}"
        )
    if notes:
        print("\nunavailable in this build:")
        for note in notes:
            print(f"  {note}")
    return 0


class ExploreNet(nn.Module):
    """The network ``python -m ai3 explore`` explores when given none: small
    enough to finish in seconds, with layers where different algorithms win."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
            nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(128, 128, 1), nn.ReLU(),
            nn.Conv2d(128, 128, 5, padding=2), nn.ReLU(),
        )  # fmt: skip
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


def load_model(spec: str | None) -> tuple[nn.Module, str]:
    """The network named on the command line: a torchvision model name (random
    weights), ``package.module:callable``, or none for :class:`ExploreNet`."""
    if spec is None:
        return ExploreNet(), "ExploreNet (the built-in example)"
    if ":" in spec:
        mod_name, _, attr = spec.partition(":")
        try:
            obj = getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError) as e:
            raise SystemExit(f"python -m ai3 explore: cannot load {spec!r}: {e}") from e
        net = obj() if callable(obj) and not isinstance(obj, nn.Module) else obj
    else:
        try:
            import torchvision
        except ImportError as e:
            raise SystemExit(
                "python -m ai3 explore: torchvision is needed for model names: "
                "pip install 'aithree[examples]'"
            ) from e
        try:
            net = torchvision.models.get_model(spec, weights=None)
        except ValueError as e:
            names = ", ".join(sorted(torchvision.models.list_models(torchvision.models))[:12])
            raise SystemExit(
                f"python -m ai3 explore: unknown model {spec!r}; torchvision has e.g. {names}, "
                "... (or give package.module:callable)"
            ) from e
    if not isinstance(net, nn.Module):
        raise SystemExit(f"python -m ai3 explore: {spec!r} is not a torch.nn.Module")
    return net, spec


def explore(args: argparse.Namespace) -> int:
    """``python -m ai3 explore``: prints the report, writes it into ``--out``."""
    net, title = load_model(args.model)
    if args.size is not None:
        size = tuple(args.size)
    else:
        size = (32, 32) if args.model is None else (224, 224)
    shape = (args.batch, 3, *size)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    algorithms = [a.strip() for a in args.algorithms.split(",")] if args.algorithms else None
    print(f"exploring {title}, input {list(shape)}, {ai3.get_num_threads()} thread(s)")
    report = ai3.explore(
        net.eval(), shape, ops, algorithms,
        max_workspace=args.max_workspace, repeat=args.repeat, progress=not args.no_progress,
        cache=not args.no_cache,
    )  # fmt: skip
    print(report)
    written = report.save(args.out)
    if args.plan:
        report.plan.save(args.plan)
        written["plan (--plan)"] = Path(args.plan)
    print(f"\nwrote into {args.out}:")
    for kind, path in written.items():
        print(f"  {kind:<5} {path}")
    if "png" not in written:
        print(f"  (no PNG: {ai3.autotune.report.PLOTS_HINT})")
    print(f"deploy the plan: ai3.convert(net, plan={str(written['plan'])!r})")
    return 0


def _add_explore(commands) -> None:
    p = commands.add_parser(
        "explore",
        help="time every algorithm of every layer, next to PyTorch; save the best plan",
        description="Times every algorithm that can run each layer of MODEL on its input "
        "shape, next to PyTorch, prints the table and writes report.csv, report.json, "
        "plan.json and report.png (with matplotlib) into --out.",
    )
    p.add_argument("model", nargs="?", help="a torchvision model name (random weights) or "
                   "package.module:callable; none: a small built-in network")  # fmt: skip
    p.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    p.add_argument("--size", type=int, nargs=2, metavar=("H", "W"),
                   help="image size (default 224 224; 32 32 for the built-in network)")  # fmt: skip
    p.add_argument("--ops", default="conv2d,linear", help="operations to explore (default conv2d,linear)")  # fmt: skip
    p.add_argument("--algorithms", help="only these algorithms, comma-separated")
    p.add_argument("--max-workspace", type=int, metavar="BYTES",
                   help="never choose an algorithm needing more scratch memory")  # fmt: skip
    p.add_argument("--repeat", type=int, default=7, help="most timed calls per algorithm")
    p.add_argument("--out", default="ai3-explore", help="output folder (default ai3-explore)")
    p.add_argument("--plan", help="also write the plan to this path")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-cache", action="store_true",
                   help="measure everything again (neither read nor write the measurement cache)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m ai3``."""
    parser = argparse.ArgumentParser(
        prog="python -m ai3",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")
    _add_explore(commands)
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
    if args.command == "explore":
        return explore(args)
    return demo() if args.command == "demo" else algorithms()


if __name__ == "__main__":
    sys.exit(main())
