//! Reductions: softmax along one axis, and the mean over a set of axes.

use rayon::prelude::*;

use super::par::CHUNK;
use crate::alloc::{check_len, checked_product, try_zeroed_vec, KernelError, KernelResult};
use crate::params::AxisParams;
use crate::Float;

/// Numerically stable softmax along the axis of `p`: `exp(x - max) / sum`.
/// A NaN in a slice makes that whole slice NaN, as in PyTorch. Buffers of
/// other lengths than `p`'s are an error, as is a refused allocation of the
/// running maxima and sums (`inner` of each per task).
pub fn softmax<T: Float>(p: &AxisParams, input: &[T], output: &mut [T]) -> KernelResult<()> {
    let len = checked_product("softmax size", &[p.outer, p.dim, p.inner])?;
    check_len("softmax input", input.len(), len)?;
    check_len("softmax output", output.len(), len)?;
    if p.is_empty() {
        return Ok(());
    }
    let block = p.dim * p.inner;
    if p.inner == 1 {
        // Each slice is a contiguous row.
        output
            .par_chunks_mut(block)
            .zip(input.par_chunks(block))
            .for_each(|(out, x)| {
                let max = x.iter().fold(T::neg_infinity(), |m, &v| m.max(v));
                let mut sum = T::zero();
                for (o, &v) in out.iter_mut().zip(x) {
                    *o = (v - max).exp();
                    sum += *o;
                }
                out.iter_mut().for_each(|o| *o = *o / sum);
            });
        return Ok(());
    }
    // Slices are strided by `inner`: keep `inner` running maxima and sums so
    // every pass walks memory in order.
    const WHAT: &str = "softmax running maxima and sums";
    output
        .par_chunks_mut(block)
        .zip(input.par_chunks(block))
        .try_for_each(|(out, x)| -> KernelResult<()> {
            let mut max: Vec<T> = try_zeroed_vec(p.inner, WHAT)?;
            max.copy_from_slice(&x[..p.inner]);
            for row in x.chunks(p.inner).skip(1) {
                for (m, &v) in max.iter_mut().zip(row) {
                    *m = m.max(v);
                }
            }
            let mut sum = try_zeroed_vec::<T>(p.inner, WHAT)?;
            for (orow, row) in out.chunks_mut(p.inner).zip(x.chunks(p.inner)) {
                for (((o, &v), &m), s) in orow.iter_mut().zip(row).zip(&max).zip(&mut sum) {
                    *o = (v - m).exp();
                    *s += *o;
                }
            }
            for orow in out.chunks_mut(p.inner) {
                for (o, &s) in orow.iter_mut().zip(&sum) {
                    *o = *o / s;
                }
            }
            Ok(())
        })
}

/// A run of adjacent dimensions that are all reduced or all kept.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Group {
    size: usize,
    stride: usize,
    reduced: bool,
}

/// Drops size-1 dimensions and merges neighbours with the same role.
fn groups(shape: &[usize], reduce: &[bool]) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    let mut stride = 1;
    for k in (0..shape.len()).rev() {
        let size = shape[k];
        if size != 1 {
            match out.last_mut() {
                Some(g) if g.reduced == reduce[k] => g.size *= size,
                _ => out.push(Group {
                    size,
                    stride,
                    reduced: reduce[k],
                }),
            }
        }
        stride *= size;
    }
    out.reverse();
    out
}

/// Offset of combination `i` of the given groups (row-major over them).
#[inline]
fn offset(mut i: usize, gs: &[Group]) -> usize {
    let mut off = 0;
    for g in gs.iter().rev() {
        off += (i % g.size) * g.stride;
        i /= g.size;
    }
    off
}

/// The mean over the dimensions `k` with `reduce[k]`, of a contiguous
/// `input` of `shape`; `output` holds the kept dimensions in order
/// (`keepdim` only changes the shape, not the data). Sums in f64.
///
/// Buffers of other lengths than the shape says are an error, as is a
/// refused allocation of a task's accumulator row.
pub fn mean<T: Float>(
    shape: &[usize],
    reduce: &[bool],
    input: &[T],
    output: &mut [T],
) -> KernelResult<()> {
    reduce_sum(shape, reduce, input, output, true)
}

/// The sum over the dimensions `k` with `reduce[k]`, laid out as [`mean`]'s
/// (a sum over no elements is 0). Sums in f64.
pub fn sum<T: Float>(
    shape: &[usize],
    reduce: &[bool],
    input: &[T],
    output: &mut [T],
) -> KernelResult<()> {
    reduce_sum(shape, reduce, input, output, false)
}

/// The sum over the reduced dimensions, divided by their element count when `mean`.
fn reduce_sum<T: Float>(
    shape: &[usize],
    reduce: &[bool],
    input: &[T],
    output: &mut [T],
    mean: bool,
) -> KernelResult<()> {
    if shape.len() != reduce.len() {
        return Err(KernelError::Precondition {
            what: "mean needs one reduce flag per dimension",
        });
    }
    check_len(
        "mean input",
        input.len(),
        checked_product("mean input size", shape)?,
    )?;
    let kept_dims: Vec<usize> = (0..shape.len())
        .filter(|&k| !reduce[k])
        .map(|k| shape[k])
        .collect();
    check_len(
        "mean output",
        output.len(),
        checked_product("mean output size", &kept_dims)?,
    )?;
    if output.is_empty() {
        return Ok(());
    }
    let count: usize = shape
        .iter()
        .zip(reduce)
        .filter(|(_, &r)| r)
        .map(|(&d, _)| d)
        .product();
    let scale = if mean { 1.0 / count as f64 } else { 1.0 };
    let gs = groups(shape, reduce);
    // The innermost group is contiguous: summed as runs when reduced, or
    // accumulated as whole output rows when kept.
    let last = gs.last().copied().unwrap_or(Group {
        size: 1,
        stride: 1,
        reduced: false,
    });
    let (row_len, run) = if last.reduced {
        (1, last.size)
    } else {
        (last.size, 1)
    };
    let n_outer = gs.len().saturating_sub(1);
    let kept: Vec<Group> = gs[..n_outer]
        .iter()
        .filter(|g| !g.reduced)
        .copied()
        .collect();
    let red: Vec<Group> = gs[..n_outer]
        .iter()
        .filter(|g| g.reduced)
        .copied()
        .collect();
    let combos: usize = red.iter().map(|g| g.size).product();
    let to = |v: f64| T::from_f64(v).unwrap_or_else(T::nan);
    // About CHUNK input elements per task, however the work splits into rows.
    let rows_per_task = (CHUNK / (row_len * run * combos).max(1)).max(1);
    output
        .par_chunks_mut(rows_per_task * row_len)
        .enumerate()
        .try_for_each(|(t, block)| -> KernelResult<()> {
            let mut acc: Vec<f64> = try_zeroed_vec(row_len, "mean accumulator row")?;
            for (i, out) in block.chunks_mut(row_len).enumerate() {
                let base = offset(t * rows_per_task + i, &kept);
                acc.fill(0.0);
                for c in 0..combos {
                    let src = &input[base + offset(c, &red)..][..row_len.max(run)];
                    if last.reduced {
                        acc[0] += src
                            .iter()
                            .map(|v| v.to_f64().unwrap_or(f64::NAN))
                            .sum::<f64>();
                    } else {
                        for (a, v) in acc.iter_mut().zip(src) {
                            *a += v.to_f64().unwrap_or(f64::NAN);
                        }
                    }
                }
                for (o, &a) in out.iter_mut().zip(&acc) {
                    *o = to(a * scale);
                }
            }
            Ok(())
        })
}

/// `x / max(||x||_2, eps)` along the axis of `p` (`F.normalize` with `p=2`).
/// Buffers of other lengths than `p`'s are an error.
pub fn l2_normalize<T: Float>(
    p: &AxisParams,
    eps: T,
    input: &[T],
    output: &mut [T],
) -> KernelResult<()> {
    let len = checked_product("normalize size", &[p.outer, p.dim, p.inner])?;
    check_len("normalize input", input.len(), len)?;
    check_len("normalize output", output.len(), len)?;
    if p.is_empty() {
        return Ok(());
    }
    let block = p.dim * p.inner;
    output
        .par_chunks_mut(block)
        .zip(input.par_chunks(block))
        .for_each(|(out, x)| {
            for j in 0..p.inner {
                let sq: T = (0..p.dim)
                    .map(|d| x[d * p.inner + j] * x[d * p.inner + j])
                    .sum();
                let norm = sq.sqrt();
                let inv = T::one() / if norm > eps { norm } else { eps };
                for d in 0..p.dim {
                    out[d * p.inner + j] = x[d * p.inner + j] * inv;
                }
            }
        });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::test_util::{assert_close, cast, Rng};

    fn naive_softmax(p: &AxisParams, x: &[f64]) -> Vec<f64> {
        let mut out = vec![0.0; x.len()];
        for o in 0..p.outer {
            for i in 0..p.inner {
                let at = |d: usize| (o * p.dim + d) * p.inner + i;
                let sum: f64 = (0..p.dim).map(|d| x[at(d)].exp()).sum();
                for d in 0..p.dim {
                    out[at(d)] = x[at(d)].exp() / sum;
                }
            }
        }
        out
    }

    #[test]
    fn softmax_matches_naive() {
        let mut rng = Rng::new(11);
        for shape in [[1, 5, 1], [3, 7, 1], [2, 4, 6], [1, 3, 1000], [40, 1000, 1]] {
            let p = AxisParams {
                outer: shape[0],
                dim: shape[1],
                inner: shape[2],
            };
            let x: Vec<f64> = rng.vec(p.len()).iter().map(|v| 20.0 * v).collect();
            let want = naive_softmax(&p, &x);
            let mut out = vec![f64::NAN; p.len()];
            softmax(&p, &x, &mut out).unwrap();
            assert_close(&out, &want, 1e-12, &format!("{p:?}"));
            let mut out32 = vec![f32::NAN; p.len()];
            softmax(&p, &cast::<f32>(&x), &mut out32).unwrap();
            assert_close(&out32, &want, 1e-5, &format!("{p:?} f32"));
        }
        // Large inputs do not overflow; NaN poisons its slice only.
        let p = AxisParams {
            outer: 2,
            dim: 3,
            inner: 1,
        };
        let mut out = [0f32; 6];
        softmax(
            &p,
            &[1000.0, 1000.0, f32::NAN, 1000.0, 1000.0, 0.0],
            &mut out,
        )
        .unwrap();
        assert!(out[..3].iter().all(|v| v.is_nan()));
        assert_eq!(&out[3..5], &[0.5, 0.5]);
    }

    /// The mean straight from the definition: each input element added to
    /// the output element its kept indices select.
    fn naive_mean(shape: &[usize], reduce: &[bool], x: &[f64]) -> Vec<f64> {
        let kept: Vec<usize> = (0..shape.len()).filter(|&k| !reduce[k]).collect();
        let n_out: usize = kept.iter().map(|&k| shape[k]).product();
        let count = x.len() / n_out;
        let mut out = vec![0.0; n_out];
        for (flat, &v) in x.iter().enumerate() {
            let mut rest = flat;
            let mut idx = vec![0; shape.len()];
            for k in (0..shape.len()).rev() {
                idx[k] = rest % shape[k];
                rest /= shape[k];
            }
            let o = kept.iter().fold(0, |a, &k| a * shape[k] + idx[k]);
            out[o] += v / count as f64;
        }
        out
    }

    #[test]
    fn mean_matches_naive() {
        let mut rng = Rng::new(12);
        let shape = [3, 4, 1, 5, 6];
        for mask in 0..32u32 {
            let reduce: Vec<bool> = (0..5).map(|k| mask >> k & 1 == 1).collect();
            let x = rng.vec(shape.iter().product());
            let want = naive_mean(&shape, &reduce, &x);
            let mut out = vec![f64::NAN; want.len()];
            mean(&shape, &reduce, &x, &mut out).unwrap();
            assert_close(&out, &want, 1e-12, &format!("{reduce:?}"));
            let mut out32 = vec![f32::NAN; want.len()];
            mean(&shape, &reduce, &cast::<f32>(&x), &mut out32).unwrap();
            assert_close(&out32, &want, 1e-6, &format!("{reduce:?} f32"));
        }
        // Global average pooling of a large tensor, and a scalar.
        let shape = [4, 64, 32, 32];
        let x = rng.vec(shape.iter().product());
        let reduce = [false, false, true, true];
        let mut out = vec![f64::NAN; 256];
        mean(&shape, &reduce, &x, &mut out).unwrap();
        assert_close(&out, &naive_mean(&shape, &reduce, &x), 1e-12, "gap");
        let mut out = [f64::NAN];
        mean(&[], &[], &[3.5], &mut out).unwrap();
        assert_eq!(out, [3.5]);
    }
}
