//! A zero-padded, column-phase-split copy of the input, shared by the direct
//! and SMM kernels.
//!
//! Padding the input once turns every kernel tap into a plain shifted read
//! with no bounds checks. Splitting each padded row into `stride_w` phases
//! (phase `q` holds padded columns `q, q + sw, q + 2 sw, ...`) makes the
//! columns one tap reads for consecutive output columns contiguous whatever
//! the horizontal stride, so the inner loops always use unit-stride vector
//! loads. Padded column `X = x * sw + kx * dw` lives in phase `(kx * dw) % sw`
//! at index `x + (kx * dw) / sw`.

use rayon::prelude::*;

use crate::alloc::{checked_product, try_vec_with_capacity, try_zeroed_vec, KernelResult};
use crate::params::Conv2dParams;
use crate::Float;

/// Extra zeroed elements after the buffer so full-width vector loads that
/// start inside the buffer never leave it.
pub(crate) const SLACK: usize = 64;

/// The padded copy of a whole batch: `[batch][in_channels][hp][sw][wq]`.
pub(crate) struct Padded<T> {
    /// The elements, followed by [`SLACK`] zeros.
    pub buf: Vec<T>,
    /// Elements per phase of a padded row (`ceil(padded_w / sw)`).
    pub wq: usize,
    /// Elements per padded row (`sw * wq`).
    pub row_stride: usize,
    /// Elements per channel plane.
    pub chan_stride: usize,
    /// Elements per image.
    pub img_stride: usize,
}

/// The sizes of [`Padded`]'s buffer for `p`.
struct Layout {
    wq: usize,
    row_stride: usize,
    chan_stride: usize,
    img_stride: usize,
    /// Elements of the buffer, slack included.
    len: usize,
}

const WHAT: &str = "padded input copy";

impl Layout {
    fn of(p: &Conv2dParams) -> KernelResult<Self> {
        let sw = p.stride.1;
        let wq = p.padded_w().div_ceil(sw);
        let row_stride = checked_product(WHAT, &[sw, wq])?;
        let chan_stride = checked_product(WHAT, &[p.padded_h(), row_stride])?;
        let img_stride = checked_product(WHAT, &[p.in_channels, chan_stride])?;
        let len = checked_product(WHAT, &[p.batch, img_stride])?
            .checked_add(SLACK)
            .ok_or(crate::KernelError::Overflow { what: WHAT })?;
        Ok(Layout {
            wq,
            row_stride,
            chan_stride,
            img_stride,
            len,
        })
    }
}

/// Elements of the zero-padded input copy the direct and SMM kernels make for
/// `p` (their only scratch memory), or an error when the count overflows.
pub fn padded_copy_elements(p: &Conv2dParams) -> KernelResult<usize> {
    Ok(Layout::of(p)?.len)
}

impl<T: Float> Padded<T> {
    /// Copies `input` (NCHW) into the padded, phase-split layout, in parallel
    /// over channel planes. `p` has passed [`Conv2dParams::check_sizes`]; the
    /// copy's own size may still overflow or be refused (huge padding).
    pub fn new(p: &Conv2dParams, input: &[T]) -> KernelResult<Self> {
        let Layout {
            wq,
            row_stride,
            chan_stride,
            img_stride,
            len,
        } = Layout::of(p)?;
        let sw = p.stride.1;
        let planes = p.batch * p.in_channels;
        let mut buf = try_zeroed_vec(len, WHAT)?;
        let plane_in = p.in_h * p.in_w;
        let (pt, pl) = (p.padding.top, p.padding.left);
        if plane_in > 0 && chan_stride > 0 {
            buf[..planes * chan_stride]
                .par_chunks_mut(chan_stride)
                .zip(input.par_chunks(plane_in))
                .with_min_len(super::min_len(p))
                .for_each(|(dst, src)| {
                    for (iy, src_row) in src.chunks_exact(p.in_w).enumerate() {
                        let row = &mut dst[(iy + pt) * row_stride..][..row_stride];
                        if sw == 1 {
                            row[pl..pl + p.in_w].copy_from_slice(src_row);
                        } else {
                            // Phase and index of padded column `pl + ix`,
                            // stepped without dividing per element.
                            let (mut q, mut j) = (pl % sw, pl / sw);
                            for &v in src_row {
                                row[q * wq + j] = v;
                                q += 1;
                                if q == sw {
                                    q = 0;
                                    j += 1;
                                }
                            }
                        }
                    }
                });
        }
        Ok(Padded {
            buf,
            wq,
            row_stride,
            chan_stride,
            img_stride,
        })
    }

    /// Offset of kernel tap `(ky, kx)` relative to the read position of its
    /// output pixel's top-left tap, for every tap in row-major order.
    pub fn tap_offsets(&self, p: &Conv2dParams) -> KernelResult<Vec<usize>> {
        let (dh, dw) = p.dilation;
        let sw = p.stride.1;
        let mut taps = try_vec_with_capacity(p.kernel_h * p.kernel_w, "kernel tap offsets")?;
        for ky in 0..p.kernel_h {
            for kx in 0..p.kernel_w {
                let c = kx * dw;
                taps.push(ky * dh * self.row_stride + (c % sw) * self.wq + c / sw);
            }
        }
        Ok(taps)
    }

    /// Offset, within one image's channel plane, of output pixel `(y, x)`'s
    /// top-left tap.
    #[inline]
    pub fn pixel_offset(&self, p: &Conv2dParams, y: usize, x: usize) -> usize {
        y * p.stride.0 * self.row_stride + x
    }
}

/// A pointer that rayon tasks writing disjoint parts of one buffer may share.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr<T>(pub *mut T);

// SAFETY: the kernels only write through it to disjoint elements per task.
unsafe impl<T: Send> Send for SendPtr<T> {}
unsafe impl<T: Send> Sync for SendPtr<T> {}

/// Checks a kernel against the reference on shapes larger than the shared
/// grid's: rows longer than a vector, more channels than a register block,
/// several blocks and slot groups, strides, dilation and groups.
#[cfg(test)]
pub(crate) fn check_larger_shapes(
    name: &str,
    conv32: crate::cpu::test_util::ConvFn<f32>,
    conv64: crate::cpu::test_util::ConvFn<f64>,
) {
    use crate::cpu::test_util::{check_conv_case, Rng};
    use crate::params::Padding2d;
    let mut rng = Rng::new(11);
    // (batch, ic, oc, groups, h, w, k, stride, padding, dilation)
    let cases = [
        (
            2,
            5,
            19,
            1,
            13,
            37,
            (3, 3),
            (1, 1),
            Padding2d::symmetric(1, 1),
            (1, 1),
        ),
        (
            1,
            3,
            64,
            1,
            20,
            40,
            (3, 3),
            (1, 1),
            Padding2d::symmetric(1, 1),
            (1, 1),
        ),
        (
            3,
            6,
            20,
            2,
            17,
            35,
            (3, 5),
            (2, 2),
            Padding2d::symmetric(1, 2),
            (1, 1),
        ),
        (
            2,
            8,
            12,
            1,
            21,
            50,
            (3, 3),
            (1, 3),
            Padding2d {
                top: 0,
                bottom: 2,
                left: 3,
                right: 1,
            },
            (2, 3),
        ),
        (
            2,
            24,
            24,
            24,
            19,
            33,
            (3, 3),
            (1, 1),
            Padding2d::symmetric(1, 1),
            (1, 1),
        ),
        (
            1,
            16,
            6,
            2,
            9,
            70,
            (1, 1),
            (1, 1),
            Padding2d::default(),
            (1, 1),
        ),
        (
            2,
            32,
            40,
            1,
            14,
            14,
            (3, 3),
            (1, 1),
            Padding2d::symmetric(1, 1),
            (1, 1),
        ),
        (
            1,
            4,
            9,
            1,
            30,
            17,
            (7, 7),
            (2, 2),
            Padding2d::symmetric(3, 3),
            (1, 1),
        ),
    ];
    for (batch, ic, oc, groups, h, w, (kh, kw), stride, padding, dilation) in cases {
        let p = Conv2dParams {
            batch,
            in_channels: ic,
            in_h: h,
            in_w: w,
            out_channels: oc,
            kernel_h: kh,
            kernel_w: kw,
            stride,
            padding,
            dilation,
            groups,
        };
        check_conv_case(name, &p, &mut rng, conv32, conv64);
    }
}
