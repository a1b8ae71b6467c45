//! Flatten.

use super::attrs::{optional, Arity, OpSpec, ParamKind as K};
use ai3_kernels::custom;

use super::{custom_result, simple_algorithm, single, with_dtype, Operation};
use crate::error::{Error, Result};
use crate::registry::{Algorithm, OpKind, Request};
use crate::tensor::{shape_str, Tensor};

/// Merges dimensions `start_dim..=end_dim` into one (negative dims count from the end).
#[derive(Debug)]
pub struct Flatten {
    start_dim: i64,
    end_dim: i64,
    algorithm: Algorithm,
}

impl Flatten {
    /// PyTorch's `torch.flatten(x, start_dim, end_dim)`.
    pub fn new(start_dim: i64, end_dim: i64) -> Self {
        Flatten {
            start_dim,
            end_dim,
            algorithm: Algorithm::Direct,
        }
    }

    /// Runs the algorithm `request` resolves to.
    pub fn with_request(mut self, request: Request) -> Result<Self> {
        self.algorithm = simple_algorithm(OpKind::Flatten, request)?;
        Ok(self)
    }

    /// `(start, end)` normalised for input of `shape`, checked to be in order.
    fn dims(&self, shape: &[usize]) -> Result<(usize, usize)> {
        let start = normalize(self.start_dim, shape.len(), shape)?;
        let end = normalize(self.end_dim, shape.len(), shape)?;
        if start > end {
            return Err(Error::invalid(
                OpKind::Flatten.name(),
                format!(
                    "start_dim {} comes after end_dim {} for input of shape {}",
                    self.start_dim,
                    self.end_dim,
                    shape_str(shape)
                ),
            ));
        }
        Ok((start, end))
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
        Ok(self.algorithm.name().into())
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let x = single(OpKind::Flatten, inputs)?;
        let (start, end) = self.dims(x)?;
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
            let out_shape = output.shape().to_vec();
            let (src, dst) = (x.as_slice::<T>()?, output.as_mut_slice::<T>()?);
            match self.algorithm {
                Algorithm::Custom => {
                    let (start, end) = self.dims(x.shape())?;
                    let in_shape: &[usize] = if x.shape().is_empty() {
                        &[1]
                    } else {
                        x.shape()
                    };
                    custom_result(
                        OpKind::Flatten,
                        x.shape(),
                        custom::flatten(in_shape, start, end, src, &out_shape, dst),
                    )?
                }
                _ => dst.copy_from_slice(src),
            }
        });
        Ok(())
    }
}

/// `flatten`: dimensions `start_dim..=end_dim` (defaults 1 and -1, as `nn.Flatten`).
pub const SPEC: OpSpec = OpSpec {
    inputs: Arity::exactly(1),
    params: &[optional("start_dim", K::Int), optional("end_dim", K::Int)],
    build: |a| {
        let f = Flatten::new(a.int_or("start_dim", 1)?, a.int_or("end_dim", -1)?);
        Ok(Box::new(f.with_request(a.request)?))
    },
};
