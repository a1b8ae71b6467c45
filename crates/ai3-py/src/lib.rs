//! `ai3._core`: the Python extension. It only converts between Python and
//! `ai3-core`: DLPack in and out, the GIL released around every computation,
//! errors mapped once (see [`errors`]). No algorithm logic lives here.

mod dlpack;
mod errors;

use ai3_core::ops::{
    AdaptiveAvgPool2d, AvgPool2d, Conv2d, Flatten, Linear, MaxPool2d, Operation, PadMode, Relu,
};
use ai3_core::params::{AvgPoolOptions, Padding2d};
use ai3_core::registry::{self, REGISTRY};
use ai3_core::{DType, Error, Graph, OpKind, Request, Tensor, ValueId};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::errors::{no_panic, to_py};

type Pair = (usize, usize);

fn parse_dtype(name: &str) -> PyResult<DType> {
    DType::from_name(name).ok_or_else(|| {
        to_py(Error::dtype(
            "model",
            format!("unsupported dtype {name}; ai3 computes in float32 and float64"),
        ))
    })
}

fn parse_request(op: OpKind, name: &str) -> PyResult<Request> {
    Request::parse(op, name).map_err(to_py)
}

fn parse_pad_mode(name: &str) -> PyResult<PadMode> {
    Ok(match name {
        "zeros" => PadMode::Zeros,
        "reflect" => PadMode::Reflect,
        "replicate" => PadMode::Replicate,
        "circular" => PadMode::Circular,
        other => {
            return Err(to_py(Error::invalid(
                OpKind::Conv2d.name(),
                format!(
                "padding_mode must be 'zeros', 'reflect', 'replicate' or 'circular', got '{other}'"
            ),
            )))
        }
    })
}

fn padding2d((top, bottom, left, right): (usize, usize, usize, usize)) -> Padding2d {
    Padding2d {
        top,
        bottom,
        left,
        right,
    }
}

/// A weight as a tensor of `dtype`: copied once at build time, or borrowed
/// (no copy) when `copy` is false and it already has the right dtype and layout.
fn import_weight(obj: &Bound<'_, PyAny>, op: OpKind, dtype: DType, copy: bool) -> PyResult<Tensor> {
    let t = dlpack::import(obj, op.name())?;
    if !copy && t.dtype() == dtype && t.is_contiguous() {
        return Ok(t);
    }
    t.to_dtype(dtype).map_err(to_py)
}

fn optional_weight(
    obj: Option<&Bound<'_, PyAny>>,
    op: OpKind,
    dtype: DType,
    copy: bool,
) -> PyResult<Option<Tensor>> {
    obj.map(|b| import_weight(b, op, dtype, copy)).transpose()
}

/// Runs a graph with the GIL released; returns DLPack capsules of the outputs.
fn run_graph<'py>(
    py: Python<'py>,
    graph: &Graph,
    inputs: &Bound<'py, PyList>,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let tensors: Vec<Tensor> = inputs
        .iter()
        .enumerate()
        .map(|(i, x)| dlpack::import(&x, graph.input_consumer(i)))
        .collect::<PyResult<_>>()?;
    let outputs = py
        .detach(|| no_panic("model", || graph.run(tensors)))
        .map_err(to_py)?;
    outputs.into_iter().map(|t| dlpack::export(py, t)).collect()
}

impl Model {
    /// Builds an operation and appends it reading `inputs`; a panic in either becomes an error.
    fn push<O: Operation + 'static>(
        &mut self,
        name: &str,
        inputs: Vec<ValueId>,
        build: impl FnOnce() -> ai3_core::Result<O>,
    ) -> PyResult<ValueId> {
        no_panic(name, || {
            let op = build()?;
            self.graph.push(name, Box::new(op), inputs)
        })
        .map_err(to_py)
    }
}

/// A network held in Rust: built node by node from Python, then run with the GIL released.
#[pyclass(module = "ai3._core")]
struct Model {
    graph: Graph,
    copy_weights: bool,
}

#[pymethods]
impl Model {
    /// An empty model computing in `dtype` (`"float32"` or `"float64"`) with `num_inputs` inputs.
    ///
    /// With `copy_weights=False` weights of the right dtype are borrowed from
    /// their tensors instead of copied (used for swapped modules, whose weights train).
    #[new]
    #[pyo3(signature = (dtype, num_inputs, copy_weights = true))]
    fn new(dtype: &str, num_inputs: usize, copy_weights: bool) -> PyResult<Self> {
        Ok(Model {
            graph: Graph::new(parse_dtype(dtype)?, num_inputs),
            copy_weights,
        })
    }

    /// The dtype the model computes in.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.graph.dtype().name()
    }

    /// Adds a convolution reading value `x`; padding is `(top, bottom, left, right)`.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (name, x, weight, bias, stride, padding, dilation, groups, padding_mode, algorithm))]
    fn conv2d(
        &mut self,
        name: &str,
        x: ValueId,
        weight: &Bound<'_, PyAny>,
        bias: Option<&Bound<'_, PyAny>>,
        stride: Pair,
        padding: (usize, usize, usize, usize),
        dilation: Pair,
        groups: usize,
        padding_mode: &str,
        algorithm: &str,
    ) -> PyResult<ValueId> {
        let op = OpKind::Conv2d;
        let dtype = self.graph.dtype();
        let weight = import_weight(weight, op, dtype, self.copy_weights)?;
        let bias = optional_weight(bias, op, dtype, self.copy_weights)?;
        let mode = parse_pad_mode(padding_mode)?;
        let request = parse_request(op, algorithm)?;
        self.push(name, vec![x], || {
            Conv2d::new(
                weight,
                bias,
                stride,
                padding2d(padding),
                dilation,
                groups,
                mode,
                request,
            )
        })
    }

    /// Adds a fully connected layer reading value `x`.
    #[pyo3(signature = (name, x, weight, bias, algorithm))]
    fn linear(
        &mut self,
        name: &str,
        x: ValueId,
        weight: &Bound<'_, PyAny>,
        bias: Option<&Bound<'_, PyAny>>,
        algorithm: &str,
    ) -> PyResult<ValueId> {
        let op = OpKind::Linear;
        let dtype = self.graph.dtype();
        let weight = import_weight(weight, op, dtype, self.copy_weights)?;
        let bias = optional_weight(bias, op, dtype, self.copy_weights)?;
        let request = parse_request(op, algorithm)?;
        self.push(name, vec![x], || Linear::new(weight, bias, request))
    }

    /// Adds a ReLU reading value `x`.
    fn relu(&mut self, name: &str, x: ValueId, algorithm: &str) -> PyResult<ValueId> {
        parse_request(OpKind::Relu, algorithm)?;
        self.push(name, vec![x], || Ok(Relu))
    }

    /// Adds max pooling reading value `x`.
    #[allow(clippy::too_many_arguments)]
    fn maxpool2d(
        &mut self,
        name: &str,
        x: ValueId,
        kernel: Pair,
        stride: Pair,
        padding: Pair,
        dilation: Pair,
        ceil_mode: bool,
        algorithm: &str,
    ) -> PyResult<ValueId> {
        parse_request(OpKind::MaxPool2d, algorithm)?;
        let window = ai3_core::ops::Window {
            kernel,
            stride,
            padding,
            dilation,
            ceil_mode,
        };
        self.push(name, vec![x], || MaxPool2d::new(window))
    }

    /// Adds average pooling reading value `x`.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (name, x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, algorithm))]
    fn avgpool2d(
        &mut self,
        name: &str,
        x: ValueId,
        kernel: Pair,
        stride: Pair,
        padding: Pair,
        ceil_mode: bool,
        count_include_pad: bool,
        divisor_override: Option<usize>,
        algorithm: &str,
    ) -> PyResult<ValueId> {
        parse_request(OpKind::AvgPool2d, algorithm)?;
        let window = ai3_core::ops::Window {
            kernel,
            stride,
            padding,
            dilation: (1, 1),
            ceil_mode,
        };
        let options = AvgPoolOptions {
            count_include_pad,
            divisor_override,
        };
        self.push(name, vec![x], || AvgPool2d::new(window, options))
    }

    /// Adds adaptive average pooling reading value `x`; `None` keeps an input dimension.
    fn adaptiveavgpool2d(
        &mut self,
        name: &str,
        x: ValueId,
        output_size: (Option<usize>, Option<usize>),
        algorithm: &str,
    ) -> PyResult<ValueId> {
        parse_request(OpKind::AdaptiveAvgPool2d, algorithm)?;
        self.push(name, vec![x], || AdaptiveAvgPool2d::new(output_size))
    }

    /// Adds a flatten of dimensions `start_dim..=end_dim` of value `x`.
    fn flatten(
        &mut self,
        name: &str,
        x: ValueId,
        start_dim: i64,
        end_dim: i64,
        algorithm: &str,
    ) -> PyResult<ValueId> {
        parse_request(OpKind::Flatten, algorithm)?;
        self.push(name, vec![x], || Ok(Flatten::new(start_dim, end_dim)))
    }

    /// Declares the values the model returns.
    fn set_outputs(&mut self, outputs: Vec<ValueId>) -> PyResult<()> {
        self.graph.set_outputs(outputs).map_err(to_py)
    }

    /// Runs the model on DLPack tensors; returns one DLPack capsule per output.
    fn run<'py>(
        &self,
        py: Python<'py>,
        inputs: &Bound<'py, PyList>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        run_graph(py, &self.graph, inputs)
    }

    /// One dict per node (name, op, algorithm, input_shapes, output_shape) for these input shapes.
    fn summary<'py>(
        &self,
        py: Python<'py>,
        input_shapes: Vec<Vec<usize>>,
    ) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let reports = no_panic("summary", || self.graph.summary(&input_shapes)).map_err(to_py)?;
        reports
            .into_iter()
            .map(|r| {
                let d = PyDict::new(py);
                d.set_item("name", r.name)?;
                d.set_item("op", r.op)?;
                d.set_item("algorithm", r.algorithm)?;
                d.set_item("input_shapes", r.input_shapes)?;
                d.set_item("output_shape", r.output_shape)?;
                Ok(d)
            })
            .collect()
    }

    /// Node names and operations in execution order (no shapes needed).
    fn nodes(&self) -> Vec<(String, &'static str)> {
        self.graph
            .nodes()
            .iter()
            .map(|n| (n.name.clone(), n.op.kind().name()))
            .collect()
    }
}

/// Every registry row: op, algorithm, device, summary, and why it is unavailable (or None).
#[pyfunction]
fn algorithms(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    REGISTRY
        .iter()
        .map(|e| {
            let d = PyDict::new(py);
            d.set_item("op", e.op.name())?;
            d.set_item("algorithm", e.algorithm.name())?;
            d.set_item("device", e.device.name())?;
            d.set_item("summary", e.summary)?;
            d.set_item("unavailable", (e.available)().err())?;
            Ok(d)
        })
        .collect()
}

/// The names a user may select for each operation, `'default'` included.
#[pyfunction]
fn selectable() -> Vec<(&'static str, Vec<&'static str>)> {
    OpKind::ALL
        .iter()
        .map(|&op| (op.name(), registry::selectable_names(op)))
        .collect()
}

/// Checks an algorithm name for an operation; raises `ai3.AlgorithmError` if unknown.
#[pyfunction]
fn check_algorithm(op: &str, algorithm: &str) -> PyResult<()> {
    let kind = OpKind::from_name(op)
        .ok_or_else(|| to_py(Error::invalid(op, format!("unknown operation '{op}'"))))?;
    parse_request(kind, algorithm).map(|_| ())
}

/// Imports a tensor through DLPack and copies it into ai3-owned memory.
///
/// Returns `(address seen on import, capsule of the copy, address of the copy)`,
/// so tests can check that neither direction of the crossing copies.
#[pyfunction]
fn dlpack_roundtrip<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
) -> PyResult<(usize, Bound<'py, PyAny>, usize)> {
    let t = dlpack::import(x, "dlpack_roundtrip")?;
    let seen = t.data_ptr() as usize;
    let copy = t.to_contiguous().map_err(to_py)?;
    let written = copy.data_ptr() as usize;
    Ok((seen, dlpack::export(py, copy)?, written))
}

/// The Python extension module `ai3._core`.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Model>()?;
    m.add_function(wrap_pyfunction!(algorithms, m)?)?;
    m.add_function(wrap_pyfunction!(selectable, m)?)?;
    m.add_function(wrap_pyfunction!(check_algorithm, m)?)?;
    m.add_function(wrap_pyfunction!(dlpack_roundtrip, m)?)?;
    Ok(())
}
