"""Builds ai3 from source with user C++ (``AI3_CUSTOM_DIR``) and checks the result
in a fresh virtual environment that has torch but no Rust toolchain on its PATH.

The build tests run ``maturin build --release`` in the repository's cargo target
directory, so they take minutes but reuse the dependencies pip's build compiled there;
the manylinux one builds for an explicit target (nothing to reuse) with the lighter
``wheel-check`` profile.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "custom_conv2d"

# Every test here but the venv check builds a wheel or an sdist: slow, and needs cargo.
needs_cargo = pytest.mark.skipif(
    shutil.which("cargo") is None, reason="building ai3 from source needs cargo on PATH"
)


def build_wheel(
    out: Path, custom_dir: Path | None, *extra: str, profile: str = "release"
) -> subprocess.CompletedProcess:
    """``maturin build --profile <profile>`` into ``out``; output captured, never raises
    on failure."""
    env = dict(os.environ, CARGO_TARGET_DIR=str(REPO / "target"))
    env.pop("AI3_CUSTOM_DIR", None)
    if custom_dir is not None:
        env["AI3_CUSTOM_DIR"] = str(custom_dir)
    cmd = [sys.executable, "-m", "maturin", "build", "--profile", profile, "-o", str(out)]
    cmd += ["-i", sys.executable, *extra]
    return subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600, check=False
    )


def no_rust_path(venv: Path) -> str:
    """The venv's bin, then the current PATH minus every directory holding cargo or rustc."""
    keep = [
        p
        for p in os.environ.get("PATH", "").split(os.pathsep)
        if p and not any((Path(p) / tool).exists() for tool in ("cargo", "rustc", "rustup"))
    ]
    path = os.pathsep.join([str(venv / "bin"), *keep])
    assert shutil.which("cargo", path=path) is None
    assert shutil.which("rustc", path=path) is None
    return path


def outer_site_dirs() -> list[str]:
    """The site-packages directories of the running environment (venv or not), in order."""
    paths = sysconfig.get_paths()
    dirs = [paths["purelib"], paths["platlib"], *site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    seen: list[str] = []
    for d in dirs:
        if d not in seen and Path(d).is_dir():
            seen.append(d)
    return seen


def make_venv(where: Path) -> Path:
    """A new venv whose Python also sees this environment's packages (torch); returns its python.

    ``--system-site-packages`` is not enough: made from inside a venv it inherits the
    *base* interpreter's site-packages, not the venv's, so torch would be missing. A
    ``.pth`` file listing this environment's site-packages works whatever the outer
    interpreter is; its entries come after the new venv's own site-packages, so a wheel
    installed there shadows any ai3 installed outside."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    python = where / "bin" / "python"
    (purelib(python) / "_ai3_outer_env.pth").write_text("\n".join(outer_site_dirs()) + "\n")
    return python


def purelib(python: Path) -> Path:
    """The site-packages directory of the interpreter ``python``."""
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def fresh_venv(where: Path, wheel: Path) -> tuple[Path, dict[str, str]]:
    """A venv seeing this environment's torch, with ``wheel`` installed; returns (python, env).

    The wheel is installed with ``--no-deps`` (torch comes from outside) and
    ``--force-reinstall``, because an ai3 installed in the outer environment would
    otherwise count as already satisfying the wheel. ``env`` has no Rust on its PATH."""
    python = make_venv(where)
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--force-reinstall",
            str(wheel),
        ],
        check=True,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CARGO", "RUST"))}
    env["PATH"] = no_rust_path(where)
    # PYTHONPATH would put a source checkout's ai3 ahead of the installed wheel.
    for var in ("AI3_CUSTOM_DIR", "PYTHONPATH"):
        env.pop(var, None)
    return python, env


def test_fresh_venv_sees_this_environments_torch(tmp_path):
    """The venv the wheel tests use imports the outer environment's torch (also when
    the outer interpreter is itself a venv) and its own ai3 ahead of any outer one."""
    import torch

    python = make_venv(tmp_path / "venv")
    inner = str(purelib(python))
    # A stand-in for the installed wheel: it must win over the outer ai3.
    (Path(inner) / "ai3").mkdir()
    (Path(inner) / "ai3" / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import sys, torch, ai3; print(torch.__file__); print(ai3.__file__); print(sys.prefix)"
    ran = run_in(python, env, code, tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    torch_file, ai3_file, prefix = ran.stdout.split()
    assert Path(torch_file).resolve() == Path(torch.__file__).resolve()
    assert Path(ai3_file).resolve() == (Path(inner) / "ai3" / "__init__.py").resolve()
    assert Path(prefix).resolve() == (tmp_path / "venv").resolve()


def run_in(python: Path, env: dict[str, str], code: str, cwd: Path) -> subprocess.CompletedProcess:
    """Runs ``code`` with the venv's Python."""
    return subprocess.run(
        [str(python), "-c", textwrap.dedent(code)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def ai3_cli(
    python: Path, env: dict[str, str], cwd: Path, *args: str
) -> subprocess.CompletedProcess:
    """``python -m ai3 <args>`` in the venv."""
    return subprocess.run(
        [str(python), "-m", "ai3", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def only_wheel(out: Path) -> Path:
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


# The user's directory for the main test: the worked example with DEFAULT_CONV2D
# switched on, plus a relu that throws a std::exception and a linear that throws
# something else, to check both reach Python as exceptions.
THROWING_RELU = """
#include "relu.hpp"
#include <stdexcept>
void ai3::custom::relu(const ai3::Tensor &input, ai3::Tensor &) {
    throw std::runtime_error("relu says no to " + std::to_string(input.numel()) + " elements");
}
"""
THROWING_LINEAR = """
#include "linear.hpp"
void ai3::custom::linear(const ai3::Tensor &, const ai3::Tensor &, const ai3::Tensor *,
                         ai3::Tensor &) {
    throw 42;
}
"""

CHECK_CUSTOM = """
import copy, sys
import ai3, torch
from torch import nn

assert ai3.__file__.startswith(sys.prefix), (ai3.__file__, sys.prefix)
torch.manual_seed(0)
net = nn.Sequential(
    nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
    nn.Conv2d(8, 6, (3, 1), stride=(2, 1), padding=(1, 0), dilation=(1, 1), groups=2),
    # An even kernel with padding="same" pads unevenly: ai3 applies that padding first.
    nn.Conv2d(6, 6, 2, padding="same", groups=6, bias=False),
    nn.Flatten(), nn.Linear(6 * 4 * 8, 5),
).eval()
x = torch.randn(2, 3, 8, 8)
ref = net(x)
tol = dict(atol=1e-4 * max(1.0, ref.abs().max().item()), rtol=1e-4)
for selector in ["custom", "default"]:
    model = ai3.convert(net, {"conv2d": selector}, sample_input_shape=x.shape)
    algos = [r["algorithm"] for r in model.summary() if r["op"] == "conv2d"]
    assert algos == ["custom"] * 3, (selector, algos)
    torch.testing.assert_close(model(x), ref, **tol)
    swapped = copy.deepcopy(net)
    ai3.swap_conv2d(swapped, selector)
    torch.testing.assert_close(swapped(x), ref, **tol)
    # f64 and an unbatched input go through the same C++.
    m64 = ai3.convert(net.double(), {"conv2d": selector})
    torch.testing.assert_close(m64(x.double()), ref.double(), atol=1e-3, rtol=1e-3)
    net.float()
    torch.testing.assert_close(ai3.convert(net[:1], {"conv2d": selector})(x[0]), net[:1](x[0]), **tol)

# Built-in algorithms stay selectable next to the user's.
direct = ai3.convert(net, {"conv2d": "direct"})
torch.testing.assert_close(direct(x), ref, **tol)

try:
    ai3.convert(nn.Sequential(nn.ReLU()), {"relu": "custom"})(x)
except ai3.CustomError as e:
    assert "relu says no to 384 elements" in str(e), e
else:
    raise AssertionError("relu did not raise")
try:
    ai3.convert(nn.Sequential(nn.Linear(4, 2)), {"linear": "custom"})(torch.randn(3, 4))
except ai3.CustomError as e:
    assert "not a std::exception" in str(e), e
else:
    raise AssertionError("linear did not raise")
try:
    ai3.convert(nn.Sequential(nn.MaxPool2d(2)), {"maxpool2d": "custom"})
except ai3.AlgorithmError as e:
    assert "custom maxpool2d is not implemented" in str(e) and "maxpool2d.cpp" in str(e), e
else:
    raise AssertionError("maxpool2d custom was accepted")
print("custom checks passed")
"""


@pytest.mark.slow
@needs_cargo
def test_custom_example_builds_and_matches_pytorch(tmp_path):
    custom = tmp_path / "my_impls"
    shutil.copytree(EXAMPLE, custom)
    # DEFAULT_CONV2D = true through the directory's build.cfg (which also
    # exercises the config file), so 'default' must pick the example's conv2d.
    (custom / "build.cfg").write_text(
        "# flags for the test\ncxxflags = -DAI3_DEFAULT_CONV2D=true\n"
    )
    (custom / "relu.cpp").write_text(THROWING_RELU)
    (custom / "linear.cpp").write_text(THROWING_LINEAR)

    built = build_wheel(tmp_path / "dist", custom)
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-8000:]
    python, env = fresh_venv(tmp_path / "venv", only_wheel(tmp_path / "dist"))

    checked = run_in(python, env, CHECK_CUSTOM, tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "custom checks passed" in checked.stdout

    suite = ai3_cli(python, env, tmp_path, "test", "--op", "conv2d", "--algorithm", "custom")
    assert suite.returncode == 0, suite.stdout + suite.stderr
    assert " 0 failed" in suite.stdout, suite.stdout


@pytest.mark.slow
@needs_cargo
def test_cpp_compile_error_reaches_the_user(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "conv2d.cpp").write_text(
        '#include "conv2d.hpp"\n'
        "namespace ai3::custom {\n"
        "void conv2d(const Tensor &, const Tensor &, const Tensor *, std::int64_t, std::int64_t,\n"
        "            std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,\n"
        "            Tensor &) {\n"
        "    undeclared_identifier_for_the_test = 1;\n"
        "}\n"
        "}\n"
    )
    built = build_wheel(tmp_path / "dist", broken)
    out = built.stdout + built.stderr
    assert built.returncode != 0
    assert "undeclared_identifier_for_the_test" in out, out[-8000:]
    assert "conv2d.cpp" in out and "error" in out, out[-8000:]
    assert not list(tmp_path.glob("dist/*.whl"))


@pytest.mark.slow
@needs_cargo
def test_missing_custom_dir_is_a_clear_build_error(tmp_path):
    built = build_wheel(tmp_path / "dist", tmp_path / "does_not_exist")
    assert built.returncode != 0
    out = built.stdout + built.stderr
    assert "AI3_CUSTOM_DIR" in out and "does_not_exist" in out and "is not a directory" in out, out[
        -4000:
    ]


SMOKE = """
import sys
import ai3, torch
from torch import nn

assert ai3.__file__.startswith(sys.prefix), (ai3.__file__, sys.prefix)
torch.manual_seed(0)
net = nn.Sequential(
    nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(8, 8, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4),
).eval()
x = torch.randn(2, 3, 16, 16)
ref = net(x)
for algo in ["default", "direct", "smm", "gemm", "winograd", "fft"]:
    torch.testing.assert_close(ai3.convert(net, {"conv2d": algo})(x), ref, atol=1e-4, rtol=1e-4)
try:
    ai3.convert(net, {"conv2d": "custom"})
except ai3.AlgorithmError as e:
    assert "custom conv2d is not implemented" in str(e), e
else:
    raise AssertionError("custom was accepted in a stock wheel")
ai3.swap_conv2d(net, "gemm")
torch.testing.assert_close(net(x), ref, atol=1e-4, rtol=1e-4)
print("smoke passed")
"""


@pytest.mark.slow
@needs_cargo
@pytest.mark.skipif(
    not (sys.platform == "linux" and os.uname().machine == "x86_64"),
    reason="the manylinux2014 wheel is built and checked for x86-64 Linux",
)
def test_manylinux_wheel_installs_and_runs_without_rust(tmp_path):
    pytest.importorskip("ziglang", reason="the manylinux2014 build needs ziglang (test extra)")
    # maturin runs zig as `<python> -m ziglang`: point it at the Python that has it.
    os.environ.setdefault("CARGO_ZIGBUILD_PYTHON_PATH", sys.executable)
    # Built for an explicit target, so nothing of the release build pip made is reused:
    # the lighter `wheel-check` profile (Cargo.toml) compiles everything faster, and the
    # packaging this checks does not depend on the optimisation level.
    built = build_wheel(
        tmp_path / "dist",
        None,
        "--zig",
        "--compatibility",
        "manylinux2014",
        profile="wheel-check",
    )
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-8000:]
    wheel = only_wheel(tmp_path / "dist")
    # One abi3 wheel for every CPython >= 3.10, passing maturin's manylinux_2_17 check.
    assert "-cp310-abi3-" in wheel.name and "manylinux_2_17_x86_64" in wheel.name, wheel.name

    python, env = fresh_venv(tmp_path / "venv", wheel)
    smoke = run_in(python, env, SMOKE, tmp_path)
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert "smoke passed" in smoke.stdout
    suite = ai3_cli(python, env, tmp_path, "test", "--quick")
    assert suite.returncode == 0, suite.stdout + suite.stderr


@pytest.mark.slow
@needs_cargo
def test_sdist_carries_the_cpp_sources(tmp_path):
    import tarfile

    made = subprocess.run(
        [sys.executable, "-m", "maturin", "sdist", "-o", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    (sdist,) = tmp_path.glob("aithree-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    stock = [p.name for p in (REPO / "cpp_custom").iterdir() if p.suffix in (".hpp", ".cpp")]
    assert "ai3.hpp" in stock and "conv2d.cpp" in stock
    for name in stock:
        assert f"cpp_custom/{name}" in names, name
    for path in [
        "crates/ai3-kernels/build.rs",
        "crates/ai3-kernels/src/custom/bridge.cc",
        "crates/ai3-kernels/src/custom/bridge.h",
        "crates/ai3-kernels/src/custom/mod.rs",
    ]:
        assert path in names, path


def test_extras_never_pin_an_old_torch():
    """Installing an extra must not downgrade the user's torch: torch and torchvision
    have lower bounds only, and .ci/check-torch-floor tests exactly those bounds."""
    import re

    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    floor_script = (REPO / ".ci" / "check-torch-floor").read_text()
    floors = dict(re.findall(r"^(TORCH|TORCHVISION)_FLOOR=(\S+)$", floor_script, re.M))
    groups = {"dependencies": project["dependencies"], **project["optional-dependencies"]}
    for group, reqs in groups.items():
        for req in reqs:
            name = re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower()
            if name not in ("torch", "torchvision"):
                continue
            spec = req[len(name) :].replace(" ", "")
            assert re.fullmatch(r">=[0-9.]+", spec), (group, req)
            assert spec[2:] == floors[name.upper()], (group, req, floors)
    assert "torch>=" + floors["TORCH"] in project["optional-dependencies"]["test"]
    assert "hypothesis>=6" in project["optional-dependencies"]["test"]


def test_ci_runs_the_readme_test_command_in_a_fresh_venv():
    """.ci/run makes and activates a venv, then runs the README's test command verbatim;
    that command's `cargo test` leaves out the criterion benchmarks crate."""
    import re

    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Run the tests\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1).strip().splitlines()
    assert block[0] == "python3 -m venv .venv && . .venv/bin/activate", block
    command = block[-1]
    assert "cargo test" in command and "python3 -m pytest" in command, command
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert command in ci, (command, ci)
    made = next(i for i, line in enumerate(ci) if line.startswith("python3 -m venv "))
    activated = next(
        i for i, line in enumerate(ci) if re.fullmatch(r'\. "?\S+/bin/activate"?', line)
    )
    assert made < activated < ci.index(command)

    workspace = tomllib.loads((REPO / "Cargo.toml").read_text())["workspace"]
    assert "benches" in workspace["members"]  # still buildable: cargo bench -p ai3-benches
    assert "--workspace" not in command
    assert "benches" not in workspace["default-members"]
    assert sorted(workspace["default-members"]) == sorted(
        m for m in workspace["members"] if m != "benches"
    )
