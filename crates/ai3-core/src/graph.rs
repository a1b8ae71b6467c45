//! The graph IR and its executor.
//!
//! A graph is a list of nodes in topological order; each node reads values
//! (graph inputs, constants or outputs of earlier nodes) and produces one
//! value. Values may have several readers, and nodes several inputs.
//!
//! Running a graph for an input shape first plans memory: every intermediate
//! value gets a place in one arena (see [`crate::plan`]). Plans are cached per
//! input shape and arenas are pooled, so a call with a shape seen before
//! allocates no intermediate memory, and several threads may run one graph at
//! once (each takes its own arena from the pool).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::dtype::{DType, Device};
use crate::error::{Error, Result};
use crate::layout::{self, Blocked, Layout, PlanNode, Route, Step};
use crate::ops::{build_node, Attrs, Operation};
use crate::plan::{place, Interval};
use crate::registry::{self, Candidate, DeviceKind, OpKind};
use crate::tensor::{checked_bytes, contiguous_strides, shape_str, Tensor, ALIGNMENT};
use ai3_kernels::cpu::blocked;

/// Index of a value (a graph input, a constant or a node's output).
pub type ValueId = usize;

/// One operation applied to earlier values.
#[derive(Debug)]
pub struct Node {
    /// A readable name, e.g. the PyTorch module path `features.0`.
    pub name: String,
    /// The computation.
    pub op: Box<dyn Operation>,
    /// Values read, in order.
    pub inputs: Vec<ValueId>,
    /// The value produced.
    pub output: ValueId,
}

/// How a value comes to exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Input(usize),
    Constant(usize),
    Node(usize),
}

/// Memory layout of one run for one set of input shapes.
#[derive(Debug)]
struct Plan {
    /// The steps, each value's shape and layout, what each node reads.
    route: Route,
    /// Arena byte offset of each intermediate value (`None` for inputs, constants, outputs).
    offsets: Vec<Option<usize>>,
    arena_bytes: usize,
    intermediate_bytes: usize,
    /// Enough work to spread over ai3's pool (see [`PARALLEL_WORK`]); else
    /// the run stays on the calling thread.
    parallel: bool,
    /// Per node: it may run channels last (see [`Graph::channels_last`]).
    channels_last: Vec<bool>,
    /// Per graph input: a channels-last one is read in place, as every
    /// node that reads it may run channels last.
    read_channels_last: Vec<bool>,
    /// The first steps, run a few images at a time (see [`Chunks`]).
    chunks: Option<Chunks>,
}

/// A run of the first steps executed a few images at a time: every step of
/// the run for the first images, then for the next ones, so that what one
/// step writes is still in cache when the next reads it. A batch of large
/// images otherwise streams every intermediate value through memory
/// (MobileNetV2 at batch 10: 10 x 96 x 112 x 112 floats, 48 MB, written by
/// one layer and read by the next).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Chunks {
    /// Steps in the run.
    steps: usize,
    /// Images per chunk (the last may have fewer).
    images: usize,
}

/// Bytes one step may read and write for a chunk of images: a chunk takes
/// as many images as fit, and steps whose whole-batch output is smaller
/// are not worth chunking. About a third of the 32 MB L3 cache of the
/// machines measured (MobileNetV2 at batch 10: 2 images a chunk, 29.9 ->
/// 24.5 ms).
const CHUNK_BYTES: usize = 12 << 20;

/// What a summary says was fused into `op`, joined by `+` in the order
/// they apply: `"mul"` for an input scale, `"add"` for a residual, the
/// activation's name (`"mul+add+relu"`), or nothing.
fn fused_name(op: &dyn Operation) -> Option<String> {
    let parts: Vec<&str> = [
        op.fused_input_scale().then(|| OpKind::Mul.name()),
        op.fused_residual().then(|| OpKind::Add.name()),
        op.fused_activation().map(|k| k.name()),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!parts.is_empty()).then(|| parts.join("+"))
}

/// Work (the sum of every node's [`Operation::work`], in multiply-adds)
/// from which a run goes to ai3's pool, parking PyTorch's idle OpenMP
/// threads. Smaller runs stay on the calling thread, alone: handing the work
/// to the pool and back wakes two or three sleeping threads, tens of
/// microseconds on a virtual machine, more than a second thread saves on a
/// run of under about 80 us.
const PARALLEL_WORK: usize = 1 << 21;

/// Plans kept per graph. A transformer meets a new shape for every sequence
/// length: the least recently used plan goes, one at a time, never all at once.
const PLANS_KEPT: usize = 64;

#[derive(Debug, Default)]
struct Runtime {
    /// Plans by input shapes, with when each was last used (a tick of `clock`).
    plans: HashMap<Vec<Vec<usize>>, (Arc<Plan>, u64)>,
    clock: u64,
    /// Free arenas, by size in bytes.
    arenas: Vec<Tensor>,
    arenas_allocated: usize,
}

/// What the memory planner decided for one input shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Bytes of the arena holding every intermediate value.
    pub arena_bytes: usize,
    /// What the intermediates would take if none shared memory.
    pub intermediate_bytes: usize,
    /// How many arenas this graph has allocated so far, over all calls.
    pub arenas_allocated: usize,
    /// The most scratch memory one node's algorithm needs (nodes run one at
    /// a time, so this is what a call needs beyond the arena).
    pub workspace_bytes: usize,
    /// Steps (nodes and reorders) of the run of first steps executed a few
    /// images at a time, so that each step's output is still in cache for
    /// the next; 0 when the batch runs whole.
    pub chunked_steps: usize,
    /// Images per chunk of that run (the batch when there is none).
    pub chunk_images: usize,
}

/// A network as ai3 runs it.
#[derive(Debug)]
pub struct Graph {
    dtype: DType,
    num_inputs: usize,
    nodes: Vec<Node>,
    constants: Vec<Tensor>,
    sources: Vec<Source>,
    outputs: Vec<ValueId>,
    /// Whether plans may keep values in the channel-blocked layout.
    blocked_layouts: bool,
    runtime: Mutex<Runtime>,
}

/// One row of a graph summary.
#[derive(Debug, Clone)]
pub struct NodeReport {
    /// Node name.
    pub name: String,
    /// Operation name.
    pub op: String,
    /// Algorithm that runs for the given input shape.
    pub algorithm: String,
    /// Input shapes.
    pub input_shapes: Vec<Vec<usize>>,
    /// Output shape.
    pub output_shape: Vec<usize>,
    /// The activation fused into the node, if any (e.g. `relu` after a conv2d).
    pub fused: Option<String>,
    /// Scratch bytes the algorithm needs beyond input, output and prepared weights.
    pub workspace_bytes: usize,
    /// The layout the node computes in (its output's): `NCHW`, `NCHW8c`
    /// ([`Layout::name`]), or the operation's own (`NHWC`, see
    /// [`Operation::own_layout`]).
    pub layout: &'static str,
    /// The reorders made for this node before it runs (`'<producer>' ->
    /// NCHW8c`), or, for a graph output it produces, after the last node.
    pub reorders: Vec<String>,
}

impl Graph {
    /// An empty graph computing in `dtype` with `num_inputs` inputs (values `0..num_inputs`).
    pub fn new(dtype: DType, num_inputs: usize) -> Self {
        Graph {
            dtype,
            num_inputs,
            nodes: Vec::new(),
            constants: Vec::new(),
            sources: (0..num_inputs).map(Source::Input).collect(),
            outputs: Vec::new(),
            blocked_layouts: true,
            runtime: Mutex::new(Runtime::default()),
        }
    }

    /// Whether plans may keep values in the channel-blocked layout.
    pub fn blocked_layouts(&self) -> bool {
        self.blocked_layouts
    }

    /// Lets plans keep runs of operations in the channel-blocked layout
    /// where it pays (the default), or keeps every value NCHW.
    pub fn set_blocked_layouts(&mut self, on: bool) {
        self.blocked_layouts = on;
        self.invalidate();
    }

    /// The steps of a run for these shapes of every value: which nodes run
    /// blocked and where values are reordered (see [`crate::layout`]).
    fn route(&self, shapes: Vec<Vec<usize>>) -> Route {
        let nodes: Vec<PlanNode<'_>> = self
            .nodes
            .iter()
            .map(|n| PlanNode {
                op: n.op.as_ref(),
                inputs: &n.inputs,
                output: n.output,
            })
            .collect();
        let produced_by: Vec<Option<usize>> = self
            .sources
            .iter()
            .map(|s| match *s {
                Source::Node(n) => Some(n),
                _ => None,
            })
            .collect();
        let layouts = layout::plan(
            self.dtype,
            self.blocked_layouts,
            &nodes,
            &shapes,
            &produced_by,
            &self.outputs,
        );
        layout::route(layouts, &nodes, shapes, &produced_by, &self.outputs)
    }

    /// The dtype every value has.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The nodes in execution order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    fn num_values(&self) -> usize {
        self.sources.len()
    }

    /// Adds a constant value (a tensor the network holds, e.g. a layer scale).
    pub fn constant(&mut self, tensor: Tensor) -> Result<ValueId> {
        if tensor.dtype() != self.dtype {
            return Err(Error::dtype(
                "constant",
                format!(
                    "constant of shape {} is {} but the graph computes in {}",
                    shape_str(tensor.shape()),
                    tensor.dtype(),
                    self.dtype
                ),
            ));
        }
        let tensor = if tensor.is_contiguous() {
            tensor
        } else {
            tensor.to_contiguous()?
        };
        self.constants.push(tensor);
        self.sources
            .push(Source::Constant(self.constants.len() - 1));
        self.invalidate();
        Ok(self.num_values() - 1)
    }

    /// Appends node `op` reading `inputs`, with its parameters by name and the
    /// algorithm selected (`"default"`, `"gemm"`, ...); returns the id of its
    /// output value. Parameters are checked against the operation's
    /// [`OpSpec`](crate::ops::OpSpec): an unknown, missing or mistyped one is
    /// an error naming the operation.
    pub fn add(
        &mut self,
        op: OpKind,
        name: impl Into<String>,
        inputs: Vec<ValueId>,
        attrs: Attrs,
        algorithm: &str,
    ) -> Result<ValueId> {
        let name = name.into();
        let (node, reads) = build_node(op, inputs, attrs, algorithm, self.dtype)?;
        self.push(name, node, reads)
    }

    /// Appends a node reading `inputs`; returns the id of its output value.
    pub fn push(
        &mut self,
        name: impl Into<String>,
        op: Box<dyn Operation>,
        inputs: Vec<ValueId>,
    ) -> Result<ValueId> {
        let name = name.into();
        if let Some(&bad) = inputs.iter().find(|&&v| v >= self.num_values()) {
            return Err(Error::internal(
                name,
                format!("reads value {bad} before it exists"),
            ));
        }
        self.nodes.push(Node {
            name,
            op,
            inputs,
            output: self.num_values(),
        });
        self.sources.push(Source::Node(self.nodes.len() - 1));
        self.invalidate();
        Ok(self.num_values() - 1)
    }

    /// Declares which values the graph returns.
    pub fn set_outputs(&mut self, outputs: Vec<ValueId>) -> Result<()> {
        if let Some(&bad) = outputs.iter().find(|&&v| v >= self.num_values()) {
            return Err(Error::internal(
                "graph",
                format!("output {bad} does not exist"),
            ));
        }
        self.outputs = outputs;
        self.invalidate();
        Ok(())
    }

    fn invalidate(&mut self) {
        *self.runtime.get_mut().unwrap_or_else(|p| p.into_inner()) = Runtime::default();
    }

    fn runtime(&self) -> MutexGuard<'_, Runtime> {
        // A panic while holding the lock cannot leave the runtime inconsistent:
        // it only caches plans and free arenas.
        self.runtime.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The operation that first reads graph input `i` (`"model"` if none does),
    /// so errors about an input name the layer it was meant for.
    pub fn input_consumer(&self, i: usize) -> &'static str {
        self.nodes
            .iter()
            .find(|n| n.inputs.contains(&i))
            .map_or("model", |n| n.op.kind().name())
    }

    fn check_inputs(&self, inputs: &[Tensor]) -> Result<()> {
        if inputs.len() != self.num_inputs {
            return Err(Error::invalid(
                "model",
                format!(
                    "expected {} input(s), got {}",
                    self.num_inputs,
                    inputs.len()
                ),
            ));
        }
        for (i, x) in inputs.iter().enumerate() {
            if x.dtype() != self.dtype {
                return Err(Error::dtype(
                    self.input_consumer(i),
                    format!(
                        "input {i} of shape {} is {} but the model computes in {}; convert the input or the model (convert(..., dtype=...))",
                        shape_str(x.shape()),
                        x.dtype(),
                        self.dtype
                    ),
                ));
            }
            if x.device() != Device::Cpu {
                return Err(Error::device(
                    self.input_consumer(i),
                    format!(
                        "input {i} of shape {} is on {}, but this model runs on the CPU",
                        shape_str(x.shape()),
                        x.device()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Every value's shape for these input shapes.
    fn infer_shapes(&self, input_shapes: &[Vec<usize>]) -> Result<Vec<Vec<usize>>> {
        if input_shapes.len() != self.num_inputs {
            return Err(Error::invalid(
                "model",
                format!(
                    "expected {} input shape(s), got {}",
                    self.num_inputs,
                    input_shapes.len()
                ),
            ));
        }
        let mut shapes: Vec<Vec<usize>> = Vec::with_capacity(self.num_values());
        for source in &self.sources {
            let shape = match *source {
                Source::Input(i) => input_shapes[i].clone(),
                Source::Constant(c) => self.constants[c].shape().to_vec(),
                Source::Node(n) => {
                    let node = &self.nodes[n];
                    let ins: Vec<&[usize]> =
                        node.inputs.iter().map(|&v| shapes[v].as_slice()).collect();
                    let shape = node
                        .op
                        .output_shape(&ins)
                        .map_err(|e| with_node(e, &node.name))?;
                    // Countable in bytes before any later node reads it or
                    // anything is allocated for it.
                    checked_bytes(node.op.kind().name(), self.dtype, &shape).map_err(|e| {
                        let ins = self.input_shapes_str(node, &shapes);
                        with_node(e.map_msg(|m| format!("the output: {m}; {ins}")), &node.name)
                    })?;
                    shape
                }
            };
            shapes.push(shape);
        }
        Ok(shapes)
    }

    /// Propagates input shapes through the graph: one report per node.
    pub fn summary(&self, input_shapes: &[Vec<usize>]) -> Result<Vec<NodeReport>> {
        let shapes = self.infer_shapes(input_shapes)?;
        let route = self.route(shapes.clone());
        let mut reorders = vec![Vec::new(); self.nodes.len()];
        for step in &route.steps {
            if let Step::Reorder { src, to, owner, .. } = *step {
                let what = match self.sources.get(src) {
                    Some(Source::Input(i)) => format!("input {i}"),
                    Some(Source::Constant(c)) => format!("constant {c}"),
                    Some(Source::Node(n)) => format!("'{}'", self.nodes[*n].name),
                    None => format!("value {src}"),
                };
                reorders[owner].push(format!("{what} -> {}", to.name()));
            }
        }
        self.nodes
            .iter()
            .zip(reorders)
            .map(|(node, reorders)| {
                let (refs, candidates) = self.node_candidates(node, &shapes)?;
                let layout = route.layouts[node.output];
                let algorithm = match layout {
                    Layout::Blocked => node.op.blocked_algorithm_for(&refs),
                    Layout::Nchw => node.op.algorithm_for_inputs(&refs),
                }
                .map_err(|e| with_node(e, &node.name))?;
                let workspace_bytes = candidates
                    .iter()
                    .find(|c| c.algorithm.name() == algorithm)
                    .map_or(0, |c| c.workspace_bytes);
                Ok(NodeReport {
                    name: node.name.clone(),
                    op: node.op.kind().name().into(),
                    algorithm,
                    input_shapes: refs.iter().map(|s| s.to_vec()).collect(),
                    output_shape: shapes[node.output].clone(),
                    fused: fused_name(node.op.as_ref()),
                    workspace_bytes,
                    layout: node.op.own_layout().unwrap_or(layout.name()),
                    reorders,
                })
            })
            .collect()
    }

    /// For every node, every algorithm of its operation with whether it can
    /// run the node for these input shapes and the scratch memory it needs:
    /// what exploration chooses among.
    pub fn candidates(&self, input_shapes: &[Vec<usize>]) -> Result<Vec<Vec<Candidate>>> {
        let shapes = self.infer_shapes(input_shapes)?;
        self.nodes
            .iter()
            .map(|node| Ok(self.node_candidates(node, &shapes)?.1))
            .collect()
    }

    /// `node`'s input shapes (from every value's `shapes`) and what the
    /// registry says of each of its algorithms for them.
    fn node_candidates<'s>(
        &self,
        node: &Node,
        shapes: &'s [Vec<usize>],
    ) -> Result<(Vec<&'s [usize]>, Vec<Candidate>)> {
        let refs: Vec<&[usize]> = node.inputs.iter().map(|&v| shapes[v].as_slice()).collect();
        let problem = node
            .op
            .problem(&refs)
            .map_err(|e| with_node(e, &node.name))?;
        let candidates =
            registry::candidates(node.op.kind(), DeviceKind::Cpu, &problem, self.dtype);
        Ok((refs, candidates))
    }

    /// `node`'s input shapes, for messages.
    fn input_shapes_str(&self, node: &Node, shapes: &[Vec<usize>]) -> String {
        let ins: Vec<String> = node.inputs.iter().map(|&u| shape_str(&shapes[u])).collect();
        match ins.len() {
            1 => format!("input shape {}", ins[0]),
            _ => format!("input shapes {}", ins.join(", ")),
        }
    }

    fn make_plan(&self, input_shapes: &[Vec<usize>]) -> Result<Plan> {
        let route = self.route(self.infer_shapes(input_shapes)?);
        let total = route.shapes.len();
        let mut last_use: Vec<Option<usize>> = vec![None; total];
        for (s, step) in route.steps.iter().enumerate() {
            for &v in route.reads(step) {
                last_use[v] = Some(s);
            }
        }
        let chunks = self.chunks(&route);
        let chunked = chunks.map_or(0, |c| c.steps);
        let mut intermediates = Vec::new();
        let mut intervals = Vec::new();
        // Aligned bytes of every intermediate together: when that fits, no
        // offset the planner computes can overflow.
        let mut total_bytes = 0usize;
        for (s, step) in route.steps.iter().enumerate() {
            let v = self.written(step);
            let op = match *step {
                Step::Node(i) => self.nodes[i].op.kind().name(),
                Step::Reorder { .. } => "reorder",
            };
            // Logical sizes were checked by `infer_shapes`; a blocked one
            // rounds the channels up to whole blocks.
            let bytes = checked_bytes(op, self.dtype, &route.physical(v))?;
            if route.outputs.contains(&v) {
                continue;
            }
            total_bytes = total_bytes
                .checked_add(bytes.div_ceil(ALIGNMENT) * ALIGNMENT)
                .ok_or_else(|| {
                    Error::shape(
                        "model",
                        format!(
                            "the intermediate values for input shape(s) {} need more bytes than a 64-bit size can count",
                            input_shapes.iter().map(|s| shape_str(s)).collect::<Vec<_>>().join(", ")
                        ),
                    )
                })?;
            intermediates.push(v);
            let last = last_use[v].unwrap_or(s);
            intervals.push(Interval {
                bytes,
                // A value of a chunked run read after it is written chunk by
                // chunk while the run's other values come and go: it shares
                // no memory with any of them.
                first: if s < chunked && last >= chunked { 0 } else { s },
                last,
            });
        }
        let intermediate_bytes = intervals.iter().map(|iv| iv.bytes).sum();
        // Values placed inside a concatenation's output: they share its
        // interval, stretched over their own lifetimes, and get no place of
        // their own.
        let mut homes = self.in_place_homes(&route, &intermediates);
        self.outputs_over_inputs(&route, &last_use, &intermediates, &mut homes);
        let mut own = Vec::with_capacity(intermediates.len());
        let mut slot = vec![None; total];
        for (&v, iv) in intermediates.iter().zip(&intervals) {
            if homes[v].is_none() {
                slot[v] = Some(own.len());
                own.push(*iv);
            }
        }
        for (&v, iv) in intermediates.iter().zip(&intervals) {
            if let Some((root, _)) = homes[v] {
                let r = &mut own[slot[root].expect("a home is an intermediate with no home")];
                r.first = r.first.min(iv.first);
                r.last = r.last.max(iv.last);
            }
        }
        let placement = place(&own);
        let mut offsets = vec![None; total];
        for &v in &intermediates {
            offsets[v] = Some(match homes[v] {
                Some((root, at)) => placement.offsets[slot[root].expect("checked above")] + at,
                None => placement.offsets[slot[v].expect("set above")],
            });
        }
        // Saturating: only compared with a threshold.
        let work: usize = self
            .nodes
            .iter()
            .map(|n| {
                let ins: Vec<&[usize]> = n
                    .inputs
                    .iter()
                    .map(|&v| route.shapes[v].as_slice())
                    .collect();
                n.op.work(&ins)
            })
            .fold(0, usize::saturating_add);
        let (channels_last, read_channels_last) = self.channels_last(&route, &last_use);
        Ok(Plan {
            parallel: work >= PARALLEL_WORK,
            route,
            offsets,
            arena_bytes: placement.arena_bytes,
            intermediate_bytes,
            channels_last,
            read_channels_last,
            chunks,
        })
    }

    /// The run of first steps worth executing a few images at a time
    /// ([`Chunks`]), if any: the longest run of steps on 4-D values of one
    /// batch whose operations work image by image
    /// ([`Operation::per_image`]), cut after its last step that writes or
    /// reads a value over [`CHUNK_BYTES`]; a chunk takes as many images as
    /// keep every step's reads and write within [`CHUNK_BYTES`], at least
    /// one.
    fn chunks(&self, route: &Route) -> Option<Chunks> {
        let bytes = |v: usize| -> usize {
            let n: usize = route.physical(v).iter().product();
            n.saturating_mul(self.dtype.size())
        };
        let batch_of = |v: usize| match route.shapes[v].as_slice() {
            &[n, _, _, _] => Some(n),
            _ => None,
        };
        let first = route.steps.first()?;
        let batch = batch_of(self.written(first))?;
        let (mut steps, mut peak) = (0, 0usize);
        let mut peaks = Vec::new();
        for step in &route.steps {
            let (out, reads) = (self.written(step), route.reads(step));
            let per_image = match *step {
                Step::Node(i) => {
                    let shapes: Vec<&[usize]> =
                        reads.iter().map(|&u| route.shapes[u].as_slice()).collect();
                    self.nodes[i].op.per_image(&shapes)
                }
                Step::Reorder { .. } => true,
            };
            let one_batch = std::iter::once(&out)
                .chain(reads)
                .all(|&v| batch_of(v) == Some(batch));
            if !per_image || !one_batch {
                break;
            }
            let touched = reads
                .iter()
                .map(|&u| bytes(u))
                .fold(bytes(out), usize::saturating_add);
            peak = peak.max(touched);
            peaks.push(peak);
            // The step that reads a large value runs in the chunks too, so
            // that it reads each chunk while still in cache.
            if std::iter::once(&out)
                .chain(reads)
                .any(|&v| bytes(v) > CHUNK_BYTES)
            {
                steps = peaks.len();
            }
        }
        if steps == 0 || batch < 2 {
            return None;
        }
        let per_image = peaks[steps - 1].div_ceil(batch).max(1);
        let images = (CHUNK_BYTES / per_image).max(1);
        if images >= batch {
            return None;
        }
        // Chunks of equal size (10 images: 2 x 5 or 5 x 2, not 3 x 3 + 1).
        let images = batch.div_ceil(batch.div_ceil(images));
        Some(Chunks { steps, images })
    }

    /// The value `step` writes.
    fn written(&self, step: &Step) -> usize {
        match *step {
            Step::Node(i) => self.nodes[i].output,
            Step::Reorder { dst, .. } => dst,
        }
    }

    /// Which nodes may run channels last, and which graph inputs are then
    /// read in place when they arrive channels last (PyTorch's
    /// `torch.channels_last`: ConvNeXt's activations reach a swapped layer
    /// so). A node may when its operation can
    /// ([`Operation::channels_last`]), it runs NCHW in the plan, its one
    /// input is a graph input, and its output is a graph output no step
    /// reads: that output is then returned channels last too, as PyTorch
    /// returns it. An input is read in place when every step reading it is
    /// such a node. `last_use[v]` is the last step reading value `v`.
    fn channels_last(&self, route: &Route, last_use: &[Option<usize>]) -> (Vec<bool>, Vec<bool>) {
        let nodes: Vec<bool> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let [x] = route.inputs[i][..] else {
                    return false;
                };
                route.blocked[i] == Blocked::No
                    && matches!(self.sources.get(x), Some(Source::Input(_)))
                    && route.outputs.contains(&n.output)
                    && last_use[n.output].is_none()
                    && n.op.channels_last(&[route.shapes[x].as_slice()])
            })
            .collect();
        let mut inputs = vec![true; self.num_inputs];
        let mut read = vec![false; self.num_inputs];
        for step in &route.steps {
            for &v in route.reads(step) {
                if let Some(&Source::Input(j)) = self.sources.get(v) {
                    read[j] = true;
                    inputs[j] &= matches!(*step, Step::Node(i) if nodes[i]);
                }
            }
        }
        for (i, r) in inputs.iter_mut().zip(read) {
            *i &= r;
        }
        (nodes, inputs)
    }

    /// For each value that goes inside the output of a concatenation (see
    /// [`Operation::in_place_parts`]), `(that output, byte offset in it)`,
    /// where the output itself has no such home; `None` for every other value.
    ///
    /// Concatenations are visited last to first, so one that feeds another
    /// is itself placed inside the later one first, and its inputs follow.
    /// An input goes to its place unless it already has one (it feeds two
    /// concatenations: the earlier copies it) or is not an intermediate
    /// (inputs, constants, outputs). A concatenation whose inputs all already
    /// sit end to end (DenseNet's: each layer's input is the previous one's
    /// plus one more feature map) is placed over them and copies nothing.
    /// Places stay [`ALIGNMENT`]-aligned. A concatenation reads its inputs
    /// in its own layout (reorders' copies included); a blocked one is
    /// placed only when every value fills whole channel blocks, whose
    /// offsets are then the NCHW ones.
    fn in_place_homes(
        &self,
        route: &Route,
        intermediates: &[usize],
    ) -> Vec<Option<(usize, usize)>> {
        let total = route.shapes.len();
        let mut homes: Vec<Option<(usize, usize)>> = vec![None; total];
        let mut is_intermediate = vec![false; total];
        for &v in intermediates {
            is_intermediate[v] = true;
        }
        let size = self.dtype.size();
        for (node, inputs) in self.nodes.iter().zip(&route.inputs).rev() {
            let c = node.output;
            // A blocked value's offsets are its logical ones only when its
            // channels fill whole blocks (a blocked concatenation's inputs).
            let whole = |v: usize| {
                route.layouts[v] == Layout::Nchw
                    || route.physical(v).iter().product::<usize>()
                        == route.shapes[v].iter().product::<usize>()
            };
            let same_layout = inputs.iter().all(|&v| route.layouts[v] == route.layouts[c]);
            if !is_intermediate[c] || !same_layout || !whole(c) || !inputs.iter().all(|&v| whole(v))
            {
                continue;
            }
            let refs: Vec<&[usize]> = inputs.iter().map(|&v| route.shapes[v].as_slice()).collect();
            let Some(starts) = node.op.in_place_parts(&refs) else {
                continue;
            };
            let at = |i: usize| starts[i] * size;
            if homes[c].is_none() {
                // Over inputs already end to end (a prefix of a later output).
                let first = inputs.first().and_then(|&v| homes[v]);
                if let Some((root, base)) = first {
                    let end_to_end = inputs
                        .iter()
                        .enumerate()
                        .all(|(i, &v)| homes[v] == Some((root, base + at(i))));
                    if end_to_end {
                        homes[c] = Some((root, base));
                        continue;
                    }
                }
            }
            let (root, base) = homes[c].unwrap_or((c, 0));
            for (i, &v) in inputs.iter().enumerate() {
                let place = base + at(i);
                if is_intermediate[v] && homes[v].is_none() && v != root && place % ALIGNMENT == 0 {
                    homes[v] = Some((root, place));
                }
            }
        }
        homes
    }

    /// Gives `homes` the outputs written over an input
    /// ([`Operation::output_over_input`]: a 1x1 convolution over the
    /// residual it adds): the output's home is the input's place (the
    /// input's own home, where an earlier output was written over it) when
    /// the node is the input's last reader and reads it once, and both are
    /// intermediates of one layout and physical shape that no concatenation
    /// places or holds. The input's place is then stretched over the
    /// output's lifetime, so a chain of residual blocks writes one buffer.
    fn outputs_over_inputs(
        &self,
        route: &Route,
        last_use: &[Option<usize>],
        intermediates: &[usize],
        homes: &mut [Option<(usize, usize)>],
    ) {
        let total = route.shapes.len();
        let mut free = vec![false; total];
        for &v in intermediates {
            free[v] = homes[v].is_none();
        }
        for home in homes.iter().flatten() {
            free[home.0] = false;
        }
        for (s, step) in route.steps.iter().enumerate() {
            let Step::Node(i) = *step else { continue };
            let (reads, v) = (route.reads(step), self.nodes[i].output);
            let shapes: Vec<&[usize]> = reads.iter().map(|&u| route.shapes[u].as_slice()).collect();
            let blocked = route.blocked[i].has_kernel();
            let Some(&r) = self.nodes[i]
                .op
                .output_over_input(&shapes, blocked)
                .and_then(|k| reads.get(k))
            else {
                continue;
            };
            let over = free[r]
                && free[v]
                && last_use[r] == Some(s)
                && reads.iter().filter(|&&u| u == r).count() == 1
                && route.layouts[r] == route.layouts[v]
                && route.physical(r) == route.physical(v);
            if over {
                homes[v] = Some(homes[r].unwrap_or((r, 0)));
            }
        }
    }

    fn plan_for(&self, input_shapes: &[Vec<usize>]) -> Result<Arc<Plan>> {
        {
            let mut rt = self.runtime();
            rt.clock += 1;
            let now = rt.clock;
            if let Some((plan, used)) = rt.plans.get_mut(input_shapes) {
                *used = now;
                return Ok(plan.clone());
            }
        }
        // Planned outside the lock: another thread may plan the same shape meanwhile, harmlessly.
        let plan = Arc::new(self.make_plan(input_shapes)?);
        let mut rt = self.runtime();
        // A model fed many shapes keeps the ones it uses, within a bound.
        if rt.plans.len() >= PLANS_KEPT {
            let oldest = rt
                .plans
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                rt.plans.remove(&k);
            }
        }
        let now = rt.clock;
        rt.plans.insert(input_shapes.to_vec(), (plan.clone(), now));
        Ok(plan)
    }

    /// The memory plan for these input shapes (planning it if needed).
    pub fn memory_plan(&self, input_shapes: &[Vec<usize>]) -> Result<MemoryPlan> {
        let plan = self.plan_for(input_shapes)?;
        let workspace_bytes = self
            .summary(input_shapes)?
            .iter()
            .map(|r| r.workspace_bytes)
            .max()
            .unwrap_or(0);
        Ok(MemoryPlan {
            arena_bytes: plan.arena_bytes,
            intermediate_bytes: plan.intermediate_bytes,
            arenas_allocated: self.runtime().arenas_allocated,
            workspace_bytes,
            chunked_steps: plan.chunks.map_or(0, |c| c.steps),
            chunk_images: plan.chunks.map_or_else(
                || {
                    input_shapes
                        .first()
                        .and_then(|s| s.first())
                        .copied()
                        .unwrap_or(1)
                },
                |c| c.images,
            ),
        })
    }

    /// An arena for `plan`, reused from the pool when one is free; a refused
    /// allocation names the largest intermediate value and the input shapes.
    fn take_arena(&self, plan: &Plan, input_shapes: &[Vec<usize>]) -> Result<Tensor> {
        let bytes = plan.arena_bytes;
        {
            let mut rt = self.runtime();
            if let Some(i) = rt.arenas.iter().position(|a| a.numel() * 4 >= bytes) {
                return Ok(rt.arenas.swap_remove(i));
            }
        }
        // Allocated outside the lock: other threads keep running meanwhile.
        // Not zeroed: it is reused from call to call, so every kernel must
        // write its output whole anyway (debug builds fill it with NaN).
        let arena = Tensor::unfilled(DType::F32, &[bytes.div_ceil(4)]).map_err(|e| {
            let Error::OutOfMemory { .. } = e else {
                return e.with_op("model");
            };
            // Only computed on failure: the node whose output is largest.
            let largest = self
                .nodes
                .iter()
                .filter(|n| plan.offsets[n.output].is_some())
                .max_by_key(|n| plan.route.shapes[n.output].iter().product::<usize>());
            let ins: Vec<String> = input_shapes.iter().map(|s| shape_str(s)).collect();
            let (op, what) = match largest {
                Some(n) => (
                    n.op.kind().name(),
                    format!(
                        "the arena of intermediate values (the largest: the output of shape {} of node '{}')",
                        shape_str(&plan.route.shapes[n.output]),
                        n.name
                    ),
                ),
                None => ("model", "the arena of intermediate values".to_string()),
            };
            Error::out_of_memory(
                op,
                &what,
                bytes,
                &format!("model input shape(s) {}", ins.join(", ")),
            )
        })?;
        self.runtime().arenas_allocated += 1;
        Ok(arena)
    }

    fn return_arena(&self, arena: Tensor) {
        let mut rt = self.runtime();
        // Arenas too small for the current plans are dropped rather than pooled forever.
        let needed = rt
            .plans
            .values()
            .map(|(p, _)| p.arena_bytes)
            .max()
            .unwrap_or(0);
        if arena.numel() * 4 >= needed && rt.arenas.len() < 16 {
            rt.arenas.push(arena);
        }
    }

    /// Runs the graph. Inputs may be borrowed and non-contiguous; outputs are owned.
    pub fn run(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>> {
        self.with_arena(&inputs, |plan, arena| {
            self.execute(plan, &inputs, arena, None)
        })
    }

    /// Runs the graph `repeat` times (after one untimed warm-up run) and returns
    /// the outputs of the last run with each node's median wall time in seconds,
    /// in node order.
    pub fn profile(&self, inputs: Vec<Tensor>, repeat: usize) -> Result<(Vec<Tensor>, Vec<f64>)> {
        let mut samples: Vec<Vec<f64>> = Vec::with_capacity(self.nodes.len());
        for _ in &self.nodes {
            // `repeat` is the caller's: a count no memory can hold is an error.
            samples.push(
                ai3_kernels::alloc::try_vec_with_capacity(repeat, "profile samples")
                    .map_err(|e| Error::from_kernel("model", &format!("repeat={repeat}"), e))?,
            );
        }
        let out = self.with_arena(&inputs, |plan, arena| {
            let mut out = self.execute(plan, &inputs, arena, None)?;
            for _ in 0..repeat.max(1) {
                let mut times = vec![0.0; self.nodes.len()];
                out = self.execute(plan, &inputs, arena, Some(&mut times))?;
                for (s, t) in samples.iter_mut().zip(times) {
                    s.push(t);
                }
            }
            Ok(out)
        })?;
        let medians = samples
            .into_iter()
            .map(|mut s| {
                s.sort_by(f64::total_cmp);
                s.get(s.len() / 2).copied().unwrap_or(0.0)
            })
            .collect();
        Ok((out, medians))
    }

    /// Checks the inputs, then runs `f` with the plan for their shapes and a
    /// pooled arena, inside ai3's thread pool (on the calling thread alone
    /// for small runs).
    fn with_arena<R>(
        &self,
        inputs: &[Tensor],
        f: impl FnOnce(&Plan, &mut Tensor) -> Result<R> + Send,
    ) -> Result<R>
    where
        R: Send,
    {
        self.check_inputs(inputs)?;
        let input_shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
        let plan = self.plan_for(&input_shapes)?;
        let mut arena = self.take_arena(&plan, &input_shapes)?;
        let run = || f(&plan, &mut arena);
        // Runs of several nodes keep the pool's workers awake between them
        // (a swapped layer's one node has nothing to wait between).
        let several = self.nodes.len() > 1;
        let result = if plan.parallel && several {
            crate::threads::install_parking_openmp(|| crate::threads::with_workers_awake(run))
        } else if plan.parallel {
            crate::threads::install_parking_openmp(run)
        } else {
            crate::threads::run_on_caller(run)
        };
        self.return_arena(arena);
        result
    }

    /// Runs every step once; with `times` (one per node), adds each node's
    /// wall time in seconds, the reorders made for it included.
    fn execute(
        &self,
        plan: &Plan,
        inputs: &[Tensor],
        arena: &mut Tensor,
        mut times: Option<&mut [f64]>,
    ) -> Result<Vec<Tensor>> {
        // Channels-last inputs that every reader takes as they are.
        let in_place: Vec<bool> = inputs
            .iter()
            .zip(&plan.read_channels_last)
            .map(|(t, &ok)| ok && !t.is_contiguous() && t.is_channels_last())
            .collect();
        // Kernels need row-major data: only non-contiguous inputs are copied.
        let copies: Vec<Option<Tensor>> = inputs
            .iter()
            .enumerate()
            .map(|(i, t)| {
                (!t.is_contiguous() && !in_place[i])
                    .then(|| t.to_contiguous())
                    .transpose()
                    .map_err(|e| {
                        e.with_op(self.input_consumer(i))
                            .map_msg(|m| format!("{m} (a contiguous copy of input {i})"))
                    })
            })
            .collect::<Result<_>>()?;
        let route = &plan.route;
        let base = arena.data_ptr_mut();
        let mut values: Vec<Option<Tensor>> = (0..route.shapes.len()).map(|_| None).collect();
        // A channels-last input read in place is not cut into chunks.
        let chunks = plan.chunks.filter(|_| !in_place.contains(&true));
        if let Some(c) = chunks {
            self.execute_chunks(
                plan,
                c,
                inputs,
                &copies,
                base,
                &mut values,
                times.as_deref_mut(),
            )?;
        }
        for step in &route.steps[chunks.map_or(0, |c| c.steps)..] {
            let (v, owner) = match *step {
                Step::Node(i) => (self.nodes[i].output, i),
                Step::Reorder { dst, owner, .. } => (dst, owner),
            };
            if let Step::Node(i) = *step {
                let start = times.is_some().then(std::time::Instant::now);
                if let Some(out) = self.run_channels_last(plan, i, inputs, &in_place)? {
                    if let (Some(times), Some(start)) = (times.as_deref_mut(), start) {
                        times[i] += start.elapsed().as_secs_f64();
                    }
                    values[v] = Some(out);
                    continue;
                }
            }
            let mut out = self.output_for(plan, v, owner, base)?;
            let start = times.is_some().then(std::time::Instant::now);
            // An empty output (a batch of 0) has nothing to compute; its
            // shape was already checked when the plan was made.
            if out.numel() > 0 {
                let reads = route.reads(step);
                let refs: Vec<&Tensor> = reads
                    .iter()
                    .map(|&u| self.value(u, &values, inputs, &copies))
                    .collect::<Result<_>>()?;
                let shapes: Vec<&[usize]> =
                    reads.iter().map(|&u| route.shapes[u].as_slice()).collect();
                self.compute_step(route, step, &refs, &shapes, &mut out)?;
            }
            if let (Some(times), Some(start)) = (times.as_deref_mut(), start) {
                times[owner] += start.elapsed().as_secs_f64();
            }
            values[v] = Some(out);
        }
        let mut result = Vec::with_capacity(route.outputs.len());
        for (k, &v) in route.outputs.iter().enumerate() {
            let reused_later = route.outputs[k + 1..].contains(&v);
            let computed = v >= self.num_values() || matches!(self.sources[v], Source::Node(_));
            let t = if computed && !reused_later {
                values[v]
                    .take()
                    .ok_or_else(|| Error::internal("graph", "output vanished"))?
            } else {
                self.value(v, &values, inputs, &copies)?
                    .to_contiguous()
                    .map_err(|e| e.with_op("model"))?
            };
            result.push(t);
        }
        Ok(result)
    }

    /// The buffer of value `v`, written by a step of node `owner`: its place
    /// in the arena, or memory of its own (a graph output).
    fn output_for(&self, plan: &Plan, v: usize, owner: usize, base: *mut u8) -> Result<Tensor> {
        let route = &plan.route;
        let shape = route.physical(v);
        match plan.offsets[v] {
            // SAFETY: the planner gives values alive at the same time disjoint
            // ranges inside the arena, which outlives this call.
            Some(offset) => unsafe {
                let strides = contiguous_strides(&shape);
                Tensor::from_raw_parts(
                    base.add(offset),
                    self.dtype,
                    shape,
                    strides,
                    Device::Cpu,
                    Box::new(()),
                )
            },
            // Every kernel writes its output whole (the arena, reused
            // from call to call, relies on it too): no zeroing.
            None => Tensor::unfilled(self.dtype, &shape).map_err(|e| {
                let node = &self.nodes[owner];
                let ins = self.input_shapes_str(node, &route.shapes);
                let e = match e {
                    Error::OutOfMemory { .. } => Error::out_of_memory(
                        node.op.kind().name(),
                        &format!("the output of shape {}", shape_str(&shape)),
                        checked_bytes("model", self.dtype, &shape).unwrap_or(usize::MAX),
                        &ins,
                    ),
                    other => other.with_op(node.op.kind().name()),
                };
                with_node(e, &node.name)
            }),
        }
    }

    /// Runs `step` into `out` from the values it reads (`reads`), whose
    /// logical shapes are `shapes`.
    fn compute_step(
        &self,
        route: &Route,
        step: &Step,
        reads: &[&Tensor],
        shapes: &[&[usize]],
        out: &mut Tensor,
    ) -> Result<()> {
        match *step {
            Step::Node(i) => {
                let node = &self.nodes[i];
                // Elementwise operations run their usual kernel over the
                // blocked buffers.
                let done = if route.blocked[i].has_kernel() {
                    node.op.forward_blocked(reads, shapes, out)
                } else {
                    node.op.forward(reads, out)
                };
                done.map_err(|e| with_node(e, &node.name))
            }
            Step::Reorder { to, owner, .. } => reorder(reads[0], shapes[0], to, out)
                .map_err(|e| with_node(e, &self.nodes[owner].name)),
        }
    }

    /// Runs the chunked first steps ([`Chunks`]): every value they write
    /// gets its whole buffer first, then each step runs on views of a few
    /// images of what it reads and writes, chunk after chunk. With `times`,
    /// adds each step's time to its node's.
    #[allow(clippy::too_many_arguments)]
    fn execute_chunks(
        &self,
        plan: &Plan,
        chunks: Chunks,
        inputs: &[Tensor],
        copies: &[Option<Tensor>],
        base: *mut u8,
        values: &mut [Option<Tensor>],
        mut times: Option<&mut [f64]>,
    ) -> Result<()> {
        let route = &plan.route;
        let steps = &route.steps[..chunks.steps];
        let owner = |step: &Step| match *step {
            Step::Node(i) => i,
            Step::Reorder { owner, .. } => owner,
        };
        for step in steps {
            let v = self.written(step);
            values[v] = Some(self.output_for(plan, v, owner(step), base)?);
        }
        let batch = route.shapes[self.written(&steps[0])][0];
        let values = &*values;
        let chunk = |first: usize, mut times: Option<&mut [f64]>| -> Result<()> {
            let n = chunks.images.min(batch - first);
            for step in steps {
                let start = times.is_some().then(std::time::Instant::now);
                let reads = route.reads(step);
                let views: Vec<Tensor> = reads
                    .iter()
                    .map(|&u| images(self.value(u, values, inputs, copies)?, first, n))
                    .collect::<Result<_>>()?;
                let refs: Vec<&Tensor> = views.iter().collect();
                let shapes: Vec<Vec<usize>> = reads
                    .iter()
                    .map(|&u| {
                        let mut s = route.shapes[u].clone();
                        s[0] = n;
                        s
                    })
                    .collect();
                let shapes: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
                let v = self.written(step);
                let whole = values[v]
                    .as_ref()
                    .ok_or_else(|| Error::internal("graph", "chunked output vanished"))?;
                let mut out = images(whole, first, n)?;
                if out.numel() > 0 {
                    self.compute_step(route, step, &refs, &shapes, &mut out)?;
                }
                if let (Some(times), Some(start)) = (times.as_deref_mut(), start) {
                    times[owner(step)] += start.elapsed().as_secs_f64();
                }
            }
            Ok(())
        };
        // One chunk after the other: the kernels spread each step of a
        // chunk over the threads (chunks on threads of their own measured
        // slower, and would need every chunked value in memory of its own).
        for first in (0..batch).step_by(chunks.images) {
            chunk(first, times.as_deref_mut())?;
        }
        Ok(())
    }

    /// Runs node `i` channels last when the plan lets it and its input
    /// arrived so (`in_place`, per graph input): its output, a
    /// channels-last view of an NHWC tensor. `None` when it runs NCHW.
    fn run_channels_last(
        &self,
        plan: &Plan,
        i: usize,
        inputs: &[Tensor],
        in_place: &[bool],
    ) -> Result<Option<Tensor>> {
        let node = &self.nodes[i];
        let input = match (plan.channels_last[i], &plan.route.inputs[i][..]) {
            (true, &[x]) => match self.sources[x] {
                Source::Input(j) if in_place[j] => &inputs[j],
                _ => return Ok(None),
            },
            _ => return Ok(None),
        };
        let &[n, c, h, w] = input.shape() else {
            return Ok(None);
        };
        // SAFETY: a channels-last input is its `[n, h, w, c]` elements
        // row-major from its first one; the caller's input outlives this
        // call, and nothing writes it meanwhile.
        let x = unsafe {
            Tensor::from_raw_parts(
                input.data_ptr() as *mut u8,
                self.dtype,
                vec![n, h, w, c],
                contiguous_strides(&[n, h, w, c]),
                Device::Cpu,
                Box::new(()),
            )?
        };
        let &[on, oc, oh, ow] = plan.route.shapes[node.output].as_slice() else {
            return Err(Error::internal(
                node.op.kind().name(),
                "a channels-last output is not 4-D",
            ));
        };
        let mut out = Tensor::unfilled(self.dtype, &[on, oh, ow, oc])
            .map_err(|e| with_node(e.with_op(node.op.kind().name()), &node.name))?;
        if out.numel() > 0 {
            node.op
                .forward_channels_last(&[&x], &mut out)
                .map_err(|e| with_node(e, &node.name))?;
        }
        out.permuted(&[0, 3, 1, 2]).map(Some)
    }

    fn value<'a>(
        &'a self,
        v: ValueId,
        values: &'a [Option<Tensor>],
        inputs: &'a [Tensor],
        copies: &'a [Option<Tensor>],
    ) -> Result<&'a Tensor> {
        match self.sources.get(v) {
            Some(&Source::Input(i)) => Ok(copies[i].as_ref().unwrap_or(&inputs[i])),
            Some(&Source::Constant(c)) => Ok(&self.constants[c]),
            // A node's output or a reorder's copy.
            _ => values[v]
                .as_ref()
                .ok_or_else(|| Error::internal("graph", format!("value {v} read before written"))),
        }
    }

    /// A human-readable table of the graph for the given input shapes: a
    /// line per node with its algorithm, layout, shapes and reorders.
    pub fn describe(&self, input_shapes: &[Vec<usize>]) -> Result<String> {
        let mut s = String::new();
        for r in self.summary(input_shapes)? {
            let ins: Vec<String> = r.input_shapes.iter().map(|x| shape_str(x)).collect();
            let _ = write!(
                s,
                "{:<24} {:<18} {:<10} {:<7} {} -> {}",
                r.name,
                r.op,
                r.algorithm,
                r.layout,
                ins.join(", "),
                shape_str(&r.output_shape)
            );
            if !r.reorders.is_empty() {
                let _ = write!(s, "  (reorders: {})", r.reorders.join("; "));
            }
            s.push('\n');
        }
        Ok(s)
    }
}

/// Writes `x` (of logical shape `shape`, `[n, c, h, w]`) into `out` in
/// layout `to`, from the other one.
/// Images `first..first + n` of the contiguous, batch-first tensor `t`, as
/// a view of its memory. The chunked steps write through such views of
/// their outputs, each chunk's images apart from the others'.
fn images(t: &Tensor, first: usize, n: usize) -> Result<Tensor> {
    let mut shape = t.shape().to_vec();
    if !t.is_contiguous() || shape.first().is_none_or(|&b| first + n > b) {
        return Err(Error::internal(
            "graph",
            format!(
                "images {first}..{} of a tensor of shape {}",
                first + n,
                shape_str(&shape)
            ),
        ));
    }
    let image: usize = shape[1..].iter().product();
    shape[0] = n;
    let strides = contiguous_strides(&shape);
    // SAFETY: the images lie inside `t`'s memory (checked above), which
    // outlives the view (the executor drops views before the values); a
    // chunked step writes only its output's view, no other view overlaps.
    unsafe {
        Tensor::from_raw_parts(
            t.data_ptr()
                .cast_mut()
                .add(first * image * t.dtype().size()),
            t.dtype(),
            shape,
            strides,
            Device::Cpu,
            Box::new(()),
        )
    }
}

fn reorder(x: &Tensor, shape: &[usize], to: Layout, out: &mut Tensor) -> Result<()> {
    let &[n, c, h, w] = shape else {
        return Err(Error::internal(
            "reorder",
            format!(
                "a value of shape {} has no blocked layout",
                shape_str(shape)
            ),
        ));
    };
    crate::ops::with_dtype!(x.dtype(), T, {
        let (src, dst) = (x.as_slice::<T>()?, out.as_mut_slice::<T>()?);
        let done = match to {
            Layout::Blocked => blocked::to_blocked(n, c, h * w, src, dst),
            Layout::Nchw => blocked::from_blocked(n, c, h * w, src, dst),
        };
        done.map_err(|e| {
            Error::from_kernel(
                "reorder",
                &format!("value of shape {}", shape_str(shape)),
                e,
            )
        })
    })
}

/// Adds the node an error came from to its message.
fn with_node(e: Error, node: &str) -> Error {
    e.map_msg(|msg| format!("{msg} (at node '{node}')"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{Activation, ActivationKind, Concat, Flatten, Softmax};

    fn relu() -> Box<Activation> {
        Box::new(Activation::new(ActivationKind::Relu).unwrap())
    }

    fn relu_chain() -> Graph {
        let mut g = Graph::new(DType::F32, 1);
        let a = g.push("relu", relu(), vec![0]).unwrap();
        let b = g.push("relu2", relu(), vec![a]).unwrap();
        let c = g
            .push("flatten", Box::new(Flatten::new(1, -1)), vec![b])
            .unwrap();
        g.set_outputs(vec![c, a]).unwrap();
        g
    }

    /// A 1x1 convolution on the blocked kernel, 16 -> 16 channels, adding
    /// a residual (its second input) where `residual`.
    fn pointwise(seed: usize, residual: bool) -> Box<crate::ops::Conv2d> {
        use crate::registry::{Algorithm, Request};
        let w: Vec<f32> = (0..256)
            .map(|i| ((i * 7 + seed * 5) % 13) as f32 / 13.0 - 0.5)
            .collect();
        let conv = crate::ops::Conv2d::new(
            Tensor::from_slice(&w, &[16, 16, 1, 1]).unwrap(),
            None,
            (1, 1),
            Default::default(),
            (1, 1),
            1,
            crate::ops::PadMode::Zeros,
            Request::Named(Algorithm::Gemm),
        )
        .unwrap();
        Box::new(conv.with_residual(residual))
    }

    /// ResNet's bottleneck ends: a 1x1 convolution that is its residual's
    /// last reader is written over it, block after block in one place; a
    /// residual read again later, or also the convolution's input, keeps
    /// its own. The results are the NCHW run's.
    #[test]
    fn residual_1x1_convolutions_are_written_over_their_residual() {
        if !ai3_kernels::cpu::blocked::available() {
            return;
        }
        let mut g = Graph::new(DType::F32, 1);
        let a = g.push("a", pointwise(0, false), vec![0]).unwrap();
        let h1 = g.push("h1", pointwise(1, false), vec![a]).unwrap();
        let b1 = g.push("b1", pointwise(2, true), vec![h1, a]).unwrap();
        let h2 = g.push("h2", pointwise(3, false), vec![b1]).unwrap();
        let b2 = g.push("b2", pointwise(4, true), vec![h2, b1]).unwrap();
        let h3 = g.push("h3", pointwise(5, false), vec![b2]).unwrap();
        let b3 = g.push("b3", pointwise(6, true), vec![h3, b2]).unwrap();
        let q = g.push("q", pointwise(7, false), vec![b3]).unwrap();
        let b4 = g.push("b4", pointwise(8, true), vec![q, q]).unwrap();
        let add = Box::new(crate::ops::Binary::new(
            crate::ops::BinaryKind::Add,
            None,
            false,
        ));
        let out = g.push("out", add, vec![b4, b2]).unwrap();
        g.set_outputs(vec![out]).unwrap();

        let shape = vec![1, 16, 6, 6];
        let plan = g.make_plan(std::slice::from_ref(&shape)).unwrap();
        let at = |v: usize| plan.offsets[v].unwrap();
        assert_eq!((at(b1), at(b2)), (at(a), at(a)));
        // b2 is read after b3; q is both of b4's inputs.
        assert_ne!(at(b3), at(b2));
        assert_ne!(at(b4), at(q));

        let x: Vec<f32> = (0..576)
            .map(|i| ((i * 11) % 17) as f32 / 17.0 - 0.5)
            .collect();
        let run = |g: &Graph| {
            let got = g
                .run(vec![Tensor::from_slice(&x, &shape).unwrap()])
                .unwrap();
            got[0].as_slice::<f32>().unwrap().to_vec()
        };
        let blocked = run(&g);
        g.set_blocked_layouts(false);
        let nchw = run(&g);
        for (i, (b, n)) in blocked.iter().zip(&nchw).enumerate() {
            assert!(
                (b - n).abs() <= 1e-4 * (1.0 + n.abs()),
                "at {i}: {b} vs {n}"
            );
        }
    }

    /// DenseNet's pattern at batch 1: every layer concatenates all earlier
    /// feature maps. Each map is written once, inside the last
    /// concatenation's output, and every concatenation is a view over it.
    #[test]
    fn concatenations_at_batch_1_are_planned_in_place() {
        let mut g = Graph::new(DType::F32, 1);
        let cat = || Box::new(Concat::new(1));
        let a = g.push("a", relu(), vec![0]).unwrap();
        let c1 = g.push("c1", cat(), vec![a]).unwrap();
        let f1 = g.push("f1", relu(), vec![c1]).unwrap();
        let c2 = g.push("c2", cat(), vec![a, f1]).unwrap();
        let f2 = g.push("f2", relu(), vec![c2]).unwrap();
        let c3 = g.push("c3", cat(), vec![a, f1, f2]).unwrap();
        let out = g.push("out", relu(), vec![c3]).unwrap();
        g.set_outputs(vec![out]).unwrap();

        let shape = vec![1, 16, 4, 4];
        let plan = g.make_plan(std::slice::from_ref(&shape)).unwrap();
        let at = |v: usize| plan.offsets[v].unwrap();
        let map = 16 * 16 * 4; // bytes of one [1, 16, 4, 4] map
        assert_eq!((at(c1), at(c2)), (at(c3), at(c3)));
        assert_eq!(
            (at(a), at(f1), at(f2)),
            (at(c3), at(c3) + map, at(c3) + 2 * map)
        );

        let x: Vec<f32> = (0..256).map(|i| i as f32 - 128.0).collect();
        let want: Vec<f32> = x.iter().map(|v| v.max(0.0)).collect();
        let got = g
            .run(vec![Tensor::from_slice(&x, &shape).unwrap()])
            .unwrap();
        assert_eq!(got[0].shape(), &[1, 64, 4, 4]);
        assert_eq!(got[0].as_slice::<f32>().unwrap(), want.repeat(4).as_slice());

        // At batch 2 a channel range is not contiguous: every value has a
        // place of its own, and the result is the same.
        let plan = g.make_plan(&[vec![2, 16, 4, 4]]).unwrap();
        assert_ne!(plan.offsets[a], plan.offsets[c3]);
        let x2 = [x.clone(), x].concat();
        let got = g
            .run(vec![Tensor::from_slice(&x2, &[2, 16, 4, 4]).unwrap()])
            .unwrap();
        let image = want.repeat(4);
        assert_eq!(
            got[0].as_slice::<f32>().unwrap(),
            image.repeat(2).as_slice()
        );
    }

    /// A batch of large images runs its first steps chunk by chunk; a value
    /// of the run read after it shares memory with no other value of the
    /// run (a later chunk would overwrite it there).
    #[test]
    fn large_first_steps_run_in_chunks_and_keep_their_outputs() {
        let mut g = Graph::new(DType::F32, 1);
        let a = g.push("a", relu(), vec![0]).unwrap();
        let b = g.push("b", relu(), vec![a]).unwrap();
        let c = g.push("c", relu(), vec![b]).unwrap();
        let d = g.push("d", Box::new(Concat::new(1)), vec![c, a]).unwrap();
        let e = g.push("e", relu(), vec![d]).unwrap();
        let f = g.push("f", Box::new(Flatten::new(1, -1)), vec![e]).unwrap();
        let out = g.push("out", relu(), vec![f]).unwrap();
        g.set_outputs(vec![out]).unwrap();
        // 16 MiB a value: every step but the flatten and after is chunked.
        let shape = vec![4, 64, 128, 128];
        let plan = g.make_plan(std::slice::from_ref(&shape)).unwrap();
        let chunks = plan.chunks.expect("chunked");
        assert_eq!(chunks.steps, 5);
        assert!(chunks.images < 4);
        let range = |v: usize| {
            let at = plan.offsets[v].unwrap();
            at..at + plan.route.physical(v).iter().product::<usize>() * 4
        };
        for v in [a, b, c, d] {
            let (x, y) = (range(v), range(e));
            assert!(x.end <= y.start || y.end <= x.start, "{v}: {x:?} and {y:?}");
        }
        // Small images run whole.
        assert!(g
            .make_plan(&[vec![4, 64, 16, 16]])
            .unwrap()
            .chunks
            .is_none());

        let n: usize = shape.iter().product();
        let x: Vec<f32> = (0..n).map(|i| (i % 7) as f32 - 3.0).collect();
        let got = g
            .run(vec![Tensor::from_slice(&x, &shape).unwrap()])
            .unwrap();
        let image = 64 * 128 * 128;
        let want: Vec<f32> = x
            .chunks(image)
            .flat_map(|im| im.iter().chain(im).map(|v| v.max(0.0)))
            .collect();
        assert_eq!(got[0].as_slice::<f32>().unwrap(), want.as_slice());
    }

    /// The step that reads the run's last large value runs in the chunks
    /// too (it reads each chunk while still in cache), even though what it
    /// writes is small; the step after it does not.
    #[test]
    fn the_reader_of_the_last_large_value_is_chunked_too() {
        use crate::ops::{MaxPool2d, Window};
        let pool = || {
            Box::new(
                MaxPool2d::new(Window {
                    kernel: (2, 2),
                    stride: (2, 2),
                    padding: (0, 0),
                    dilation: (1, 1),
                    ceil_mode: false,
                })
                .unwrap(),
            )
        };
        let mut g = Graph::new(DType::F32, 1);
        let a = g.push("a", relu(), vec![0]).unwrap();
        let b = g.push("b", pool(), vec![a]).unwrap();
        let c = g.push("c", relu(), vec![b]).unwrap();
        g.set_outputs(vec![c]).unwrap();
        // 16 MiB into the pool, 4 MiB out of it.
        let shape = vec![4, 64, 128, 128];
        let plan = g.make_plan(std::slice::from_ref(&shape)).unwrap();
        let chunks = plan.chunks.expect("chunked");
        assert_eq!(chunks.steps, 2);
        assert!(chunks.images < 4);

        let n: usize = shape.iter().product();
        let x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 23) as f32 - 11.0).collect();
        let got = g
            .run(vec![Tensor::from_slice(&x, &shape).unwrap()])
            .unwrap();
        let (h, w) = (128, 128);
        let mut want = Vec::with_capacity(n / 4);
        for plane in x.chunks(h * w) {
            for y in 0..h / 2 {
                for xx in 0..w / 2 {
                    let at = |dy: usize, dx: usize| plane[(2 * y + dy) * w + 2 * xx + dx];
                    let m = at(0, 0).max(at(0, 1)).max(at(1, 0)).max(at(1, 1));
                    want.push(m.max(0.0));
                }
            }
        }
        assert_eq!(got[0].as_slice::<f32>().unwrap(), want.as_slice());
    }

    #[test]
    fn runs_nodes_in_order_and_returns_every_output() {
        let g = relu_chain();
        let x = Tensor::from_slice(&[-1.0f32, 2.0, -3.0, 4.0], &[1, 2, 2]).unwrap();
        let out = g.run(vec![x]).unwrap();
        assert_eq!(out[0].shape(), &[1, 4]);
        assert_eq!(out[0].as_slice::<f32>().unwrap(), &[0.0, 2.0, 0.0, 4.0]);
        // The first intermediate is also an output, so it must not live in the arena.
        assert_eq!(out[1].as_slice::<f32>().unwrap(), &[0.0, 2.0, 0.0, 4.0]);
    }

    #[test]
    fn only_runs_with_enough_work_go_to_the_pool() {
        let g = relu_chain();
        // 8 per element of each node: 3 x 8 x 4 elements.
        assert!(!g.make_plan(&[vec![1, 2, 2]]).unwrap().parallel);
        assert!(g.make_plan(&[vec![1, 512, 512]]).unwrap().parallel);
        // A product counts its multiply-adds, not the elements it touches:
        // 64 x 64 x 64 x 16 = 4Mi, from 128Ki elements.
        let mut mm = Graph::new(DType::F32, 2);
        let p = mm
            .push("mm", Box::new(crate::ops::Matmul), vec![0, 1])
            .unwrap();
        mm.set_outputs(vec![p]).unwrap();
        assert!(
            mm.make_plan(&[vec![16, 64, 64], vec![64, 64]])
                .unwrap()
                .parallel
        );
        assert!(!mm.make_plan(&[vec![4, 4], vec![4, 4]]).unwrap().parallel);
    }

    #[test]
    fn profile_times_every_node_and_returns_the_outputs() {
        let g = relu_chain();
        let x = Tensor::from_slice(&[-1.0f32, 2.0, -3.0, 4.0], &[1, 2, 2]).unwrap();
        let (out, times) = g.profile(vec![x], 3).unwrap();
        assert_eq!(times.len(), g.nodes().len());
        assert!(times.iter().all(|t| t.is_finite() && *t >= 0.0));
        assert_eq!(out[0].as_slice::<f32>().unwrap(), &[0.0, 2.0, 0.0, 4.0]);
    }

    #[test]
    fn changing_shapes_evict_the_least_recently_used_plan_only() {
        let g = relu_chain();
        let run = |len: usize| {
            let x = Tensor::zeros(DType::F32, &[1, 2, len]).unwrap();
            g.run(vec![x]).unwrap();
        };
        // A sequence length that comes back (the first) survives a stream of
        // new ones longer than the cache, as long as it keeps being used.
        for len in 1..=3 * PLANS_KEPT {
            run(len);
            run(1);
        }
        let rt = g.runtime();
        assert_eq!(rt.plans.len(), PLANS_KEPT);
        assert!(rt.plans.contains_key(&vec![vec![1, 2, 1]]));
        let last = vec![vec![1, 2, 3 * PLANS_KEPT]];
        assert!(rt.plans.contains_key(&last));
    }

    #[test]
    fn second_call_with_same_shape_reuses_the_arena() {
        let g = relu_chain();
        let run = |v: f32| {
            let x = Tensor::from_slice(&[v; 8], &[2, 2, 2]).unwrap();
            g.run(vec![x]).unwrap()
        };
        assert_eq!(run(1.0)[0].as_slice::<f32>().unwrap(), &[1.0; 8]);
        let first = g.memory_plan(&[vec![2, 2, 2]]).unwrap();
        assert_eq!(run(3.0)[0].as_slice::<f32>().unwrap(), &[3.0; 8]);
        let second = g.memory_plan(&[vec![2, 2, 2]]).unwrap();
        assert_eq!(first.arenas_allocated, 1);
        assert_eq!(second, first);
    }

    #[test]
    fn constants_feed_nodes() {
        let mut g = Graph::new(DType::F64, 0);
        let c = g
            .constant(Tensor::from_slice(&[-2.0f64, 5.0], &[2]).unwrap())
            .unwrap();
        let r = g.push("relu", relu(), vec![c]).unwrap();
        g.set_outputs(vec![r, c]).unwrap();
        let out = g.run(vec![]).unwrap();
        assert_eq!(out[0].as_slice::<f64>().unwrap(), &[0.0, 5.0]);
        assert_eq!(out[1].as_slice::<f64>().unwrap(), &[-2.0, 5.0]);
    }

    #[test]
    fn wrong_dtype_and_count_are_errors() {
        let g = relu_chain();
        let x = Tensor::from_slice(&[1.0f64], &[1]).unwrap();
        assert!(matches!(g.run(vec![x]), Err(Error::Dtype { .. })));
        assert!(matches!(g.run(vec![]), Err(Error::InvalidArgument { .. })));
    }

    #[test]
    fn errors_name_the_node() {
        let mut g = Graph::new(DType::F32, 1);
        let s = g
            .push("softmax", Box::new(Softmax::new(5)), vec![0])
            .unwrap();
        g.set_outputs(vec![s]).unwrap();
        let err = g
            .run(vec![Tensor::zeros(DType::F32, &[2, 3]).unwrap()])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("at node 'softmax'") && err.contains("[2, 3]"),
            "{err}"
        );
    }

    #[test]
    fn an_empty_batch_runs_no_kernel_and_gives_empty_outputs() {
        let g = relu_chain();
        let out = g
            .run(vec![Tensor::zeros(DType::F32, &[0, 3]).unwrap()])
            .unwrap();
        assert!(out.iter().all(|t| t.shape() == [0, 3]), "{out:?}");
    }

    /// `x + y` for `x: [n, 1, 1]`, `y: [1, n, 1]`, then `+ z` for `z: [1, 1, n]`
    /// when `three`, then relu: outputs of n^2 and n^3 elements from inputs of n.
    fn broadcast_chain(three: bool) -> Graph {
        use crate::ops::{Binary, BinaryKind};
        let mut g = Graph::new(DType::F32, 3);
        let add = || Box::new(Binary::new(BinaryKind::Add, None, false));
        let mut v = g.push("xy", add(), vec![0, 1]).unwrap();
        if three {
            v = g.push("xyz", add(), vec![v, 2]).unwrap();
        }
        let r = g.push("relu", relu(), vec![v]).unwrap();
        g.set_outputs(vec![r]).unwrap();
        g
    }

    fn column(n: usize, axis: usize) -> Tensor {
        let mut shape = [1, 1, 1];
        shape[axis] = n;
        Tensor::zeros(DType::F32, &shape).unwrap()
    }

    #[test]
    fn memory_the_system_refuses_is_an_error_naming_the_node() {
        // [2^21, 2^21, 1] f32 is 16 TB: the arena (add's output) is refused.
        let n = 1 << 21;
        let g = broadcast_chain(false);
        let err = g
            .run(vec![column(n, 0), column(n, 1), column(1, 2)])
            .unwrap_err();
        assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
        let msg = err.to_string();
        for part in [
            "add: ",
            "17.6 TB (17592186044416 bytes)",
            "[2097152, 2097152, 1]",
            "'xy'",
        ] {
            assert!(msg.contains(part), "{part} not in {msg}");
        }
        // The graph still runs on inputs that fit.
        let out = g
            .run(vec![column(2, 0), column(3, 1), column(1, 2)])
            .unwrap();
        assert_eq!(out[0].shape(), &[2, 3, 1]);
    }

    #[test]
    fn an_output_the_system_refuses_is_an_error_naming_its_op() {
        use crate::ops::{Binary, BinaryKind};
        let mut g = Graph::new(DType::F32, 2);
        let v = g
            .push(
                "sum",
                Box::new(Binary::new(BinaryKind::Add, None, false)),
                vec![0, 1],
            )
            .unwrap();
        g.set_outputs(vec![v]).unwrap();
        let n = 1 << 21;
        let err = g.run(vec![column(n, 0), column(n, 1)]).unwrap_err();
        assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
        let msg = err.to_string();
        for part in [
            "add: ",
            "the output of shape [2097152, 2097152, 1]",
            "input shapes [2097152, 1, 1], [1, 2097152, 1]",
            "'sum'",
        ] {
            assert!(msg.contains(part), "{part} not in {msg}");
        }
    }

    #[test]
    fn sizes_that_overflow_are_shape_errors_before_anything_is_allocated() {
        // [2^21]^3 f32 is 2^65 bytes.
        let n = 1 << 21;
        let g = broadcast_chain(true);
        let shapes = [vec![n, 1, 1], vec![1, n, 1], vec![1, 1, n]];
        let err = g.memory_plan(&shapes).unwrap_err();
        assert!(matches!(err, Error::Shape { .. }), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("[2097152, 2097152, 2097152]") && msg.contains("'xyz'"),
            "{msg}"
        );
        let err = g
            .run(vec![column(n, 0), column(n, 1), column(n, 2)])
            .unwrap_err();
        assert!(matches!(err, Error::Shape { .. }), "{err}");
        assert_eq!(
            g.memory_plan(&[vec![2, 1, 1], vec![1, 3, 1], vec![1, 1, 4]])
                .unwrap()
                .arenas_allocated,
            0
        );
    }

    #[test]
    fn reading_a_future_value_is_rejected() {
        let mut g = Graph::new(DType::F32, 1);
        assert!(g.push("bad", relu(), vec![5]).is_err());
    }
}
