"""Type stub of the Rust extension ``ai3._core``."""

from typing import Any

class Model:
    def __init__(self, dtype: str, num_inputs: int, copy_weights: bool = True) -> None: ...
    @property
    def dtype(self) -> str: ...
    def conv2d(
        self,
        name: str,
        x: int,
        weight: Any,
        bias: Any | None,
        stride: tuple[int, int],
        padding: tuple[int, int, int, int],
        dilation: tuple[int, int],
        groups: int,
        padding_mode: str,
        algorithm: str,
    ) -> int: ...
    def linear(self, name: str, x: int, weight: Any, bias: Any | None, algorithm: str) -> int: ...
    def relu(self, name: str, x: int, algorithm: str) -> int: ...
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
    def flatten(self, name: str, x: int, start_dim: int, end_dim: int, algorithm: str) -> int: ...
    def set_outputs(self, outputs: list[int]) -> None: ...
    def run(self, inputs: list[Any]) -> list[Any]: ...
    def summary(self, input_shapes: list[list[int]]) -> list[dict[str, Any]]: ...
    def nodes(self) -> list[tuple[str, str]]: ...

def algorithms() -> list[dict[str, Any]]: ...
def selectable() -> list[tuple[str, list[str]]]: ...
def check_algorithm(op: str, algorithm: str) -> None: ...
def dlpack_roundtrip(x: Any) -> tuple[int, Any, int]: ...
