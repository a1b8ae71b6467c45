//! im2col + GEMM convolution.
//!
//! For each `(image, group)` the input patches are unrolled into a
//! `[icg * kh * kw, columns]` matrix and multiplied by the group's weight
//! `[ocg, icg * kh * kw]`, which is already in the right layout. The output
//! columns are processed in blocks so the unrolled matrix stays within
//! [`WORKSPACE_ELEMENTS`](super::WORKSPACE_ELEMENTS) however large the image.

use rayon::prelude::*;

use super::{for_each_image_group, valid_range, with_scratch, TaskBudget};
use crate::cpu::matmul::{matmul, MatPtr};
use crate::params::Conv2dParams;
use crate::Float;

/// Elements of the unrolled column block one GEMM call consumes (about 1 MiB
/// of f32).
const COL_BLOCK_ELEMENTS: usize = 1 << 18;

/// Fewest columns per block, so deep layers (large `icg * kh * kw`) still give
/// the GEMM a useful width.
const MIN_COL_BLOCK: usize = 256;

/// Most columns per block, so shallow layers (tiny `icg * kh * kw`, like an
/// RGB input layer) keep the output block the GEMM updates in cache.
const MAX_COL_BLOCK: usize = 2048;

/// im2col + GEMM 2-D convolution (see the [module contract](super)).
///
/// A 1x1 kernel with stride 1 and no padding skips im2col: the input plane
/// already is the column matrix.
pub fn conv2d<T: Float>(
    p: &Conv2dParams,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
) {
    p.debug_check_buffers(input.len(), bias.map(<[T]>::len), output.len());
    debug_assert_eq!(weight.len(), p.weight_len());

    let icg = p.in_channels_per_group();
    let ocg = p.out_channels_per_group();
    let k = icg * p.kernel_h * p.kernel_w;
    let plane_in = p.in_h * p.in_w;
    let ohw = p.out_h() * p.out_w();
    let pointwise =
        p.kernel_h == 1 && p.kernel_w == 1 && p.stride == (1, 1) && p.padding == Default::default();

    for_each_image_group(p, output, |n, g, out, budget| {
        let img = &input[(n * p.in_channels + g * icg) * plane_in..][..icg * plane_in];
        let w_g = &weight[g * ocg * k..][..ocg * k];
        let bias_g = bias.map(|b| &b[g * ocg..(g + 1) * ocg]);
        // Starting from the bias and accumulating saves a pass over the
        // output; done per column block, just before its GEMM, so that block
        // of the output is still in cache when the GEMM reads it.
        let fill_bias = |out: &mut [T], c0: usize, width: usize| {
            if let Some(b) = bias_g {
                for (row, &bv) in out.chunks_mut(ohw).zip(b) {
                    row[c0..c0 + width].fill(bv);
                }
            }
        };
        let lhs = MatPtr {
            ptr: w_g.as_ptr(),
            rs: k,
            cs: 1,
        };
        if pointwise {
            fill_bias(out, 0, ohw);
            let rhs = MatPtr {
                ptr: img.as_ptr(),
                rs: plane_in,
                cs: 1,
            };
            // SAFETY: out is [ocg, ohw], w_g is [ocg, k], img is [k, ohw]
            // (ohw == plane_in for a pointwise kernel); all distinct buffers.
            unsafe {
                matmul(
                    ocg,
                    ohw,
                    k,
                    out.as_mut_ptr(),
                    ohw,
                    bias.is_some(),
                    lhs,
                    rhs,
                    budget.gemm_parallelism(),
                )
            };
            return;
        }
        // Column blocks small enough that the unrolled block is still in
        // cache when the GEMM packs it, but wide enough for the GEMM to run
        // at full speed.
        let block = (COL_BLOCK_ELEMENTS / k)
            .clamp(MIN_COL_BLOCK, MAX_COL_BLOCK)
            .min(budget.workspace / k)
            .clamp(1, ohw);
        // Equal blocks: no narrow (slow) GEMM for a remainder.
        let block = ohw.div_ceil(ohw.div_ceil(block));
        with_scratch::<T, _>(k * block, |col| {
            let mut c0 = 0;
            while c0 < ohw {
                let width = block.min(ohw - c0);
                let col = &mut col[..k * width];
                im2col(p, img, c0, width, col, budget);
                fill_bias(out, c0, width);
                let rhs = MatPtr {
                    ptr: col.as_ptr(),
                    rs: width,
                    cs: 1,
                };
                // SAFETY: the destination is columns [c0, c0 + width) of the
                // [ocg, ohw] block `out`; col is [k, width]; w_g is [ocg, k].
                unsafe {
                    matmul(
                        ocg,
                        width,
                        k,
                        out.as_mut_ptr().add(c0),
                        ohw,
                        bias.is_some(),
                        lhs,
                        rhs,
                        budget.gemm_parallelism(),
                    )
                };
                c0 += width;
            }
        });
    });
}

/// Fills `col` (`[icg * kh * kw, width]`) with the input values seen by
/// output positions `c0 .. c0 + width` (flattened `y * out_w + x`), zero
/// where a tap falls in the padding.
fn im2col<T: Float>(
    p: &Conv2dParams,
    img: &[T],
    c0: usize,
    width: usize,
    col: &mut [T],
    budget: TaskBudget,
) {
    let (oh, ow) = (p.out_h(), p.out_w());
    let (kh, kw) = (p.kernel_h, p.kernel_w);
    let plane_in = p.in_h * p.in_w;
    let fill_row = |r: usize, dst: &mut [T]| {
        let c = r / (kh * kw);
        let ky = (r / kw) % kh;
        let kx = r % kw;
        let plane = &img[c * plane_in..][..plane_in];
        let (y0, y1) = valid_range(oh, p.in_h, p.stride.0, ky * p.dilation.0, p.padding.top);
        let (x0, x1) = valid_range(ow, p.in_w, p.stride.1, kx * p.dilation.1, p.padding.left);
        let mut pos = c0;
        let end = c0 + width;
        // Walk the block one output row segment at a time so each segment is
        // a strided copy with zero runs at its ends.
        while pos < end {
            let y = pos / ow;
            let xs = pos % ow;
            let xe = ow.min(xs + (end - pos));
            let seg = &mut dst[pos - c0..pos - c0 + (xe - xs)];
            if y < y0 || y >= y1 {
                seg.fill(T::zero());
            } else {
                let iy = y * p.stride.0 + ky * p.dilation.0 - p.padding.top;
                let row = &plane[iy * p.in_w..][..p.in_w];
                let a = x0.clamp(xs, xe);
                let b = x1.clamp(a, xe);
                seg[..a - xs].fill(T::zero());
                if a < b {
                    let ix0 = a * p.stride.1 + kx * p.dilation.1 - p.padding.left;
                    let dst = &mut seg[a - xs..b - xs];
                    if p.stride.1 == 1 {
                        dst.copy_from_slice(&row[ix0..ix0 + (b - a)]);
                    } else {
                        let src = row[ix0..].iter().step_by(p.stride.1);
                        for (d, &s) in dst.iter_mut().zip(src) {
                            *d = s;
                        }
                    }
                }
                seg[b - xs..].fill(T::zero());
            }
            pos += xe - xs;
        }
    };
    if budget.parallel_inside {
        col.par_chunks_mut(width)
            .enumerate()
            .for_each(|(r, dst)| fill_row(r, dst));
    } else {
        col.chunks_mut(width)
            .enumerate()
            .for_each(|(r, dst)| fill_row(r, dst));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::test_util::{assert_close, cast, check_conv_algorithm, reference_conv, Rng};
    use crate::params::Padding2d;

    #[test]
    fn gemm_matches_reference() {
        check_conv_algorithm("gemm", super::conv2d::<f32>, super::conv2d::<f64>);
    }

    #[test]
    fn gemm_matches_reference_on_two_threads() {
        crate::cpu::test_util::on_two_threads(|| {
            check_conv_algorithm("gemm", super::conv2d::<f32>, super::conv2d::<f64>)
        });
    }

    #[test]
    fn gemm_blocks_large_images() {
        // 64 * 9 * 130 * 130 > WORKSPACE_ELEMENTS / threads on any machine
        // with several cores, so several column blocks are exercised.
        let p = Conv2dParams {
            batch: 1,
            in_channels: 64,
            in_h: 130,
            in_w: 130,
            out_channels: 3,
            kernel_h: 3,
            kernel_w: 3,
            stride: (1, 1),
            padding: Padding2d::symmetric(1, 1),
            dilation: (1, 1),
            groups: 1,
        };
        let mut rng = Rng::new(3);
        let input = rng.vec(p.input_len());
        let weight = rng.vec(p.weight_len());
        let want = reference_conv(&p, &input, &weight, None);
        let mut out = vec![f32::NAN; p.output_len()];
        conv2d(&p, &cast(&input), &cast(&weight), None, &mut out);
        assert_close(&out, &want, 1e-4, "gemm blocked");
    }
}
