//! Direct convolution: the plain loop nest, one output plane per rayon task.
//!
//! It is the slowest algorithm but the easiest to trust, so it doubles as the
//! baseline the others are compared with.

use rayon::prelude::*;

use crate::params::Conv2dParams;
use crate::Float;

/// Direct 2-D convolution (see the [module contract](super)).
///
/// Parallel over `(batch, out_channel)` output planes. Supports stride,
/// dilation, asymmetric zero padding and groups (including depthwise).
pub fn conv2d<T: Float>(
    p: &Conv2dParams,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
) {
    debug_assert_eq!(input.len(), p.input_len());
    debug_assert_eq!(weight.len(), p.weight_len());
    debug_assert_eq!(output.len(), p.output_len());
    debug_assert!(bias.is_none_or(|b| b.len() == p.out_channels));

    let (oh, ow) = (p.out_h(), p.out_w());
    let plane_out = oh * ow;
    if plane_out == 0 {
        return;
    }
    let plane_in = p.in_h * p.in_w;
    let icg = p.in_channels_per_group();
    let ocg = p.out_channels_per_group();
    let (kh, kw) = (p.kernel_h, p.kernel_w);
    let (sh, sw) = p.stride;
    let (dh, dw) = p.dilation;
    let (pt, pl) = (p.padding.top, p.padding.left);

    output
        .par_chunks_mut(plane_out)
        .enumerate()
        .for_each(|(idx, out)| {
            let n = idx / p.out_channels;
            let o = idx % p.out_channels;
            let g = o / ocg;
            let b = bias.map_or(T::zero(), |b| b[o]);
            let img = &input[(n * p.in_channels + g * icg) * plane_in..][..icg * plane_in];
            let w_o = &weight[o * icg * kh * kw..][..icg * kh * kw];
            for y in 0..oh {
                // Skipping taps that fall outside the image is what implements
                // the zero padding, without a padded copy.
                for x in 0..ow {
                    let mut acc = b;
                    for c in 0..icg {
                        let plane = &img[c * plane_in..][..plane_in];
                        let w_c = &w_o[c * kh * kw..][..kh * kw];
                        for ky in 0..kh {
                            let iy = (y * sh + ky * dh) as isize - pt as isize;
                            if iy < 0 || iy >= p.in_h as isize {
                                continue;
                            }
                            let row = &plane[iy as usize * p.in_w..][..p.in_w];
                            for kx in 0..kw {
                                let ix = (x * sw + kx * dw) as isize - pl as isize;
                                if ix < 0 || ix >= p.in_w as isize {
                                    continue;
                                }
                                acc += row[ix as usize] * w_c[ky * kw + kx];
                            }
                        }
                    }
                    out[y * ow + x] = acc;
                }
            }
        });
}

#[cfg(test)]
mod tests {
    use crate::cpu::test_util::check_conv_algorithm;

    #[test]
    fn direct_matches_reference() {
        check_conv_algorithm("direct", super::conv2d::<f32>, super::conv2d::<f64>);
    }

    #[test]
    fn direct_matches_reference_on_two_threads() {
        crate::cpu::test_util::on_two_threads(|| {
            check_conv_algorithm("direct", super::conv2d::<f32>, super::conv2d::<f64>)
        });
    }
}
