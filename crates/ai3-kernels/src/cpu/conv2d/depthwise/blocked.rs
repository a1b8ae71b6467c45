//! Depthwise convolution on blocks of [`CB`] channels, the channel-blocked
//! (NCHWc) way, for f32 on AVX2 and FMA: the block's input planes are copied,
//! zero-padded, into one buffer whose pixels hold the block's `CB` channels
//! side by side (8x8 register transposes), so each multiply-accumulate of a
//! tap is one vector over the block's channels and every lane of it is
//! useful, whatever the plane's width, the stride or the dilation. [`R`]
//! output pixels (consecutive in the flat output plane, so rows of 7 or 14
//! pixels waste nothing) are accumulated in registers across all taps and
//! written straight to the block's NCHW planes through another transpose;
//! the fused epilogue then runs once on the block's planes while they are in
//! cache.
//!
//! With AVX-512, blocked output of stride-1 layers (and 3-wide stride-2
//! rows read in place) holds two pixels per zmm register instead
//! ([`super::pairs`]).
//!
//! Against the plane-by-plane path of the parent module (one thread,
//! mobilenet_v2, efficientnet_b0 and convnext_tiny shapes, with ReLU6):
//! 960 channels 3x3 at 7x7 80 -> 44 us; 576 at 14x14 3x3 stride 2
//! 105 -> 40 us; 144 at 56x56 3x3 stride 2 221 -> 122 us, 5x5 stride 2
//! 244 -> 170 us; 672 at 14x14 5x5 228 -> 150 us; 768 at 7x7 7x7
//! 178 -> 84 us; 96 at 56x56 7x7 569 -> 491 us; 32 at 112x112 3x3 252
//! both.

use std::arch::x86_64::*;

use rayon::prelude::*;

use super::super::{threads_for_macs, Epilogue, SharedMut};
use super::MAC_COST;
use crate::alloc::{try_zeroed_vec, KernelResult};
use crate::cpu::blocked::transpose::store_transposed;
use crate::cpu::blocked::{Fused, BLOCK as CB};
use crate::cpu::scratch::with_scratch;
use crate::params::Conv2dParams;

/// The layout of a call's input and output: both NCHW, both in the
/// channel-blocked layout (see [`crate::cpu::blocked`]), or both NHWC
/// (channels last, a whole number of blocks of channels); the last two with
/// multiplier 1 only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Io {
    Nchw,
    Blocked,
    Nhwc,
}

impl Io {
    /// Elements between consecutive pixels of one channel block, in the
    /// input and output (`None` for NCHW, whose planes are transposed).
    fn pixel_stride(self, channels: usize) -> Option<usize> {
        match self {
            Io::Nchw => None,
            Io::Blocked => Some(CB),
            Io::Nhwc => Some(channels),
        }
    }
}

/// Output pixels accumulated in registers at once (`R` vectors of `CB`).
const R: usize = 8;

/// Elements of scratch skipped, at most, to start the input buffer on a
/// 64-byte boundary (so no vector load straddles two cache lines: 144
/// channels at 56x56 310 -> 278 us).
const ALIGN: usize = 16;

/// Input widths from which blocked input is read in place
/// ([`compute_direct`]) rather than copied into a padded buffer first: on
/// wide planes the copy costs a pass over memory and most of an L2 cache,
/// while the few border columns that need bounds checks are cheap (96
/// channels 112x112 stride 2, with the 1x1 layer before it, 0.21-0.23 ->
/// 0.12-0.15 ms; 32 channels 112x112 0.155 -> 0.115 ms). At 28x28 both
/// measured the same; at 14x14 the border pixels, one at a time, made 5x5
/// layers 40% slower.
const DIRECT_MIN_WIDTH: usize = 56;

/// Output elements per parallel task, at least: enough to amortise a task.
const MIN_TASK_ELEMENTS: usize = 4096;

/// Whether this path runs here: the CPU has AVX2 and FMA (the caller
/// checks that the elements are f32).
pub(super) fn available() -> bool {
    crate::isa::avx2()
}

/// Geometry of one layer: the padded, channel-interleaved input buffer and
/// the offsets the taps read at.
struct Geometry {
    /// Padded input width (pixels per buffer row).
    pw: usize,
    /// Elements of the input buffer (`padded_h * pw * CB`).
    buf_len: usize,
    /// Offset of each tap's read from its output pixel's, in elements, in
    /// `(ky, kx)` order.
    taps: Vec<usize>,
}

impl Geometry {
    fn new(p: &Conv2dParams) -> Self {
        let pw = p.padded_w();
        let taps = (0..p.kernel_h)
            .flat_map(|ky| {
                (0..p.kernel_w).map(move |kx| (ky * p.dilation.0 * pw + kx * p.dilation.1) * CB)
            })
            .collect();
        Geometry {
            pw,
            buf_len: p.padded_h() * pw * CB,
            taps,
        }
    }
}

/// Depthwise convolution of `p` (depthwise, buffers already checked by the
/// parent's `conv2d`) with input and output laid out as `io` says, the
/// weights as [`super::pack_blocked`] packs them, with
/// `fused` applied in registers (blocked only) and then `epilogue` to each
/// block's output (offsets in that layout). Needs [`available`]; a refused
/// scratch allocation fails the call.
#[allow(clippy::too_many_arguments)]
pub(super) fn conv2d(
    p: &Conv2dParams,
    io: Io,
    input: &[f32],
    packed: &[f32],
    output: &mut [f32],
    fused: Fused<'_>,
    epilogue: Option<Epilogue<f32>>,
) -> KernelResult<()> {
    assert!(
        available(),
        "blocked depthwise convolution needs AVX2 and FMA"
    );
    assert!(
        io != Io::Nhwc || (p.out_channels.is_multiple_of(CB) && epilogue.is_none()),
        "NHWC depthwise convolution takes whole channel blocks and no epilogue"
    );
    assert!(
        io == Io::Blocked || (fused.residual.is_none() && fused.clamp.is_none()),
        "depthwise convolution fuses in registers only into blocked output"
    );
    fused.check(output.len())?;
    let plane_out = p.out_h() * p.out_w();
    let blocks = p.out_channels.div_ceil(CB);
    let image_out = match io {
        Io::Nchw | Io::Nhwc => p.out_channels * plane_out,
        Io::Blocked => blocks * CB * plane_out,
    };
    if plane_out == 0 || p.batch == 0 {
        return Ok(());
    }
    let geo = Geometry::new(p);
    let geo = &geo;
    let ntaps = geo.taps.len();
    // Wide planes read in place (blocked or NHWC) need no padded copy of
    // the input: their scratch is the weights alone, not hundreds of KB
    // allocated and zeroed per task batch (a 112x112 plane: 406 KB).
    let direct = io != Io::Nchw && p.in_w >= DIRECT_MIN_WIDTH;
    // Blocked output with AVX-512 takes two pixels a register
    // (`super::pairs`): stride-1 layers from the padded buffer, as the plan
    // of their stores says, and stride-1 (and 3-wide stride-2) rows read in
    // place.
    let pairs = io == Io::Blocked && crate::isa::avx512();
    let stores = (pairs && !direct)
        .then(|| super::pairs::plan(p, geo.pw))
        .flatten();
    let stores = stores.as_deref();
    // Stride 2 from the padded buffer, a row's pairs at a time.
    let stride2 = pairs
        && !direct
        && p.stride == (2, 2)
        && super::pairs::pairs_stride2(p.kernel_w, p.dilation.1)
        && p.dilation.0 == 1;
    // The pair loops read one pixel (stride 1) or two (stride 2) past the
    // padded buffer (into lanes they do not store).
    let buf_len = match (direct, stores) {
        (true, _) => 0,
        (false, Some(_)) => geo.buf_len + CB,
        (false, None) if stride2 => geo.buf_len + 2 * CB,
        (false, None) => geo.buf_len,
    };
    // Scratch: the input buffer (from a 64-byte boundary). The weights
    // come packed, `[tap][CB]` and the bias per block.
    let block_weights = (ntaps + 1) * CB;
    let scratch_len = ALIGN + buf_len;
    let plane_in = p.in_h * p.in_w;
    let mult = p.out_channels_per_group();
    let pixels = io.pixel_stride(p.out_channels);
    // Where the task of image `n`, block `ob` writes: the block's planes
    // (NCHW, blocked), or its lanes of the image's first pixel (NHWC).
    let region = |n: usize, ob: usize| match io {
        Io::Nhwc => n * image_out + ob * CB,
        _ => n * image_out + ob * CB * plane_out,
    };
    // SAFETY (of every call): `out` is `output` advanced to `region(n, ob)`;
    // the task writes only its block's elements there.
    let task = |scratch: &mut [f32], n: usize, ob: usize, out: *mut f32| {
        // What the stores fuse: the residual at the block's region, the clamp.
        let fuse = Fuse {
            residual: fused
                .residual
                .map_or(std::ptr::null(), |r| r[region(n, ob)..].as_ptr()),
            clamp: fused.clamp,
        };
        let skip = scratch.as_ptr().align_offset(64).min(ALIGN);
        let buf = &mut scratch[skip..][..buf_len];
        let (wb, bb) = packed[ob * block_weights..][..block_weights].split_at(ntaps * CB);
        let c0 = ob * CB;
        let valid = CB.min(p.out_channels - c0);
        // The block's first input pixel and the distance between its pixels.
        let src = match io {
            Io::Nchw => {
                // Lanes past `valid` read the last channel's plane again.
                let srcs: [&[f32]; CB] = std::array::from_fn(|l| {
                    let c = c0 + l.min(valid - 1);
                    &input[(n * p.in_channels + c / mult) * plane_in..][..plane_in]
                });
                // SAFETY: the CPU has AVX2 and FMA (asserted); `buf` has
                // `geo.buf_len` elements, each source is one input plane.
                unsafe { pack(p, geo.pw, &srcs, buf) };
                None
            }
            Io::Blocked => Some((
                &input[(n * blocks + ob) * plane_in * CB..][..plane_in * CB],
                CB,
            )),
            Io::Nhwc => {
                let image = &input[n * plane_in * p.in_channels..][..plane_in * p.in_channels];
                Some((&image[c0..], p.in_channels))
            }
        };
        match (src, stores) {
            // SAFETY: AVX2 and FMA (asserted), and AVX-512 where `pairs`;
            // `src` holds the block's `in_h * in_w` pixels `stride` apart,
            // `out` its output pixels as far apart, `wb` and `bb` as below.
            (Some((src, stride)), _) if direct => unsafe {
                compute_direct(p, src, stride, wb, bb, out, fuse, pairs)
            },
            (Some((src, stride)), Some(stores)) => {
                pack_pixels(p, geo.pw, src, stride, buf);
                // SAFETY: AVX-512 (`stores` only then); `buf` is packed from
                // a 64-byte boundary with a pixel to spare, `wb` and `bb` as
                // below, `out` the block's blocked planes, `stores` the plan
                // for `p`.
                unsafe {
                    super::pairs::padded(
                        buf,
                        &geo.taps,
                        wb,
                        bb,
                        out,
                        stores,
                        fuse,
                        (p.kernel_w, p.dilation.1),
                    )
                }
            }
            (Some((src, stride)), None) if stride2 => {
                pack_pixels(p, geo.pw, src, stride, buf);
                // SAFETY: AVX-512 (`stride2` only then); `buf` is packed
                // with two pixels to spare, `wb` and `bb` as below, `out`
                // the block's blocked planes; `p` is stride 2 with a kernel
                // the pairs take.
                unsafe { super::pairs::padded_stride2(p, buf, geo.pw, wb, bb, out, fuse) }
            }
            (src, _) => {
                if let Some((src, stride)) = src {
                    pack_pixels(p, geo.pw, src, stride, buf);
                }
                // SAFETY: AVX2 and FMA (asserted); `buf` is packed, `wb` and
                // `bb` hold a vector per tap and one, `out` `valid` planes
                // (NCHW) or `plane_out` pixels `pixels` apart.
                unsafe { compute(p, geo, buf, wb, bb, out, valid, pixels, fuse) }
            }
        }
        if let Some(e) = epilogue {
            let len = match io {
                Io::Nchw => valid * plane_out,
                _ => CB * plane_out,
            };
            // SAFETY: NCHW or blocked (NHWC has no epilogue): the block's
            // planes are `len` elements from `out`.
            e(region(n, ob), unsafe {
                std::slice::from_raw_parts_mut(out, len)
            });
        }
    };
    let tasks = p.batch * blocks;
    let out = SharedMut(output.as_mut_ptr());
    let out = &out;
    if threads_for_macs(p.macs().saturating_mul(MAC_COST)) > 1 && tasks > 1 {
        (0..tasks)
            .into_par_iter()
            .with_min_len(MIN_TASK_ELEMENTS.div_ceil(CB * plane_out))
            .try_for_each_init(
                || try_zeroed_vec::<f32>(scratch_len, "depthwise channel block"),
                |buf, t| {
                    let buf = buf.as_mut().map_err(|e| e.clone())?;
                    let (n, ob) = (t / blocks, t % blocks);
                    // SAFETY: task t alone writes the elements of block ob
                    // of image n, from `region(n, ob)` (inside `output`).
                    task(buf, n, ob, unsafe { out.0.add(region(n, ob)) });
                    Ok(())
                },
            )
    } else {
        with_scratch::<f32, _>(scratch_len, |scratch| {
            // The padding positions must be zero; `pack` writes only the others.
            scratch[..ALIGN + buf_len].fill(0.0);
            for t in 0..tasks {
                let (n, ob) = (t / blocks, t % blocks);
                // SAFETY: as above, one task at a time.
                task(scratch, n, ob, unsafe { out.0.add(region(n, ob)) });
            }
        })
    }
}

/// What a block's stores fuse, in registers: the residual and a clamp
/// ([`Fused`], for one block).
#[derive(Clone, Copy)]
pub(super) struct Fuse {
    /// The block's residual, at the same offsets as its output (null: none).
    residual: *const f32,
    /// The bounds, `lo <= hi`.
    clamp: Option<(f32, f32)>,
}

impl Fuse {
    /// Stores `v` plus the residual, clamped, at `out + at`.
    ///
    /// # Safety
    /// AVX2; `out + at` valid for writes of `CB` elements, the residual (if
    /// any) for reads of as many at `at`.
    #[inline(always)]
    unsafe fn store(self, out: *mut f32, at: usize, mut v: __m256) {
        // SAFETY: the caller's contract.
        unsafe {
            if !self.residual.is_null() {
                v = _mm256_add_ps(v, _mm256_loadu_ps(self.residual.add(at)));
            }
            if let Some((lo, hi)) = self.clamp {
                v = crate::cpu::blocked::tile::clamp(v, _mm256_set1_ps(lo), _mm256_set1_ps(hi));
            }
            _mm256_storeu_ps(out.add(at), v);
        }
    }

    /// Stores the lanes of `v` that `mask` selects (each half one pixel's
    /// block), plus the residual, clamped, at `out + at`; the other lanes
    /// are neither read nor written.
    ///
    /// # Safety
    /// AVX-512F; the selected lanes of `out + at` valid for writes, of the
    /// residual (if any) for reads.
    #[inline(always)]
    pub(super) unsafe fn store_pair(self, out: *mut f32, at: usize, mask: u16, mut v: __m512) {
        // SAFETY: the caller's contract; masked lanes are not accessed.
        unsafe {
            if !self.residual.is_null() {
                v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, self.residual.add(at)));
            }
            if let Some((lo, hi)) = self.clamp {
                let (lo, hi) = (_mm512_set1_ps(lo), _mm512_set1_ps(hi));
                v = crate::cpu::blocked::tile::clamp512(v, lo, hi);
            }
            _mm512_mask_storeu_ps(out.add(at), mask, v);
        }
    }
}

/// Writes input pixel `(y, x)` of plane `srcs[l]` to
/// `buf[((top + y) * pw + left + x) * CB + l]`, 8 flat pixels of the 8
/// planes at a time; the padding positions are not written.
///
/// # Safety
/// AVX2 and FMA; each source has `in_h * in_w` elements and `buf`
/// `padded_h * pw * CB`.
#[target_feature(enable = "avx2,fma")]
pub(in crate::cpu::conv2d) unsafe fn pack(
    p: &Conv2dParams,
    pw: usize,
    srcs: &[&[f32]; CB],
    buf: &mut [f32],
) {
    let (in_w, top, left) = (p.in_w, p.padding.top, p.padding.left);
    let plane = p.in_h * in_w;
    let bp = buf.as_mut_ptr();
    // Flat input pixels walk the padded buffer's rows: `pos` is the buffer
    // pixel of the next flat pixel, which is at column `x`.
    let (mut x, mut pos) = (0, top * pw + left);
    let mut step = || {
        let at = pos;
        x += 1;
        pos += 1;
        if x == in_w {
            x = 0;
            pos += pw - in_w;
        }
        at * CB
    };
    let mut i = 0;
    // SAFETY (whole body): reads stay inside the planes (i + 8 <= plane),
    // writes at pixel positions of the padded buffer.
    unsafe {
        while i + 8 <= plane {
            let rows = std::array::from_fn(|l| _mm256_loadu_ps(srcs[l].as_ptr().add(i)));
            store_transposed(rows, std::array::from_fn(|_| bp.add(step())));
            i += 8;
        }
        for i in i..plane {
            let d = bp.add(step());
            for (l, s) in srcs.iter().enumerate() {
                *d.add(l) = *s.get_unchecked(i);
            }
        }
    }
}

/// Zeroes the padding positions of one block's padded buffer (`padded_h *
/// pw * CB` elements): what [`pack`] leaves unwritten, so a reused buffer
/// needs no full clear.
pub(in crate::cpu::conv2d) fn zero_borders(p: &Conv2dParams, pw: usize, buf: &mut [f32]) {
    let (top, left) = (p.padding.top, p.padding.left);
    let row = pw * CB;
    let inner = top + p.in_h;
    buf[..top * row].fill(0.0);
    buf[inner * row..p.padded_h() * row].fill(0.0);
    for y in top..inner {
        let r = &mut buf[y * row..][..row];
        r[..left * CB].fill(0.0);
        r[(left + p.in_w) * CB..].fill(0.0);
    }
}

/// Copies the block's input pixels (`in_h * in_w` of them, `stride`
/// elements apart in `src`, [`CB`] lanes each) into the padded buffer; the
/// padding positions are not written.
pub(in crate::cpu::conv2d) fn pack_pixels(
    p: &Conv2dParams,
    pw: usize,
    src: &[f32],
    stride: usize,
    buf: &mut [f32],
) {
    let row = p.in_w * CB;
    for y in 0..p.in_h {
        let dst = &mut buf[((p.padding.top + y) * pw + p.padding.left) * CB..][..row];
        if stride == CB {
            dst.copy_from_slice(&src[y * row..][..row]);
            continue;
        }
        for (x, d) in dst.chunks_exact_mut(CB).enumerate() {
            d.copy_from_slice(&src[(y * p.in_w + x) * stride..][..CB]);
        }
    }
}

/// `out[l][q] = bb[l] + sum over taps t of wb[t][l] * buf[base(q) + taps[t] + l]`
/// for the first `valid` lanes, where `base(q)` is the buffer offset of the
/// top-left input pixel of the window of flat output pixel `q`: [`R`]
/// pixels in registers at a time, written through an 8x8 transpose to
/// `valid` planes (`pixels` `None`: NCHW) or as they are, all `CB` lanes of
/// pixel `q` at `out + q * pixels` (blocked, NHWC), through `fuse`.
///
/// # Safety
/// AVX2 and FMA; `buf` packed for `p` (`geo.buf_len` elements), `wb`
/// `taps * CB`, `bb` `CB`; `out` valid for writes of `valid * out_h * out_w`
/// elements (NCHW) or of `CB` at each pixel's place, `fuse` as [`Fuse`]
/// says (nothing fused into NCHW); `1 <= valid <= CB`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn compute(
    p: &Conv2dParams,
    geo: &Geometry,
    buf: &[f32],
    wb: &[f32],
    bb: &[f32],
    out: *mut f32,
    valid: usize,
    pixels: Option<usize>,
    fuse: Fuse,
) {
    if let (Some(stride), 1 | 2) = (pixels, p.stride.1) {
        // SAFETY: the caller's contract.
        return unsafe { compute_rows(p, geo, buf, wb, bb, out, stride, fuse) };
    }
    let (ow, plane_out) = (p.out_w(), p.out_h() * p.out_w());
    let (sh, sw) = p.stride;
    let (bp, wp, op) = (buf.as_ptr(), wb.as_ptr(), out);
    // The flat output pixels walk the buffer: `pos` is the top-left of the
    // window of the next pixel, at output column `x`.
    let (mut x, mut pos) = (0, 0);
    let (row_step, col_step) = (sh * geo.pw * CB, sw * CB);
    // SAFETY (whole body): every window of an output pixel lies inside the
    // padded buffer; stores go to lanes < valid and pixels < plane_out of
    // `out`, through `tmp` when the block is partial.
    unsafe {
        let bias = _mm256_loadu_ps(bb.as_ptr());
        let mut q0 = 0;
        while q0 < plane_out {
            let n = R.min(plane_out - q0);
            // Past the last pixel: its window again.
            let mut base = [0usize; R];
            let mut last = pos;
            for b in base.iter_mut().take(n) {
                (*b, last) = (pos, pos);
                x += 1;
                pos += col_step;
                if x == ow {
                    x = 0;
                    pos += row_step - ow * col_step;
                }
            }
            base[n..].fill(last);
            let mut acc = [bias; R];
            for (t, &off) in geo.taps.iter().enumerate() {
                let w = _mm256_loadu_ps(wp.add(t * CB));
                for (a, &b) in acc.iter_mut().zip(&base) {
                    *a = _mm256_fmadd_ps(w, _mm256_loadu_ps(bp.add(b + off)), *a);
                }
            }
            if let Some(stride) = pixels {
                for (r, a) in acc.iter().take(n).enumerate() {
                    fuse.store(op, (q0 + r) * stride, *a);
                }
            } else if n == R && valid == CB {
                store_transposed(acc, std::array::from_fn(|l| op.add(l * plane_out + q0)));
            } else {
                let mut tmp = [[0.0f32; R]; CB];
                let tp = tmp.as_mut_ptr().cast::<f32>();
                store_transposed(acc, std::array::from_fn(|l| tp.add(l * R)));
                for (l, row) in tmp.iter().take(valid).enumerate() {
                    std::ptr::copy_nonoverlapping(row.as_ptr(), op.add(l * plane_out + q0), n);
                }
            }
            q0 += R;
        }
    }
}

/// [`compute`] for output pixels `stride` elements apart (blocked, NHWC)
/// and a column stride of 1 or 2: each output row in groups of equal size,
/// at most [`R`] pixels ([`equal_tiles`]: 2 of 7 for a row of 14), whose
/// windows are a constant distance apart in the buffer, so that each tap
/// reads the group's pixels at constant offsets from one pointer. (The
/// flat groups of [`compute`] cross rows, and load each pixel's window
/// offset anew for every tap: as many loads again as the FMAs take.)
///
/// # Safety
/// As [`compute`], with `pixels` `Some(stride)`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn compute_rows(
    p: &Conv2dParams,
    geo: &Geometry,
    buf: &[f32],
    wb: &[f32],
    bb: &[f32],
    out: *mut f32,
    stride: usize,
    fuse: Fuse,
) {
    /// `N` output pixels from the window at `first`, `SW` buffer pixels
    /// apart, stored from `out + at`, `stride` apart.
    #[inline(always)]
    unsafe fn group<const N: usize, const SW: usize>(
        first: *const f32,
        taps: &[usize],
        wp: *const f32,
        bias: __m256,
        (out, at, stride): (*mut f32, usize, usize),
        fuse: Fuse,
    ) {
        // SAFETY: the caller's contract (compute_rows').
        unsafe {
            let mut acc = [bias; N];
            for (t, &off) in taps.iter().enumerate() {
                let w = _mm256_loadu_ps(wp.add(t * CB));
                let x = first.add(off);
                for (r, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(w, _mm256_loadu_ps(x.add(r * SW * CB)), *a);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                fuse.store(out, at + r * stride, *a);
            }
        }
    }
    let (oh, ow) = (p.out_h(), p.out_w());
    let (sh, sw) = p.stride;
    let (kh, kw) = (p.kernel_h, p.kernel_w);
    let (bp, wp) = (buf.as_ptr(), wb.as_ptr());
    let taps = &geo.taps[..];
    let row_step = p.dilation.0 * geo.pw * CB;
    // Kernels whose rows reuse their loads: undilated along the rows, 3, 5
    // or 7 wide, stride 1 (0: none; with stride 2 the unrolled loop, twice
    // as long, ran 1.6-1.75x slower than `group`).
    let kw_reuse = if p.dilation.1 == 1 && sw == 1 && matches!(kw, 3 | 5 | 7) {
        kw
    } else {
        0
    };
    // SAFETY (whole body): every window of an output pixel lies inside the
    // padded buffer; stores go to the row's pixels of `out`.
    unsafe {
        let bias = _mm256_loadu_ps(bb.as_ptr());
        for y in 0..oh {
            let row = bp.add(y * sh * geo.pw * CB);
            for (x0, n) in crate::cpu::blocked::tile::equal_tiles(ow, R) {
                let first = row.add(x0 * sw * CB);
                let o = (out, (y * ow + x0) * stride, stride);
                macro_rules! dispatch {
                    ($($n:literal)*) => {
                        match (n, sw, kw_reuse) {
                            $(($n, 1, 3) => reuse::<$n, 3>(first, CB, (kh, row_step), wp, bias, o, fuse),
                              ($n, 1, 5) => reuse::<$n, 5>(first, CB, (kh, row_step), wp, bias, o, fuse),
                              ($n, 1, 7) => reuse::<$n, 7>(first, CB, (kh, row_step), wp, bias, o, fuse),
                              ($n, 1, _) => group::<$n, 1>(first, taps, wp, bias, o, fuse),
                              ($n, _, _) => group::<$n, 2>(first, taps, wp, bias, o, fuse),)*
                            _ => unreachable!("a group of {n} pixels"),
                        }
                    };
                }
                dispatch!(1 2 3 4 5 6 7 8);
            }
        }
    }
}

/// `N` output pixels of stride 1, one after the other along a row, of a
/// kernel `KW` wide, undilated along the rows, from the window at `first`
/// (input pixels `ps` elements apart, `kh` tap rows `row_step` apart, the
/// first row's weights at `wp`), stored from `out + at`, `stride` apart,
/// through `fuse`. Each input pixel of a tap row is loaded once and
/// multiplied by the row's weights (in registers) for every output pixel
/// whose window holds it, not loaded once per tap: 3x3, 7 pixels a row take
/// 9 loads for 21 FMAs, not 21.
///
/// # Safety
/// AVX2 and FMA; the windows inside the input, the stores inside `out`,
/// `fuse` as [`Fuse`] says.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn reuse<const N: usize, const KW: usize>(
    first: *const f32,
    ps: usize,
    (kh, row_step): (usize, usize),
    wp: *const f32,
    bias: __m256,
    (out, at, stride): (*mut f32, usize, usize),
    fuse: Fuse,
) {
    // SAFETY: the caller's contract.
    unsafe {
        let mut acc = [bias; N];
        for ky in 0..kh {
            let x = first.add(ky * row_step);
            let w: [__m256; KW] =
                std::array::from_fn(|kx| _mm256_loadu_ps(wp.add((ky * KW + kx) * CB)));
            for j in 0..N + KW - 1 {
                let v = _mm256_loadu_ps(x.add(j * ps));
                for (kx, w) in w.iter().enumerate() {
                    if j >= kx && j - kx < N {
                        acc[j - kx] = _mm256_fmadd_ps(*w, v, acc[j - kx]);
                    }
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            fuse.store(out, at + r * stride, *a);
        }
    }
}

/// The output of one channel block straight from its input pixels `src`
/// (`in_h * in_w` of them, `stride` elements apart, [`CB`] lanes each), with
/// no padded copy: taps outside the input are skipped. The output pixels go
/// as far apart from `out`. Each output row's interior (every tap's
/// column inside the input) runs [`R`] pixels in registers at a time, the
/// last group shifted back to end at the interior's end (it recomputes a
/// few pixels, identically); border pixels run one at a time. Stores go
/// through `fuse`. With `pairs` (AVX-512), stride-1 interiors of blocked
/// input take [`super::pairs::row`] instead.
///
/// # Safety
/// AVX2 and FMA, and AVX-512F where `pairs`; `src` holds those pixels, `wb`
/// `taps * CB`, `bb` `CB`,
/// `out` is valid for writes of `CB` elements at each of the `out_h *
/// out_w` pixels' places, `fuse` as [`Fuse`] says.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn compute_direct(
    p: &Conv2dParams,
    src: &[f32],
    stride: usize,
    wb: &[f32],
    bb: &[f32],
    out: *mut f32,
    fuse: Fuse,
    pairs: bool,
) {
    let (oh, ow) = (p.out_h(), p.out_w());
    let (sh, sw) = p.stride;
    let (dh, dw) = p.dilation;
    let (kh, kw) = (p.kernel_h, p.kernel_w);
    let (in_h, in_w) = (p.in_h as isize, p.in_w as isize);
    let (top, left) = (p.padding.top as isize, p.padding.left as isize);
    // Interior columns: x * sw - left >= 0 and x * sw + (kw - 1) * dw - left < in_w.
    let x_lo = (p.padding.left.div_ceil(sw)).min(ow);
    let reach = ((kw - 1) * dw) as isize;
    let x_hi = if in_w - 1 - reach + left < 0 {
        x_lo
    } else {
        (((in_w - 1 - reach + left) as usize) / sw + 1).clamp(x_lo, ow)
    };
    let (sp, wp, op) = (src.as_ptr(), wb.as_ptr(), out);
    let ps = stride;
    // SAFETY (whole body): every load is of a pixel inside the input (rows
    // and columns checked, or interior), every store of a pixel of `out`.
    unsafe {
        let bias = _mm256_loadu_ps(bb.as_ptr());
        // The input row of tap row `ky` for output row `y` (inside the input).
        let row = |y: usize, ky: usize| {
            sp.add(((y * sh + ky * dh) as isize - top) as usize * p.in_w * ps)
        };
        let pixel = |x: usize, y: usize, kys: std::ops::Range<usize>| {
            let mut acc = bias;
            for ky in kys {
                for kx in 0..kw {
                    let ix = (x * sw + kx * dw) as isize - left;
                    if ix >= 0 && ix < in_w {
                        let w = _mm256_loadu_ps(wp.add((ky * kw + kx) * CB));
                        let v = _mm256_loadu_ps(row(y, ky).offset(ix * ps as isize));
                        acc = _mm256_fmadd_ps(w, v, acc);
                    }
                }
            }
            acc
        };
        for y in 0..oh {
            // The tap rows inside the input: iy = y * sh + ky * dh - top in [0, in_h).
            let y0 = (y * sh) as isize - top;
            let ky0 = if y0 >= 0 { 0 } else { (-y0) as usize }.div_ceil(dh);
            let ky1 = if y0 >= in_h {
                0
            } else {
                ((in_h - y0) as usize).div_ceil(dh)
            };
            let kys = ky0.min(kh)..ky1.min(kh);
            let orow = y * ow * ps;
            for x in (0..x_lo).chain(x_hi..ow) {
                fuse.store(op, orow + x * ps, pixel(x, y, kys.clone()));
            }
            let run = x_hi - x_lo;
            let pair_stride = sw == 1 || (sw == 2 && super::pairs::pairs_stride2(kw, dw));
            if pairs && pair_stride && ps == CB && run >= 2 * super::pairs::A && !kys.is_empty() {
                // The first interior pixel's read of tap (kys.start, 0).
                let first = row(y, kys.start).offset(((x_lo * sw) as isize - left) * CB as isize);
                let (step, at) = (dh * p.in_w * CB, orow + x_lo * CB);
                // SAFETY: AVX-512 (`pairs`); the run's taps are interior
                // pixels of rows `kys`, `dh` input rows apart; its outputs
                // are pixels of `out`.
                super::pairs::row(first, step, kys, (kw, sw, dw), wb, bb, (op, at), run, fuse);
                continue;
            }
            if run < R {
                for x in x_lo..x_hi {
                    fuse.store(op, orow + x * ps, pixel(x, y, kys.clone()));
                }
                continue;
            }
            let mut x0 = x_lo;
            if sw == 1 && dw == 1 && matches!(kw, 3 | 5 | 7) {
                let (ky0, rows) = (kys.start, kys.len());
                let w0 = wp.add(ky0 * kw * CB);
                loop {
                    let first = row(y, ky0).offset((x0 as isize - left) * ps as isize);
                    let o = (op, orow + x0 * ps, ps);
                    let rows = (rows, dh * p.in_w * ps);
                    match kw {
                        3 => reuse::<R, 3>(first, ps, rows, w0, bias, o, fuse),
                        5 => reuse::<R, 5>(first, ps, rows, w0, bias, o, fuse),
                        _ => reuse::<R, 7>(first, ps, rows, w0, bias, o, fuse),
                    }
                    if x0 + R == x_hi {
                        break;
                    }
                    x0 = (x0 + R).min(x_hi - R);
                }
                continue;
            }
            loop {
                let mut acc = [bias; R];
                for ky in kys.clone() {
                    // The first pixel's input column for tap 0, in elements.
                    let base = row(y, ky).offset(((x0 * sw) as isize - left) * ps as isize);
                    for kx in 0..kw {
                        let w = _mm256_loadu_ps(wp.add((ky * kw + kx) * CB));
                        let tap = base.add(kx * dw * ps);
                        for (r, a) in acc.iter_mut().enumerate() {
                            *a = _mm256_fmadd_ps(w, _mm256_loadu_ps(tap.add(r * sw * ps)), *a);
                        }
                    }
                }
                for (r, a) in acc.iter().enumerate() {
                    fuse.store(op, orow + (x0 + r) * ps, *a);
                }
                if x0 + R == x_hi {
                    break;
                }
                x0 = (x0 + R).min(x_hi - R);
            }
        }
    }
}
