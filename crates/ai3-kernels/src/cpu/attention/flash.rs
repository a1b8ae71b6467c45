//! Attention with an online softmax (FlashAttention's recurrence): each task
//! takes a block of query rows and walks the keys in blocks, keeping per row
//! the running maximum, the running sum and the rescaled output. The scores
//! of one block pair are all it holds, so memory stays flat in the sequence
//! length, and causal attention skips the key blocks after the diagonal.

use rayon::prelude::*;

use super::{finish_scores, kv_head, lane_sum, prologue, Mask};
use crate::alloc::{try_zeroed_vec, KernelResult};
use crate::cpu::matmul::{matmul, MatPtr};
use crate::cpu::scratch::with_scratch;
use crate::float::as_f32;
use crate::params::AttentionParams;
use crate::Float;

/// Query rows per task.
pub const BLOCK_Q: usize = 144;
/// Keys per step.
pub const BLOCK_K: usize = 384;

/// Scratch elements one task holds: a block of scores, the output
/// accumulator, and the running maxima and sums.
pub fn scratch_len(p: &AttentionParams) -> usize {
    BLOCK_Q * (BLOCK_K.min(p.kv_len.max(1)) + p.v_dim + 2)
}

/// f32 elements each head running at once holds on CPUs with AVX-512: its
/// keys packed for the register tiles, which every query block then reads.
pub fn packed_keys_len(p: &AttentionParams) -> usize {
    if tiles_available() {
        p.kv_len.div_ceil(NR) * NR * p.head_dim
    } else {
        0
    }
}

/// Keys per packed panel: the columns of the AVX-512 register tile.
const NR: usize = 32;

/// Whether the keys are packed for the AVX-512 register tiles (f32 only).
fn tiles_available() -> bool {
    cfg!(target_arch = "x86_64") && crate::isa::avx512()
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
            // f32 with AVX-512: the keys packed once per head for the register tiles.
            let kp = match as_f32(kh) {
                Some(k32) if tiles_available() => Some(pack_keys(k32, lk, d)?),
                _ => None,
            };
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
                            if let Some(kp) = &kp {
                                // SAFETY: T is f32 (kp exists); the views are
                                // inside the checked buffers and the scratch.
                                unsafe {
                                    tiles::scores(
                                        qb.as_ptr().cast(),
                                        rows,
                                        d,
                                        kp,
                                        j0,
                                        cols,
                                        scores.as_mut_ptr().cast(),
                                    )
                                };
                            } else {
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
                                let sum: T = lane_sum(row);
                                sums[r] = sums[r] * alpha + sum;
                                maxes[r] = m_new;
                                if alpha != T::one() {
                                    acc[r * dv..][..dv].iter_mut().for_each(|a| *a *= alpha);
                                }
                            }
                            if kp.is_some() {
                                // SAFETY: as above; `acc` holds `rows x dv`.
                                unsafe {
                                    tiles::accumulate(
                                        scores.as_ptr().cast(),
                                        rows,
                                        cols,
                                        vh[j0 * dv..].as_ptr().cast(),
                                        dv,
                                        acc.as_mut_ptr().cast(),
                                    )
                                };
                            } else {
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
                                    matmul(
                                        rows,
                                        dv,
                                        cols,
                                        acc.as_mut_ptr(),
                                        dv,
                                        true,
                                        probs,
                                        vm,
                                        par,
                                    );
                                }
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

/// One head's keys `[lk, d]` as panels of [`NR`] keys, each `[d][NR]`
/// (zero past the last key): the `B` operand of `q @ kᵀ` for the tiles.
fn pack_keys(k: &[f32], lk: usize, d: usize) -> KernelResult<Vec<f32>> {
    let mut out: Vec<f32> = try_zeroed_vec(lk.div_ceil(NR) * NR * d, "packed keys")?;
    for (j, row) in k.chunks_exact(d.max(1)).enumerate().take(lk) {
        let base = (j / NR) * d * NR + j % NR;
        for (e, &x) in row.iter().enumerate() {
            out[base + e * NR] = x;
        }
    }
    Ok(out)
}

/// The two products of a block pair on the f32 register tiles.
#[cfg(target_arch = "x86_64")]
mod tiles {
    use super::NR;
    use crate::cpu::tile::{avx512 as tile, Init, Tile};
    use tile::MR;

    const _: () = assert!(
        tile::NR == NR,
        "the packed keys' panels are the tile's columns"
    );

    /// `scores[rows x cols] = q[rows x d] @ kᵀ` for keys `j0..j0 + cols`
    /// (`j0` a multiple of [`NR`]), from the packed keys `kp`.
    ///
    /// # Safety
    /// AVX-512F; `q` holds `rows x d`, `kp` the packed keys past `j0 + cols`,
    /// `scores` `rows x cols`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scores(
        q: *const f32,
        rows: usize,
        d: usize,
        kp: &[f32],
        j0: usize,
        cols: usize,
        scores: *mut f32,
    ) {
        let mut c0 = 0;
        while c0 < cols {
            let mut t = Tile {
                a: q,
                lda: d,
                b: unsafe { kp.as_ptr().add((j0 + c0) / NR * d * NR) },
                ldb: NR,
                kc: d,
                c: unsafe { scores.add(c0) },
                ldc: cols,
                n: NR.min(cols - c0),
                init: Init::Zero,
            };
            each_rows(rows, &mut t);
            c0 += NR;
        }
    }

    /// `acc[rows x dv] += probs[rows x cols] @ v[cols x dv]` (`v` at row stride `dv`).
    ///
    /// # Safety
    /// AVX-512F; the buffers hold the sizes named.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn accumulate(
        probs: *const f32,
        rows: usize,
        cols: usize,
        v: *const f32,
        dv: usize,
        acc: *mut f32,
    ) {
        let mut c0 = 0;
        while c0 < dv {
            let mut t = Tile {
                a: probs,
                lda: cols,
                b: unsafe { v.add(c0) },
                ldb: dv,
                kc: cols,
                c: unsafe { acc.add(c0) },
                ldc: dv,
                n: NR.min(dv - c0),
                init: Init::Load,
            };
            each_rows(rows, &mut t);
            c0 += NR;
        }
    }

    /// Runs `t` over `rows` rows, [`MR`] at a time.
    #[target_feature(enable = "avx512f")]
    unsafe fn each_rows(rows: usize, t: &mut Tile) {
        let mut i = 0;
        while i < rows {
            let m = MR.min(rows - i);
            // SAFETY: rows i..i+m exist in a and c (the callers' contracts).
            unsafe {
                tile::run(m, t);
                t.a = t.a.add(m * t.lda);
                t.c = t.c.add(m * t.ldc);
            }
            i += m;
        }
    }
}

/// Without x86-64 there are no packed keys ([`tiles_available`] is false),
/// so these are never called.
#[cfg(not(target_arch = "x86_64"))]
mod tiles {
    pub(super) unsafe fn scores(
        _: *const f32,
        _: usize,
        _: usize,
        _: &[f32],
        _: usize,
        _: usize,
        _: *mut f32,
    ) {
        unreachable!("packed keys exist only with AVX-512")
    }

    pub(super) unsafe fn accumulate(
        _: *const f32,
        _: usize,
        _: usize,
        _: *const f32,
        _: usize,
        _: *mut f32,
    ) {
        unreachable!("packed keys exist only with AVX-512")
    }
}
