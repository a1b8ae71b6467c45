//! Max pooling.

use super::separable::{pool, Reduce};
use crate::alloc::KernelResult;
use crate::params::Pool2dParams;
use crate::Float;

/// 2-D max pooling as PyTorch's `max_pool2d`: padding counts as `-inf`,
/// dilation spreads the window, `ceil_mode` windows are clipped to the input,
/// and a NaN anywhere in a window makes that output NaN.
///
/// Separable (see `pool`): a window's rows are folded into one, whose
/// windows along the width give the output row.
///
/// A buffer of the wrong length is an error before anything is written; a
/// refused scratch allocation fails the call.
pub fn maxpool2d<T: Float>(p: &Pool2dParams, input: &[T], output: &mut [T]) -> KernelResult<()> {
    p.check_buffers(input.len(), output.len())?;
    pool(p, Reduce::Max, input, output, |_, _| {})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::test_util::Rng;

    fn params(
        h: usize,
        w: usize,
        k: usize,
        s: usize,
        pad: usize,
        d: usize,
        ceil: bool,
    ) -> Pool2dParams {
        Pool2dParams {
            batch: 1,
            channels: 1,
            in_h: h,
            in_w: w,
            kernel: (k, k),
            stride: (s, s),
            padding: (pad, pad),
            dilation: (d, d),
            ceil_mode: ceil,
        }
    }

    /// Straight from the definition: the maximum over the window's in-bounds
    /// positions, NaN if any of them is NaN.
    fn naive(p: &Pool2dParams, x: &[f64]) -> Vec<f64> {
        let (oh, ow) = (p.out_h(), p.out_w());
        let mut out = Vec::new();
        for plane in x.chunks(p.in_h * p.in_w) {
            for y in 0..oh {
                for xo in 0..ow {
                    let mut vals = Vec::new();
                    for ky in 0..p.kernel.0 {
                        for kx in 0..p.kernel.1 {
                            let iy = (y * p.stride.0 + ky * p.dilation.0) as isize
                                - p.padding.0 as isize;
                            let ix = (xo * p.stride.1 + kx * p.dilation.1) as isize
                                - p.padding.1 as isize;
                            if iy >= 0
                                && ix >= 0
                                && (iy as usize) < p.in_h
                                && (ix as usize) < p.in_w
                            {
                                vals.push(plane[iy as usize * p.in_w + ix as usize]);
                            }
                        }
                    }
                    let nan = vals.iter().any(|v| v.is_nan());
                    let max = vals.into_iter().fold(f64::NEG_INFINITY, f64::max);
                    out.push(if nan { f64::NAN } else { max });
                }
            }
        }
        out
    }

    #[test]
    fn hand_computed() {
        // 4x5 ramp, kernel 2, stride 2, ceil mode: the last column's windows
        // are clipped to one column.
        let x: Vec<f32> = (0..20).map(|i| i as f32).collect();
        let p = params(4, 5, 2, 2, 0, 1, true);
        assert_eq!((p.out_h(), p.out_w()), (2, 3));
        let mut out = [f32::NAN; 6];
        maxpool2d(&p, &x, &mut out).unwrap();
        assert_eq!(out, [6., 8., 9., 16., 18., 19.]);

        // Padding 1 with kernel 3 stride 2 on [[-1 -2] [-3 -4]]: padding must
        // not win as 0.
        let x = [-1.0f64, -2.0, -3.0, -4.0];
        let p = params(2, 2, 3, 2, 1, 1, false);
        let mut out = [f64::NAN; 1];
        maxpool2d(&p, &x, &mut out).unwrap();
        assert_eq!(out, [-1.0]);

        // Dilation 2 on a 3x3 ramp picks the corners.
        let x: Vec<f64> = (0..9).map(|i| -(i as f64)).collect();
        let p = params(3, 3, 2, 1, 0, 2, false);
        let mut out = [f64::NAN; 1];
        maxpool2d(&p, &x, &mut out).unwrap();
        assert_eq!(out, [0.0]);
    }

    #[test]
    fn nan_propagates() {
        let x = [1.0f32, f32::NAN, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let p = params(2, 4, 2, 2, 0, 1, false);
        let mut out = [0.0f32; 2];
        maxpool2d(&p, &x, &mut out).unwrap();
        assert!(out[0].is_nan());
        assert_eq!(out[1], 8.0);
    }

    #[test]
    fn matches_naive() {
        let mut rng = Rng::new(9);
        for &(h, w) in &[(7, 9), (8, 5), (11, 11)] {
            for k in 1..4 {
                for s in 1..4 {
                    for pad in 0..=k / 2 {
                        for d in 1..3 {
                            for ceil in [false, true] {
                                let mut p = params(h, w, k, s, pad, d, ceil);
                                p.batch = 2;
                                p.channels = 3;
                                p.kernel = (k, k.max(2) - 1);
                                p.padding = (pad, pad.min(p.kernel.1 / 2));
                                p.stride = (s, 1 + s % 2);
                                let x = rng.vec(p.input_len());
                                let mut out = vec![f64::NAN; p.output_len()];
                                maxpool2d(&p, &x, &mut out).unwrap();
                                assert_eq!(out, naive(&p, &x), "{p:?}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// Stride-1 windows centred by their padding keep the plane's size, and
    /// the kernel folds a whole plane as one run: the borders, and NaNs
    /// next to them, must still come out right.
    #[test]
    fn same_size_planes_match_naive() {
        let mut rng = Rng::new(13);
        for &(h, w) in &[(5, 7), (14, 14), (3, 3), (1, 4), (6, 1)] {
            for k in [3, 5] {
                for d in [1, 2] {
                    let mut p = params(h, w, k, 1, (k - 1) / 2 * d, d, false);
                    p.batch = 2;
                    p.channels = 3;
                    assert_eq!((p.out_h(), p.out_w()), (h, w));
                    let mut x = rng.vec(p.input_len());
                    for i in (0..x.len()).step_by(11) {
                        x[i] = f64::NAN;
                    }
                    let mut out = vec![0.0; p.output_len()];
                    maxpool2d(&p, &x, &mut out).unwrap();
                    let want = naive(&p, &x);
                    let same = |a: f64, b: f64| a == b || (a.is_nan() && b.is_nan());
                    assert!(out.iter().zip(&want).all(|(&a, &b)| same(a, b)), "{p:?}");
                }
            }
        }
    }
}
