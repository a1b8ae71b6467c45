//! `embedding`: rows of a held table picked by indices (`nn.Embedding`,
//! `F.embedding`).
//!
//! The indices arrive in the graph's float dtype (the Python side converts
//! integer inputs exactly, and refuses those a float cannot hold); each must
//! be a whole number naming a row of the table, or the call fails naming it.

use ai3_kernels::cpu::shape;

use super::attrs::{required, Arity, OpSpec, ParamKind as K};
use super::{
    check_weight_dtype, elements, elements_mut, kernel_result, single, with_dtype, Operation,
};
use crate::error::{Error, Result};
use crate::registry::{Algorithm, OpKind};
use crate::tensor::{shape_str, Tensor};

/// A lookup in a table of shape `[rows, width]`: indices of shape `s` give an
/// output of shape `s + [width]`.
#[derive(Debug)]
pub struct Embedding {
    weight: Tensor,
}

impl Embedding {
    /// The lookup in `weight`, which must be 2-D.
    pub fn new(weight: Tensor) -> Result<Self> {
        if weight.shape().len() != 2 {
            return Err(Error::shape(
                OpKind::Embedding.name(),
                format!(
                    "weight must be 2-D (rows, width), got shape {}",
                    shape_str(weight.shape())
                ),
            ));
        }
        Ok(Embedding { weight })
    }

    /// The row each index names, or an error naming the first bad one.
    fn rows<T: ai3_kernels::Float>(&self, indices: &[T], shape: &[usize]) -> Result<Vec<usize>> {
        let count = self.weight.shape()[0];
        indices
            .iter()
            .map(|&v| {
                let f = v.to_f64().unwrap_or(f64::NAN);
                if f.fract() == 0.0 && f >= 0.0 && f < count as f64 {
                    Ok(f as usize)
                } else {
                    Err(Error::invalid(
                        OpKind::Embedding.name(),
                        format!(
                            "index {f} is not a row of the table of {count} rows \
                             (indices of shape {})",
                            shape_str(shape)
                        ),
                    ))
                }
            })
            .collect()
    }
}

impl Operation for Embedding {
    fn kind(&self) -> OpKind {
        OpKind::Embedding
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Ok(Algorithm::Direct.name().into())
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let x = single(OpKind::Embedding, inputs)?;
        Ok([x, &self.weight.shape()[1..]].concat())
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let op = OpKind::Embedding;
        let x = single(op, inputs)?;
        check_weight_dtype(op, "weight", &self.weight, x.dtype())?;
        let width = self.weight.shape()[1];
        with_dtype!(x.dtype(), T, {
            let rows = self.rows::<T>(elements(x)?, x.shape())?;
            let done =
                shape::take_rows::<T>(elements(&self.weight)?, width, &rows, elements_mut(output)?);
            kernel_result(op, done, || {
                format!(
                    "indices of shape {}, table of shape {}",
                    shape_str(x.shape()),
                    shape_str(self.weight.shape())
                )
            })?
        });
        Ok(())
    }
}

/// `embedding` of its one input (the indices) in the table `weight`.
pub const SPEC: OpSpec = OpSpec {
    inputs: Arity::exactly(1),
    params: &[required("weight", K::Tensor)],
    build: |a| Ok(Box::new(Embedding::new(a.required_tensor("weight")?)?)),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looks_up_rows_and_names_bad_indices() {
        let table = Tensor::from_slice(&[0.0f32, 1.0, 10.0, 11.0, 20.0, 21.0], &[3, 2]).unwrap();
        let e = Embedding::new(table).unwrap();
        let idx = Tensor::from_slice(&[2.0f32, 0.0], &[1, 2]).unwrap();
        assert_eq!(e.output_shape(&[&[1, 2]]).unwrap(), vec![1, 2, 2]);
        let mut out = Tensor::zeros(idx.dtype(), &[1, 2, 2]).unwrap();
        e.forward(&[&idx], &mut out).unwrap();
        assert_eq!(out.as_slice::<f32>().unwrap(), &[20.0, 21.0, 0.0, 1.0]);
        for bad in [3.0f32, -1.0, 0.5, f32::NAN] {
            let idx = Tensor::from_slice(&[0.0, bad], &[2]).unwrap();
            let mut out = Tensor::zeros(idx.dtype(), &[2, 2]).unwrap();
            let err = e.forward(&[&idx], &mut out).unwrap_err().to_string();
            assert!(err.contains("not a row of the table of 3 rows"), "{err}");
            assert!(err.contains("[2]"), "{err}");
        }
        let flat = Tensor::from_slice(&[0.0f32; 3], &[3]).unwrap();
        assert!(Embedding::new(flat).is_err());
    }
}
