"""Type stub of the Rust extension ``ai3._core``."""

from typing import Any

#: A reshape size expression: ``("const", v)`` (``-1`` infers), ``("dim", input, axis)``,
#: or ``("add" | "sub" | "mul" | "floordiv", a, b)``; a bare int is a constant.
SizeExpr = int | tuple[Any, ...]

#: A layer's weight: a tensor the layer holds (prepared once), or an int naming
#: a graph value the layer reads on every call. A layer's weights are all one or
#: all the other.
Weight = Any

class Model:
    def __init__(self, dtype: str, num_inputs: int, copy_weights: bool = True) -> None: ...
    @property
    def dtype(self) -> str: ...
    def conv2d(
        self,
        name: str,
        x: int,
        weight: Weight,
        bias: Weight | None,
        stride: tuple[int, int],
        padding: tuple[int, int, int, int],
        dilation: tuple[int, int],
        groups: int,
        padding_mode: str,
        algorithm: str,
        activation: tuple[str, list[float]] | None = None,
    ) -> int: ...
    def linear(
        self,
        name: str,
        x: int,
        weight: Weight,
        bias: Weight | None,
        algorithm: str,
        activation: tuple[str, list[float]] | None = None,
    ) -> int: ...
    def relu(self, name: str, x: int, algorithm: str) -> int: ...
    def activation(
        self, name: str, x: int, kind: str, params: list[float], algorithm: str
    ) -> int: ...
    def binary(
        self,
        name: str,
        kind: str,
        inputs: list[int],
        scalar: float | None,
        scalar_first: bool,
        algorithm: str,
        activation: tuple[str, list[float]] | None = None,
    ) -> int: ...
    def cat(self, name: str, inputs: list[int], dim: int, algorithm: str) -> int: ...
    def softmax(self, name: str, x: int, dim: int, algorithm: str) -> int: ...
    def batchnorm2d(
        self,
        name: str,
        x: int,
        weight: Weight | None,
        bias: Weight | None,
        running_mean: Weight,
        running_var: Weight,
        eps: float,
        algorithm: str,
        activation: tuple[str, list[float]] | None = None,
    ) -> int: ...
    def layernorm(
        self,
        name: str,
        x: int,
        normalized_shape: list[int],
        weight: Weight | None,
        bias: Weight | None,
        eps: float,
        algorithm: str,
    ) -> int: ...
    def maxpool2d(
        self,
        name: str,
        x: int,
        kernel: tuple[int, int],
        stride: tuple[int, int],
        padding: tuple[int, int],
        dilation: tuple[int, int],
        ceil_mode: bool,
        algorithm: str,
    ) -> int: ...
    def avgpool2d(
        self,
        name: str,
        x: int,
        kernel: tuple[int, int],
        stride: tuple[int, int],
        padding: tuple[int, int],
        ceil_mode: bool,
        count_include_pad: bool,
        divisor_override: int | None,
        algorithm: str,
    ) -> int: ...
    def adaptiveavgpool2d(
        self, name: str, x: int, output_size: tuple[int | None, int | None], algorithm: str
    ) -> int: ...
    def adaptivemaxpool2d(
        self, name: str, x: int, output_size: tuple[int | None, int | None], algorithm: str
    ) -> int: ...
    def flatten(self, name: str, x: int, start_dim: int, end_dim: int, algorithm: str) -> int: ...
    def mean(self, name: str, x: int, dims: list[int], keepdim: bool, algorithm: str) -> int: ...
    def permute(self, name: str, x: int, dims: list[int], algorithm: str) -> int: ...
    def reshape(
        self, name: str, inputs: list[int], spec: list[SizeExpr], algorithm: str
    ) -> int: ...
    def slice(
        self,
        name: str,
        x: int,
        dim: int,
        index: int,
        chunks: int | None,
        split_size: int | None,
        sections: list[int] | None,
        algorithm: str,
    ) -> int: ...
    def set_outputs(self, outputs: list[int]) -> None: ...
    def run(self, inputs: list[Any]) -> list[Any]: ...
    def summary(self, input_shapes: list[list[int]]) -> list[dict[str, Any]]: ...
    def profile(self, inputs: list[Any], repeat: int) -> tuple[list[Any], list[float]]: ...
    def memory_plan(self, input_shapes: list[list[int]]) -> dict[str, int]: ...
    def candidates(self, input_shapes: list[list[int]]) -> list[list[dict[str, Any]]]: ...
    def nodes(self) -> list[tuple[str, str]]: ...

def algorithms() -> list[dict[str, Any]]: ...
def selectable() -> list[tuple[str, list[str]]]: ...
def check_algorithm(op: str, algorithm: str) -> None: ...
def runs_custom(op: str, algorithm: str) -> bool: ...
def dlpack_roundtrip(x: Any) -> tuple[int, Any, int]: ...
def set_num_threads(n: int) -> None: ...
def get_num_threads() -> int: ...
def _park_openmp(on: bool) -> bool: ...
def _parks_openmp() -> bool: ...
