//! Fully connected layer as one GEMM.

use crate::cpu::matmul::{matmul, MatPtr};
use crate::params::LinearParams;
use crate::Float;

/// `output = input @ weightᵀ + bias` through the gemm crate.
///
/// `input` is `[rows, in_features]`, `weight` `[out_features, in_features]`
/// (PyTorch's layout), `output` `[rows, out_features]`. The weight is read
/// transposed through strides, never copied.
pub fn gemm<T: Float>(
    p: &LinearParams,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
) {
    debug_assert_eq!(input.len(), p.rows * p.in_features);
    debug_assert_eq!(weight.len(), p.out_features * p.in_features);
    debug_assert_eq!(output.len(), p.rows * p.out_features);
    debug_assert!(bias.is_none_or(|b| b.len() == p.out_features));
    if p.rows == 0 || p.out_features == 0 {
        return;
    }
    // Starting from the bias and accumulating saves a second pass over the output.
    if let Some(b) = bias {
        for row in output.chunks_mut(p.out_features) {
            row.copy_from_slice(b);
        }
    }
    let lhs = MatPtr {
        ptr: input.as_ptr(),
        rs: p.in_features,
        cs: 1,
    };
    // Element (k, j) of weightᵀ is weight[j * in_features + k].
    let rhs = MatPtr {
        ptr: weight.as_ptr(),
        rs: 1,
        cs: p.in_features,
    };
    // SAFETY: the three buffers have the lengths asserted above and are distinct.
    unsafe {
        matmul(
            p.rows,
            p.out_features,
            p.in_features,
            output.as_mut_ptr(),
            p.out_features,
            bias.is_some(),
            lhs,
            rhs,
            ::gemm::Parallelism::Rayon(0),
        )
    };
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
                gemm(&p, &x, &w, b, &mut out);
                assert_close(&out, &want, 1e-12, &what);
                let b32 = b.map(cast::<f32>);
                let mut out32 = vec![f32::NAN; want.len()];
                gemm(&p, &cast(&x), &cast(&w), b32.as_deref(), &mut out32);
                assert_close(&out32, &want, 1e-5, &what);
            }
        }
    }
}
