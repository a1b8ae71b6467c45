//! Fully connected layer as one GEMM: [`gemm()`] for any weight, and
//! [`packed`] for an f32 weight packed once when the layer is built.

pub mod packed;

use rayon::prelude::*;

use crate::alloc::KernelResult;
use crate::cpu::conv2d::SharedMut;
use crate::cpu::matmul::{matmul_strided, MatMut, MatPtr};
use crate::params::LinearParams;
use crate::Float;

/// `output = input @ weightᵀ + bias` through the gemm crate (f64, and f32
/// where the [`packed`] kernel cannot run).
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
    let out = SharedMut(dst.ptr);
    // Rows j0..j1 of outputᵀ from rows j0..j1 of the weight.
    let features = |(j0, j1): (usize, usize), parallelism| {
        let out = &out;
        // SAFETY: rows j0..j1 of the weight and of outputᵀ exist (the
        // lengths are checked above); the buffers are distinct, and each
        // call writes only its own features' outputs.
        unsafe {
            matmul_strided(
                j1 - j0,
                p.rows,
                p.in_features,
                MatMut {
                    ptr: out.0.add(j0),
                    ..dst
                },
                bias.is_some(),
                MatPtr {
                    ptr: weight.as_ptr().add(j0 * p.in_features),
                    ..lhs
                },
                rhs,
                parallelism,
            )
        }
    };
    let threads = rayon::current_num_threads();
    let macs = p
        .rows
        .saturating_mul(p.in_features)
        .saturating_mul(p.out_features);
    if p.rows > FEW_ROWS || threads == 1 || macs < SPLIT_MACS {
        features((0, p.out_features), ::gemm::Parallelism::Rayon(0));
    } else {
        // Few rows: the gemm crate runs such a product on one thread, so
        // blocks of output features go to the threads here.
        let per = p
            .out_features
            .div_ceil(threads * BLOCKS_PER_THREAD)
            .next_multiple_of(16);
        (0..p.out_features.div_ceil(per))
            .into_par_iter()
            .for_each(|blk| {
                let range = (blk * per, ((blk + 1) * per).min(p.out_features));
                features(range, ::gemm::Parallelism::None)
            });
    }
    Ok(())
}

/// Rows (a batch) up to which [`gemm`] shares a product among threads by
/// blocks of output features itself.
const FEW_ROWS: usize = 8;

/// Multiply-adds from which [`gemm`] shares a product of few rows: such a
/// product streams its weight once, so two threads read it about twice as
/// fast (mobilenet_v2's 1280 -> 1000 classifier at batch 1: 0.26 -> 0.17
/// ms on 2 threads, AVX2).
const SPLIT_MACS: usize = 1 << 18;

/// Blocks of output features per thread, so that uneven blocks balance.
const BLOCKS_PER_THREAD: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::test_util::{assert_close, cast, on_two_threads, Rng};

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

    /// Calls `check(p, x, w, bias, want, what)` for each case, with and
    /// without a bias, `want` computed by [`naive`] in f64.
    #[allow(clippy::type_complexity)]
    fn each_case(
        seed: u64,
        cases: &[(usize, usize, usize)],
        check: impl Fn(&LinearParams, &[f64], &[f64], Option<&[f64]>, &[f64], &str),
    ) {
        let mut rng = Rng::new(seed);
        for &(rows, in_features, out_features) in cases {
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
                check(
                    &p,
                    &x,
                    &w,
                    b,
                    &want,
                    &format!("linear {p:?} bias={}", b.is_some()),
                );
            }
        }
    }

    #[test]
    fn linear_matches_naive() {
        let cases = [
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
            // Few rows and enough products to share by blocks of features
            // (with a last, shorter block), and one row over FEW_ROWS.
            (1, 1300, 1000),
            (8, 300, 130),
            (9, 300, 130),
        ];
        // Two threads, as the shared path needs, whatever this machine has.
        on_two_threads(|| {
            each_case(1, &cases, |p, x, w, b, want, what| {
                let mut out = vec![f64::NAN; want.len()];
                gemm(p, x, w, b, &mut out).unwrap();
                assert_close(&out, want, 1e-12, what);
                let b32 = b.map(cast::<f32>);
                let mut out32 = vec![f32::NAN; want.len()];
                gemm(p, &cast(x), &cast(w), b32.as_deref(), &mut out32).unwrap();
                assert_close(&out32, want, 1e-5, what);
            })
        });
    }

    #[test]
    fn packed_matches_naive() {
        if !packed::available() {
            eprintln!("skipped: the portable ISA level has no register tile for the packed kernel");
            return;
        }
        // Row tails of every tile height, column tails inside and across the
        // two vectors of a panel, several reduction blocks.
        let cases = [
            (1, 1, 1),
            (4, 7, 3),
            (13, 16, 17),
            (25, 33, 32),
            (97, 70, 45),
            (200, 300, 65),
            (30, 600, 100),
            (11, 513, 64),
            (300, 96, 288),
            // Row blocks of unequal tile counts (ConvNeXt's 196 rows), more
            // row blocks than tasks wanted, few panels for many groups.
            (196, 50, 130),
            (1000, 20, 70),
            // More rows than one block of MB, fewer than the features: one
            // block of every row, over several reduction blocks.
            (150, 600, 200),
            (5, 10, 300),
            // One and two rows (the reduction split in interleaved parts,
            // with a remainder), full and partial panels, one long stream.
            (1, 1031, 40),
            (2, 1030, 24),
            (1, 3, 16),
            (2, 7, 9),
        ];
        on_two_threads(|| {
            each_case(2, &cases, |p, x, w, b, want, what| {
                let (out_f, in_f) = (p.out_features, p.in_features);
                let b32 = b.map(cast::<f32>);
                let packed = packed::PackedWeight::new(&cast(w), b32.as_deref(), out_f, in_f)
                    .unwrap()
                    .unwrap();
                let mut out = vec![f32::NAN; want.len()];
                packed::linear(p, &cast(x), &packed, &mut out, None);
                assert_close(&out, want, 1e-5, what);
            })
        });
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
