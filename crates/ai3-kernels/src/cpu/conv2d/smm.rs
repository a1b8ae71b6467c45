//! SMM-Conv: convolution as Scalar Matrix Multiplications with zero packing
//! (Ofir & Ben-Artzi, 2022).
//!
//! Each output plane is the sum, over (input channel, kernel row, kernel
//! column), of the input plane shifted by that tap (with stride and dilation)
//! and scaled by the tap's scalar weight. The input is zero-packed once
//! (`Padded`: padded, and split into column phases so a strided tap is
//! still a contiguous shifted matrix), so every scalar-matrix product is a
//! plain `acc += w * shifted` over whole rows with no bounds checks.
//!
//! Done plane by plane those products stream whole output planes through
//! memory once per tap. Instead the output is cut into tiles of a few rows of
//! a block of output channels, small enough that the tile's accumulators stay
//! in L1, and the products are fused: one pass over the tile loads the
//! shifted input vectors of the taps of one kernel row once and adds every
//! block channel's scalar multiples of them to that channel's accumulators,
//! so each accumulator is read and written once per (input channel, kernel
//! row) instead of once per tap. The tile is written out once at the end.

#[cfg(target_arch = "x86_64")]
use std::any::TypeId;

use rayon::prelude::*;

use super::padded::{Padded, SendPtr};
use crate::alloc::{check_len, checked_product, try_zeroed_vec, KernelResult};
use crate::params::Conv2dParams;
use crate::Float;

/// Accumulator bytes per task: about half of a typical L1 data cache.
const ACC_BYTES: usize = 24 << 10;

/// Most taps one pass fuses.
const MAX_FUSED: usize = 4;

/// One fused pass: for every block channel `m`, row `r < rows` and column
/// `x < cols`, `acc[m][r][x] += sum_j w[m * w_stride + j] * src[r * src_stride + offs[j] + x]`
/// over the pass's taps `j`.
struct Pass<T> {
    src: *const T,
    offs: [usize; MAX_FUSED],
    src_stride: usize,
    acc: *mut T,
    /// Distance between block channels in `acc` (`rows * cols`).
    tile: usize,
    rows: usize,
    /// A multiple of the vector length.
    cols: usize,
    w: *const T,
    w_stride: usize,
    nm: usize,
}

type PassFn<T> = unsafe fn(&Pass<T>);

/// SMM-Conv 2-D convolution (see the [module contract](super)).
///
/// Parallel over (image, group, output-channel block, row tile). Supports
/// stride, dilation, asymmetric zero padding and groups (including
/// depthwise).
///
/// Fails, before writing anything, when a buffer has the wrong length, and
/// when the padded copy of the input or a buffer overflows or cannot be
/// allocated.
pub fn conv2d<T: Float>(
    p: &Conv2dParams,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
) -> KernelResult<()> {
    run(p, input, weight, bias, output, false)
}

/// [`conv2d`], optionally with the portable kernels whatever the CPU.
fn run<T: Float>(
    p: &Conv2dParams,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
    portable: bool,
) -> KernelResult<()> {
    p.check_buffers(input.len(), bias.map(<[T]>::len), output.len())?;
    check_len("conv2d weight", weight.len(), p.weight_len())?;

    let (oh, ow) = (p.out_h(), p.out_w());
    let plane_out = oh * ow;
    if output.is_empty() {
        return Ok(());
    }
    let icg = p.in_channels_per_group();
    let ocg = p.out_channels_per_group();
    let (kh, kw) = (p.kernel_h, p.kernel_w);
    let sz = std::mem::size_of::<T>();
    let vl = 64 / sz;
    let owp = ow.div_ceil(vl) * vl;
    let passes = select::<T>(portable);

    let pad = Padded::new(p, input)?;
    let taps = pad.tap_offsets(p)?;
    let src_stride = p.stride.0 * pad.row_stride;

    // Tile: `mo` output channels x `rows` output rows, accumulators in L1.
    let acc_elems = (ACC_BYTES / sz).max(owp);
    let mo = ocg.clamp(1, 16).min((acc_elems / owp).max(1));
    let rows = (acc_elems / (mo * owp)).clamp(1, oh);
    let nob = ocg.div_ceil(mo);
    let nrt = oh.div_ceil(rows);
    let ntasks = p.batch * p.groups * nob * nrt;

    // Weights of each (group, block) as [c][ky][m][kx], so one pass's
    // weights are `w_stride = kw` apart per channel.
    let wblock = icg * kh * mo * kw;
    let mut packed = try_zeroed_vec(
        checked_product("packed SMM weights", &[p.groups, nob, wblock])?,
        "packed SMM weights",
    )?;
    packed
        .par_chunks_mut(wblock)
        .with_min_len(super::min_len(p))
        .enumerate()
        .for_each(|(gb, dst)| {
            let (g, ob) = (gb / nob, gb % nob);
            for m in 0..mo.min(ocg - ob * mo) {
                let o = g * ocg + ob * mo + m;
                for c in 0..icg {
                    for ky in 0..kh {
                        for kx in 0..kw {
                            dst[((c * kh + ky) * mo + m) * kw + kx] =
                                weight[((o * icg + c) * kh + ky) * kw + kx];
                        }
                    }
                }
            }
        });

    let out = SendPtr(output.as_mut_ptr());
    // Each thread's accumulators: a refused allocation fails that thread's
    // tasks, and the first such error is the call's.
    let acc_len = mo * rows * owp + vl;
    (0..ntasks)
        .into_par_iter()
        .with_min_len(super::min_len(p))
        .try_for_each_init(
            || try_zeroed_vec::<T>(acc_len, "SMM accumulator tile"),
            |buf, t| -> KernelResult<()> {
                let buf = buf.as_mut().map_err(|e| e.clone())?;
                let out = &out;
                // Whole-vector, 64-byte aligned accumulator rows.
                let align = buf.as_ptr().align_offset(64).min(vl);
                let acc = &mut buf[align..align + mo * rows * owp];
                let rt = t % nrt;
                let ob = (t / nrt) % nob;
                let g = (t / (nrt * nob)) % p.groups;
                let n = t / (nrt * nob * p.groups);
                let y0 = rt * rows;
                let nr = rows.min(oh - y0);
                let o0 = g * ocg + ob * mo;
                let nm = mo.min(ocg - ob * mo);
                let tile = nr * owp;
                for m in 0..nm {
                    acc[m * tile..(m + 1) * tile].fill(bias.map_or(T::zero(), |b| b[o0 + m]));
                }
                let img = &pad.buf[n * pad.img_stride + g * icg * pad.chan_stride..];
                let wb = &packed[(g * nob + ob) * wblock..][..wblock];
                let mut pass = Pass {
                    src: std::ptr::null(),
                    offs: [0; MAX_FUSED],
                    src_stride,
                    acc: acc.as_mut_ptr(),
                    tile,
                    rows: nr,
                    cols: owp,
                    w: std::ptr::null(),
                    w_stride: kw,
                    nm,
                };
                for c in 0..icg {
                    let plane = &img[c * pad.chan_stride + y0 * src_stride..];
                    for ky in 0..kh {
                        let row_taps = &taps[ky * kw..(ky + 1) * kw];
                        let w_row = &wb[(c * kh + ky) * mo * kw..];
                        for (ci, chunk) in row_taps.chunks(MAX_FUSED).enumerate() {
                            pass.src = plane.as_ptr();
                            pass.offs[..chunk.len()].copy_from_slice(chunk);
                            pass.w = w_row[ci * MAX_FUSED..].as_ptr();
                            // SAFETY: the source rows lie in the padded buffer
                            // (reads past `ow` stay in its slack), the weights in
                            // the block, the accumulators in `acc`.
                            unsafe { passes[chunk.len() - 1](&pass) };
                        }
                    }
                }
                for m in 0..nm {
                    for r in 0..nr {
                        let dst = (n * p.out_channels + o0 + m) * plane_out + (y0 + r) * ow;
                        let row = &acc[m * tile + r * owp..][..ow];
                        // SAFETY: each (image, channel, row) is written by one task only.
                        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), out.0.add(dst), ow) };
                    }
                }
                Ok(())
            },
        )
}

/// The fastest fused-pass kernels for `T`, indexed by the number of taps - 1.
/// `portable` forces the plain Rust kernels (for tests).
fn select<T: Float>(force_portable: bool) -> [PassFn<T>; MAX_FUSED] {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = force_portable;
    #[cfg(target_arch = "x86_64")]
    if !force_portable && crate::isa::avx512() {
        if TypeId::of::<T>() == TypeId::of::<f32>() {
            let f: [PassFn<f32>; MAX_FUSED] = [
                avx512::pass_f32::<1>,
                avx512::pass_f32::<2>,
                avx512::pass_f32::<3>,
                avx512::pass_f32::<4>,
            ];
            // SAFETY: T is f32, so the two types are the same.
            return unsafe {
                std::mem::transmute::<[PassFn<f32>; MAX_FUSED], [PassFn<T>; MAX_FUSED]>(f)
            };
        }
        if TypeId::of::<T>() == TypeId::of::<f64>() {
            let f: [PassFn<f64>; MAX_FUSED] = [
                avx512::pass_f64::<1>,
                avx512::pass_f64::<2>,
                avx512::pass_f64::<3>,
                avx512::pass_f64::<4>,
            ];
            // SAFETY: T is f64, so the two types are the same.
            return unsafe {
                std::mem::transmute::<[PassFn<f64>; MAX_FUSED], [PassFn<T>; MAX_FUSED]>(f)
            };
        }
    }
    [
        pass_portable::<T, 1>,
        pass_portable::<T, 2>,
        pass_portable::<T, 3>,
        pass_portable::<T, 4>,
    ]
}

/// Plain Rust fused pass: one scalar-matrix product at a time, which the
/// compiler vectorises along the row.
///
/// # Safety
/// The pass's pointers must cover what [`Pass`] describes.
unsafe fn pass_portable<T: Float, const K: usize>(a: &Pass<T>) {
    for m in 0..a.nm {
        for j in 0..K {
            let w = *a.w.add(m * a.w_stride + j);
            for r in 0..a.rows {
                let s = std::slice::from_raw_parts(a.src.add(r * a.src_stride + a.offs[j]), a.cols);
                let d = std::slice::from_raw_parts_mut(a.acc.add(m * a.tile + r * a.cols), a.cols);
                for (d, &s) in d.iter_mut().zip(s) {
                    *d += w * s;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::Pass;

    macro_rules! pass_kernel {
        ($name:ident, $t:ty, $zero:ident, $set1:ident, $loadu:ident, $load:ident, $store:ident,
         $fmadd:ident) => {
            /// AVX-512 fused pass: the `K` shifted input vectors of a column
            /// are loaded once and reused by every block channel.
            ///
            /// # Safety
            /// AVX-512F must be available; the pointers must cover what
            /// [`Pass`] describes, with `acc` 64-byte aligned and `cols` a
            /// multiple of the vector length.
            #[target_feature(enable = "avx512f")]
            pub(super) unsafe fn $name<const K: usize>(a: &Pass<$t>) {
                const VL: usize = 64 / std::mem::size_of::<$t>();
                for r in 0..a.rows {
                    let s = a.src.add(r * a.src_stride);
                    let d = a.acc.add(r * a.cols);
                    let mut x = 0;
                    while x < a.cols {
                        let mut v = [$zero(); K];
                        for j in 0..K {
                            v[j] = $loadu(s.add(a.offs[j] + x));
                        }
                        let mut w = a.w;
                        let mut dm = d.add(x);
                        for _ in 0..a.nm {
                            let mut acc = $load(dm);
                            for j in 0..K {
                                acc = $fmadd($set1(*w.add(j)), v[j], acc);
                            }
                            $store(dm, acc);
                            w = w.add(a.w_stride);
                            dm = dm.add(a.tile);
                        }
                        x += VL;
                    }
                }
            }
        };
    }

    pass_kernel!(
        pass_f32,
        f32,
        _mm512_setzero_ps,
        _mm512_set1_ps,
        _mm512_loadu_ps,
        _mm512_load_ps,
        _mm512_store_ps,
        _mm512_fmadd_ps
    );
    pass_kernel!(
        pass_f64,
        f64,
        _mm512_setzero_pd,
        _mm512_set1_pd,
        _mm512_loadu_pd,
        _mm512_load_pd,
        _mm512_store_pd,
        _mm512_fmadd_pd
    );
}

#[cfg(test)]
mod tests {
    crate::cpu::test_util::blocked_conv_tests!("smm", crate::cpu::conv2d::smm);

    #[test]
    fn huge_padding_is_an_allocation_error() {
        crate::cpu::test_util::check_conv_refuses_huge_padding(super::conv2d::<f32>);
    }
}
