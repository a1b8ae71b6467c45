//! Attention with an online softmax (FlashAttention's recurrence): each task
//! takes a block of query rows and walks the keys in blocks, keeping per row
//! the running maximum, the running sum and the rescaled output. The scores
//! of one block pair are all it holds, so memory stays flat in the sequence
//! length, and causal attention skips the key blocks after the diagonal.

use rayon::prelude::*;

use super::{finish_scores, kv_head, prologue, Mask};
use crate::alloc::KernelResult;
use crate::cpu::matmul::{matmul, MatPtr};
use crate::cpu::scratch::with_scratch;
use crate::params::AttentionParams;
use crate::Float;

/// Query rows per task.
pub const BLOCK_Q: usize = 128;
/// Keys per step.
pub const BLOCK_K: usize = 256;

/// Scratch elements one task holds: a block of scores, the output
/// accumulator, and the running maxima and sums.
pub fn scratch_len(p: &AttentionParams) -> usize {
    BLOCK_Q * (BLOCK_K.min(p.kv_len.max(1)) + p.v_dim + 2)
}

/// `output = softmax(q @ kᵀ * scale + mask) @ v` per head (see
/// [`AttentionParams`]), tiled: tasks of [`BLOCK_Q`] query rows run in
/// parallel. Buffers of the wrong length are an error before anything is written.
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
    let scale = T::from_f64(p.scale).unwrap_or_else(T::nan);
    let bk = BLOCK_K.min(lk);
    output
        .par_chunks_mut(lq * dv)
        .enumerate()
        .try_for_each(|(bh, head_out)| {
            let kvh = kv_head(p, bh);
            let kh = &k[kvh * lk * d..][..lk * d];
            let vh = &v[kvh * lk * dv..][..lk * dv];
            head_out
                .par_chunks_mut(BLOCK_Q * dv)
                .enumerate()
                .try_for_each(|(blk, out)| {
                    let i0 = blk * BLOCK_Q;
                    let rows = out.len() / dv;
                    let qb = &q[(bh * lq + i0) * d..][..rows * d];
                    with_scratch(scratch_len(p), |buf: &mut [T]| {
                        let (scores, rest) = buf.split_at_mut(BLOCK_Q * bk);
                        let (acc, rest) = rest.split_at_mut(BLOCK_Q * dv);
                        let (maxes, sums) = rest.split_at_mut(BLOCK_Q);
                        acc[..rows * dv].fill(T::zero());
                        maxes.fill(T::neg_infinity());
                        sums.fill(T::zero());
                        let mut j0 = 0;
                        while j0 < lk && !(p.causal && j0 > i0 + rows - 1) {
                            let cols = bk.min(lk - j0);
                            // SAFETY: views inside the checked buffers; scratch is distinct.
                            unsafe {
                                let lhs = MatPtr {
                                    ptr: qb.as_ptr(),
                                    rs: d,
                                    cs: 1,
                                };
                                let kt = MatPtr {
                                    ptr: kh[j0 * d..].as_ptr(),
                                    rs: 1,
                                    cs: d,
                                };
                                let par = gemm::Parallelism::None;
                                matmul(
                                    rows,
                                    cols,
                                    d,
                                    scores.as_mut_ptr(),
                                    cols,
                                    false,
                                    lhs,
                                    kt,
                                    par,
                                );
                            }
                            for r in 0..rows {
                                let row = &mut scores[r * cols..][..cols];
                                let bmax = finish_scores(p, row, scale, mask, bh, i0 + r, j0);
                                let m_new = if bmax.is_nan() {
                                    bmax
                                } else {
                                    maxes[r].max(bmax)
                                };
                                if m_new == T::neg_infinity() {
                                    row.fill(T::zero()); // nothing unmasked yet in this row
                                    continue;
                                }
                                let alpha = (maxes[r] - m_new).exp();
                                row.iter_mut().for_each(|x| *x = *x - m_new);
                                T::exp_in_place(row);
                                let sum: T = row.iter().copied().sum();
                                sums[r] = sums[r] * alpha + sum;
                                maxes[r] = m_new;
                                if alpha != T::one() {
                                    acc[r * dv..][..dv].iter_mut().for_each(|a| *a *= alpha);
                                }
                            }
                            // SAFETY: as above; `acc` holds `rows x dv`.
                            unsafe {
                                let probs = MatPtr {
                                    ptr: scores.as_ptr(),
                                    rs: cols,
                                    cs: 1,
                                };
                                let vm = MatPtr {
                                    ptr: vh[j0 * dv..].as_ptr(),
                                    rs: dv,
                                    cs: 1,
                                };
                                let par = gemm::Parallelism::None;
                                matmul(rows, dv, cols, acc.as_mut_ptr(), dv, true, probs, vm, par);
                            }
                            j0 += cols;
                        }
                        for r in 0..rows {
                            let inv = if sums[r] > T::zero() || sums[r].is_nan() {
                                T::one() / sums[r]
                            } else {
                                T::zero() // every key masked: zeros, as in PyTorch
                            };
                            for (o, &a) in out[r * dv..][..dv].iter_mut().zip(&acc[r * dv..][..dv])
                            {
                                *o = a * inv;
                            }
                        }
                    })
                })
        })
}
