//! Planned layouts: which values live in the channel-blocked layout (NCHW8c,
//! see [`ai3_kernels::cpu::blocked`]) and where the graph reorders.
//!
//! Each operation says, for its input shapes, whether it can run on blocked
//! values ([`Operation::blocked`]): with a kernel of its own (depthwise,
//! 1x1, Winograd and other `direct` convolutions, batch norm, pooling,
//! concatenation of whole channel blocks), which declares what it gains
//! over its NCHW kernel, or elementwise (activations, adds and products of
//! blocked values), which run their usual kernel over the blocked buffers.
//! A kernel that saves nothing (pooling, batch norm, concatenation) and
//! reads no candidate's output is left out when its output is smaller than
//! what it reads: the run then starts after it, reordering less. Candidates
//! connected through the values between them form regions; a
//! region goes blocked when its kernels gain more than its reorders cost
//! (every value entering it is reordered in, every value leaving it, to an
//! NCHW reader or a graph output, is reordered out), both counted in
//! elements moved. MobileNet's and EfficientNet's inverted residual blocks
//! thus run blocked from the first depthwise convolution to the global
//! pooling, with one reorder at each end, and DenseNet's dense blocks from
//! one transition to the next, and ResNet's and GoogLeNet's from the layer
//! after the stem's pooling on (their 3x3 layers on Winograd's blocked
//! kernel). A kernel may read its input in either layout
//! ([`Blocked::EitherInput`]: direct's blocked kernel for fewer than 8
//! input channels), taking a blocked producer's output as it is and an
//! NCHW value where it lies: an RGB input layer on it starts the run with
//! no reorder of the image (`'default'` runs such layers on it when their
//! output is planned blocked, see [`crate::registry::image_into_blocks`]:
//! the benchmark's CNNs but ConvNeXt, whose patches are permuted next, run
//! blocked from their first layer to their pooling, with one reorder, out).
//!
//! A plan is kept per input shape, but `'default'` follows the thread
//! count: a node planned blocked whose algorithm has no blocked kernel any
//! more runs its NCHW kernel between reorders (`via_nchw`).
//!
//! The padding lanes of a blocked value (past the channel count in its last
//! block) hold finite values that never reach a real channel: reorders and
//! the kernels write them as zeros, the kernels that read them give them
//! zero weights, and only elementwise operations that keep finite values
//! finite are admitted (no division).
//!
//! Blocked layouts need f32 and a CPU with the blocked kernels (AVX2 and
//! FMA); elsewhere every value is NCHW.
//!
//! Channels-last (NHWC) values are not planned here: they follow the
//! strides of a graph input at run time. A node that reads a graph input
//! and writes a graph output may read a channels-last input in place and
//! write its output so ([`Operation::channels_last`], decided per plan in
//! the graph's executor), which is the case of a swapped layer. Conversion
//! also keeps a network's own channels-last values so: a convolution of a
//! permute to NCHW becomes a channels-last node
//! (`ChannelsLast` in `ops/conv2d.rs`) where the permutes around it then
//! cancel (ConvNeXt's blocks; `ai3._fusion`).

use ai3_kernels::cpu::blocked;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::Operation;
use crate::tensor::{shape_str, Tensor};

pub use ai3_kernels::cpu::blocked::BLOCK;

/// The memory layout of a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Row-major `[n, c, h, w]` (any row-major shape for other ranks).
    Nchw,
    /// `[n, ceil(c / 8), h, w, 8]`: 8 channels side by side per pixel.
    Blocked,
}

impl Layout {
    /// How summaries name it: `NCHW` or `NCHW8c`.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Nchw => "NCHW",
            Layout::Blocked => "NCHW8c",
        }
    }
}

/// How an operation can run on blocked values, for given input shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blocked {
    /// Only on NCHW values.
    No,
    /// Its usual kernel, run over the blocked buffers (their physical
    /// shapes), computes the blocked output: the operation is elementwise,
    /// the same for every channel, keeps finite values finite, and each
    /// input has the output's channels (or is a scalar).
    Elementwise,
    /// With its own blocked kernel ([`Operation::forward_blocked`]), which
    /// moves about `gain` fewer elements than its NCHW one.
    Kernel {
        /// Elements saved against the NCHW kernel (0 when none).
        gain: usize,
    },
    /// With its own kernel ([`Operation::forward_blocked`]), which reads its
    /// one input in either layout and writes a blocked output: blocked from
    /// a blocked producer, else NCHW where it lies (a convolution of a few
    /// input channels, such as an RGB input layer, then starts a run with
    /// no reorder in).
    EitherInput {
        /// Elements saved against the NCHW kernel.
        gain: usize,
    },
}

impl Blocked {
    /// Whether the node runs its blocked kernel
    /// ([`Operation::forward_blocked`]).
    pub fn has_kernel(self) -> bool {
        matches!(self, Blocked::Kernel { .. } | Blocked::EitherInput { .. })
    }
}

/// Whether `t`, a value of logical shape `logical` handed to a blocked
/// kernel, is NCHW (a [`Blocked::EitherInput`] node's input from an NCHW
/// producer): a blocked buffer of a 4-D value has 5 axes.
pub(crate) fn is_nchw(t: &Tensor, logical: &[usize]) -> bool {
    t.shape() == logical
}

/// The physical shape of a blocked value of logical shape `[n, c, h, w]`.
pub fn blocked_shape(shape: &[usize]) -> Vec<usize> {
    match *shape {
        [n, c, h, w] => vec![n, c.div_ceil(BLOCK), h, w, BLOCK],
        _ => shape.to_vec(),
    }
}

/// Runs `op`'s NCHW kernel for blocked `inputs` (tensors of the physical
/// shapes, `shapes` the logical ones) into the blocked `output` of logical
/// shape `out_shape`: each blocked input reordered to NCHW, the output
/// back. For a node planned blocked whose blocked kernel no longer applies (its
/// `'default'` algorithm depends on the thread count, which may change
/// after the plan was made), so the run stays right, at the reorders' cost.
pub(crate) fn via_nchw(
    op: &dyn Operation,
    inputs: &[&Tensor],
    shapes: &[&[usize]],
    out_shape: &[usize],
    output: &mut Tensor,
) -> Result<()> {
    let dims = |s: &[usize]| match *s {
        [n, c, h, w] => Ok((n, c, h * w)),
        _ => Err(Error::internal(
            op.kind().name(),
            format!("a blocked value of shape {} is not 4-D", shape_str(s)),
        )),
    };
    let reordered = |t: &Tensor, s: &[usize], to_nchw: bool, dst: &mut Tensor| -> Result<()> {
        let (n, c, plane) = dims(s)?;
        let done = if to_nchw {
            blocked::from_blocked(n, c, plane, t.as_slice::<f32>()?, dst.as_mut_slice()?)
        } else {
            blocked::to_blocked(n, c, plane, t.as_slice::<f32>()?, dst.as_mut_slice()?)
        };
        crate::ops::kernel_result(op.kind(), done, || "a reorder".into())
    };
    // A [`Blocked::EitherInput`] node's input may be NCHW already.
    let mut nchw = Vec::with_capacity(inputs.len());
    for (t, s) in inputs.iter().zip(shapes) {
        if is_nchw(t, s) {
            nchw.push(None);
            continue;
        }
        let mut d = Tensor::zeros(DType::F32, s)?;
        reordered(t, s, true, &mut d)?;
        nchw.push(Some(d));
    }
    let refs: Vec<&Tensor> = nchw
        .iter()
        .zip(inputs)
        .map(|(d, t)| d.as_ref().unwrap_or(t))
        .collect();
    let mut out = Tensor::zeros(DType::F32, out_shape)?;
    op.forward(&refs, &mut out)?;
    reordered(&out, out_shape, false, output)
}

/// The layouts of one plan: per node how it runs on blocked values
/// ([`Blocked::No`]: it runs NCHW); a node that runs blocked has a blocked
/// output.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Layouts {
    /// Per node.
    pub blocked: Vec<Blocked>,
}

/// One node as the planner sees it.
pub(crate) struct PlanNode<'a> {
    pub op: &'a dyn Operation,
    pub inputs: &'a [usize],
    pub output: usize,
}

/// Chooses the blocked regions (see the module docs). `shapes` holds every
/// value's logical shape, `produced_by[v]` the node that writes value `v`
/// (`None` for inputs and constants), `outputs` the graph's outputs.
pub(crate) fn plan(
    dtype: DType,
    enabled: bool,
    nodes: &[PlanNode<'_>],
    shapes: &[Vec<usize>],
    produced_by: &[Option<usize>],
    outputs: &[usize],
) -> Layouts {
    let none = Layouts {
        blocked: vec![Blocked::No; nodes.len()],
    };
    if !enabled || dtype != DType::F32 || !ai3_kernels::cpu::blocked::available() {
        return none;
    }
    let numel = |v: usize| shapes[v].iter().product::<usize>();
    // Candidates: a kernel of their own, or elementwise over at least one
    // candidate's output; every input 4-D.
    let mut support = vec![Blocked::No; nodes.len()];
    for (i, node) in nodes.iter().enumerate() {
        let ins: Vec<&[usize]> = node.inputs.iter().map(|&v| shapes[v].as_slice()).collect();
        if shapes[node.output].len() != 4 {
            continue;
        }
        let s = node.op.blocked(&ins);
        let feeds = node
            .inputs
            .iter()
            .any(|&v| produced_by[v].is_some_and(|p| support[p] != Blocked::No));
        // A kernel that saves nothing, first in its run, only moves the
        // reorder into the run from its input to its output: it stays NCHW
        // when its output is the smaller (a max pooling after a stem).
        let shrinks = || {
            let read: usize = node.inputs.iter().map(|&v| numel(v)).sum();
            read > numel(node.output)
        };
        support[i] = match s {
            Blocked::Elementwise if !feeds => Blocked::No,
            Blocked::Kernel { gain: 0 } if !feeds && shrinks() => Blocked::No,
            s => s,
        };
    }
    // Regions: candidates joined through the values between them.
    let mut parent: Vec<usize> = (0..nodes.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    for (i, node) in nodes.iter().enumerate() {
        if support[i] == Blocked::No {
            continue;
        }
        for &v in node.inputs {
            if let Some(p) = produced_by[v].filter(|&p| support[p] != Blocked::No) {
                let (a, b) = (root(&mut parent, i), root(&mut parent, p));
                parent[a] = b;
            }
        }
    }
    let region: Vec<Option<usize>> = (0..nodes.len())
        .map(|i| (support[i] != Blocked::No).then(|| root(&mut parent, i)))
        .collect();
    // Gains and reorder costs per region.
    let mut gain = vec![0usize; nodes.len()];
    let mut cost = vec![0usize; nodes.len()];
    let mut entering: Vec<(usize, usize)> = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let Some(r) = region[i] else { continue };
        match support[i] {
            Blocked::Kernel { gain: g } => gain[r] = gain[r].saturating_add(g),
            // Reads what enters as it is.
            Blocked::EitherInput { gain: g } => {
                gain[r] = gain[r].saturating_add(g);
                continue;
            }
            _ => {}
        }
        for &v in node.inputs {
            let inside = produced_by[v].is_some_and(|p| region[p] == Some(r));
            if !inside && !entering.contains(&(r, v)) {
                entering.push((r, v));
                cost[r] = cost[r].saturating_add(numel(v));
            }
        }
    }
    let mut leaving = vec![false; shapes.len()];
    for (i, node) in nodes.iter().enumerate() {
        for &v in node.inputs {
            leaving[v] |=
                produced_by[v].is_some_and(|p| region[p].is_some() && region[i] != region[p]);
        }
    }
    for &v in outputs {
        leaving[v] |= produced_by[v].is_some_and(|p| region[p].is_some());
    }
    for (v, &l) in leaving.iter().enumerate() {
        if l {
            if let Some(r) = produced_by[v].and_then(|p| region[p]) {
                cost[r] = cost[r].saturating_add(numel(v));
            }
        }
    }
    Layouts {
        blocked: region
            .iter()
            .zip(support)
            .map(|(r, s)| match r {
                Some(r) if gain[*r] > cost[*r] => s,
                _ => Blocked::No,
            })
            .collect(),
    }
}

/// One step of a run: a node, or a reorder of a value into a copy of it in
/// the other layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Runs node `.0`.
    Node(usize),
    /// Writes value `src` into value `dst` in layout `to`, for node `owner`
    /// (the reader it is made for, or the producer of a graph output), whose
    /// time a profile counts it in.
    Reorder {
        src: usize,
        dst: usize,
        to: Layout,
        owner: usize,
    },
}

/// How a run goes for one set of input shapes: the steps, and what every
/// node reads once the reorders are in.
#[derive(Clone, Debug)]
pub(crate) struct Route {
    /// Logical shape of every value, the reorders' copies appended.
    pub shapes: Vec<Vec<usize>>,
    /// Layout of every value.
    pub layouts: Vec<Layout>,
    /// In order.
    pub steps: Vec<Step>,
    /// Per node, the values it reads (copies where its inputs are reordered).
    pub inputs: Vec<Vec<usize>>,
    /// Per node, how it runs on blocked values ([`Blocked::No`]: NCHW).
    pub blocked: Vec<Blocked>,
    /// The values returned, NCHW.
    pub outputs: Vec<usize>,
}

impl Route {
    /// The values `step` (one of [`Route::steps`]) reads.
    pub fn reads<'a>(&'a self, step: &'a Step) -> &'a [usize] {
        match step {
            Step::Node(i) => &self.inputs[*i],
            Step::Reorder { src, .. } => std::slice::from_ref(src),
        }
    }

    /// The shape value `v`'s buffer has.
    pub fn physical(&self, v: usize) -> Vec<usize> {
        match self.layouts[v] {
            Layout::Nchw => self.shapes[v].clone(),
            Layout::Blocked => blocked_shape(&self.shapes[v]),
        }
    }
}

/// The steps for `layouts`: each node reads its inputs in its own layout,
/// through one copy per value and layout, made right before its first
/// reader; graph outputs are returned NCHW.
pub(crate) fn route(
    layouts: Layouts,
    nodes: &[PlanNode<'_>],
    mut shapes: Vec<Vec<usize>>,
    produced_by: &[Option<usize>],
    outputs: &[usize],
) -> Route {
    let mut layout: Vec<Layout> = vec![Layout::Nchw; shapes.len()];
    for (node, &b) in nodes.iter().zip(&layouts.blocked) {
        if b != Blocked::No {
            layout[node.output] = Layout::Blocked;
        }
    }
    let mut copies: Vec<((usize, Layout), usize)> = Vec::new();
    let mut steps = Vec::with_capacity(nodes.len());
    let mut copy = |v: usize,
                    to: Layout,
                    owner: usize,
                    shapes: &mut Vec<Vec<usize>>,
                    steps: &mut Vec<Step>| {
        if layout[v] == to {
            return v;
        }
        if let Some(&(_, w)) = copies.iter().find(|(k, _)| *k == (v, to)) {
            return w;
        }
        let w = shapes.len();
        shapes.push(shapes[v].clone());
        layout.push(to);
        copies.push(((v, to), w));
        steps.push(Step::Reorder {
            src: v,
            dst: w,
            to,
            owner,
        });
        w
    };
    let mut inputs = Vec::with_capacity(nodes.len());
    for (i, node) in nodes.iter().enumerate() {
        let ins = match layouts.blocked[i] {
            // Reads its inputs as they were written.
            Blocked::EitherInput { .. } => node.inputs.to_vec(),
            b => {
                let to = if b == Blocked::No {
                    Layout::Nchw
                } else {
                    Layout::Blocked
                };
                node.inputs
                    .iter()
                    .map(|&v| copy(v, to, i, &mut shapes, &mut steps))
                    .collect()
            }
        };
        inputs.push(ins);
        steps.push(Step::Node(i));
    }
    let outputs = outputs
        .iter()
        .map(|&v| match produced_by[v] {
            Some(p) => copy(v, Layout::Nchw, p, &mut shapes, &mut steps),
            None => v,
        })
        .collect();
    Route {
        shapes,
        layouts: layout,
        steps,
        inputs,
        blocked: layouts.blocked,
        outputs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Result;
    use crate::registry::OpKind;
    use crate::tensor::Tensor;

    /// An operation that only says how it runs blocked.
    #[derive(Debug)]
    struct Fake(Blocked);

    impl Operation for Fake {
        fn kind(&self) -> OpKind {
            OpKind::Relu
        }
        fn algorithm_for(&self, _: &[usize]) -> Result<String> {
            Ok("direct".into())
        }
        fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
            Ok(inputs[0].to_vec())
        }
        fn forward(&self, _: &[&Tensor], _: &mut Tensor) -> Result<()> {
            Ok(())
        }
        fn blocked(&self, _: &[&[usize]]) -> Blocked {
            self.0
        }
    }

    const K: Blocked = Blocked::Kernel { gain: 1000 };
    const E: Blocked = Blocked::Elementwise;
    const N: Blocked = Blocked::No;

    /// Plans and routes a graph of one input (value 0, `[1, 16, 4, 4]`, 256
    /// elements) whose node `i` writes value `i + 1` and reads `reads[i]`.
    fn run(ops: &[Blocked], reads: &[&[usize]], outputs: &[usize], dtype: DType) -> Route {
        let fakes: Vec<Fake> = ops.iter().map(|&b| Fake(b)).collect();
        let nodes: Vec<PlanNode<'_>> = fakes
            .iter()
            .zip(reads)
            .enumerate()
            .map(|(i, (op, r))| PlanNode {
                op,
                inputs: r,
                output: i + 1,
            })
            .collect();
        let shapes = vec![vec![1, 16, 4, 4]; ops.len() + 1];
        let produced_by: Vec<Option<usize>> = (0..=ops.len()).map(|v| v.checked_sub(1)).collect();
        let layouts = plan(dtype, true, &nodes, &shapes, &produced_by, outputs);
        route(layouts, &nodes, shapes, &produced_by, outputs)
    }

    fn reorders(r: &Route) -> Vec<(usize, Layout, usize)> {
        r.steps
            .iter()
            .filter_map(|s| match *s {
                Step::Reorder { src, to, owner, .. } => Some((src, to, owner)),
                Step::Node(_) => None,
            })
            .collect()
    }

    #[test]
    fn a_paying_run_is_blocked_with_one_reorder_at_each_end() {
        let r = run(
            &[K, E, K, N],
            &[&[0], &[1], &[2, 1], &[3]],
            &[4],
            DType::F32,
        );
        if !ai3_kernels::cpu::blocked::available() {
            assert_eq!(r.blocked, vec![N; 4]);
            assert!(reorders(&r).is_empty());
            return;
        }
        assert_eq!(r.blocked, vec![K, E, K, N]);
        // The input in before node 0; value 3 out before node 3.
        assert_eq!(
            reorders(&r),
            vec![(0, Layout::Blocked, 0), (3, Layout::Nchw, 3)]
        );
        assert_eq!(r.inputs[0], vec![5]);
        assert_eq!(r.inputs[2], vec![2, 1]);
        assert_eq!(r.inputs[3], vec![6]);
        assert_eq!(r.physical(1), vec![1, 2, 4, 4, 8]);
        assert_eq!(r.physical(4), vec![1, 16, 4, 4]);
        assert_eq!(r.outputs, vec![4]);
    }

    #[test]
    fn a_run_whose_reorders_cost_more_stays_nchw() {
        let small = Blocked::Kernel { gain: 511 };
        let r = run(&[small, N], &[&[0], &[1]], &[2], DType::F32);
        assert_eq!(r.blocked, vec![N, N]);
        assert!(reorders(&r).is_empty());
        assert_eq!(r.steps, vec![Step::Node(0), Step::Node(1)]);
    }

    #[test]
    fn elementwise_nodes_follow_blocked_producers_only() {
        // E reads the input, not a candidate's output: it stays NCHW, and
        // the kernel after it pays for its own reorders.
        let r = run(&[E, K], &[&[0], &[1]], &[2], DType::F32);
        assert_eq!(r.blocked[0], N);
    }

    #[test]
    fn one_copy_serves_every_reader_and_outputs_leave_nchw() {
        // Value 1 (blocked) is read by two NCHW nodes and is an output.
        let r = run(&[K, N, N], &[&[0], &[1], &[1]], &[1, 3], DType::F32);
        if !ai3_kernels::cpu::blocked::available() {
            return;
        }
        assert_eq!(r.blocked, vec![K, N, N]);
        let copies: Vec<_> = reorders(&r).into_iter().filter(|c| c.0 == 1).collect();
        assert_eq!(copies, vec![(1, Layout::Nchw, 1)]);
        let copy = r.inputs[1][0];
        assert_eq!(r.inputs[2], vec![copy]);
        assert_eq!(r.outputs, vec![copy, 3]);
    }

    #[test]
    fn a_kernel_reading_either_layout_takes_its_input_as_it_is() {
        let f = Blocked::EitherInput { gain: 300 };
        let small = Blocked::Kernel { gain: 0 };
        // The input goes to node 0 as it is; only value 2 is reordered, out.
        let r = run(&[f, small, N], &[&[0], &[1], &[2]], &[3], DType::F32);
        if !ai3_kernels::cpu::blocked::available() {
            return;
        }
        assert_eq!(r.blocked, vec![f, small, N]);
        assert_eq!(reorders(&r), vec![(2, Layout::Nchw, 2)]);
        assert_eq!(r.inputs[0], vec![0]);
        assert_eq!(r.physical(1), vec![1, 2, 4, 4, 8]);
        // Its gain must pay for the reorder out (256 elements).
        let poor = Blocked::EitherInput { gain: 255 };
        let r = run(&[poor, N], &[&[0], &[1]], &[2], DType::F32);
        assert_eq!(r.blocked, vec![N, N]);
        // From a blocked producer it reads blocked, with no reorder.
        let r = run(&[K, f], &[&[0], &[1]], &[2], DType::F32);
        assert_eq!(r.blocked, vec![K, f]);
        assert_eq!(
            reorders(&r),
            vec![(0, Layout::Blocked, 0), (2, Layout::Nchw, 1)]
        );
        assert_eq!(r.inputs[1], vec![1]);
    }

    #[test]
    fn float64_and_the_switch_keep_every_value_nchw() {
        let r = run(&[K, K], &[&[0], &[1]], &[2], DType::F64);
        assert_eq!(r.blocked, vec![N, N]);
        let fake = Fake(K);
        let nodes = [PlanNode {
            op: &fake,
            inputs: &[0],
            output: 1,
        }];
        let shapes = vec![vec![1, 16, 4, 4]; 2];
        let off = plan(DType::F32, false, &nodes, &shapes, &[None, Some(0)], &[1]);
        assert_eq!(off.blocked, vec![N]);
    }
}
