//! Attention that materialises each head's `q_len x kv_len` score matrix:
//! two large GEMMs around a row softmax. Fast for short sequences; its
//! scratch grows with `q_len * kv_len`.

use rayon::prelude::*;

use super::{finish_scores, kv_head, lane_sum, prologue, Mask};
use crate::alloc::KernelResult;
use crate::cpu::matmul::{matmul, MatPtr};
use crate::cpu::scratch::with_scratch;
use crate::params::AttentionParams;
use crate::Float;

/// `output = softmax(q @ kᵀ * scale + mask) @ v` per head (see [`AttentionParams`]).
///
/// Heads run in parallel when there are enough of them, each on its own
/// score matrix; otherwise one head at a time with threaded GEMMs. Buffers
/// of the wrong length are an error before anything is written.
pub fn attention<T: Float>(
    p: &AttentionParams,
    q: &[T],
    k: &[T],
    v: &[T],
    mask: Option<&Mask<'_, T>>,
    output: &mut [T],
) -> KernelResult<()> {
    if !prologue(p, q, k, v, mask, output)? {
        return Ok(());
    }
    let (lq, lk, d, dv) = (p.q_len, p.kv_len, p.head_dim, p.v_dim);
    let heads = p.batch * p.heads;
    let threads = rayon::current_num_threads();
    let per_head = |bh: usize, out: &mut [T], par: gemm::Parallelism| -> KernelResult<()> {
        let kvh = kv_head(p, bh);
        with_scratch(lq * lk, |scores: &mut [T]| {
            let qh = &q[bh * lq * d..][..lq * d];
            let kh = &k[kvh * lk * d..][..lk * d];
            let vh = &v[kvh * lk * dv..][..lk * dv];
            // SAFETY: the views stay inside the checked buffers; `scores` is distinct.
            unsafe {
                let lhs = MatPtr {
                    ptr: qh.as_ptr(),
                    rs: d,
                    cs: 1,
                };
                let kt = MatPtr {
                    ptr: kh.as_ptr(),
                    rs: 1,
                    cs: d,
                };
                matmul(lq, lk, d, scores.as_mut_ptr(), lk, false, lhs, kt, par);
            }
            let scale = T::from_f64(p.scale).unwrap_or_else(T::nan);
            let softmax_row = |(i, row): (usize, &mut [T])| {
                let max = finish_scores(p, row, scale, mask, bh, i, 0);
                if max == T::neg_infinity() {
                    row.fill(T::zero()); // every key masked: zeros, as in PyTorch
                    return;
                }
                row.iter_mut().for_each(|x| *x = *x - max);
                T::exp_in_place(row);
                let sum: T = lane_sum(row);
                let inv = T::one() / sum;
                row.iter_mut().for_each(|x| *x *= inv);
            };
            if matches!(par, gemm::Parallelism::None) {
                scores.chunks_mut(lk).enumerate().for_each(softmax_row);
            } else {
                scores.par_chunks_mut(lk).enumerate().for_each(softmax_row);
            }
            // SAFETY: as above; `out` is this head's `lq x dv` block.
            unsafe {
                let probs = MatPtr {
                    ptr: scores.as_ptr(),
                    rs: lk,
                    cs: 1,
                };
                let vm = MatPtr {
                    ptr: vh.as_ptr(),
                    rs: dv,
                    cs: 1,
                };
                matmul(lq, dv, lk, out.as_mut_ptr(), dv, false, probs, vm, par);
            }
        })
    };
    if heads >= threads {
        output
            .par_chunks_mut(lq * dv)
            .enumerate()
            .try_for_each(|(bh, out)| per_head(bh, out, gemm::Parallelism::None))
    } else {
        output
            .chunks_mut(lq * dv)
            .enumerate()
            .try_for_each(|(bh, out)| per_head(bh, out, gemm::Parallelism::Rayon(0)))
    }
}
