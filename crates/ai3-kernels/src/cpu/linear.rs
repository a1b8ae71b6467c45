//! Fully connected layer as one GEMM.

use crate::alloc::KernelResult;
use crate::cpu::matmul::{matmul_strided, MatMut, MatPtr};
use crate::params::LinearParams;
use crate::Float;

/// `output = input @ weightᵀ + bias` through the gemm crate.
///
/// `input` is `[rows, in_features]`, `weight` `[out_features, in_features]`
/// (PyTorch's layout), `output` `[rows, out_features]`. The weight is read
/// transposed through strides, never copied. A buffer of the wrong length
/// is an error, before anything is written.
pub fn gemm<T: Float>(
    p: &LinearParams,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
) -> KernelResult<()> {
    p.check_buffers(
        input.len(),
        weight.len(),
        bias.map(<[T]>::len),
        output.len(),
    )?;
    if p.rows == 0 || p.out_features == 0 {
        return Ok(());
    }
    // Starting from the bias and accumulating saves a second pass over the output.
    if let Some(b) = bias {
        for row in output.chunks_mut(p.out_features) {
            row.copy_from_slice(b);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        let b = bias.map(as_f32);
        if let (Some(x), Some(w), Some(out)) = (as_f32(input), as_f32(weight), as_f32_mut(output)) {
            if !matches!(b, Some(None)) {
                nt_avx512::linear(p, x, w, b.flatten(), out);
                return Ok(());
            }
        }
    }
    // Computed transposed, outputᵀ = weight @ inputᵀ: the big operand (the
    // weight) is then read row-major, which the gemm crate packs several
    // times faster than the column-major view of weightᵀ, and only the small
    // input is read across strides.
    let lhs = MatPtr {
        ptr: weight.as_ptr(),
        rs: p.in_features,
        cs: 1,
    };
    // Element (k, r) of inputᵀ is input[r * in_features + k].
    let rhs = MatPtr {
        ptr: input.as_ptr(),
        rs: 1,
        cs: p.in_features,
    };
    // Element (j, r) of outputᵀ is output[r * out_features + j].
    let dst = MatMut {
        ptr: output.as_mut_ptr(),
        rs: 1,
        cs: p.out_features,
    };
    // SAFETY: the three buffers have the lengths checked above and are distinct.
    unsafe {
        matmul_strided(
            p.out_features,
            p.rows,
            p.in_features,
            dst,
            bias.is_some(),
            lhs,
            rhs,
            ::gemm::Parallelism::Rayon(0),
        )
    };
    Ok(())
}

fn as_f32<T: Float>(v: &[T]) -> Option<&[f32]> {
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
        // SAFETY: T is f32.
        Some(unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<f32>(), v.len()) })
    } else {
        None
    }
}

fn as_f32_mut<T: Float>(v: &mut [T]) -> Option<&mut [f32]> {
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
        // SAFETY: T is f32.
        Some(unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<f32>(), v.len()) })
    } else {
        None
    }
}

/// f32 linear layers with AVX-512: each output is the dot product of two
/// contiguous rows (an input row and a weight row), so the weight is streamed
/// once in its own layout, never packed or transposed.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // small fixed tiles, indexed on purpose
mod nt_avx512 {
    use std::arch::x86_64::*;

    use rayon::prelude::*;

    use crate::params::LinearParams;

    /// Output features per parallel task.
    const TASK_COLS: usize = 64;
    /// Reduction length kept in L1/L2 per pass.
    const KC: usize = 1024;

    pub(super) fn linear(
        p: &LinearParams,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        out: &mut [f32],
    ) {
        let (rows, kf, nf) = (p.rows, p.in_features, p.out_features);
        let out_ptr = crate::cpu::conv2d::SharedMut(out.as_mut_ptr());
        let tasks = nf.div_ceil(TASK_COLS);
        (0..tasks).into_par_iter().for_each(|t| {
            let j0 = t * TASK_COLS;
            let j1 = (j0 + TASK_COLS).min(nf);
            // SAFETY: avx512f was detected by the caller; task t writes only
            // columns j0..j1 of every output row; all indices are in bounds
            // of the asserted lengths.
            unsafe { block(rows, kf, nf, x, w, bias, out_ptr, j0, j1) };
        });
    }

    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn block(
        rows: usize,
        kf: usize,
        nf: usize,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        out: crate::cpu::conv2d::SharedMut<f32>,
        j0: usize,
        j1: usize,
    ) {
        let out = out.0;
        // With fewer than four input rows each weight row is used for at most
        // three dot products: it is streamed whole, which keeps the hardware
        // prefetchers on long contiguous runs; K blocks only pay off when rows
        // reuse the weight block from cache.
        let k_block = if rows < 4 { kf.max(1) } else { KC };
        let mut k0 = 0;
        while k0 < kf.max(1) {
            let kc = k_block.min(kf - k0);
            let first = k0 == 0;
            let mut j = j0;
            while j < j1 {
                let nj = 4.min(j1 - j);
                let mut i = 0;
                while i < rows {
                    let ni = 4.min(rows - i);
                    let mut acc = [[0.0f32; 4]; 4];
                    if nj == 4 {
                        // SAFETY: rows i..i+ni and j..j+4 exist.
                        unsafe {
                            match ni {
                                4 => acc = tile::<4>(x, w, kf, i, j, k0, kc),
                                3 => acc[..3].copy_from_slice(&tile::<3>(x, w, kf, i, j, k0, kc)),
                                2 => acc[..2].copy_from_slice(&tile::<2>(x, w, kf, i, j, k0, kc)),
                                _ => acc[..1].copy_from_slice(&tile::<1>(x, w, kf, i, j, k0, kc)),
                            }
                        }
                    } else {
                        for a in 0..ni {
                            for b in 0..nj {
                                acc[a][b] = unsafe { dot(x, w, kf, i + a, j + b, k0, kc) };
                            }
                        }
                    }
                    for a in 0..ni {
                        for b in 0..nj {
                            // SAFETY: (i + a, j + b) is inside the output,
                            // and column j + b belongs to this task.
                            let o = unsafe { &mut *out.add((i + a) * nf + j + b) };
                            *o = if first {
                                acc[a][b] + bias.map_or(0.0, |bv| bv[j + b])
                            } else {
                                *o + acc[a][b]
                            };
                        }
                    }
                    i += 4;
                }
                j += 4;
            }
            k0 += kc;
            if kf == 0 {
                break;
            }
        }
    }

    /// Dot products of `N` input rows (from `i`) with 4 weight rows (from
    /// `j`) over `k0..k0 + kc`: `N` times 4 independent accumulators.
    #[inline]
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const N: usize>(
        x: &[f32],
        w: &[f32],
        kf: usize,
        i: usize,
        j: usize,
        k0: usize,
        kc: usize,
    ) -> [[f32; 4]; N] {
        let xp: [*const f32; N] = std::array::from_fn(|a| x[(i + a) * kf + k0..].as_ptr());
        let wp: [*const f32; 4] = std::array::from_fn(|b| w[(j + b) * kf + k0..].as_ptr());
        let mut acc = [[_mm512_setzero_ps(); 4]; N];
        let mut k = 0;
        while k + 16 <= kc {
            // SAFETY: k + 16 <= kc, inside each row's k0..k0+kc range.
            unsafe {
                let xv: [__m512; N] = std::array::from_fn(|a| _mm512_loadu_ps(xp[a].add(k)));
                let wv: [__m512; 4] = std::array::from_fn(|b| _mm512_loadu_ps(wp[b].add(k)));
                for a in 0..N {
                    for b in 0..4 {
                        acc[a][b] = _mm512_fmadd_ps(xv[a], wv[b], acc[a][b]);
                    }
                }
            }
            k += 16;
        }
        let mut r = [[0.0f32; 4]; N];
        for a in 0..N {
            for b in 0..4 {
                let mut s = _mm512_reduce_add_ps(acc[a][b]);
                for kk in k..kc {
                    // SAFETY: kk < kc.
                    s += unsafe { *xp[a].add(kk) * *wp[b].add(kk) };
                }
                r[a][b] = s;
            }
        }
        r
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn dot(
        x: &[f32],
        w: &[f32],
        kf: usize,
        i: usize,
        j: usize,
        k0: usize,
        kc: usize,
    ) -> f32 {
        let xr = &x[i * kf + k0..][..kc];
        let wr = &w[j * kf + k0..][..kc];
        let mut acc = _mm512_setzero_ps();
        let mut k = 0;
        while k + 16 <= kc {
            // SAFETY: k + 16 <= kc.
            unsafe {
                acc = _mm512_fmadd_ps(
                    _mm512_loadu_ps(xr.as_ptr().add(k)),
                    _mm512_loadu_ps(wr.as_ptr().add(k)),
                    acc,
                );
            }
            k += 16;
        }
        let mut s = _mm512_reduce_add_ps(acc);
        for kk in k..kc {
            s += xr[kk] * wr[kk];
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::test_util::{assert_close, cast, Rng};

    fn naive(p: &LinearParams, x: &[f64], w: &[f64], b: Option<&[f64]>) -> Vec<f64> {
        let mut out = vec![0.0; p.rows * p.out_features];
        for r in 0..p.rows {
            for j in 0..p.out_features {
                let mut s = b.map_or(0.0, |b| b[j]);
                for k in 0..p.in_features {
                    s += x[r * p.in_features + k] * w[j * p.in_features + k];
                }
                out[r * p.out_features + j] = s;
            }
        }
        out
    }

    #[test]
    fn linear_matches_naive() {
        let mut rng = Rng::new(1);
        for &(rows, in_features, out_features) in &[
            (1, 1, 1),
            (1, 7, 3),
            (5, 16, 9),
            (33, 70, 17),
            (4, 0, 3),
            (128, 300, 65),
            (2, 40, 8),
            (3, 1030, 13),
            (6, 2100, 9),
            (1, 4097, 70),
        ] {
            let p = LinearParams {
                rows,
                in_features,
                out_features,
            };
            let x = rng.vec(rows * in_features);
            let w = rng.vec(out_features * in_features);
            let bv = rng.vec(out_features);
            for b in [None, Some(bv.as_slice())] {
                let want = naive(&p, &x, &w, b);
                let what = format!("linear {p:?} bias={}", b.is_some());
                let mut out = vec![f64::NAN; want.len()];
                gemm(&p, &x, &w, b, &mut out).unwrap();
                assert_close(&out, &want, 1e-12, &what);
                let b32 = b.map(cast::<f32>);
                let mut out32 = vec![f32::NAN; want.len()];
                gemm(&p, &cast(&x), &cast(&w), b32.as_deref(), &mut out32).unwrap();
                assert_close(&out32, &want, 1e-5, &what);
            }
        }
    }

    #[test]
    fn wrong_lengths_are_errors_before_any_write() {
        let p = LinearParams {
            rows: 3,
            in_features: 5,
            out_features: 4,
        };
        let (x, w, b) = (vec![1.0f32; 15], vec![1.0f32; 20], vec![1.0f32; 4]);
        let mut out = vec![f32::NAN; 12];
        let length = |r: KernelResult<()>| matches!(r, Err(crate::KernelError::Length { .. }));
        assert!(length(gemm(&p, &x[1..], &w, Some(&b), &mut out)));
        assert!(length(gemm(&p, &x, &w[1..], Some(&b), &mut out)));
        assert!(length(gemm(&p, &x, &w, Some(&b[1..]), &mut out)));
        assert!(length(gemm(&p, &x, &w, Some(&b), &mut out[1..])));
        assert!(out.iter().all(|v| v.is_nan()));
        // Sizes whose product overflows cannot match any buffer.
        let huge = LinearParams {
            rows: 1 << 40,
            in_features: 1 << 40,
            out_features: 1,
        };
        let r = gemm(&huge, &x, &w, None, &mut out);
        assert!(
            matches!(r, Err(crate::KernelError::Overflow { .. })),
            "{r:?}"
        );
        gemm(&p, &x, &w, Some(&b), &mut out).unwrap();
        assert_eq!(out, [6.0; 12]);
    }
}
