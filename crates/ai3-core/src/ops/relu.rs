//! ReLU.

use ai3_kernels::cpu::activation;

use super::{check_not_empty, single, with_dtype, Operation};
use crate::error::Result;
use crate::registry::{Algorithm, OpKind};
use crate::tensor::Tensor;

/// `max(x, 0)` elementwise, any shape.
#[derive(Debug, Default)]
pub struct Relu;

impl Operation for Relu {
    fn kind(&self) -> OpKind {
        OpKind::Relu
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Ok(Algorithm::Direct.name().into())
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let x = single(OpKind::Relu, inputs)?;
        check_not_empty(OpKind::Relu, x)?;
        Ok(x.to_vec())
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let x = single(OpKind::Relu, inputs)?;
        with_dtype!(x.dtype(), T, {
            activation::relu::<T>(x.as_slice()?, output.as_mut_slice()?)
        });
        Ok(())
    }
}
