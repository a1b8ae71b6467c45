//! Operations: their user-facing parameters, validation, output shapes and
//! dispatch to the kernel of the chosen algorithm. One file per operation family.

use std::fmt;

use ai3_kernels::custom::CustomError;
use ai3_kernels::KernelResult;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::Blocked;
use crate::registry::{self, Algorithm, DeviceKind, OpKind, Problem, Request};
use crate::tensor::{shape_str, Tensor};

pub(crate) mod activation;
pub(crate) mod attention;
mod attrs;
pub(crate) mod binary;
pub(crate) mod conv2d;
pub(crate) mod embedding;
pub(crate) mod flatten;
pub(crate) mod linear;
pub(crate) mod matmul;
pub(crate) mod mha;
pub(crate) mod norm;
pub(crate) mod pool;
pub(crate) mod reduce;
pub(crate) mod reshape;
mod runtime_weights;
pub(crate) mod shape;
pub(crate) mod shift;
pub(crate) mod view;

pub use activation::{Activation, ActivationKind};
pub use attention::Attention;
pub use attrs::{
    build_node, optional, required, Args, Arity, Attr, Attrs, OpSpec, ParamKind, ParamSpec,
};
pub use binary::{Binary, BinaryKind};
pub use conv2d::{Conv2d, PadMode};
pub use embedding::Embedding;
pub use flatten::Flatten;
pub use linear::Linear;
pub use matmul::Matmul;
pub use mha::MultiheadAttention;
pub use norm::{BatchNorm2d, LayerNorm};
pub use pool::{AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool2d, MaxPool2d, Window};
pub use reduce::{Mean, Normalize, Softmax};
pub use reshape::{Reshape, SizeExpr};
pub use runtime_weights::{BuildLayer, RuntimeWeights};
pub use shape::{Concat, Permute, Slice, SliceMode};
pub use shift::{Pad, Roll};
pub use view::{Expand, Index, IndexItem};

/// A node's computation: validated at construction, then run many times.
///
/// Inputs reach `forward` contiguous, on the CPU and in the graph's dtype;
/// `output` is a contiguous tensor of `output_shape`'s shape whose contents
/// are unspecified (the executor may hand out reused memory): `forward` must
/// write every element of it.
pub trait Operation: Send + Sync + fmt::Debug {
    /// Which operation this is.
    fn kind(&self) -> OpKind;
    /// The algorithm that runs for input of this shape (what a summary shows).
    fn algorithm_for(&self, input_shape: &[usize]) -> Result<String>;
    /// The algorithm that runs for inputs of these shapes; by default that of
    /// the first input (operations whose choice depends on the others override it).
    fn algorithm_for_inputs(&self, inputs: &[&[usize]]) -> Result<String> {
        self.algorithm_for(inputs.first().copied().unwrap_or(&[]))
    }
    /// The problem the registry judges for inputs of these shapes (support,
    /// workspace); by default the first input's element count.
    fn problem(&self, inputs: &[&[usize]]) -> Result<Problem> {
        let numel = inputs.first().map_or(0, |s| s.iter().product());
        Ok(Problem::Elementwise { numel })
    }
    /// Rough cost for inputs of these shapes (see [`Problem::work`]), which
    /// decides whether a run is worth spreading over threads; by default the
    /// problem's. Operations whose problem understates their cost override it.
    fn work(&self, inputs: &[&[usize]]) -> usize {
        self.problem(inputs).map_or(0, |p| p.work())
    }
    /// The output shape for these input shapes, or an error naming the shapes.
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>>;
    /// The activation fused into this node at convert time, for summaries.
    fn fused_activation(&self) -> Option<OpKind> {
        None
    }
    /// Whether this node adds a residual (a second input) to its output at
    /// convert time, for summaries.
    fn fused_residual(&self) -> bool {
        false
    }
    /// Whether this node multiplies its input's channels by a scale (its
    /// last input) before computing, fused at convert time, for summaries.
    fn fused_input_scale(&self) -> bool {
        false
    }
    /// When the output is the inputs laid end to end (a concatenation whose
    /// dimensions before the axis are all 1), where each input starts in it,
    /// in elements; `None` otherwise. The memory planner may then place the
    /// inputs there (their producers write straight into the output), and
    /// `forward` must leave an input that is already in its place untouched.
    fn in_place_parts(&self, _inputs: &[&[usize]]) -> Option<Vec<usize>> {
        None
    }
    /// An input whose buffer the output may be written over, for inputs of
    /// these (logical) shapes run channel-blocked (`blocked`) or not: the
    /// memory planner may then give the output that input's place where
    /// this node is its last reader, and the node finds that input's values
    /// in the output buffer on entry (the input's tensor then points at
    /// the output's memory, which `forward` must not read through it). By
    /// default none.
    fn output_over_input(&self, _inputs: &[&[usize]], _blocked: bool) -> Option<usize> {
        None
    }
    /// Whether image `i` of the output depends on image `i` of each input
    /// alone, for inputs of these shapes (4-D, one batch, which the
    /// executor checks): the executor may then run the node on a few images
    /// at a time (see the graph's chunked runs). By default not.
    fn per_image(&self, _inputs: &[&[usize]]) -> bool {
        false
    }
    /// Computes `output` from `inputs`.
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()>;
    /// Whether this node can read its one input channels last (see
    /// [`Tensor::is_channels_last`]) and write its output so, for an input
    /// of this (logical) shape; by default not.
    fn channels_last(&self, _inputs: &[&[usize]]) -> bool {
        false
    }
    /// Computes `output` from `inputs`, both as contiguous NHWC tensors
    /// (`[n, h, w, c]`, the memory of channels-last ones). Called only when
    /// [`Self::channels_last`] said so for the inputs' logical shapes.
    fn forward_channels_last(&self, _inputs: &[&Tensor], _output: &mut Tensor) -> Result<()> {
        Err(Error::internal(
            self.kind().name(),
            "this operation has no channels-last kernel",
        ))
    }
    /// The layout of the node's values when the operation itself fixes it
    /// (`NHWC` for a channels-last convolution, whose shapes are `[n, h, w,
    /// c]`), which summaries show instead of the planned one; by default
    /// none.
    fn own_layout(&self) -> Option<&'static str> {
        None
    }
    /// Whether this node can run on channel-blocked values for inputs of
    /// these (logical) shapes, and how (see [`crate::layout`]); by default not.
    fn blocked(&self, _inputs: &[&[usize]]) -> Blocked {
        Blocked::No
    }
    /// The algorithm that runs for inputs of these shapes when the node is
    /// planned blocked (what a summary shows then); by default that of
    /// [`Self::algorithm_for_inputs`]. A convolution's `'default'` may pick
    /// another kernel for a blocked output than for an NCHW one.
    fn blocked_algorithm_for(&self, inputs: &[&[usize]]) -> Result<String> {
        self.algorithm_for_inputs(inputs)
    }
    /// Computes the blocked `output` from blocked `inputs` (tensors of the
    /// physical shapes [`crate::layout::blocked_shape`] gives; NCHW ones
    /// too for [`Blocked::EitherInput`], see `crate::layout::is_nchw`),
    /// `shapes` being the inputs' logical shapes. Called only when
    /// [`Self::blocked`] said [`Blocked::Kernel`] or
    /// [`Blocked::EitherInput`] for them.
    fn forward_blocked(
        &self,
        _inputs: &[&Tensor],
        _shapes: &[&[usize]],
        _output: &mut Tensor,
    ) -> Result<()> {
        Err(Error::internal(
            self.kind().name(),
            "this operation has no channel-blocked kernel",
        ))
    }
}

/// Runs `$body` with `$t` bound to the Rust element type of `$dtype`.
macro_rules! with_dtype {
    ($dtype:expr, $t:ident, $body:expr) => {
        match $dtype {
            $crate::dtype::DType::F32 => {
                type $t = f32;
                $body
            }
            $crate::dtype::DType::F64 => {
                type $t = f64;
                $body
            }
        }
    };
}
pub(crate) use with_dtype;

/// `(batch, channels, height, width, batched)` of a 3-D or 4-D image input.
pub(crate) fn image_dims(
    op: OpKind,
    shape: &[usize],
) -> Result<(usize, usize, usize, usize, bool)> {
    let dims = any_plane_dims(op, shape)?;
    // An empty batch (or no channels) gives an empty output, as in PyTorch; an
    // empty plane has no windows to compute, which PyTorch rejects too.
    if dims.2 == 0 || dims.3 == 0 {
        return Err(Error::shape(
            op.name(),
            format!(
                "input of shape {} has an empty spatial plane ({}x{})",
                shape_str(shape),
                dims.2,
                dims.3
            ),
        ));
    }
    Ok(dims)
}

/// [`image_dims`] for the inputs where PyTorch accepts an empty plane: a
/// convolution's empty batch, an unbatched adaptive average (NaN).
pub(crate) fn any_plane_dims(
    op: OpKind,
    shape: &[usize],
) -> Result<(usize, usize, usize, usize, bool)> {
    Ok(match *shape {
        [c, h, w] => (1, c, h, w, false),
        [n, c, h, w] => (n, c, h, w, true),
        _ => {
            return Err(Error::shape(
                op.name(),
                format!(
                    "expected a 3-D (unbatched) or 4-D (batched) input, got shape {}",
                    shape_str(shape)
                ),
            ))
        }
    })
}

/// Output shape of an image operation, keeping the input's batching.
pub(crate) fn image_shape(batched: bool, n: usize, c: usize, h: usize, w: usize) -> Vec<usize> {
    if batched {
        vec![n, c, h, w]
    } else {
        vec![c, h, w]
    }
}

/// The one input of a single-input operation.
pub(crate) fn single<'a, T: ?Sized>(op: OpKind, inputs: &[&'a T]) -> Result<&'a T> {
    match inputs {
        [x] => Ok(x),
        _ => Err(Error::internal(
            op.name(),
            format!("expected 1 input, got {}", inputs.len()),
        )),
    }
}

/// The input of a layer that may fuse a residual and, when `residual`,
/// the residual: its second input.
pub(crate) fn with_residual<'a, T: ?Sized>(
    op: OpKind,
    residual: bool,
    inputs: &[&'a T],
) -> Result<(&'a T, Option<&'a T>)> {
    match (inputs, residual) {
        ([x], false) => Ok((x, None)),
        ([x, r], true) => Ok((x, Some(r))),
        _ => Err(Error::internal(
            op.name(),
            format!(
                "expected {} input(s), got {}",
                1 + usize::from(residual),
                inputs.len()
            ),
        )),
    }
}

/// What a layer with a fused residual and activation applies to each
/// finished run of its output, given the run's offset in the output: the
/// residual's elements at that offset added, then the activation.
pub(crate) fn residual_epilogue<'a, T: crate::dtype::Element>(
    residual: Option<&'a [T]>,
    activation: Option<ActivationKind>,
) -> impl Fn(usize, &mut [T]) + Sync + 'a {
    move |at: usize, s: &mut [T]| {
        if let Some(r) = residual {
            s.iter_mut().zip(&r[at..]).for_each(|(o, &r)| *o += r);
        }
        if let Some(a) = activation {
            a.apply_serial(s)
        }
    }
}

/// Dimension `dim` of a tensor of rank `rank` (negative counts from the end,
/// as in PyTorch), or an error naming the shape.
pub(crate) fn normalize_dim(op: OpKind, dim: i64, rank: usize, shape: &[usize]) -> Result<usize> {
    let r = rank as i64;
    let d = if dim < 0 { dim + r } else { dim };
    if !(0..r).contains(&d) {
        return Err(Error::invalid(
            op.name(),
            format!(
                "dimension {dim} is out of range for input of shape {} (expected a value in [{}, {}])",
                shape_str(shape),
                -r,
                r - 1
            ),
        ));
    }
    Ok(d as usize)
}

/// The elements of `t`, or an empty slice when it has none (an empty
/// tensor's strides need not look contiguous, so `as_slice` may refuse it).
pub(crate) fn elements<T: crate::dtype::Element>(t: &Tensor) -> Result<&[T]> {
    if t.numel() == 0 {
        return Ok(&[]);
    }
    t.as_slice()
}

/// The elements of `t` for writing, or an empty slice when it has none.
pub(crate) fn elements_mut<T: crate::dtype::Element>(t: &mut Tensor) -> Result<&mut [T]> {
    if t.numel() == 0 {
        return Ok(&mut []);
    }
    t.as_mut_slice()
}

/// Checks that a weight tensor has the dtype of the graph.
pub(crate) fn check_weight_dtype(op: OpKind, what: &str, t: &Tensor, dtype: DType) -> Result<()> {
    if t.dtype() != dtype {
        return Err(Error::dtype(
            op.name(),
            format!(
                "{what} is {} but the operation computes in {dtype}",
                t.dtype()
            ),
        ));
    }
    Ok(())
}

/// Rejects zero or negative hyperparameters such as strides.
pub(crate) fn check_positive(op: OpKind, what: &str, values: &[usize]) -> Result<()> {
    if values.contains(&0) {
        return Err(Error::invalid(
            op.name(),
            format!("{what} must be positive, got {values:?}"),
        ));
    }
    Ok(())
}

/// The algorithm that runs `request` for an operation whose built-in
/// algorithms accept every input (all but conv2d and linear), validated so a
/// bad request fails when the model is built.
pub(crate) fn simple_algorithm(op: OpKind, request: Request) -> Result<Algorithm> {
    registry::resolve(
        op,
        request,
        DeviceKind::Cpu,
        &Problem::Elementwise { numel: 1 },
    )
}

/// A kernel's result as ai3's, through the one mapping ([`Error::from_kernel`]):
/// `context`, built only on failure, states the shapes.
pub(crate) fn kernel_result<T>(
    op: OpKind,
    result: KernelResult<T>,
    context: impl FnOnce() -> String,
) -> Result<T> {
    result.map_err(|e| Error::from_kernel(op.name(), &context(), e))
}

/// Maps what the user's C++ kernel reported to ai3's errors, naming the input shape.
pub(crate) fn custom_result(
    op: OpKind,
    shape: &[usize],
    result: std::result::Result<(), CustomError>,
) -> Result<()> {
    match result {
        Ok(()) => Ok(()),
        Err(CustomError::NotImplemented) => Err(Error::algorithm(
            op.name(),
            format!(
                "the custom implementation threw ai3::NotImplemented for input of shape {}",
                shape_str(shape)
            ),
        )),
        Err(CustomError::Failed(msg)) => Err(Error::custom(
            op.name(),
            format!("{msg} (input of shape {})", shape_str(shape)),
        )),
        Err(CustomError::Kernel(e)) => Err(Error::from_kernel(
            op.name(),
            &format!("input of shape {}", shape_str(shape)),
            e,
        )),
    }
}
