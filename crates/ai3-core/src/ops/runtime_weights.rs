//! Layers whose weights are values of the graph (inputs of the model, or
//! computed by it) rather than constants held by the layer: `F.conv2d(x, w)`
//! where `w` is an argument of `forward`.
//!
//! The node reads `[x, weight_1, weight_2, ...]` and builds the layer from the
//! weights it is given on every call, so the layer's own validation applies
//! unchanged. Algorithms that prepare their weights (Winograd's filter
//! transform, direct convolution's packing) then do so per call: with weights
//! that change between calls there is nothing to keep.

use std::fmt;

use super::Operation;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::registry::OpKind;
use crate::tensor::Tensor;

/// Builds the layer from its weights, in the order the node reads them.
pub type BuildLayer = dyn Fn(Vec<Tensor>) -> Result<Box<dyn Operation>> + Send + Sync;

/// A layer built from weights read as graph values (see the module docs).
pub struct RuntimeWeights {
    kind: OpKind,
    dtype: DType,
    fused: Option<OpKind>,
    build: Box<BuildLayer>,
}

impl fmt::Debug for RuntimeWeights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RuntimeWeights")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl RuntimeWeights {
    /// A `kind` layer computing in `dtype`, built by `build` from the weights
    /// (every input after the first) on each call; `fused` names the
    /// activation the built layer applies, for summaries.
    pub fn new(kind: OpKind, dtype: DType, fused: Option<OpKind>, build: Box<BuildLayer>) -> Self {
        RuntimeWeights {
            kind,
            dtype,
            fused,
            build,
        }
    }

    /// The layer for weights of these shapes, built from zeros: enough to
    /// check shapes and resolve the algorithm without the weights' values.
    fn probe(&self, weight_shapes: &[&[usize]]) -> Result<Box<dyn Operation>> {
        let zeros = weight_shapes
            .iter()
            .map(|s| Tensor::zeros(self.dtype, s).map_err(|e| e.with_op(self.kind.name())))
            .collect::<Result<Vec<_>>>()?;
        (self.build)(zeros)
    }

    fn split<'a, T: ?Sized>(&self, inputs: &'a [&'a T]) -> Result<(&'a T, &'a [&'a T])> {
        match inputs {
            [x, weights @ ..] if !weights.is_empty() => Ok((x, weights)),
            _ => Err(Error::internal(
                self.kind.name(),
                format!(
                    "expected an input and its weights, got {} value(s)",
                    inputs.len()
                ),
            )),
        }
    }
}

impl Operation for RuntimeWeights {
    fn kind(&self) -> OpKind {
        self.kind
    }

    fn fused_activation(&self) -> Option<OpKind> {
        self.fused
    }

    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Err(Error::internal(
            self.kind.name(),
            "the algorithm of a layer with runtime weights depends on their shapes",
        ))
    }

    fn algorithm_for_inputs(&self, inputs: &[&[usize]]) -> Result<String> {
        let (x, weights) = self.split(inputs)?;
        self.probe(weights)?.algorithm_for(x)
    }

    fn problem(&self, inputs: &[&[usize]]) -> Result<crate::registry::Problem> {
        let (x, weights) = self.split(inputs)?;
        self.probe(weights)?.problem(&[x])
    }

    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let (x, weights) = self.split(inputs)?;
        self.probe(weights)?.output_shape(&[x])
    }

    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let (x, weights) = self.split(inputs)?;
        // The layer owns its weights; copying them costs far less than the layer itself.
        let owned = weights
            .iter()
            .map(|w| w.to_contiguous())
            .collect::<Result<Vec<_>>>()?;
        (self.build)(owned)?.forward(&[x], output)
    }
}
