"""ai3: fine-grained algorithmic control over the operations of PyTorch networks.

Two ways in:

- :func:`convert` (alias :func:`swap_backend`) turns a whole network into an
  :class:`ai3.Model` that runs entirely in Rust;
- :func:`swap_operation` (and ``swap_conv2d``, ``swap_linear``, ...) replaces
  modules in place, so the network still trains and compiles.

Both take algorithmic selectors: a name, a list in forward order, or a
function of the module (and its input shape). ``'auto'`` measures each
layer's algorithms and keeps the fastest; :func:`explore` reports every
algorithm of every layer next to PyTorch and gives a :class:`Plan` to save
and apply.
"""

from importlib.metadata import PackageNotFoundError, version

from . import testing  # the correctness suite behind ``python -m ai3 test``
from .algorithms import (
    DEFAULT_ALGOS,
    OPERATIONS,
    SUPPORTED_ALGORITHMS,
    algorithm_table,
    using_cublas,
    using_cudnn,
    using_mps_and_metal,
    using_sycl,
)
from .autotune import Auto, Plan, Report, explore
from .convert import convert, swap_backend
from .errors import (
    AlgorithmError,
    CustomError,
    DeviceError,
    DtypeError,
    Error,
    InternalError,
    InvalidArgumentError,
    OutOfMemoryError,
    PlanError,
    SelectorError,
    ShapeError,
    UnsupportedOperationError,
)
from .model import Model, Summary
from .selectors import AlgorithmicSelector
from .swap import (
    swap_adaptiveavgpool2d,
    swap_avgpool2d,
    swap_conv2d,
    swap_flatten,
    swap_linear,
    swap_maxpool2d,
    swap_operation,
    swap_relu,
)
from .tensor import Tensor
from .threads import cpu_isa, get_num_threads, set_num_threads

try:
    __version__ = version("aithree")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+unknown"

__all__ = [
    "AlgorithmError",
    "Auto",
    "CustomError",
    "AlgorithmicSelector",
    "DEFAULT_ALGOS",
    "DeviceError",
    "DtypeError",
    "Error",
    "InternalError",
    "InvalidArgumentError",
    "Model",
    "OPERATIONS",
    "OutOfMemoryError",
    "Plan",
    "PlanError",
    "Report",
    "SUPPORTED_ALGORITHMS",
    "SelectorError",
    "ShapeError",
    "Summary",
    "Tensor",
    "UnsupportedOperationError",
    "__version__",
    "algorithm_table",
    "get_num_threads",
    "cpu_isa",
    "set_num_threads",
    "convert",
    "explore",
    "swap_adaptiveavgpool2d",
    "swap_avgpool2d",
    "swap_backend",
    "swap_conv2d",
    "swap_flatten",
    "swap_linear",
    "swap_maxpool2d",
    "swap_operation",
    "swap_relu",
    "testing",
    "using_cublas",
    "using_cudnn",
    "using_mps_and_metal",
    "using_sycl",
]
