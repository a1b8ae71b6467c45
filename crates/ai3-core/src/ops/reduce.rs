//! Reductions: softmax along one dimension, L2 normalisation, and the mean
//! and sum over dimensions.

use super::attrs::{optional, required, Arity, OpSpec, ParamKind as K};
use ai3_kernels::cpu::reduce;
use ai3_kernels::params::AxisParams;

use super::{elements, elements_mut, kernel_result, normalize_dim, single, with_dtype, Operation};
use crate::error::{Error, Result};
use crate::registry::{Algorithm, OpKind};
use crate::tensor::{shape_str, Tensor};

/// `torch.softmax(x, dim)`.
#[derive(Debug, Clone, Copy)]
pub struct Softmax {
    dim: i64,
}

impl Softmax {
    /// Softmax along `dim` (negative counts from the end).
    pub fn new(dim: i64) -> Self {
        Softmax { dim }
    }

    fn params(&self, shape: &[usize]) -> Result<AxisParams> {
        axis_params(OpKind::Softmax, self.dim, shape)
    }
}

/// The sizes around dimension `dim` of `shape` for `op`; a 0-D tensor
/// behaves as one of shape `[1]`, as in PyTorch.
fn axis_params(op: OpKind, dim: i64, shape: &[usize]) -> Result<AxisParams> {
    if shape.is_empty() {
        normalize_dim(op, dim, 1, shape)?;
        return Ok(AxisParams::new(&[1], 0));
    }
    Ok(AxisParams::new(
        shape,
        normalize_dim(op, dim, shape.len(), shape)?,
    ))
}

impl Operation for Softmax {
    fn kind(&self) -> OpKind {
        OpKind::Softmax
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Ok(Algorithm::Direct.name().into())
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let x = single(OpKind::Softmax, inputs)?;
        self.params(x)?;
        Ok(x.to_vec())
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let x = single(OpKind::Softmax, inputs)?;
        let p = self.params(x.shape())?;
        with_dtype!(x.dtype(), T, {
            let done = reduce::softmax::<T>(&p, x.as_slice()?, output.as_mut_slice()?);
            kernel_result(OpKind::Softmax, done, || {
                format!("input shape {}, dim {}", shape_str(x.shape()), self.dim)
            })?
        });
        Ok(())
    }
}

/// `F.normalize(x, p=2, dim, eps)`: `x / max(||x||_2, eps)` along `dim`.
#[derive(Debug, Clone, Copy)]
pub struct Normalize {
    dim: i64,
    eps: f64,
}

impl Normalize {
    /// L2 normalisation along `dim` (negative counts from the end).
    pub fn new(dim: i64, eps: f64) -> Self {
        Normalize { dim, eps }
    }
}

impl Operation for Normalize {
    fn kind(&self) -> OpKind {
        OpKind::Normalize
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Ok(Algorithm::Direct.name().into())
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let x = single(OpKind::Normalize, inputs)?;
        axis_params(OpKind::Normalize, self.dim, x)?;
        Ok(x.to_vec())
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let x = single(OpKind::Normalize, inputs)?;
        let p = axis_params(OpKind::Normalize, self.dim, x.shape())?;
        with_dtype!(x.dtype(), T, {
            let eps = super::activation::lit::<T>(self.eps);
            let done = reduce::l2_normalize::<T>(&p, eps, elements(x)?, elements_mut(output)?);
            kernel_result(OpKind::Normalize, done, || {
                format!("input shape {}", shape_str(x.shape()))
            })?
        });
        Ok(())
    }
}

/// `normalize` (L2) along `dim` (default 1, as `F.normalize`), `eps` (default 1e-12).
pub const NORMALIZE: OpSpec = OpSpec {
    inputs: Arity::exactly(1),
    params: &[optional("dim", K::Int), optional("eps", K::Float)],
    build: |a| {
        Ok(Box::new(Normalize::new(
            a.int_or("dim", 1)?,
            a.float_or("eps", 1e-12)?,
        )))
    },
};

/// `x.mean(dims, keepdim)` or `x.sum(dims, keepdim)`; no dims means every dimension.
#[derive(Debug, Clone)]
pub struct Mean {
    op: OpKind,
    dims: Vec<i64>,
    keepdim: bool,
}

impl Mean {
    /// The mean over `dims` (negative counts from the end; empty = all).
    pub fn new(dims: Vec<i64>, keepdim: bool) -> Self {
        Mean {
            op: OpKind::Mean,
            dims,
            keepdim,
        }
    }

    /// The sum over `dims` (negative counts from the end; empty = all).
    pub fn sum(dims: Vec<i64>, keepdim: bool) -> Self {
        Mean {
            op: OpKind::Sum,
            dims,
            keepdim,
        }
    }

    /// Which dimensions of `shape` are reduced.
    fn mask(&self, shape: &[usize]) -> Result<Vec<bool>> {
        let op = self.op;
        let rank = shape.len();
        if self.dims.is_empty() {
            return Ok(vec![true; rank]);
        }
        let mut mask = vec![false; rank];
        for &d in &self.dims {
            // A 0-D tensor accepts dim 0 or -1, as in PyTorch.
            let k = normalize_dim(op, d, rank.max(1), shape)?;
            if rank == 0 {
                continue;
            }
            if std::mem::replace(&mut mask[k], true) {
                return Err(Error::invalid(
                    op.name(),
                    format!(
                        "dimension {d} appears more than once in dims {:?} for input of shape {}",
                        self.dims,
                        shape_str(shape)
                    ),
                ));
            }
        }
        Ok(mask)
    }
}

impl Operation for Mean {
    fn kind(&self) -> OpKind {
        self.op
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Ok(Algorithm::Direct.name().into())
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let x = single(self.op, inputs)?;
        let mask = self.mask(x)?;
        Ok(x.iter()
            .zip(&mask)
            .filter_map(|(&d, &r)| match (r, self.keepdim) {
                (false, _) => Some(d),
                (true, true) => Some(1),
                (true, false) => None,
            })
            .collect())
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let x = single(self.op, inputs)?;
        let mask = self.mask(x.shape())?;
        let mean = self.op == OpKind::Mean;
        with_dtype!(x.dtype(), T, {
            if x.numel() == 0 {
                // Over no elements the mean is NaN and the sum 0, as in PyTorch.
                elements_mut::<T>(output)?.fill(if mean { T::NAN } else { 0.0 as T });
            } else {
                let kernel = if mean {
                    reduce::mean::<T>
                } else {
                    reduce::sum::<T>
                };
                let done = kernel(x.shape(), &mask, elements(x)?, output.as_mut_slice()?);
                kernel_result(self.op, done, || {
                    format!("input shape {}", shape_str(x.shape()))
                })?
            }
        });
        Ok(())
    }
}

/// `softmax` along `dim`.
pub const SOFTMAX: OpSpec = OpSpec {
    inputs: Arity::exactly(1),
    params: &[required("dim", K::Int)],
    build: |a| Ok(Box::new(Softmax::new(a.int("dim")?))),
};

/// `mean` over `dims` (absent or empty: every dimension), keeping them with `keepdim`.
pub const MEAN: OpSpec = OpSpec {
    inputs: Arity::exactly(1),
    params: &[optional("dims", K::Ints), optional("keepdim", K::Bool)],
    build: |a| {
        let dims = a.opt_ints("dims")?.unwrap_or_default();
        Ok(Box::new(Mean::new(dims, a.bool_or("keepdim", false)?)))
    },
};

/// `sum` over `dims` (absent or empty: every dimension), keeping them with `keepdim`.
pub const SUM: OpSpec = OpSpec {
    inputs: Arity::exactly(1),
    params: &[optional("dims", K::Ints), optional("keepdim", K::Bool)],
    build: |a| {
        let dims = a.opt_ints("dims")?.unwrap_or_default();
        Ok(Box::new(Mean::sum(dims, a.bool_or("keepdim", false)?)))
    },
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_shapes_and_errors() {
        let m = Mean::new(vec![-1, 1], false);
        assert_eq!(m.output_shape(&[&[2, 3, 4]]).unwrap(), vec![2]);
        let m = Mean::new(vec![2, 3], true);
        assert_eq!(m.output_shape(&[&[2, 3, 4, 5]]).unwrap(), vec![2, 3, 1, 1]);
        assert_eq!(
            Mean::new(vec![], false).output_shape(&[&[2, 3]]).unwrap(),
            Vec::<usize>::new()
        );
        let err = Mean::new(vec![1, -1], false)
            .output_shape(&[&[2, 3]])
            .unwrap_err();
        assert!(err.to_string().contains("more than once"), "{err}");
        let err = Mean::new(vec![3], false)
            .output_shape(&[&[2, 3]])
            .unwrap_err();
        assert!(err.to_string().contains("[2, 3]"), "{err}");
    }

    #[test]
    fn sum_adds_and_an_empty_sum_is_zero() {
        let x = Tensor::from_slice(&[1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
        let s = Mean::sum(vec![1], true);
        assert_eq!(s.kind(), OpKind::Sum);
        assert_eq!(s.output_shape(&[&[2, 3]]).unwrap(), vec![2, 1]);
        let mut out = Tensor::zeros(x.dtype(), &[2, 1]).unwrap();
        s.forward(&[&x], &mut out).unwrap();
        assert_eq!(out.as_slice::<f64>().unwrap(), &[6.0, 15.0]);
        let empty = Tensor::zeros(x.dtype(), &[0, 2]).unwrap();
        let mut out = Tensor::zeros(x.dtype(), &[2]).unwrap();
        out.as_mut_slice::<f64>().unwrap().fill(7.0);
        Mean::sum(vec![0], false)
            .forward(&[&empty], &mut out)
            .unwrap();
        assert_eq!(out.as_slice::<f64>().unwrap(), &[0.0, 0.0]);
        let err = Mean::sum(vec![2], false)
            .output_shape(&[&[2, 3]])
            .unwrap_err();
        assert!(err.to_string().contains("sum"), "{err}");
    }

    #[test]
    fn softmax_runs() {
        let x = Tensor::from_slice(&[0.0f64, 0.0, 1.0, 1.0], &[2, 2]).unwrap();
        let mut out = Tensor::zeros(x.dtype(), &[2, 2]).unwrap();
        Softmax::new(0).forward(&[&x], &mut out).unwrap();
        let e = 1.0 / (1.0 + 1f64.exp());
        for (g, w) in out
            .as_slice::<f64>()
            .unwrap()
            .iter()
            .zip([e, e, 1.0 - e, 1.0 - e])
        {
            assert!((g - w).abs() < 1e-15, "{g} vs {w}");
        }
        assert!(Softmax::new(2).output_shape(&[&[2, 2]]).is_err());
    }
}
