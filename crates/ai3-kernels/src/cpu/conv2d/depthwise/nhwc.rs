//! Depthwise convolution of channels-last (NHWC) f32 input on AVX-512, stride
//! 1, for 3-, 5- and 7-wide kernels: ConvNeXt's 7x7 layers, whose input
//! reaches a swapped layer channels last.
//!
//! In NHWC a pixel's channels are consecutive, so one zmm register holds 16
//! channels of one pixel and every tap is a plain multiply-accumulate, with
//! no shuffles. A task takes a band of output rows of one image and up to
//! [`MAX_GROUP`] of its channels: it copies the band's input rows, those
//! channels only, into a zero-padded buffer (so no pixel needs bounds
//! checks, whatever the plane's width), each vector of 16 channels as a
//! plane of its own, then computes one vector's output rows after the
//! other, [`R`] output pixels of a row in registers at a time. Each tap
//! row's `R + K - 1` input vectors are loaded once and serve all `K` taps
//! of that row; the vector's `K` rows of input that a row of output reads
//! are contiguous (`K` times the padded width, 64 bytes a pixel: 27 KB at
//! 56 pixels plus padding), so they stay in L1 for the next output row,
//! which reads `K - 1` of them again.
//!
//! Measured on an Intel Xeon with AVX-512 (the kernel alone, two threads,
//! 7 paired rounds, ConvNeXt's four 7x7 shapes at batch 10 and 1), the
//! planes and the vector-first order took 0.91x the time (geometric mean)
//! of one buffer of interleaved pixels computed row by row (every vector of
//! a row, then the next row), which read each output row's input from L2:
//! 768 channels at 7x7, batch 10, 0.80x; 384 at 14x14 0.93x; 96 at 56x56
//! 0.91x. The vector-first order on the interleaved buffer took
//! 0.92-0.96x (two runs).
//!
//! The AVX2 path ([`super::blocked`]) runs 8 channels a register, a block at
//! a time over the whole plane. ConvNeXt's layers, batch 10, 2 threads,
//! swapped (PyTorch 1.13, 0.71, 0.36 and 0.19 ms): 96 channels 56x56 2.9 ->
//! 1.3 ms, 192 at 28x28 1.6 -> 0.58, 384 at 14x14 0.60 (in the network) ->
//! 0.35, 768 at 7x7 0.45 -> 0.21 (whole rows of 7 in registers; in runs of
//! 4, 2 and 1, 0.32).

use std::arch::x86_64::*;

use rayon::prelude::*;

use super::super::{threads_for_macs, SharedMut};
use super::MAC_COST;
use crate::alloc::KernelResult;
use crate::cpu::blocked::BLOCK as CB;
use crate::cpu::scratch::with_scratch_named;
use crate::params::Conv2dParams;

/// Lanes of a register: channels per vector.
const V: usize = 16;

/// Output pixels accumulated in registers at once.
const R: usize = 8;

/// Channels per task, at most: its buffer holds a plane per vector of them.
const MAX_GROUP: usize = 128;

/// Bytes of padded input rows a task copies, at most (half a core's L2). A
/// band's first `kh - 1` rows are copied for its windows only, so short
/// bands copy much more than they compute on.
const BAND_BYTES: usize = 512 * 1024;

/// Whether [`conv2d`] takes `p` (a depthwise layer with multiplier 1, the
/// caller checks): AVX-512F here, stride and dilation 1, a 3-, 5- or 7-wide
/// kernel and a multiple of 16 channels.
pub(super) fn applies(p: &Conv2dParams) -> bool {
    crate::isa::avx512()
        && p.stride == (1, 1)
        && p.dilation == (1, 1)
        && matches!(p.kernel_w, 3 | 5 | 7)
        && p.out_channels.is_multiple_of(V)
}

/// How a layer splits into tasks: channel groups and bands of output rows.
struct Split {
    /// Channels of every group but maybe the last (a multiple of [`V`]).
    group: usize,
    /// Channel groups.
    groups: usize,
    /// Output rows of every band but maybe the last.
    band: usize,
    /// Bands.
    bands: usize,
}

impl Split {
    fn new(p: &Conv2dParams) -> Self {
        let c = p.out_channels;
        let groups = c.div_ceil(MAX_GROUP);
        // Equal groups, each a whole number of vectors.
        let group = (c / V).div_ceil(groups) * V;
        let groups = c.div_ceil(group);
        let row_bytes = p.padded_w() * group * size_of::<f32>();
        let oh = p.out_h();
        let most = (BAND_BYTES / row_bytes.max(1))
            .saturating_sub(p.kernel_h - 1)
            .clamp(1, oh.max(1));
        let mut bands = oh.div_ceil(most);
        // Enough tasks for the threads, when the layer has the rows.
        let want = 2 * rayon::current_num_threads();
        if p.batch * groups * bands < want {
            bands = want.div_ceil(p.batch * groups).min(oh.max(1));
        }
        // Bands of equal height, give or take a row.
        let band = oh.div_ceil(bands).max(1);
        Split {
            group,
            groups,
            band,
            bands: oh.div_ceil(band),
        }
    }
}

/// The NHWC depthwise convolution of `p` ([`applies`]; buffers checked by the
/// caller): `input` `[batch][in_h][in_w][c]`, `output` `[batch][out_h][out_w][c]`,
/// `packed` the weights and bias as [`super::pack_blocked`] packs them. A
/// refused scratch allocation fails the call.
pub(super) fn conv2d(
    p: &Conv2dParams,
    input: &[f32],
    packed: &[f32],
    output: &mut [f32],
) -> KernelResult<()> {
    assert!(applies(p), "NHWC depthwise convolution: AVX-512F, stride 1");
    let (oh, ow, c) = (p.out_h(), p.out_w(), p.out_channels);
    if oh * ow == 0 || p.batch == 0 {
        return Ok(());
    }
    let split = Split::new(p);
    let split = &split;
    let taps = p.kernel_h * p.kernel_w;
    let rows = split.band + p.kernel_h - 1;
    let buf_len = rows * p.padded_w() * split.group;
    let scratch_len = buf_len + (taps + 1) * split.group;
    let out = SharedMut(output.as_mut_ptr());
    let out = &out;
    let task = |scratch: &mut [f32], t: usize| {
        let (n, rest) = (
            t / (split.groups * split.bands),
            t % (split.groups * split.bands),
        );
        let (g, b) = (rest / split.bands, rest % split.bands);
        let c0 = g * split.group;
        let cg = split.group.min(c - c0);
        let y0 = b * split.band;
        let y1 = (y0 + split.band).min(oh);
        let (buf, weights) = scratch.split_at_mut(buf_len);
        gather_weights(p, packed, c0, cg, weights);
        gather_rows(p, input, n, c0, cg, y0..y1, buf);
        // SAFETY: AVX-512F (`applies`, asserted); `buf` holds rows `y0 ..
        // y1 + kh - 1` of the padded input, `cg` channels a pixel;
        // `weights` a `cg`-vector per tap and the bias; `applies` keeps
        // the kernel width 3, 5 or 7; the task writes
        // rows `y0..y1` of image `n`, channels `c0..c0 + cg`, inside `output`.
        unsafe {
            let first = out.0.add((n * oh + y0) * ow * c + c0);
            let count = y1 - y0;
            match p.kernel_w {
                3 => band_k::<3>(p, buf, cg, weights, count, first),
                5 => band_k::<5>(p, buf, cg, weights, count, first),
                _ => band_k::<7>(p, buf, cg, weights, count, first),
            }
        }
    };
    let tasks = p.batch * split.groups * split.bands;
    // Per-thread scratch, reused: every element a task reads it writes first.
    let run =
        |t: usize| with_scratch_named::<f32, _>(scratch_len, "NHWC depthwise band", |s| task(s, t));
    if threads_for_macs(p.macs().saturating_mul(MAC_COST)) > 1 && tasks > 1 {
        (0..tasks).into_par_iter().try_for_each(run)
    } else {
        (0..tasks).try_for_each(run)
    }
}

/// Channels `c0..c0 + cg` of the packed weights (blocks of [`CB`] lanes,
/// see [`super::pack_blocked`]) as a `cg`-vector per tap, then the bias.
fn gather_weights(p: &Conv2dParams, packed: &[f32], c0: usize, cg: usize, dst: &mut [f32]) {
    let taps = p.kernel_h * p.kernel_w;
    let block = (taps + 1) * CB;
    for ob in c0 / CB..(c0 + cg) / CB {
        let src = &packed[ob * block..][..block];
        let lane = ob * CB - c0;
        for (t, w) in src.chunks_exact(CB).enumerate() {
            dst[t * cg + lane..][..CB].copy_from_slice(w);
        }
    }
}

/// Copies padded input rows `rows.start .. rows.end + kh - 1` of image `n`,
/// channels `c0..c0 + cg`, into `buf`, zeros where the padding is: each
/// vector of [`V`] channels as a plane of its own (`kh - 1 + rows.len()`
/// rows of `padded_w` pixels of `V` values), the planes one after the other.
fn gather_rows(
    p: &Conv2dParams,
    input: &[f32],
    n: usize,
    c0: usize,
    cg: usize,
    rows: std::ops::Range<usize>,
    buf: &mut [f32],
) {
    let c = p.in_channels;
    let pw = p.padded_w();
    let (left, width) = (p.padding.left * V, p.in_w * V);
    let image = &input[n * p.in_h * p.in_w * c..][..p.in_h * p.in_w * c];
    let count = rows.len() + p.kernel_h - 1;
    for (j, plane) in buf
        .chunks_exact_mut(count * pw * V)
        .take(cg / V)
        .enumerate()
    {
        let lanes = c0 + j * V;
        for (i, dst) in plane.chunks_exact_mut(pw * V).enumerate() {
            let iy = (rows.start + i) as isize - p.padding.top as isize;
            if iy < 0 || iy >= p.in_h as isize {
                dst.fill(0.0);
                continue;
            }
            let src = &image[iy as usize * p.in_w * c..][..p.in_w * c];
            let (pad_l, rest) = dst.split_at_mut(left);
            let (mid, pad_r) = rest.split_at_mut(width);
            pad_l.fill(0.0);
            pad_r.fill(0.0);
            for (d, s) in mid.chunks_exact_mut(V).zip(src.chunks_exact(c)) {
                d.copy_from_slice(&s[lanes..lanes + V]);
            }
        }
    }
}

/// Output rows `0..rows` of a band of `cg` channels from its padded input
/// rows `buf` (a plane per vector of channels), into `out` (the band's
/// first pixel, channel `c0`; pixels `out_channels` apart): all the rows
/// of one vector, then the next vector's.
///
/// # Safety
/// AVX-512F; `buf` as [`gather_rows`] fills it, `weights` as
/// [`gather_weights`]; `out` valid for writes of `cg` elements at each of
/// the band's `rows * out_w` pixels; `p.kernel_w == K`.
#[target_feature(enable = "avx512f")]
unsafe fn band_k<const K: usize>(
    p: &Conv2dParams,
    buf: &[f32],
    cg: usize,
    weights: &[f32],
    rows: usize,
    out: *mut f32,
) {
    let (ow, c, kh) = (p.out_w(), p.out_channels, p.kernel_h);
    let row = p.padded_w() * V;
    let plane = (rows + kh - 1) * row;
    let taps = kh * K;
    let (bp, wp) = (buf.as_ptr(), weights.as_ptr());
    // SAFETY (whole body): output pixel x of row y reads buffer rows y ..
    // y + kh, pixels x .. x + K (inside the padded rows), and writes its
    // `cg` channels in `out`.
    unsafe {
        for v in (0..cg).step_by(V) {
            for y in 0..rows {
                let bias = _mm512_loadu_ps(wp.add(taps * cg + v));
                let src = bp.add((v / V) * plane + y * row);
                let dst = out.add(y * ow * c + v);
                let at = Run {
                    src,
                    row,
                    pixel: V,
                    tap: cg,
                    weights: wp.add(v),
                    kh,
                    bias,
                    out: dst,
                    out_pixel: c,
                };
                if ow >= R {
                    let mut x = 0;
                    loop {
                        at.pixels::<K, R>(x);
                        if x + R == ow {
                            break;
                        }
                        x = (x + R).min(ow - R);
                    }
                } else {
                    // A whole row in registers (ConvNeXt's last stage: 7).
                    match ow {
                        7 => at.pixels::<K, 7>(0),
                        6 => at.pixels::<K, 6>(0),
                        5 => at.pixels::<K, 5>(0),
                        4 => at.pixels::<K, 4>(0),
                        3 => at.pixels::<K, 3>(0),
                        2 => at.pixels::<K, 2>(0),
                        _ => at.pixels::<K, 1>(0),
                    }
                }
            }
        }
    }
}

/// One output row's vector of channels: where it reads and writes.
#[derive(Clone, Copy)]
struct Run {
    /// Buffer pixel (0, 0) of the row's windows, at the vector's channels.
    src: *const f32,
    /// Elements between buffer rows.
    row: usize,
    /// Elements between buffer pixels.
    pixel: usize,
    /// Tap 0's weights for the vector; the next tap's are `tap` elements on.
    weights: *const f32,
    /// Elements between taps' weights.
    tap: usize,
    /// Kernel rows.
    kh: usize,
    bias: __m512,
    /// Output pixel 0 of the row, at the vector's channels.
    out: *mut f32,
    /// Elements between output pixels.
    out_pixel: usize,
}

impl Run {
    /// Output pixels `x..x + N` of `K`-wide taps, in registers.
    ///
    /// # Safety
    /// AVX-512F; the pixels' windows inside the buffer, the pixels inside
    /// the output (see [`band_k`]); `N + K - 1 <= 16`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn pixels<const K: usize, const N: usize>(self, x: usize) {
        // SAFETY: the caller's contract.
        unsafe {
            let mut acc = [self.bias; N];
            for ky in 0..self.kh {
                let s = self.src.add(ky * self.row + x * self.pixel);
                let mut xs = [_mm512_setzero_ps(); 16];
                for (j, v) in xs.iter_mut().enumerate().take(N + K - 1) {
                    *v = _mm512_loadu_ps(s.add(j * self.pixel));
                }
                for kx in 0..K {
                    let w = _mm512_loadu_ps(self.weights.add((ky * K + kx) * self.tap));
                    for (r, a) in acc.iter_mut().enumerate() {
                        *a = _mm512_fmadd_ps(xs[r + kx], w, *a);
                    }
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(self.out.add((x + r) * self.out_pixel), *a);
            }
        }
    }
}
