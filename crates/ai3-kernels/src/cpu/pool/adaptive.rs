//! Adaptive average and max pooling.

use super::{for_each_plane, try_table};
use crate::alloc::KernelResult;
use crate::float::lane_sum;
use crate::isa::multiversion;
use crate::params::AdaptivePool2dParams;
use crate::Float;

/// Input range `[floor(o * len / out), ceil((o + 1) * len / out))` pooled
/// into output `o`, computed in 128 bits so large sizes cannot overflow.
#[inline]
fn bounds(o: usize, len: usize, out: usize) -> (usize, usize) {
    let (o, len, out) = (o as u128, len as u128, out as u128);
    (
        (o * len / out) as usize,
        ((o + 1) * len).div_ceil(out) as usize,
    )
}

/// Writes `reduce(window)` for every adaptive window of every plane; a window
/// is given as the input plane, its row range and its column range.
fn for_each_window<T: Float, F>(
    p: &AdaptivePool2dParams,
    input: &[T],
    output: &mut [T],
    reduce: F,
) -> KernelResult<()>
where
    F: Fn(&[T], (usize, usize), (usize, usize)) -> T + Sync,
{
    p.check_buffers(input.len(), output.len())?;
    let (oh, ow) = (p.out_h, p.out_w);
    if (oh, ow) == (p.in_h, p.in_w) {
        // Every window is one value, which both the mean and the maximum
        // return unchanged: a copy (AlexNet's 6x6 pool of its 6x6 maps read
        // 0.14 ms at batch 1 a window at a time, ONNX Runtime's 0.03).
        output.copy_from_slice(input);
        return Ok(());
    }
    let rows = try_table(oh, |y| bounds(y, p.in_h, oh))?;
    let cols = try_table(ow, |x| bounds(x, p.in_w, ow))?;
    for_each_plane(input, p.in_h * p.in_w, output, oh * ow, |src, dst| {
        for (y, &r) in rows.iter().enumerate() {
            for (x, &c) in cols.iter().enumerate() {
                dst[y * ow + x] = reduce(src, r, c);
            }
        }
        Ok(())
    })
}

/// 2-D adaptive average pooling as PyTorch's `adaptive_avg_pool2d`: output
/// `o` averages the input range `[floor(o * in / out), ceil((o + 1) * in / out))`
/// in each dimension (ranges may overlap). A buffer of the wrong length is an
/// error before anything is written.
pub fn adaptive_avgpool2d<T: Float>(
    p: &AdaptivePool2dParams,
    input: &[T],
    output: &mut [T],
) -> KernelResult<()> {
    let w = p.in_w;
    for_each_window(p, input, output, |src, (h0, h1), (w0, w1)| {
        let mut mean = T::zero();
        let rows = &src[h0 * w..h1 * w];
        // SAFETY: plain Rust on slices, compiled for the ISA level in use.
        unsafe { window_mean(rows, w, (w0, w1), &mut mean) };
        mean
    })
}

multiversion! {
    /// `*mean` = the mean of columns `w0..w1` of the rows of width `w` in
    /// `rows`, summed in f64 over lanes (a global pool sums whole planes).
    unsafe fn window_mean<T>(rows: &[T], w: usize, cols: (usize, usize), mean: &mut T) => window_mean_impl
}

#[inline(always)]
unsafe fn window_mean_impl<T: Float>(rows: &[T], w: usize, (w0, w1): (usize, usize), mean: &mut T) {
    let f = |v: T| v.to_f64().unwrap_or(f64::NAN);
    let sum = if w0 == 0 && w1 == w {
        // Whole rows: one contiguous run.
        lane_sum(rows, f)
    } else {
        rows.chunks_exact(w).map(|r| lane_sum(&r[w0..w1], f)).sum()
    };
    let count = (rows.len() / w.max(1)) * (w1 - w0);
    *mean = T::from_f64(sum / count as f64).unwrap_or_else(T::nan);
}

/// 2-D adaptive max pooling as PyTorch's `adaptive_max_pool2d`, with the
/// windows of [`adaptive_avgpool2d`]; a NaN in a window makes its output NaN.
pub fn adaptive_maxpool2d<T: Float>(
    p: &AdaptivePool2dParams,
    input: &[T],
    output: &mut [T],
) -> KernelResult<()> {
    let w = p.in_w;
    for_each_window(p, input, output, |src, (h0, h1), (w0, w1)| {
        let mut acc = T::neg_infinity();
        for iy in h0..h1 {
            for &v in &src[iy * w + w0..iy * w + w1] {
                // Once acc is NaN nothing replaces it but another NaN.
                if v > acc || v.is_nan() {
                    acc = v;
                }
            }
        }
        acc
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::test_util::Rng;

    /// The maximum of each window straight from the window rule.
    fn naive_max(p: &AdaptivePool2dParams, x: &[f64]) -> Vec<f64> {
        let mut out = Vec::new();
        for plane in x.chunks(p.in_h * p.in_w) {
            for y in 0..p.out_h {
                for xo in 0..p.out_w {
                    let (h0, h1) = (y * p.in_h / p.out_h, ((y + 1) * p.in_h).div_ceil(p.out_h));
                    let (w0, w1) = (xo * p.in_w / p.out_w, ((xo + 1) * p.in_w).div_ceil(p.out_w));
                    let mut m = f64::NEG_INFINITY;
                    for iy in h0..h1 {
                        for ix in w0..w1 {
                            m = m.max(plane[iy * p.in_w + ix]);
                        }
                    }
                    out.push(m);
                }
            }
        }
        out
    }

    #[test]
    fn adaptive_max_matches_naive_and_propagates_nan() {
        let mut rng = Rng::new(31);
        for (ih, iw, oh, ow) in [(5, 7, 3, 2), (4, 4, 1, 1), (3, 2, 5, 7), (9, 10, 4, 4)] {
            let p = AdaptivePool2dParams {
                batch: 2,
                channels: 3,
                in_h: ih,
                in_w: iw,
                out_h: oh,
                out_w: ow,
            };
            let x = rng.vec(p.input_len());
            let mut out = vec![f64::NAN; p.output_len()];
            adaptive_maxpool2d(&p, &x, &mut out).unwrap();
            assert_eq!(out, naive_max(&p, &x), "{p:?}");
            let mut out32 = vec![f32::NAN; p.output_len()];
            let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
            adaptive_maxpool2d(&p, &x32, &mut out32).unwrap();
            let want: Vec<f32> = naive_max(&p, &x).iter().map(|&v| v as f32).collect();
            assert_eq!(out32, want);
        }
        let p = AdaptivePool2dParams {
            batch: 1,
            channels: 1,
            in_h: 1,
            in_w: 4,
            out_h: 1,
            out_w: 2,
        };
        let mut out = [0.0f32; 2];
        adaptive_maxpool2d(&p, &[1.0, f32::NAN, 3.0, 4.0], &mut out).unwrap();
        assert!(out[0].is_nan());
        assert_eq!(out[1], 4.0);
    }

    #[test]
    fn hand_computed() {
        // 1x5 -> 1x3: ranges [0,2), [1,4), [3,5).
        let x = [1.0f64, 2.0, 3.0, 4.0, 5.0];
        let p = AdaptivePool2dParams {
            batch: 1,
            channels: 1,
            in_h: 1,
            in_w: 5,
            out_h: 1,
            out_w: 3,
        };
        let mut out = [f64::NAN; 3];
        adaptive_avgpool2d(&p, &x, &mut out).unwrap();
        assert_eq!(out, [1.5, 3.0, 4.5]);
    }

    #[test]
    fn global_and_identity() {
        let x: Vec<f32> = (0..2 * 3 * 4 * 6).map(|i| i as f32).collect();
        let mut p = AdaptivePool2dParams {
            batch: 2,
            channels: 3,
            in_h: 4,
            in_w: 6,
            out_h: 1,
            out_w: 1,
        };
        let mut out = vec![f32::NAN; 6];
        adaptive_avgpool2d(&p, &x, &mut out).unwrap();
        for (i, v) in out.iter().enumerate() {
            let plane = &x[i * 24..(i + 1) * 24];
            assert_eq!(*v, plane.iter().sum::<f32>() / 24.0);
        }
        p.out_h = 4;
        p.out_w = 6;
        let mut same = vec![f32::NAN; x.len()];
        adaptive_avgpool2d(&p, &x, &mut same).unwrap();
        assert_eq!(same, x);
        // The same size is a copy for the maximum too, NaN and -0.0 kept.
        let mut y = x.clone();
        (y[5], y[7]) = (f32::NAN, -0.0);
        let mut same = vec![1.0f32; y.len()];
        adaptive_maxpool2d(&p, &y, &mut same).unwrap();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&same), bits(&y));
        // A buffer of the wrong length is still an error.
        assert!(adaptive_maxpool2d(&p, &y[1..], &mut same).is_err());
    }

    #[test]
    fn upsampling_repeats() {
        // 2x2 -> 3x3: row/col ranges [0,1), [0,2), [1,2).
        let x = [1.0f64, 2.0, 3.0, 4.0];
        let p = AdaptivePool2dParams {
            batch: 1,
            channels: 1,
            in_h: 2,
            in_w: 2,
            out_h: 3,
            out_w: 3,
        };
        let mut out = [f64::NAN; 9];
        adaptive_avgpool2d(&p, &x, &mut out).unwrap();
        assert_eq!(out, [1.0, 1.5, 2.0, 2.0, 2.5, 3.0, 3.0, 3.5, 4.0]);
    }
}
