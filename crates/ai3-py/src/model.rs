//! The `Model` class: a graph built node by node from Python, one method per
//! operation, each building one op through [`Model::push`].

use ai3_core::ops::{
    Activation, ActivationKind, AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool2d, BatchNorm2d,
    Binary, BinaryKind, Concat, Conv2d, Flatten, LayerNorm, Linear, MaxPool2d, Mean, Operation,
    Permute, Reshape, RuntimeWeights, Slice, SliceMode, Softmax,
};
use ai3_core::params::AvgPoolOptions;
use ai3_core::{Error, Graph, OpKind, Tensor, ValueId};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyList};

use crate::args::{
    import_weight, padding2d, parse_activation, parse_dtype, parse_pad_mode, parse_request,
    parse_size_expr,
};
use crate::dlpack;
use crate::errors::{no_panic, to_py};

type Pair = (usize, usize);

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

    /// A weight argument: a tensor the layer holds, or an int naming a graph
    /// value (a model input or a computed value) the layer reads on every call.
    fn weight_arg(&self, obj: &Bound<'_, PyAny>, op: OpKind) -> PyResult<Weight> {
        if obj.is_instance_of::<PyInt>() {
            return Ok(Weight::Value(obj.extract()?));
        }
        Ok(Weight::Held(self.weight(obj, op)?))
    }

    fn optional_arg(&self, obj: Option<&Bound<'_, PyAny>>, op: OpKind) -> PyResult<Option<Weight>> {
        obj.map(|o| self.weight_arg(o, op)).transpose()
    }

    /// Appends a layer reading `x` with these weights (`None`: absent, e.g. no
    /// bias), built by `build`. When every weight is held the layer is built
    /// once; when every weight is a value id the node reads them and builds
    /// the layer from them on every call ([`RuntimeWeights`]). Mixing is an error.
    fn push_layer<O: Operation + 'static>(
        &mut self,
        name: &str,
        x: ValueId,
        op: OpKind,
        weights: Vec<Option<Weight>>,
        fused: Option<OpKind>,
        build: impl Fn(Vec<Option<Tensor>>) -> ai3_core::Result<O> + Send + Sync + 'static,
    ) -> PyResult<ValueId> {
        if weights
            .iter()
            .flatten()
            .all(|w| matches!(w, Weight::Held(_)))
        {
            let held = weights
                .into_iter()
                .map(|w| match w {
                    Some(Weight::Held(t)) => Some(t),
                    _ => None,
                })
                .collect();
            return self.push(name, vec![x], || build(held));
        }
        let present: Vec<bool> = weights.iter().map(Option::is_some).collect();
        let mut inputs = vec![x];
        for w in weights.into_iter().flatten() {
            match w {
                Weight::Value(v) => inputs.push(v),
                // Adding constants here would shift the value ids the caller counts.
                Weight::Held(_) => {
                    return Err(to_py(Error::invalid(
                        op.name(),
                        "weights must all be tensors or all be value ids (add constants with `constant`)",
                    )))
                }
            }
        }
        let dtype = self.graph.dtype();
        let layer = move |given: Vec<Tensor>| -> ai3_core::Result<Box<dyn Operation>> {
            let mut given = given.into_iter();
            let weights = present.iter().map(|&p| if p { given.next() } else { None });
            Ok(Box::new(build(weights.collect())?))
        };
        // Building once from zeros checks the weights' shapes now, not on the first call.
        self.push(name, inputs, || {
            Ok(RuntimeWeights::new(op, dtype, fused, Box::new(layer)))
        })
    }

    fn weight(&self, obj: &Bound<'_, PyAny>, op: OpKind) -> PyResult<Tensor> {
        import_weight(obj, op.name(), self.graph.dtype(), self.copy_weights)
    }
}

/// The weights `push_layer` hands a layer's builder, as `N` slots in order.
fn slots<const N: usize>(
    op: OpKind,
    weights: Vec<Option<Tensor>>,
) -> ai3_core::Result<[Option<Tensor>; N]> {
    let got = weights.len();
    weights
        .try_into()
        .map_err(|_| Error::internal(op.name(), format!("expected {N} weight slots, got {got}")))
}

/// A weight slot that cannot be empty.
fn required(op: OpKind, weight: Option<Tensor>) -> ai3_core::Result<Tensor> {
    weight.ok_or_else(|| Error::internal(op.name(), "a required weight is missing"))
}

/// A weight given to a layer method: see [`Model::weight_arg`].
enum Weight {
    Held(Tensor),
    Value(ValueId),
}

/// A network held in Rust: built node by node from Python, then run with the GIL released.
#[pyclass(module = "ai3._core")]
pub(crate) struct Model {
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

    /// Adds a convolution reading value `x`; padding is `(top, bottom, left, right)`;
    /// `activation=(name, params)` fuses an activation into its output.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (name, x, weight, bias, stride, padding, dilation, groups, padding_mode, algorithm, activation = None))]
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
        activation: Option<(String, Vec<f64>)>,
    ) -> PyResult<ValueId> {
        let op = OpKind::Conv2d;
        let weights = vec![
            Some(self.weight_arg(weight, op)?),
            self.optional_arg(bias, op)?,
        ];
        let mode = parse_pad_mode(padding_mode)?;
        let request = parse_request(op, algorithm)?;
        let act = parse_activation(activation)?;
        let padding = padding2d(padding);
        let fused = act.map(|a| a.op_kind());
        self.push_layer(name, x, op, weights, fused, move |w| {
            let [weight, bias] = slots(op, w)?;
            let weight = required(op, weight)?;
            let conv = Conv2d::new(
                weight, bias, stride, padding, dilation, groups, mode, request,
            )?;
            Ok(conv.with_activation(act))
        })
    }

    /// Adds a fully connected layer reading value `x`, optionally with a fused activation.
    #[pyo3(signature = (name, x, weight, bias, algorithm, activation = None))]
    fn linear(
        &mut self,
        name: &str,
        x: ValueId,
        weight: &Bound<'_, PyAny>,
        bias: Option<&Bound<'_, PyAny>>,
        algorithm: &str,
        activation: Option<(String, Vec<f64>)>,
    ) -> PyResult<ValueId> {
        let op = OpKind::Linear;
        let weights = vec![
            Some(self.weight_arg(weight, op)?),
            self.optional_arg(bias, op)?,
        ];
        let request = parse_request(op, algorithm)?;
        let act = parse_activation(activation)?;
        let fused = act.map(|a| a.op_kind());
        self.push_layer(name, x, op, weights, fused, move |w| {
            let [weight, bias] = slots(op, w)?;
            let weight = required(op, weight)?;
            Ok(Linear::new(weight, bias, request)?.with_activation(act))
        })
    }

    /// Adds a ReLU reading value `x`.
    fn relu(&mut self, name: &str, x: ValueId, algorithm: &str) -> PyResult<ValueId> {
        let request = parse_request(OpKind::Relu, algorithm)?;
        self.push(name, vec![x], || {
            Activation::new(ActivationKind::Relu)?.with_request(request)
        })
    }

    /// Adds an elementwise activation `kind` (`relu`, `relu6`, `hardtanh`, `hardswish`,
    /// `hardsigmoid`, `silu`, `sigmoid`, `gelu`, `tanh`) reading value `x`.
    /// `params`: `[min_val, max_val]` for hardtanh; `[1.0]` for gelu's tanh approximation.
    fn activation(
        &mut self,
        name: &str,
        x: ValueId,
        kind: &str,
        params: Vec<f64>,
        algorithm: &str,
    ) -> PyResult<ValueId> {
        let kind = ActivationKind::from_name(kind, &params).map_err(to_py)?;
        let request = parse_request(kind.op_kind(), algorithm)?;
        self.push(name, vec![x], || {
            Activation::new(kind)?.with_request(request)
        })
    }

    /// Adds `add`/`sub`/`mul`/`div` of two broadcast values, or of one value and
    /// `scalar` (on the left when `scalar_first`); `activation=(name, params)`
    /// fuses an activation into its output.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (name, kind, inputs, scalar, scalar_first, algorithm, activation = None))]
    fn binary(
        &mut self,
        name: &str,
        kind: &str,
        inputs: Vec<ValueId>,
        scalar: Option<f64>,
        scalar_first: bool,
        algorithm: &str,
        activation: Option<(String, Vec<f64>)>,
    ) -> PyResult<ValueId> {
        let kind = BinaryKind::from_name(kind).map_err(to_py)?;
        parse_request(kind.op_kind(), algorithm)?;
        let act = parse_activation(activation)?;
        let op = Binary::new(kind, scalar, scalar_first).with_activation(act);
        if inputs.len() != op.num_inputs() {
            return Err(to_py(Error::invalid(
                kind.op_kind().name(),
                format!(
                    "expected {} input(s) with scalar={scalar:?}, got {}",
                    op.num_inputs(),
                    inputs.len()
                ),
            )));
        }
        self.push(name, inputs, || Ok(op))
    }

    /// Adds `torch.cat(inputs, dim)`.
    fn cat(
        &mut self,
        name: &str,
        inputs: Vec<ValueId>,
        dim: i64,
        algorithm: &str,
    ) -> PyResult<ValueId> {
        parse_request(OpKind::Cat, algorithm)?;
        if inputs.is_empty() {
            return Err(to_py(Error::invalid("cat", "needs at least one input")));
        }
        self.push(name, inputs, || Ok(Concat::new(dim)))
    }

    /// Adds `torch.softmax(x, dim)`.
    fn softmax(&mut self, name: &str, x: ValueId, dim: i64, algorithm: &str) -> PyResult<ValueId> {
        parse_request(OpKind::Softmax, algorithm)?;
        self.push(name, vec![x], || Ok(Softmax::new(dim)))
    }

    /// Adds eval-mode batch norm reading value `x` (`[N, C]`, `[C, H, W]` or `[N, C, H, W]`);
    /// `activation=(name, params)` fuses an activation into its output.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (name, x, weight, bias, running_mean, running_var, eps, algorithm, activation = None))]
    fn batchnorm2d(
        &mut self,
        name: &str,
        x: ValueId,
        weight: Option<&Bound<'_, PyAny>>,
        bias: Option<&Bound<'_, PyAny>>,
        running_mean: &Bound<'_, PyAny>,
        running_var: &Bound<'_, PyAny>,
        eps: f64,
        algorithm: &str,
        activation: Option<(String, Vec<f64>)>,
    ) -> PyResult<ValueId> {
        let op = OpKind::BatchNorm2d;
        parse_request(op, algorithm)?;
        let act = parse_activation(activation)?;
        let weights = vec![
            self.optional_arg(weight, op)?,
            self.optional_arg(bias, op)?,
            Some(self.weight_arg(running_mean, op)?),
            Some(self.weight_arg(running_var, op)?),
        ];
        let fused = act.map(|a| a.op_kind());
        self.push_layer(name, x, op, weights, fused, move |w| {
            let [weight, bias, mean, var] = slots(op, w)?;
            let (mean, var) = (required(op, mean)?, required(op, var)?);
            Ok(BatchNorm2d::new(weight, bias, mean, var, eps)?.with_activation(act))
        })
    }

    /// Adds layer norm over the trailing `normalized_shape` dimensions of value `x`.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (name, x, normalized_shape, weight, bias, eps, algorithm))]
    fn layernorm(
        &mut self,
        name: &str,
        x: ValueId,
        normalized_shape: Vec<usize>,
        weight: Option<&Bound<'_, PyAny>>,
        bias: Option<&Bound<'_, PyAny>>,
        eps: f64,
        algorithm: &str,
    ) -> PyResult<ValueId> {
        let op = OpKind::LayerNorm;
        parse_request(op, algorithm)?;
        let weights = vec![self.optional_arg(weight, op)?, self.optional_arg(bias, op)?];
        self.push_layer(name, x, op, weights, None, move |w| {
            let [weight, bias] = slots(op, w)?;
            LayerNorm::new(normalized_shape.clone(), weight, bias, eps)
        })
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
        let request = parse_request(OpKind::MaxPool2d, algorithm)?;
        let window = ai3_core::ops::Window {
            kernel,
            stride,
            padding,
            dilation,
            ceil_mode,
        };
        self.push(name, vec![x], || {
            MaxPool2d::new(window)?.with_request(request)
        })
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
        let request = parse_request(OpKind::AvgPool2d, algorithm)?;
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
        self.push(name, vec![x], || {
            AvgPool2d::new(window, options)?.with_request(request)
        })
    }

    /// Adds adaptive average pooling reading value `x`; `None` keeps an input dimension.
    fn adaptiveavgpool2d(
        &mut self,
        name: &str,
        x: ValueId,
        output_size: (Option<usize>, Option<usize>),
        algorithm: &str,
    ) -> PyResult<ValueId> {
        let request = parse_request(OpKind::AdaptiveAvgPool2d, algorithm)?;
        self.push(name, vec![x], || {
            AdaptiveAvgPool2d::new(output_size)?.with_request(request)
        })
    }

    /// Adds adaptive max pooling reading value `x`; `None` keeps an input dimension.
    fn adaptivemaxpool2d(
        &mut self,
        name: &str,
        x: ValueId,
        output_size: (Option<usize>, Option<usize>),
        algorithm: &str,
    ) -> PyResult<ValueId> {
        let request = parse_request(OpKind::AdaptiveMaxPool2d, algorithm)?;
        self.push(name, vec![x], || {
            AdaptiveMaxPool2d::new(output_size)?.with_request(request)
        })
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
        let request = parse_request(OpKind::Flatten, algorithm)?;
        self.push(name, vec![x], || {
            Flatten::new(start_dim, end_dim).with_request(request)
        })
    }

    /// Adds `x.mean(dims, keepdim)` (no dims: every dimension).
    fn mean(
        &mut self,
        name: &str,
        x: ValueId,
        dims: Vec<i64>,
        keepdim: bool,
        algorithm: &str,
    ) -> PyResult<ValueId> {
        parse_request(OpKind::Mean, algorithm)?;
        self.push(name, vec![x], || Ok(Mean::new(dims, keepdim)))
    }

    /// Adds `x.permute(dims).contiguous()`.
    fn permute(
        &mut self,
        name: &str,
        x: ValueId,
        dims: Vec<i64>,
        algorithm: &str,
    ) -> PyResult<ValueId> {
        parse_request(OpKind::Permute, algorithm)?;
        self.push(name, vec![x], || Ok(Permute::new(dims)))
    }

    /// Adds `x.transpose(dim0, dim1).contiguous()`.
    fn transpose(
        &mut self,
        name: &str,
        x: ValueId,
        dim0: i64,
        dim1: i64,
        algorithm: &str,
    ) -> PyResult<ValueId> {
        parse_request(OpKind::Permute, algorithm)?;
        self.push(name, vec![x], || Ok(Permute::transpose(dim0, dim1)))
    }

    /// Adds a constant (a tensor the network holds, such as a layer scale), copied
    /// in the model's dtype, or borrowed when the model does not copy weights.
    fn constant(&mut self, name: &str, tensor: &Bound<'_, PyAny>) -> PyResult<ValueId> {
        let dtype = self.graph.dtype();
        let t = import_weight(tensor, "constant", dtype, self.copy_weights)?;
        no_panic(name, || self.graph.constant(t)).map_err(to_py)
    }

    /// What the memory planner decided for these input shapes: `arena_bytes`,
    /// `intermediate_bytes` (if nothing shared memory) and `arenas_allocated`.
    fn memory_plan<'py>(
        &self,
        py: Python<'py>,
        input_shapes: Vec<Vec<usize>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let plan =
            no_panic("memory_plan", || self.graph.memory_plan(&input_shapes)).map_err(to_py)?;
        let d = PyDict::new(py);
        d.set_item("arena_bytes", plan.arena_bytes)?;
        d.set_item("intermediate_bytes", plan.intermediate_bytes)?;
        d.set_item("arenas_allocated", plan.arenas_allocated)?;
        d.set_item("workspace_bytes", plan.workspace_bytes)?;
        Ok(d)
    }

    /// For every node, every algorithm of its operation: a dict with
    /// `algorithm`, `unusable` (why it cannot run this node, or `None`) and
    /// `workspace_bytes`, for these input shapes.
    fn candidates<'py>(
        &self,
        py: Python<'py>,
        input_shapes: Vec<Vec<usize>>,
    ) -> PyResult<Vec<Vec<Bound<'py, PyDict>>>> {
        let nodes =
            no_panic("candidates", || self.graph.candidates(&input_shapes)).map_err(to_py)?;
        nodes
            .into_iter()
            .map(|node| {
                node.into_iter()
                    .map(|c| {
                        let d = PyDict::new(py);
                        d.set_item("algorithm", c.algorithm.name())?;
                        d.set_item("unusable", c.unusable)?;
                        d.set_item("workspace_bytes", c.workspace_bytes)?;
                        Ok(d)
                    })
                    .collect()
            })
            .collect()
    }

    /// Adds a reshape of `inputs[0]` to `spec`, one size expression per output
    /// dimension: `("const", v)` (`-1` infers), `("dim", input, axis)` (a size of
    /// `inputs[input]` at run time), `("add" | "sub" | "mul" | "floordiv", a, b)`.
    fn reshape(
        &mut self,
        name: &str,
        inputs: Vec<ValueId>,
        spec: &Bound<'_, PyList>,
        algorithm: &str,
    ) -> PyResult<ValueId> {
        parse_request(OpKind::Reshape, algorithm)?;
        if inputs.is_empty() {
            return Err(to_py(Error::invalid(
                "reshape",
                "needs the data as input 0",
            )));
        }
        let spec = spec
            .iter()
            .map(|e| parse_size_expr(&e, inputs.len()))
            .collect::<PyResult<Vec<_>>>()?;
        self.push(name, inputs, || Reshape::new(spec))
    }

    /// Adds piece `index` of `torch.chunk(x, chunks, dim)`, `torch.split(x, split_size, dim)`
    /// or `torch.split(x, sections, dim)` (exactly one of the three is given).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (name, x, dim, index, chunks, split_size, sections, algorithm))]
    fn slice(
        &mut self,
        name: &str,
        x: ValueId,
        dim: i64,
        index: usize,
        chunks: Option<usize>,
        split_size: Option<usize>,
        sections: Option<Vec<usize>>,
        algorithm: &str,
    ) -> PyResult<ValueId> {
        parse_request(OpKind::Slice, algorithm)?;
        let mode = match (chunks, split_size, sections) {
            (Some(n), None, None) => SliceMode::Chunks(n),
            (None, Some(k), None) => SliceMode::SplitSize(k),
            (None, None, Some(s)) => SliceMode::Sections(s),
            _ => {
                return Err(to_py(Error::invalid(
                    "slice",
                    "give exactly one of chunks, split_size and sections",
                )))
            }
        };
        self.push(name, vec![x], || Slice::new(dim, index, mode))
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

    /// Runs the model `repeat` times after a warm-up; returns the outputs of the
    /// last run and each node's median time in seconds, in node order.
    fn profile<'py>(
        &self,
        py: Python<'py>,
        inputs: &Bound<'py, PyList>,
        repeat: usize,
    ) -> PyResult<(Vec<Bound<'py, PyAny>>, Vec<f64>)> {
        let tensors: Vec<Tensor> = inputs
            .iter()
            .enumerate()
            .map(|(i, x)| dlpack::import(&x, self.graph.input_consumer(i)))
            .collect::<PyResult<_>>()?;
        let (outputs, times) = py
            .detach(|| no_panic("model", || self.graph.profile(tensors, repeat)))
            .map_err(to_py)?;
        let outputs = outputs
            .into_iter()
            .map(|t| dlpack::export(py, t))
            .collect::<PyResult<_>>()?;
        Ok((outputs, times))
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
                d.set_item("fused", r.fused)?;
                d.set_item("workspace_bytes", r.workspace_bytes)?;
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
