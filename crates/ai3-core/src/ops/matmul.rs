//! `torch.matmul` (and `@`, `torch.bmm`): matrix products over broadcast
//! batch dimensions, with PyTorch's rules for 1-D operands.

use ai3_kernels::cpu::bmm::bmm;

use super::attrs::{Arity, OpSpec};
use super::{elements, elements_mut, kernel_result, with_dtype, Operation};
use crate::error::{Error, Result};
use crate::registry::{Algorithm, OpKind};
use crate::tensor::{shape_str, Tensor};

const OP: OpKind = OpKind::Matmul;

/// `a @ b`: `[..., m, k] @ [..., k, n]` with the batch dimensions broadcast;
/// a 1-D `a` is a row `[1, k]` and a 1-D `b` a column `[k, 1]`, their added
/// dimension dropped from the result, as in PyTorch.
#[derive(Debug, Default)]
pub struct Matmul;

/// Sizes of one product and where each batch's operands start.
struct Plan {
    out: Vec<usize>,
    mkn: (usize, usize, usize),
    offsets: Vec<(usize, usize)>,
}

fn plan(a: &[usize], b: &[usize]) -> Result<Plan> {
    let bad = |why: &str| {
        Error::shape(
            OP.name(),
            format!("{why}: shapes {} and {}", shape_str(a), shape_str(b)),
        )
    };
    if a.is_empty() || b.is_empty() {
        return Err(bad("both operands need at least one dimension"));
    }
    let (a2, drop_m) = if a.len() == 1 {
        (vec![1, a[0]], true)
    } else {
        (a.to_vec(), false)
    };
    let (b2, drop_n) = if b.len() == 1 {
        (vec![b[0], 1], true)
    } else {
        (b.to_vec(), false)
    };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (kb, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != kb {
        return Err(bad("the inner dimensions differ"));
    }
    let (ba, bb) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
    let rank = ba.len().max(bb.len());
    let pad = |s: &[usize]| {
        let mut v = vec![1; rank - s.len()];
        v.extend_from_slice(s);
        v
    };
    let (ba, bb) = (pad(ba), pad(bb));
    let mut batch = Vec::with_capacity(rank);
    for (&x, &y) in ba.iter().zip(&bb) {
        batch.push(match (x, y) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return Err(bad("the batch dimensions do not broadcast")),
        });
    }
    // Element strides of each operand's batch dimensions, 0 where broadcast.
    let strides = |dims: &[usize], matrix: usize| {
        let mut st = vec![0usize; rank];
        let mut step = matrix;
        for d in (0..rank).rev() {
            st[d] = if dims[d] == 1 { 0 } else { step };
            step *= dims[d];
        }
        st
    };
    let (sa, sb) = (strides(&ba, m * k), strides(&bb, k * n));
    let count: usize = batch.iter().product();
    let mut offsets = Vec::with_capacity(count);
    let mut index = vec![0usize; rank];
    for _ in 0..count {
        let oa = index.iter().zip(&sa).map(|(i, s)| i * s).sum();
        let ob = index.iter().zip(&sb).map(|(i, s)| i * s).sum();
        offsets.push((oa, ob));
        for d in (0..rank).rev() {
            index[d] += 1;
            if index[d] < batch[d] {
                break;
            }
            index[d] = 0;
        }
    }
    let mut out = batch;
    if !drop_m {
        out.push(m);
    }
    if !drop_n {
        out.push(n);
    }
    Ok(Plan {
        out,
        mkn: (m, k, n),
        offsets,
    })
}

fn operands<'a, T: ?Sized>(inputs: &[&'a T]) -> Result<(&'a T, &'a T)> {
    match inputs {
        [a, b] => Ok((a, b)),
        _ => Err(Error::internal(
            OP.name(),
            format!("expected 2 inputs, got {}", inputs.len()),
        )),
    }
}

impl Operation for Matmul {
    fn kind(&self) -> OpKind {
        OP
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Ok(Algorithm::Gemm.name().into())
    }
    fn work(&self, inputs: &[&[usize]]) -> usize {
        let Ok(p) = operands(inputs).and_then(|(a, b)| plan(a, b)) else {
            return 0;
        };
        let (m, k, n) = p.mkn;
        [m, k, n]
            .iter()
            .fold(p.offsets.len(), |a, &d| a.saturating_mul(d))
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let (a, b) = operands(inputs)?;
        Ok(plan(a, b)?.out)
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let (a, b) = operands(inputs)?;
        let p = plan(a.shape(), b.shape())?;
        with_dtype!(a.dtype(), T, {
            let done = bmm::<T>(
                &p.offsets,
                p.mkn,
                elements(a)?,
                elements(b)?,
                elements_mut(output)?,
            );
            kernel_result(OP, done, || {
                format!(
                    "shapes {} and {}",
                    shape_str(a.shape()),
                    shape_str(b.shape())
                )
            })
        })
    }
}

/// `matmul`: two inputs, no parameters.
pub const SPEC: OpSpec = OpSpec {
    inputs: Arity::exactly(2),
    params: &[],
    build: |_| Ok(Box::new(Matmul)),
};
