//! Adaptive average pooling.

use super::for_each_plane;
use crate::params::AdaptivePool2dParams;
use crate::Float;

/// Input range `[floor(o * len / out), ceil((o + 1) * len / out))` pooled into output `o`.
#[inline]
fn bounds(o: usize, len: usize, out: usize) -> (usize, usize) {
    (o * len / out, ((o + 1) * len).div_ceil(out))
}

/// 2-D adaptive average pooling as PyTorch's `adaptive_avg_pool2d`: output
/// `o` averages the input range `[floor(o * in / out), ceil((o + 1) * in / out))`
/// in each dimension (ranges may overlap).
pub fn adaptive_avgpool2d<T: Float>(p: &AdaptivePool2dParams, input: &[T], output: &mut [T]) {
    debug_assert_eq!(input.len(), p.input_len());
    debug_assert_eq!(output.len(), p.output_len());
    let (oh, ow) = (p.out_h, p.out_w);
    let rows: Vec<_> = (0..oh).map(|y| bounds(y, p.in_h, oh)).collect();
    let cols: Vec<_> = (0..ow).map(|x| bounds(x, p.in_w, ow)).collect();
    for_each_plane(input, p.in_h * p.in_w, output, oh * ow, |src, dst| {
        for (y, &(h0, h1)) in rows.iter().enumerate() {
            for (x, &(w0, w1)) in cols.iter().enumerate() {
                let mut sum = T::zero();
                for iy in h0..h1 {
                    for &v in &src[iy * p.in_w + w0..iy * p.in_w + w1] {
                        sum += v;
                    }
                }
                let count = (h1 - h0) * (w1 - w0);
                dst[y * ow + x] = sum / T::from_usize(count).unwrap_or_else(T::nan);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut out = [0.0; 3];
        adaptive_avgpool2d(&p, &x, &mut out);
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
        let mut out = vec![0.0f32; 6];
        adaptive_avgpool2d(&p, &x, &mut out);
        for (i, v) in out.iter().enumerate() {
            let plane = &x[i * 24..(i + 1) * 24];
            assert_eq!(*v, plane.iter().sum::<f32>() / 24.0);
        }
        p.out_h = 4;
        p.out_w = 6;
        let mut same = vec![0.0f32; x.len()];
        adaptive_avgpool2d(&p, &x, &mut same);
        assert_eq!(same, x);
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
        let mut out = [0.0; 9];
        adaptive_avgpool2d(&p, &x, &mut out);
        assert_eq!(out, [1.0, 1.5, 2.0, 2.0, 2.5, 3.0, 3.0, 3.5, 4.0]);
    }
}
