//! im2col + GEMM convolution.
//!
//! For each `(image, group)` the input patches are unrolled into a
//! `[icg * kh * kw, columns]` matrix and multiplied by the group's weight
//! `[ocg, icg * kh * kw]`, which is already in the right layout. The output
//! columns are processed in blocks so the unrolled matrix stays within
//! `WORKSPACE_ELEMENTS` however large the image.

use rayon::prelude::*;

use gemm::Parallelism;

use super::{for_each_image_group, valid_range, with_scratch, SharedMut};
use crate::alloc::{check_len, KernelResult};
use crate::cpu::linear::packed::PackedWeight;
use crate::cpu::matmul::{matmul, MatPtr};
use crate::params::{Conv2dParams, LinearParams};
use crate::Float;

/// Elements of the unrolled column block one GEMM call consumes (about 1 MiB
/// of f32).
const COL_BLOCK_ELEMENTS: usize = 1 << 18;

/// Fewest columns per block, so deep layers (large `icg * kh * kw`) still give
/// the GEMM a useful width.
const MIN_COL_BLOCK: usize = 256;

/// Output channels per thread are a multiple of this when the threads share
/// a block's channels, so each keeps whole microkernel row panels.
const ROW_ALIGN: usize = 16;

/// Most columns per block, so shallow layers (tiny `icg * kh * kw`, like an
/// RGB input layer) keep the output block the GEMM updates in cache.
const MAX_COL_BLOCK: usize = 2048;

/// im2col + GEMM 2-D convolution (see the [module contract](super)).
///
/// A 1x1 kernel with stride 1 and no padding skips im2col: the input plane
/// already is the column matrix.
///
/// Fails, before writing anything, when a buffer has the wrong length; the
/// column blocks are bounded in size, and one refused allocation of them
/// fails the call (some of the output may then have been written).
pub fn conv2d<T: Float>(
    p: &Conv2dParams,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
) -> KernelResult<()> {
    p.check_buffers(input.len(), bias.map(<[T]>::len), output.len())?;
    check_len("conv2d weight", weight.len(), p.weight_len())?;

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
        let threads = budget.threads;
        let out = SharedMut(out.as_mut_ptr());
        // Output rows `rows` (channels of the group), columns [c0, c0 + width),
        // from the column matrix `rhs` ([k, width]).
        let multiply = |rows: std::ops::Range<usize>, c0: usize, width: usize, rhs: MatPtr<T>| {
            let out = &out;
            // Starting from the bias and accumulating saves a pass over the
            // output; done per block, just before its GEMM, so that block of
            // the output is still in cache when the GEMM reads it.
            if let Some(bv) = bias_g {
                for o in rows.clone() {
                    // SAFETY: this (rows, columns) block of the task's
                    // [ocg, ohw] output is written by this call only.
                    unsafe { std::slice::from_raw_parts_mut(out.0.add(o * ohw + c0), width) }
                        .fill(bv[o]);
                }
            }
            let lhs = MatPtr {
                ptr: w_g[rows.start * k..].as_ptr(),
                rs: k,
                cs: 1,
            };
            // SAFETY: the destination is the (rows, columns) block of the
            // [ocg, ohw] output, written by this call only; rhs is [k, width];
            // the weight rows are [rows.len(), k]; all distinct buffers.
            unsafe {
                matmul(
                    rows.len(),
                    width,
                    k,
                    out.0.add(rows.start * ohw + c0),
                    ohw,
                    bias.is_some(),
                    lhs,
                    rhs,
                    Parallelism::None,
                )
            }
        };
        // A pointwise kernel's input plane already is the column matrix.
        let plane = |c0: usize| MatPtr {
            ptr: img[c0..].as_ptr(),
            rs: plane_in,
            cs: 1,
        };
        let unrolled = |col: &[T], width: usize| MatPtr {
            ptr: col.as_ptr(),
            rs: width,
            cs: 1,
        };

        if threads > 1 && ohw < threads * MIN_COL_BLOCK {
            // Few output columns (small late-stage images): the threads share
            // the output channels, so each reads only its part of the weights,
            // which is most of what such a layer reads.
            let block = (budget.workspace / k).clamp(1, ohw);
            let block = ohw.div_ceil(ohw.div_ceil(block));
            let chunk = ocg.div_ceil(threads).next_multiple_of(ROW_ALIGN).min(ocg);
            let row_chunks = |c0: usize, width: usize, rhs: MatPtr<T>| {
                (0..ocg.div_ceil(chunk))
                    .into_par_iter()
                    .for_each(|i| multiply(i * chunk..((i + 1) * chunk).min(ocg), c0, width, rhs))
            };
            for c0 in (0..ohw).step_by(block) {
                let width = block.min(ohw - c0);
                if pointwise {
                    row_chunks(c0, width, plane(c0));
                } else {
                    with_scratch::<T, _>(k * width, |col| {
                        im2col(p, img, c0, width, col, true);
                        row_chunks(c0, width, unrolled(col, width));
                    })?;
                }
            }
            return Ok(());
        }

        // Column blocks small enough that the unrolled block (and the output
        // block the GEMM updates) is still in cache when the GEMM packs it,
        // but wide enough for the GEMM to run at full speed. When this task
        // has the whole machine, the blocks are shared among the threads,
        // each unrolling and multiplying its own blocks: no barrier between
        // im2col and GEMM, and no GEMM too small to split.
        let block = (COL_BLOCK_ELEMENTS / k)
            .clamp(MIN_COL_BLOCK, MAX_COL_BLOCK)
            .min(budget.workspace / (k * threads))
            .clamp(1, ohw);
        // Equal blocks, a multiple of the thread count of them: no narrow
        // (slow) GEMM for a remainder and no idle thread at the end.
        let blocks = ohw.div_ceil(block).div_ceil(threads) * threads;
        let block = ohw.div_ceil(blocks.min(ohw));
        let blocks = ohw.div_ceil(block);
        let run_block = |b: usize| -> KernelResult<()> {
            let c0 = b * block;
            let width = block.min(ohw - c0);
            if pointwise {
                multiply(0..ocg, c0, width, plane(c0));
                Ok(())
            } else {
                with_scratch::<T, _>(k * width, |col| {
                    im2col(p, img, c0, width, col, false);
                    multiply(0..ocg, c0, width, unrolled(col, width));
                })
            }
        };
        if threads > 1 {
            (0..blocks).into_par_iter().try_for_each(run_block)
        } else {
            (0..blocks).try_for_each(run_block)
        }
    })
}

/// Fills `col` (`[icg * kh * kw, width]`) with the input values seen by
/// output positions `c0 .. c0 + width` (flattened `y * out_w + x`), zero
/// where a tap falls in the padding; rows are filled in parallel when `parallel`.
fn im2col<T: Float>(
    p: &Conv2dParams,
    img: &[T],
    c0: usize,
    width: usize,
    col: &mut [T],
    parallel: bool,
) {
    if parallel {
        col.par_chunks_mut(width)
            .enumerate()
            .for_each(|(r, dst)| im2col_row(p, img, r, c0, dst));
    } else {
        col.chunks_mut(width)
            .enumerate()
            .for_each(|(r, dst)| im2col_row(p, img, r, c0, dst));
    }
}

/// Row `r` of one image and group's unrolled patches (`r` = (input channel,
/// ky, kx); `img` holds the group's input planes) for output positions
/// `c0 .. c0 + dst.len()` (flattened `y * out_w + x`), into `dst`; zero where
/// the tap falls in the padding.
pub(super) fn im2col_row<T: Float>(
    p: &Conv2dParams,
    img: &[T],
    r: usize,
    c0: usize,
    dst: &mut [T],
) {
    let (oh, ow) = (p.out_h(), p.out_w());
    let (kh, kw) = (p.kernel_h, p.kernel_w);
    let plane_in = p.in_h * p.in_w;
    let c = r / (kh * kw);
    let ky = (r / kw) % kh;
    let kx = r % kw;
    let plane = &img[c * plane_in..][..plane_in];
    let (y0, y1) = valid_range(oh, p.in_h, p.stride.0, ky * p.dilation.0, p.padding.top);
    let (x0, x1) = valid_range(ow, p.in_w, p.stride.1, kx * p.dilation.1, p.padding.left);
    let mut pos = c0;
    let end = c0 + dst.len();
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
                match p.stride.1 {
                    1 => dst.copy_from_slice(&row[ix0..ix0 + (b - a)]),
                    // A constant stride lets the compiler vectorise the gather.
                    2 => strided_copy::<T, 2>(dst, &row[ix0..]),
                    s => {
                        for (d, &v) in dst.iter_mut().zip(row[ix0..].iter().step_by(s)) {
                            *d = v;
                        }
                    }
                }
            }
            seg[b - xs..].fill(T::zero());
        }
        pos += xe - xs;
    }
}

/// `dst[i] = src[i * S]` for every `i` in `dst`.
#[inline(always)]
fn strided_copy<T: Float, const S: usize>(dst: &mut [T], src: &[T]) {
    let Some((last, body)) = dst.split_last_mut() else {
        return;
    };
    // Exact chunks of a constant length: no bounds check per element, so
    // the loop vectorises (loads and shuffles).
    let src = &src[..body.len() * S + 1];
    for (d, s) in body.iter_mut().zip(src.chunks_exact(S)) {
        *d = s[0];
    }
    *last = src[body.len() * S];
}

/// Whether [`conv2d_nhwc`] takes `p`: one group, no padding, no dilation,
/// and a stride equal to the kernel, so the windows are disjoint patches
/// (ConvNeXt's downsampling layers, a vision transformer's patch
/// embedding, 1x1 layers of stride 1).
pub fn applies_nhwc(p: &Conv2dParams) -> bool {
    p.groups == 1
        && p.stride == (p.kernel_h, p.kernel_w)
        && p.dilation == (1, 1)
        && p.padding == Default::default()
}

/// Writes PyTorch's weight (`[out][in][kh][kw]`) as [`conv2d_nhwc`]
/// reads it, `[out][kh][kw][in]`: the order of a patch's elements in
/// channels-last input.
pub fn nhwc_weight<T: Float>(p: &Conv2dParams, weight: &[T], out: &mut [T]) -> KernelResult<()> {
    check_len("conv2d weight", weight.len(), p.weight_len())?;
    check_len("channels-last conv2d weight", out.len(), p.weight_len())?;
    let (ic, taps) = (p.in_channels, p.kernel_h * p.kernel_w);
    for (src, dst) in weight
        .chunks_exact(ic * taps)
        .zip(out.chunks_exact_mut(ic * taps))
    {
        for (c, taps_c) in src.chunks_exact(taps).enumerate() {
            for (t, &v) in taps_c.iter().enumerate() {
                dst[t * ic + c] = v;
            }
        }
    }
    Ok(())
}

/// Convolution of channels-last (NHWC) input into channels-last output
/// over disjoint patches ([`applies_nhwc`]): each output pixel is its
/// patch's `kh` rows of `kw * in` consecutive input elements times the
/// weight, so the patches are copied into a `[pixels, kh * kw * in]` matrix
/// (with no copy at all for a 1x1 kernel) and multiplied as a linear layer
/// by `weight` from [`nhwc_weight`], straight into the NHWC output.
///
/// Fails, before writing anything, when a buffer has the wrong length or
/// `p` has overlapping windows; a refused scratch allocation fails the call.
pub fn conv2d_nhwc<T: Float>(
    p: &Conv2dParams,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
) -> KernelResult<()> {
    p.check_buffers(input.len(), bias.map(<[T]>::len), output.len())?;
    check_len("channels-last conv2d weight", weight.len(), p.weight_len())?;
    with_patches(p, input, |lin, patches| {
        crate::cpu::linear::gemm(lin, patches, weight, bias, output)
    })
}

/// [`conv2d_nhwc`] for f32 with the weight (in [`nhwc_weight`]'s order)
/// and bias packed once for the register-tile linear kernel
/// ([`PackedWeight`], built with `kh * kw * in_channels` input features):
/// the gemm crate packs the weight again on every call, which costs most
/// on the deep, narrow products of ConvNeXt's downsampling layers (384 ->
/// 768 at 14x14: 1536-long reductions over 49 pixels).
///
/// Fails, before writing anything, when a buffer has the wrong length, the
/// weight was packed for another shape, or `p` has overlapping windows; a
/// refused scratch allocation fails the call.
pub fn conv2d_nhwc_packed(
    p: &Conv2dParams,
    input: &[f32],
    weight: &PackedWeight,
    output: &mut [f32],
) -> KernelResult<()> {
    p.check_buffers(input.len(), None, output.len())?;
    let features = p.kernel_h * p.kernel_w * p.in_channels;
    if weight.in_features() != features || weight.out_features() != p.out_channels {
        return Err(crate::KernelError::Precondition {
            what: "the packed channels-last conv2d weight was packed for another layer shape",
        });
    }
    with_patches(p, input, |lin, patches| {
        crate::cpu::linear::packed::linear(lin, patches, weight, output, None);
        Ok(())
    })
}

/// Runs `multiply(lin, patches)` on the `[pixels, kh * kw * in]` matrix of
/// `p`'s patches (the input itself for a 1x1 kernel), `lin` the linear
/// layer's shape that turns them into the NHWC output. Fails when `p` has
/// overlapping windows; a refused scratch allocation fails the call.
fn with_patches<T: Float>(
    p: &Conv2dParams,
    input: &[T],
    multiply: impl FnOnce(&LinearParams, &[T]) -> KernelResult<()>,
) -> KernelResult<()> {
    if !applies_nhwc(p) {
        return Err(crate::KernelError::Precondition {
            what: "the channels-last GEMM convolution needs one group, no padding, no dilation and a stride equal to the kernel",
        });
    }
    let (oh, ow) = (p.out_h(), p.out_w());
    let row = p.kernel_w * p.in_channels;
    let lin = LinearParams {
        rows: p.batch * oh * ow,
        in_features: p.kernel_h * row,
        out_features: p.out_channels,
    };
    if p.kernel_h == 1 && p.kernel_w == 1 {
        return multiply(&lin, input);
    }
    let width = ow * lin.in_features;
    with_scratch::<T, _>(lin.rows * lin.in_features, |patches| {
        // One task per output row: its patches' kernel rows, `row`
        // consecutive elements each.
        patches
            .par_chunks_mut(width)
            .with_min_len(COL_BLOCK_ELEMENTS.div_ceil(width.max(1)))
            .enumerate()
            .for_each(|(r, dst)| {
                let (n, y) = (r / oh, r % oh);
                for ky in 0..p.kernel_h {
                    let src =
                        &input[((n * p.in_h + y * p.kernel_h + ky) * p.in_w) * p.in_channels..];
                    for x in 0..ow {
                        dst[x * lin.in_features + ky * row..][..row]
                            .copy_from_slice(&src[x * row..][..row]);
                    }
                }
            });
        multiply(&lin, patches)
    })?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::test_util::{
        assert_close, cast, channels_last, check_conv_algorithm, reference_conv, Rng,
    };
    use crate::params::Padding2d;

    /// Channels-last patches against the reference on NCHW values:
    /// ConvNeXt's 2x2 downsampling and 4x4 stem, planes the patches do not
    /// tile (leftover rows and columns), a rectangular patch, 1x1, in f32
    /// and f64, on this thread and on two.
    #[test]
    fn nhwc_patches_match_reference() {
        let case =
            |(kh, kw): (usize, usize), (h, w): (usize, usize), c: usize, oc: usize| Conv2dParams {
                batch: 2,
                in_channels: c,
                in_h: h,
                in_w: w,
                out_channels: oc,
                kernel_h: kh,
                kernel_w: kw,
                stride: (kh, kw),
                padding: Padding2d::default(),
                dilation: (1, 1),
                groups: 1,
            };
        let cases = [
            case((2, 2), (8, 8), 16, 24),
            case((4, 4), (18, 17), 3, 8),
            case((3, 1), (10, 7), 5, 7),
            case((1, 1), (5, 6), 9, 4),
            case((2, 2), (3, 3), 4, 6),
            // Deeper than the packed kernel's reduction block (384 > 256),
            // more pixels than its row tile and a partial panel of outputs.
            case((2, 2), (14, 13), 96, 40),
        ];
        let run = || {
            let mut rng = Rng::new(5);
            for p in &cases {
                assert!(applies_nhwc(p), "{p:?}");
                let x = rng.vec(p.input_len());
                let w = rng.vec(p.weight_len());
                let b = rng.vec(p.out_channels);
                let want = reference_conv(p, &x, &w, Some(&b));
                let (plane_in, plane_out) = (p.in_h * p.in_w, p.out_h() * p.out_w());
                let want = channels_last(&want, p.out_channels, plane_out, false);
                let unbiased = reference_conv(p, &x, &w, None);
                let unbiased = channels_last(&unbiased, p.out_channels, plane_out, false);
                let x = channels_last(&x, p.in_channels, plane_in, false);
                fn go<T: Float>(p: &Conv2dParams, x: &[f64], w: &[f64], b: &[f64]) -> Vec<T> {
                    let mut wt = vec![T::zero(); p.weight_len()];
                    nhwc_weight(p, &cast::<T>(w), &mut wt).unwrap();
                    let mut out = vec![T::nan(); p.output_len()];
                    conv2d_nhwc(p, &cast::<T>(x), &wt, Some(&cast::<T>(b)), &mut out).unwrap();
                    out
                }
                assert_close(
                    &go::<f32>(p, &x, &w, &b),
                    &want,
                    1e-5,
                    &format!("{p:?} f32"),
                );
                assert_close(
                    &go::<f64>(p, &x, &w, &b),
                    &want,
                    1e-12,
                    &format!("{p:?} f64"),
                );
                // The weight packed for the register-tile kernel, where it runs.
                let (xf, wf, bf) = (cast::<f32>(&x), cast::<f32>(&w), cast::<f32>(&b));
                let mut wt = vec![0f32; p.weight_len()];
                nhwc_weight(p, &wf, &mut wt).unwrap();
                let features = p.kernel_h * p.kernel_w * p.in_channels;
                for bias in [Some(&bf[..]), None] {
                    let Some(packed) =
                        PackedWeight::new(&wt, bias, p.out_channels, features).unwrap()
                    else {
                        assert!(!crate::cpu::linear::packed::available());
                        continue;
                    };
                    let mut out = vec![f32::NAN; p.output_len()];
                    conv2d_nhwc_packed(p, &xf, &packed, &mut out).unwrap();
                    let want = if bias.is_some() { &want } else { &unbiased };
                    assert_close(
                        &out,
                        want,
                        1e-5,
                        &format!("{p:?} packed, bias {}", bias.is_some()),
                    );
                }
            }
        };
        run();
        crate::cpu::test_util::on_two_threads(run);
        // Overlapping windows are refused.
        let p = Conv2dParams {
            stride: (1, 1),
            ..cases[0]
        };
        assert!(!applies_nhwc(&p));
        let (x, w) = (vec![0f32; p.input_len()], vec![0f32; p.weight_len()]);
        let mut out = vec![0f32; p.output_len()];
        assert!(conv2d_nhwc(&p, &x, &w, None, &mut out).is_err());
        if let Some(packed) = PackedWeight::new(&w, None, 24, 64).unwrap() {
            assert!(conv2d_nhwc_packed(&p, &x, &packed, &mut out).is_err());
            // A weight packed for another layer is refused, not run.
            let p = cases[0];
            let mut out = vec![0f32; p.output_len()];
            let other = PackedWeight::new(&w[..24 * 32], None, 24, 32)
                .unwrap()
                .unwrap();
            let x = vec![0f32; p.input_len()];
            assert!(conv2d_nhwc_packed(&p, &x, &other, &mut out).is_err());
        }
    }

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
    fn gemm_splits_channels_or_columns_among_threads() {
        // Batch 1 on two threads: small images share the output channels
        // (40 of them: uneven chunks), larger ones the column blocks; both
        // with and without im2col.
        let case = |k: usize, stride: usize, hw: usize| Conv2dParams {
            batch: 1,
            in_channels: 5,
            in_h: hw,
            in_w: hw,
            out_channels: 40,
            kernel_h: k,
            kernel_w: k,
            stride: (stride, stride),
            padding: Padding2d::symmetric(k / 2, k / 2),
            dilation: (1, 1),
            groups: 1,
        };
        let mut rng = Rng::new(11);
        crate::cpu::test_util::on_two_threads(|| {
            for p in [
                case(1, 1, 7),
                case(3, 2, 14),
                case(1, 1, 30),
                case(3, 1, 40),
            ] {
                crate::cpu::test_util::check_conv_case(
                    "gemm",
                    &p,
                    &mut rng,
                    super::conv2d::<f32>,
                    super::conv2d::<f64>,
                );
            }
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
        conv2d(&p, &cast(&input), &cast(&weight), None, &mut out).unwrap();
        assert_close(&out, &want, 1e-4, "gemm blocked");
    }

    #[test]
    fn wrong_lengths_are_errors_before_any_write() {
        crate::cpu::test_util::check_conv_lengths(super::conv2d::<f32>);
    }

    #[test]
    fn huge_padding_needs_no_padded_copy() {
        // im2col reads around the padding, so what direct and SMM refuse
        // (a terabyte-sized padded copy) gemm computes.
        let p = crate::cpu::test_util::hugely_padded_problem();
        let mut rng = Rng::new(4);
        let input = rng.vec(p.input_len());
        let weight = rng.vec(p.weight_len());
        let want = reference_conv(&p, &input, &weight, None);
        let mut out = vec![f32::NAN; p.output_len()];
        conv2d(&p, &cast(&input), &cast(&weight), None, &mut out).unwrap();
        assert_close(&out, &want, 1e-4, "gemm hugely padded");
    }
}
