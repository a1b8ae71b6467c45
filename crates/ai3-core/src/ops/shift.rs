//! Operations that move elements to new positions: constant padding
//! (`F.pad(x, pad, value=v)`) and cyclic shifts (`torch.roll`).

use ai3_kernels::cpu::shift;

use super::attrs::{optional, required, Arity, OpSpec, ParamKind as K};
use super::{elements, elements_mut, kernel_result, normalize_dim, single, with_dtype, Operation};
use crate::error::{Error, Result};
use crate::registry::{Algorithm, OpKind};
use crate::tensor::{shape_str, Tensor};

/// `F.pad(x, pad, mode='constant', value)`: `pad` holds `(before, after)`
/// pairs from the last dimension backwards, as in PyTorch.
#[derive(Debug, Clone)]
pub struct Pad {
    pad: Vec<usize>,
    value: f64,
}

impl Pad {
    /// Constant padding; a negative amount (PyTorch's cropping) or an odd
    /// count is an error.
    pub fn new(pad: Vec<i64>, value: f64) -> Result<Self> {
        let op = OpKind::Pad;
        if !pad.len().is_multiple_of(2) {
            return Err(Error::invalid(
                op.name(),
                format!("pad must have an even number of entries, got {pad:?}"),
            ));
        }
        let pad = pad
            .iter()
            .map(|&p| usize::try_from(p))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| {
                Error::invalid(
                    op.name(),
                    format!("negative padding (cropping) is not supported, got {pad:?}"),
                )
            })?;
        Ok(Pad { pad, value })
    }

    /// `(before, after)` per dimension of an input of shape `x`.
    fn sides(&self, x: &[usize]) -> Result<(Vec<usize>, Vec<usize>)> {
        let k = self.pad.len() / 2;
        if k > x.len() {
            return Err(Error::shape(
                OpKind::Pad.name(),
                format!(
                    "{} padding values for an input of shape {}",
                    self.pad.len(),
                    shape_str(x)
                ),
            ));
        }
        let (mut before, mut after) = (vec![0; x.len()], vec![0; x.len()]);
        for i in 0..k {
            before[x.len() - 1 - i] = self.pad[2 * i];
            after[x.len() - 1 - i] = self.pad[2 * i + 1];
        }
        Ok((before, after))
    }
}

impl Operation for Pad {
    fn kind(&self) -> OpKind {
        OpKind::Pad
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Ok(Algorithm::Direct.name().into())
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let x = single(OpKind::Pad, inputs)?;
        let (before, after) = self.sides(x)?;
        x.iter()
            .zip(before.iter().zip(&after))
            .map(|(&n, (&b, &a))| {
                n.checked_add(b)
                    .and_then(|v| v.checked_add(a))
                    .ok_or_else(|| Error::shape(OpKind::Pad.name(), "the padded size overflows"))
            })
            .collect()
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let x = single(OpKind::Pad, inputs)?;
        let (before, after) = self.sides(x.shape())?;
        if x.rank() == 0 {
            return Err(Error::shape(
                OpKind::Pad.name(),
                "cannot pad a 0-dimensional input",
            ));
        }
        with_dtype!(x.dtype(), T, {
            let value = super::activation::lit::<T>(self.value);
            let done = shift::pad_constant::<T>(
                x.shape(),
                &before,
                &after,
                value,
                elements(x)?,
                elements_mut(output)?,
            );
            kernel_result(OpKind::Pad, done, || {
                format!("input of shape {}", shape_str(x.shape()))
            })
        })
    }
}

/// `pad`: `pad` (pairs from the last dimension backwards) and `value` (default 0).
pub const PAD: OpSpec = OpSpec {
    inputs: Arity::exactly(1),
    params: &[required("pad", K::Ints), optional("value", K::Float)],
    build: |a| {
        Ok(Box::new(Pad::new(
            a.ints("pad")?,
            a.float_or("value", 0.0)?,
        )?))
    },
};

/// `torch.roll(x, shifts, dims)`; without `dims`, the flattened input rolls.
#[derive(Debug, Clone)]
pub struct Roll {
    shifts: Vec<i64>,
    dims: Vec<i64>,
}

impl Roll {
    /// A roll by `shifts` along `dims` (one shift per dimension, or one shift and no dims).
    pub fn new(shifts: Vec<i64>, dims: Vec<i64>) -> Result<Self> {
        if shifts.is_empty()
            || (dims.is_empty() && shifts.len() != 1)
            || (!dims.is_empty() && dims.len() != shifts.len())
        {
            return Err(Error::invalid(
                OpKind::Roll.name(),
                format!("shifts {shifts:?} and dims {dims:?} must have the same length (or one shift and no dims)"),
            ));
        }
        Ok(Roll { shifts, dims })
    }

    /// The shape the kernel sees and each of its dimensions' shift in `0..size`.
    fn plan(&self, x: &[usize]) -> Result<(Vec<usize>, Vec<usize>)> {
        let reduce = |s: i64, n: usize| {
            if n == 0 {
                0
            } else {
                s.rem_euclid(n as i64) as usize
            }
        };
        if self.dims.is_empty() {
            let n: usize = x.iter().product();
            return Ok((vec![n], vec![reduce(self.shifts[0], n)]));
        }
        let mut shifts = vec![0usize; x.len()];
        for (&d, &s) in self.dims.iter().zip(&self.shifts) {
            let d = normalize_dim(OpKind::Roll, d, x.len(), x)?;
            shifts[d] = (shifts[d] + reduce(s, x[d])) % x[d].max(1);
        }
        Ok((x.to_vec(), shifts))
    }
}

impl Operation for Roll {
    fn kind(&self) -> OpKind {
        OpKind::Roll
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Ok(Algorithm::Direct.name().into())
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let x = single(OpKind::Roll, inputs)?;
        self.plan(x)?;
        Ok(x.to_vec())
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let x = single(OpKind::Roll, inputs)?;
        if x.numel() == 0 {
            return Ok(());
        }
        let (shape, shifts) = self.plan(x.shape())?;
        let shape = if shape.is_empty() { vec![1] } else { shape };
        let shifts = if shifts.is_empty() { vec![0] } else { shifts };
        with_dtype!(x.dtype(), T, {
            let done = shift::roll::<T>(&shape, &shifts, elements(x)?, elements_mut(output)?);
            kernel_result(OpKind::Roll, done, || {
                format!("input of shape {}", shape_str(x.shape()))
            })
        })
    }
}

/// `roll`: `shifts` and `dims` (empty: the flattened input).
pub const ROLL: OpSpec = OpSpec {
    inputs: Arity::exactly(1),
    params: &[required("shifts", K::Ints), optional("dims", K::Ints)],
    build: |a| {
        let dims = a.opt_ints("dims")?.unwrap_or_default();
        Ok(Box::new(Roll::new(a.ints("shifts")?, dims)?))
    },
};
