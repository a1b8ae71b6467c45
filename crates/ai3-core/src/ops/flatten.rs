//! Flatten.

use super::{single, with_dtype, Operation};
use crate::error::{Error, Result};
use crate::registry::{Algorithm, OpKind};
use crate::tensor::{shape_str, Tensor};

/// Merges dimensions `start_dim..=end_dim` into one (negative dims count from the end).
#[derive(Debug)]
pub struct Flatten {
    start_dim: i64,
    end_dim: i64,
}

impl Flatten {
    /// PyTorch's `torch.flatten(x, start_dim, end_dim)`.
    pub fn new(start_dim: i64, end_dim: i64) -> Self {
        Flatten { start_dim, end_dim }
    }
}

fn normalize(dim: i64, rank: usize, shape: &[usize]) -> Result<usize> {
    // A 0-D tensor flattens as if it had one dimension, as in PyTorch.
    let r = rank.max(1) as i64;
    let d = if dim < 0 { dim + r } else { dim };
    if !(0..r).contains(&d) {
        return Err(Error::invalid(
            OpKind::Flatten.name(),
            format!(
                "dimension {dim} is out of range for input of shape {}",
                shape_str(shape)
            ),
        ));
    }
    Ok(d as usize)
}

impl Operation for Flatten {
    fn kind(&self) -> OpKind {
        OpKind::Flatten
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Ok(Algorithm::Direct.name().into())
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let x = single(OpKind::Flatten, inputs)?;
        let start = normalize(self.start_dim, x.len(), x)?;
        let end = normalize(self.end_dim, x.len(), x)?;
        if start > end {
            return Err(Error::invalid(
                OpKind::Flatten.name(),
                format!(
                    "start_dim {} comes after end_dim {} for input of shape {}",
                    self.start_dim,
                    self.end_dim,
                    shape_str(x)
                ),
            ));
        }
        if x.is_empty() {
            return Ok(vec![1]);
        }
        let mut out = x[..start].to_vec();
        out.push(x[start..=end].iter().product());
        out.extend_from_slice(&x[end + 1..]);
        Ok(out)
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let x = single(OpKind::Flatten, inputs)?;
        with_dtype!(x.dtype(), T, {
            output
                .as_mut_slice::<T>()?
                .copy_from_slice(x.as_slice::<T>()?)
        });
        Ok(())
    }
}
