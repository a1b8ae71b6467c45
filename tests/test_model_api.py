"""The user-facing surface of ``ai3.Model`` and the CLI: the summary table and repr,
``predict`` with ``out_type``, ``ai3.Tensor``, the inference-only warning,
``SUPPORTED_ALGORITHMS`` and the ``python -m ai3`` help and listings."""

from __future__ import annotations

import re
import warnings

import ai3
import numpy as np
import pytest
import torch
from ai3 import testing
from ai3.__main__ import main
from conftest import assert_close
from torch import nn

SHAPE = (2, 3, 16, 16)

#: The operations of the reference ai3, each with a user C++ hook ('custom').
REFERENCE_OPS = (
    "conv2d",
    "linear",
    "relu",
    "maxpool2d",
    "avgpool2d",
    "adaptiveavgpool2d",
    "flatten",
)


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 16, 3)
        self.fc = nn.Linear(16 * 6 * 6, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv1(x)))
        x = torch.relu(self.conv2(x))
        return self.fc(torch.flatten(x, 1))


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x, y):
        return torch.relu(self.conv(x)) * y


def _net_and_model(**kwargs):
    net = ConvNet().eval()
    return net, ai3.convert(net, {"conv2d": ["direct", "smm"]}, **kwargs)


def _columns(text: str) -> list[list[str]]:
    """Splits a table printed with two spaces between columns."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()]


# ---- summary, profile, repr ---------------------------------------------------------------------


def test_summary_prints_an_aligned_table_and_keeps_its_rows():
    net, model = _net_and_model()
    x = torch.randn(SHAPE)
    summary = model.summary(SHAPE)
    assert isinstance(summary, ai3.Summary)
    rows = summary.rows
    assert isinstance(rows, list) and all(isinstance(r, dict) for r in rows)
    # Still usable as the list of dicts it used to be.
    assert len(summary) == len(rows) and list(summary) == rows and summary[0] is rows[0]
    assert summary == rows

    text = str(summary)
    lines = text.splitlines()
    header = lines[0]
    for column in ("name", "op", "algorithm", "layout", "input shapes", "output shape"):
        assert column in header
    assert len(lines) == 1 + len(rows)
    # Every column starts at the same place on every line.
    starts = [
        header.index(c) for c in ("op", "algorithm", "layout", "input shapes", "output shape")
    ]
    for line, row in zip(lines[1:], rows, strict=True):
        assert [line[s - 2 : s] for s in starts] == ["  "] * 5, line
        assert line[starts[1] :].startswith(row["algorithm"])
        assert line[starts[2] :].startswith(row["layout"])
    cells = _columns(text)[1:]
    assert [c[0] for c in cells] == [r["name"] for r in rows]
    # The fused activation, the algorithm that runs, the layout and the
    # shapes, read from the table.
    # (The first layer runs on the blocked direct kernel where the CPU has
    # it, in NCHW8c, and the table says so.)
    assert rows[0]["layout"] == ("NCHW8c" if ai3.cpu_isa() in ("avx2", "avx512") else "NCHW")
    assert cells[0][1:5] == ["conv2d+relu", "direct", rows[0]["layout"], str(list(SHAPE))]
    assert cells[2][1:3] == ["conv2d+relu", "smm"]
    assert cells[-1][1] == "linear" and cells[-1][2] != "default"
    assert cells[-1][-1] == str(list(net(x).shape))
    assert repr(summary) == text


def test_profile_returns_a_summary_with_times():
    _, model = _net_and_model()
    x = torch.randn(SHAPE)
    profile = model.profile(x, repeat=2)
    assert isinstance(profile, ai3.Summary)
    assert [r["name"] for r in profile] == [r["name"] for r in model.summary(SHAPE)]
    assert all(r["ms"] >= 0 for r in profile)
    lines = str(profile).splitlines()
    # The times, then the reorders where there are some.
    header = lines[0].split()
    reorders = any(r["reorders"] for r in profile)
    assert header[-2:] == ["ms", "reorders"] if reorders else header[-1] == "ms"
    assert len(lines) == len(profile) + 2  # header, rows, total
    total = float(lines[-1].split()[-1])
    assert lines[-1].startswith("total")
    assert total == pytest.approx(sum(r["ms"] for r in profile), abs=2e-3)
    assert profile.total_ms == pytest.approx(sum(r["ms"] for r in profile))
    assert model.summary(SHAPE).total_ms is None


def test_repr_before_any_call_shows_requested_algorithms_and_fusion():
    _, model = _net_and_model()
    text = repr(model)
    assert text.splitlines()[0] == "ai3.Model(dtype=float32)"
    cells = _columns(text)
    assert cells[1] == ["name", "op", "algorithm (requested)"]
    assert cells[2] == ["conv1", "conv2d+relu", "direct"]
    assert cells[3] == ["pool", "maxpool2d", "default"]
    assert cells[4] == ["conv2", "conv2d+relu", "smm"]
    assert "after the first call" in text and "sample_input_shape" in text


def test_repr_after_a_call_shows_that_calls_shapes():
    net, model = _net_and_model()
    for shape in (SHAPE, (1, 3, 16, 16)):
        x = torch.randn(shape)
        assert_close(model(x), net(x))
        text = repr(model)
        assert text.splitlines()[0] == f"ai3.Model(dtype=float32, input_shape={list(shape)})"
        assert "\n".join(line[2:] for line in text.splitlines()[1:]) == str(model.summary(shape))
        assert str(list(net(x).shape)) in text
        # summary() without a shape also uses the latest call's.
        assert model.summary() == model.summary(shape)


def test_repr_prefers_the_sample_input_shape():
    net, model = _net_and_model(sample_input_shape=(1, 3, 16, 16))
    model(torch.randn(4, 3, 16, 16))
    assert repr(model).splitlines()[0] == "ai3.Model(dtype=float32, input_shape=[1, 3, 16, 16])"


def test_a_rejected_call_leaves_the_shapes_of_the_previous_one():
    _, model = _net_and_model()
    model(torch.randn(SHAPE))
    with pytest.raises(ai3.Error):
        model(torch.randn(2, 5, 16, 16))
    assert f"input_shape={list(SHAPE)}" in repr(model)


def test_summary_without_any_shape_is_an_invalid_argument():
    _, model = _net_and_model()
    with pytest.raises(ai3.InvalidArgumentError, match="summary: an input shape is needed"):
        model.summary()


# ---- predict and out_type -----------------------------------------------------------------------


def test_predict_takes_out_type_positionally():
    net, model = _net_and_model()
    x = torch.randn(SHAPE)
    expected = net(x)
    t = model.predict(x, torch.Tensor)
    assert type(t) is torch.Tensor
    assert_close(t, expected)
    n = model.predict(x, np.ndarray)
    assert isinstance(n, np.ndarray) and n.shape == tuple(expected.shape)
    assert_close(torch.from_numpy(n), expected)
    assert isinstance(model.predict(x, ai3.Tensor), ai3.Tensor)


@pytest.mark.parametrize("bad", [list, torch.randn(1), "torch", float])
def test_predict_rejects_other_out_types(bad):
    _, model = _net_and_model()
    with pytest.raises(TypeError, match=r"torch\.Tensor, numpy\.ndarray or ai3\.Tensor"):
        model.predict(torch.randn(SHAPE), bad)


def test_several_inputs_go_to_call_or_as_a_tuple_to_predict():
    net = TwoInputs().eval()
    model = ai3.convert(net)
    x, y = torch.randn(1, 3, 6, 6), torch.randn(1, 4, 4, 4)
    expected = net(x, y)
    assert_close(model(x, y), expected)
    assert_close(model.forward(x, y), expected)
    assert_close(model.predict((x, y)).torch(), expected)
    assert_close(model.predict([x, y], torch.Tensor), expected)
    # The multi-input repr lists both shapes.
    assert "input_shape=[[1, 3, 6, 6], [1, 4, 4, 4]]" in repr(model)


# ---- ai3.Tensor ---------------------------------------------------------------------------------


def test_predict_returns_an_ai3_tensor_and_call_a_torch_tensor(monkeypatch):
    net, model = _net_and_model()
    x = torch.randn(SHAPE)
    produced = []
    from_dlpack = torch.from_dlpack

    def recording(capsule):
        produced.append(from_dlpack(capsule))
        return produced[-1]

    monkeypatch.setattr(torch, "from_dlpack", recording)
    t = model.predict(x)
    monkeypatch.undo()
    assert isinstance(t, ai3.Tensor)
    assert type(model(x)) is torch.Tensor
    # The tensor made from ai3's DLPack capsule is held as it is, never copied.
    assert len(produced) == 1 and t.torch() is produced[0] and t.to(torch.Tensor) is produced[0]
    assert t.to(ai3.Tensor) is t
    assert_close(t.torch(), net(x))
    assert t.shape == tuple(net(x).shape) and t.dtype == torch.float32 and len(t) == SHAPE[0]
    array = t.numpy()
    assert isinstance(array, np.ndarray) and np.shares_memory(array, t.torch().numpy())
    assert array.ctypes.data == t.torch().data_ptr()
    assert np.shares_memory(t.to(np.ndarray), array)
    assert np.shares_memory(np.asarray(t), array)
    assert not np.shares_memory(np.array(t, copy=True), array)
    assert torch.from_dlpack(t).data_ptr() == t.torch().data_ptr()
    assert repr(t) == "ai3.Tensor(shape=[2, 10], dtype=float32)"


def test_ai3_tensor_rejects_other_types():
    t = ai3.Tensor(torch.zeros(2))
    with pytest.raises(TypeError, match=r"torch\.Tensor, numpy\.ndarray or ai3\.Tensor"):
        t.to(list)
    with pytest.raises(TypeError, match="expected a torch.Tensor"):
        ai3.Tensor([1.0, 2.0])


# ---- inference only -----------------------------------------------------------------------------


def test_input_requiring_grad_warns_once_per_model():
    net, model = _net_and_model()
    x = torch.randn(SHAPE, requires_grad=True)
    with pytest.warns(UserWarning, match="inference-only") as record:
        y = model(x)
    assert y.grad_fn is None
    assert "ai3.swap_operation" in str(record[0].message)
    assert record[0].filename == __file__  # points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_close(model(x), net(x))
        model.predict(x)
    # Another model warns on its own.
    _, other = _net_and_model()
    with pytest.warns(UserWarning, match="inference-only"):
        other.predict(x, torch.Tensor)


def test_no_warning_without_grad_or_under_no_grad():
    _, model = _net_and_model()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(torch.randn(SHAPE))
        with torch.no_grad():
            model(torch.randn(SHAPE, requires_grad=True))
        with torch.inference_mode():
            model(torch.randn(SHAPE))


# ---- SUPPORTED_ALGORITHMS -----------------------------------------------------------------------


def test_supported_algorithms_list_default_and_custom():
    registry: dict[str, set[str]] = {}
    for row in ai3.algorithm_table():
        registry.setdefault(row["op"], set()).add(row["algorithm"])
    assert set(ai3.SUPPORTED_ALGORITHMS) == set(registry)
    for op, names in ai3.SUPPORTED_ALGORITHMS.items():
        assert "default" in names, op
        assert set(names) == registry[op] | {"default", "auto"}, op
        assert len(names) == len(set(names)), op
    for op in REFERENCE_OPS:
        assert "custom" in ai3.SUPPORTED_ALGORITHMS[op], op


# ---- command line -------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["--help"], ["test", "--help"]])
def test_cli_help_is_plain_text(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "usage: python -m ai3" in out and "examples:" in out
    for markup in ("``", ":mod:", ":func:", ":class:", ":data:"):
        assert markup not in out


def _row(out: str, op: str, algorithm: str, device: str | None) -> str:
    """The line of ``algorithm`` (names may have spaces) for ``op``, on ``device``
    where the table has a device column."""
    tail = rf"\s+{device}\b" if device else r"(\s|$)"
    pattern = rf"{re.escape(op)}\s+{re.escape(algorithm)}{tail}"
    return next(line for line in out.splitlines() if re.match(pattern, line))


def _check_notes(out: str, unavailable: dict[tuple[str, str, str | None], str]) -> None:
    """Each reason once, in a numbered note; rows short and pointing at their note."""
    notes: dict[str, list[tuple[str, str]]] = {}
    for line in out.splitlines():
        match = re.match(r"  \[(\d+)\] ([\w, ]+): (.*)$", line)
        if match:
            number, ops, text = match.groups()
            for op in ops.split(", "):
                notes.setdefault(op, []).append((number, text))
            assert out.count(text) == 1
    for (op, algorithm, device), reason in unavailable.items():
        number, text = next((n, t) for n, t in notes[op] if t.replace("<op>", op) == reason)
        row = _row(out, op, algorithm, device)
        assert row.endswith(f"note {number}]") or row.endswith(f"note [{number}]"), row
        assert len(row) < 120, row


def test_cli_algorithms_prints_each_reason_once(capsys):
    assert main(["algorithms"]) == 0
    out = capsys.readouterr().out
    table = ai3.algorithm_table()
    # Whether this build has unavailable algorithms depends on cpp_custom/; the rows are
    # short either way, and any reason is given once.
    for row in table:
        line = _row(out, row["op"], row["algorithm"], row["device"])
        assert len(line) < 120, line
    _check_notes(
        out,
        {
            (r["op"], r["algorithm"], r["device"]): r["unavailable"]
            for r in table
            if r["unavailable"]
        },
    )


def test_test_summary_shares_one_note_for_reasons_differing_by_operation():
    reasons = {
        (
            "conv2d",
            "custom",
        ): "custom conv2d is missing: write conv2d.cpp in /tmp/long/path/cpp_custom",
        ("relu", "custom"): "custom relu is missing: write relu.cpp in /tmp/long/path/cpp_custom",
        ("linear", "custom"): "no C++ compiler was found",
    }
    report = testing.Report(
        torch.float32,
        unavailable=[
            testing.Unavailable(op, a, why, a == "custom" and op == "relu")
            for (op, a), why in reasons.items()
        ],
        order=list(reasons),
    )
    out = report.format_summary()
    _check_notes(out, {(op, a, None): why for (op, a), why in reasons.items()})
    assert (
        "[1] conv2d, relu: custom <op> is missing: write <op>.cpp in /tmp/long/path/cpp_custom"
        in out
    )
    assert "[2] linear: no C++ compiler was found" in out
    assert "error: relu algorithm 'custom' is unavailable [1]" in out
    assert out.splitlines()[-1] == "FAILED"
