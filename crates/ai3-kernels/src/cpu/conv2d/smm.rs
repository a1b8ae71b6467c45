//! SMM-Conv: convolution as Scalar Matrix Multiplications with zero packing
//! (Ofir & Ben-Artzi, 2022).
//!
//! Each output plane is the sum, over (input channel, kernel row, kernel
//! column), of the input plane shifted by that tap (with stride and dilation)
//! and scaled by the tap's scalar weight. Nothing is packed or padded: for
//! every tap the output rows and columns whose input lands inside the image
//! are computed once, and the rest of the tap contributes nothing, which is
//! exactly zero padding.

use rayon::prelude::*;

use super::valid_range;
use crate::params::Conv2dParams;
use crate::Float;

/// SMM-Conv 2-D convolution (see the [module contract](super)).
///
/// Parallel over `(batch, out_channel)` output planes; the inner loop is an
/// axpy over a run of output columns, which the compiler vectorises when the
/// horizontal stride is 1.
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

    // The valid output ranges depend only on the tap, not on the channel or
    // the image, so they are computed once for the whole call.
    let rows: Vec<(usize, usize)> = (0..kh)
        .map(|ky| valid_range(oh, p.in_h, sh, ky * dh, p.padding.top))
        .collect();
    let cols: Vec<(usize, usize)> = (0..kw)
        .map(|kx| valid_range(ow, p.in_w, sw, kx * dw, p.padding.left))
        .collect();

    output
        .par_chunks_mut(plane_out)
        .enumerate()
        .for_each(|(idx, out)| {
            let n = idx / p.out_channels;
            let o = idx % p.out_channels;
            let g = o / ocg;
            out.fill(bias.map_or(T::zero(), |b| b[o]));
            let img = &input[(n * p.in_channels + g * icg) * plane_in..][..icg * plane_in];
            let w_o = &weight[o * icg * kh * kw..][..icg * kh * kw];
            for c in 0..icg {
                let plane = &img[c * plane_in..][..plane_in];
                for ky in 0..kh {
                    let (y0, y1) = rows[ky];
                    for kx in 0..kw {
                        let (x0, x1) = cols[kx];
                        if x0 == x1 {
                            continue;
                        }
                        let w = w_o[(c * kh + ky) * kw + kx];
                        let ix0 = x0 * sw + kx * dw - p.padding.left;
                        for y in y0..y1 {
                            let iy = y * sh + ky * dh - p.padding.top;
                            let src = &plane[iy * p.in_w + ix0..(iy + 1) * p.in_w];
                            let dst = &mut out[y * ow + x0..y * ow + x1];
                            axpy(w, src, sw, dst);
                        }
                    }
                }
            }
        });
}

/// `dst[i] += w * src[i * stride]`; the unit-stride case gets its own loop
/// so it vectorises.
#[inline]
fn axpy<T: Float>(w: T, src: &[T], stride: usize, dst: &mut [T]) {
    if stride == 1 {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d += w * s;
        }
    } else {
        for (d, &s) in dst.iter_mut().zip(src.iter().step_by(stride)) {
            *d += w * s;
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::cpu::test_util::check_conv_algorithm;

    #[test]
    fn smm_matches_reference() {
        check_conv_algorithm("smm", super::conv2d::<f32>, super::conv2d::<f64>);
    }

    #[test]
    fn smm_matches_reference_on_two_threads() {
        crate::cpu::test_util::on_two_threads(|| {
            check_conv_algorithm("smm", super::conv2d::<f32>, super::conv2d::<f64>)
        });
    }
}
