//! The `Model` class: a graph built node by node from Python through one
//! generic entry point, [`Model::add`], then run with the GIL released.

use ai3_core::{Error, Graph, OpKind, Tensor, ValueId};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::args::{import_weight, parse_attrs, parse_dtype};
use crate::dlpack;
use crate::errors::{no_panic, to_py};

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

    /// Whether runs of operations may keep the channel-blocked layout
    /// (NCHW8c) where it pays; `False` keeps every value NCHW.
    #[getter]
    fn blocked_layouts(&self) -> bool {
        self.graph.blocked_layouts()
    }

    #[setter]
    fn set_blocked_layouts(&mut self, on: bool) {
        self.graph.set_blocked_layouts(on);
    }

    /// Adds node `op` (`"conv2d"`, `"relu"`, ... see `ai3._core.operations()`)
    /// named `name`, reading the values `inputs`, with its parameters by name
    /// in `params` and the algorithm `algorithm`; returns its value id.
    ///
    /// A tensor parameter (a weight) is a tensor the node holds, prepared
    /// once, or an int naming a graph value the node reads on every call (a
    /// node's weights are all one or all the other). `None` leaves a
    /// parameter out. Unknown, missing or mistyped parameters raise
    /// `ai3.InvalidArgumentError` naming the operation.
    #[pyo3(signature = (op, name, inputs, params = None, algorithm = "default"))]
    fn add(
        &mut self,
        op: &str,
        name: &str,
        inputs: Vec<ValueId>,
        params: Option<&Bound<'_, PyDict>>,
        algorithm: &str,
    ) -> PyResult<ValueId> {
        let kind = OpKind::from_name(op).ok_or_else(|| {
            to_py(Error::invalid(
                name,
                format!("'{op}' is not an ai3 operation (see ai3._core.operations())"),
            ))
        })?;
        let attrs = parse_attrs(kind, params, self.graph.dtype(), self.copy_weights)?;
        no_panic(name, || {
            self.graph.add(kind, name, inputs, attrs, algorithm)
        })
        .map_err(to_py)
    }

    /// Adds a constant (a tensor the network holds, such as a layer scale), copied
    /// in the model's dtype, or borrowed when the model does not copy weights.
    fn constant(&mut self, name: &str, tensor: &Bound<'_, PyAny>) -> PyResult<ValueId> {
        let dtype = self.graph.dtype();
        let t = import_weight(tensor, "constant", dtype, self.copy_weights)?;
        no_panic(name, || self.graph.constant(t)).map_err(to_py)
    }

    /// What the memory planner decided for these input shapes: `arena_bytes`,
    /// `intermediate_bytes` (if nothing shared memory), `arenas_allocated`,
    /// `workspace_bytes`, `chunked_steps` and `chunk_images`.
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
        d.set_item("chunked_steps", plan.chunked_steps)?;
        d.set_item("chunk_images", plan.chunk_images)?;
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

    /// One dict per node (name, op, algorithm, input_shapes, output_shape,
    /// fused, workspace_bytes, layout, reorders) for these input shapes.
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
                d.set_item("layout", r.layout)?;
                d.set_item("reorders", r.reorders)?;
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
