//! AVX-512 inner loops of the blocked depthwise convolution (see
//! [`super::blocked`]) for stride-1 layers with blocked output: one zmm
//! register holds two neighbouring output pixels' [`CB`] channels, so each
//! tap's multiply-accumulate covers two pixels (the AVX2 loops take one per
//! ymm register). With stride 1, two neighbouring output pixels read two
//! neighbouring input pixels at every tap, which are one 64-byte load in the
//! blocked layout.
//!
//! Two shapes of loop:
//! - [`padded`] walks the padded input buffer's grid: output pixel `(y, x)`
//!   of the grid is the one whose window starts at buffer pixel `y * pw +
//!   x`, so consecutive grid pixels read consecutive buffer pixels, rows
//!   included. The grid is `pw` wide where the output is `out_w`; its
//!   `pw - out_w` extra columns per row are computed and not stored (a
//!   [`PairStore`] plan says where each pair goes). 14x14 3x3: 16 columns
//!   computed for 14.
//! - [`row`] runs one output row's interior straight from the input (no
//!   padded copy, wide planes).
//!
//! Both keep [`A`] registers of sums, shifting the last group of a run back
//! to end at the run's end (its first pixels are recomputed, identically).
//!
//! Against the AVX2 loops (two threads, the depthwise node of 1x1 +
//! depthwise + 1x1 with ReLU6, `Model.profile`): 3x3 kernels, 384 channels
//! at 14x14 16.5 -> 12.5 us, 960 at 7x7 14.4 -> 11.0, 192 at 28x28 29.7 ->
//! 24.9, 144 at 56x56 75.7 -> 49.6 (in place); 5x5 kernels, 672 at 14x14
//! 47.4 -> 41.7, 240 at 28x28 73.4 -> 62.5; 7x7, 96 at 56x56 246 -> 191.
//! mobilenet_v2 batch 1: 2.12 -> 1.94 ms.

use std::arch::x86_64::*;

use super::blocked::Fuse;
use crate::cpu::blocked::BLOCK as CB;
use crate::params::Conv2dParams;

/// zmm registers of sums: `2 * A` output pixels at a time (enough
/// independent sums to cover the FMA latency on both FMA pipes).
pub(super) const A: usize = 12;

/// Elements of one pair of pixels.
const PAIR: usize = 2 * CB;

/// Where [`padded`] stores one pair of grid pixels: the output pixel of the
/// register's low half (its high half is the next output pixel) and which
/// halves are output pixels (`0x00ff` low, `0xff00` high, both, or none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PairStore {
    at: u32,
    mask: u16,
}

/// The store plan of [`padded`] for a stride-1 layer whose padded buffer is
/// `pw` pixels wide: one entry per pair of grid pixels, up to the last
/// output pixel (an even count of grid pixels). `None` when the layer is not
/// stride 1, too small for one group of `2 * A` pixels, or, for kernels
/// whose taps do not share loads ([`shares_loads`]), its grid has more than
/// a third more columns than its output (the AVX2 loop is then as fast or
/// faster: 7x7 planes, 5x5 kernels 28.5 -> 31.1 us, 7x7 kernels 32.1 ->
/// 36.1, before loads were shared; with them, 16.7 and 20.0 against the
/// AVX2 loop's 25.2 and 27.5).
pub(super) fn plan(p: &Conv2dParams, pw: usize) -> Option<Vec<PairStore>> {
    let (oh, ow) = (p.out_h(), p.out_w());
    let wide_grid = 3 * pw > 4 * ow && !shares_loads(p.kernel_w, p.dilation.1);
    if p.stride != (1, 1) || oh == 0 || ow == 0 || wide_grid {
        return None;
    }
    // Grid pixels up to and including the last output pixel, rounded up.
    let pixels = ((oh - 1) * pw + ow).next_multiple_of(2);
    if pixels < 2 * A || u32::try_from(oh * ow).is_err() {
        return None;
    }
    // The output pixel of each grid pixel in turn, walked without a
    // division per pixel: the plan is built on every call, before the
    // blocks' tasks start (a 28x28 plane: 419 pairs).
    let (mut y, mut x) = (0, 0);
    let mut output = || {
        let at = (y < oh && x < ow).then_some(y * ow + x);
        x += 1;
        if x == pw {
            (y, x) = (y + 1, 0);
        }
        at
    };
    let stores = (0..pixels / 2)
        .map(|_| {
            let (lo, hi) = (output(), output());
            let (at, mask) = match (lo, hi) {
                (Some(a), b) => {
                    // Both output pixels: neighbours in the output as well
                    // (the same row, or rows with no extra columns).
                    debug_assert!(b.is_none() || b == Some(a + 1));
                    (a, if b.is_some() { 0xffff } else { 0x00ff })
                }
                // A row's first pixel after the grid's extra columns.
                (None, Some(b)) => (b - 1, 0xff00),
                (None, None) => (0, 0),
            };
            PairStore {
                at: at as u32,
                mask,
            }
        })
        .collect();
    Some(stores)
}

/// A block's 8-lane vector at `src` in both halves of a zmm register.
///
/// # Safety
/// AVX-512F; `src` valid for reads of [`CB`] elements.
#[inline(always)]
unsafe fn both_halves(src: *const f32) -> __m512 {
    // SAFETY: the caller's contract.
    unsafe {
        let v = _mm512_castps256_ps512(_mm256_loadu_ps(src));
        _mm512_shuffle_f32x4::<0b01_00_01_00>(v, v)
    }
}

/// One tap row of a kernel `K` wide (odd), dilation 1, into the sums of
/// `A` pairs of pixels: `src` is where pair 0 reads tap 0, `w` the row's
/// `K` weight vectors. Even taps `2m` of pair `a` are the pair of pixels
/// `a + m` from `src`, odd taps the middle of pairs `a + m` and `a + m + 1`
/// (one shuffle): `A + K / 2` aligned loads where one load per tap and pair
/// would take `K * A`, half of them split across two cache lines. Two
/// threads, 3x3: 384 channels at 14x14 12.2 -> 9.6 us, 960 at 7x7 9.7 ->
/// 7.5, 192 at 28x28 22.9 -> 17.6, 144 at 56x56 50.6 -> 40.9; 5x5: 240 at
/// 28x28 68 -> 45, 672 at 14x14 41 -> 27; 7x7: 96 at 56x56 194 -> 166, 240
/// at 28x28 105 -> 76.
///
/// # Safety
/// AVX-512F; `src` valid for reads of `(A + K / 2) * PAIR` elements, `w` of
/// `K * CB`.
#[inline(always)]
unsafe fn row_taps<const K: usize>(acc: &mut [__m512; A], src: *const f32, w: *const f32) {
    // SAFETY: the caller's contract.
    unsafe {
        let w: [__m512; K] = std::array::from_fn(|k| both_halves(w.add(k * CB)));
        let load = |j: usize| _mm512_loadu_ps(src.add(j * PAIR));
        for (a, s) in acc.iter_mut().enumerate() {
            for m in 0..K / 2 {
                let (lo, hi) = (load(a + m), load(a + m + 1));
                // Pixels 2(a + m) + 1 and 2(a + m) + 2: the high half of
                // one load, the low half of the next.
                let mid = _mm512_shuffle_f32x4::<0b01_00_11_10>(lo, hi);
                *s = _mm512_fmadd_ps(w[2 * m], lo, *s);
                *s = _mm512_fmadd_ps(w[2 * m + 1], mid, *s);
            }
            *s = _mm512_fmadd_ps(w[K - 1], load(a + K / 2), *s);
        }
    }
}

/// Whether a tap row of a kernel `kw` wide with dilation `dw` shares loads
/// ([`row_taps`]): 3, 5 or 7 wide, no dilation.
pub(super) fn shares_loads(kw: usize, dw: usize) -> bool {
    dw == 1 && matches!(kw, 3 | 5 | 7)
}

/// Runs one tap row on [`row_taps`] when the kernel [`shares_loads`]
/// (arguments as there); whether it did.
///
/// # Safety
/// As [`row_taps`].
#[inline(always)]
unsafe fn shared_row(
    (kw, dw): (usize, usize),
    acc: &mut [__m512; A],
    src: *const f32,
    w: *const f32,
) -> bool {
    // SAFETY: the caller's contract.
    unsafe {
        match (kw, dw) {
            (3, 1) => row_taps::<3>(acc, src, w),
            (5, 1) => row_taps::<5>(acc, src, w),
            (7, 1) => row_taps::<7>(acc, src, w),
            _ => return false,
        }
    }
    true
}

/// Whether a tap row of a kernel `kw` wide with dilation `dw` runs with
/// stride 2 on pairs ([`taps_stride2`]): 3 or 5 wide, no dilation.
pub(super) fn pairs_stride2(kw: usize, dw: usize) -> bool {
    dw == 1 && matches!(kw, 3 | 5)
}

/// One tap row of a kernel `K` wide (odd), dilation 1, stride 2, into the
/// sums of `N` pairs: pair `a` (output pixels `2a` and `2a + 1`) reads
/// input pixels `4a + kx` and `4a + 2 + kx` from `src`. Tap `kx` is the low
/// (even `kx`) or high (odd) halves of aligned loads `2a + kx / 2` and the
/// one after, gathered by one shuffle: `K / 2 + 2` loads a pair, two of
/// them new. The last load reads its low half only: the pixel after it
/// may lie past the input (or the padded buffer).
///
/// # Safety
/// AVX-512F; `src` valid for reads of `(4 * N + K - 2) * CB` elements, `w`
/// of `K * CB`.
#[inline(always)]
unsafe fn taps_stride2<const K: usize, const N: usize>(
    acc: &mut [__m512; N],
    src: *const f32,
    w: *const f32,
) {
    // SAFETY: the caller's contract (the last load is masked to its low
    // pixel, the `4 * N + K - 3`-th).
    unsafe {
        let w: [__m512; K] = std::array::from_fn(|k| both_halves(w.add(k * CB)));
        let last = 2 * N - 1 + K / 2;
        let load = |j: usize| match j {
            j if j == last => _mm512_maskz_loadu_ps(0x00ff, src.add(j * PAIR)),
            j => _mm512_loadu_ps(src.add(j * PAIR)),
        };
        for (a, s) in acc.iter_mut().enumerate() {
            // The pair's K / 2 + 2 loads (at most 4: K is 3 or 5), each once.
            let l: [__m512; 4] = std::array::from_fn(|i| {
                if i < K / 2 + 2 {
                    load(2 * a + i)
                } else {
                    _mm512_setzero_ps()
                }
            });
            for (kx, w) in w.iter().enumerate() {
                let (l0, l1) = (l[kx / 2], l[kx / 2 + 1]);
                let v = if kx % 2 == 0 {
                    _mm512_shuffle_f32x4::<0b01_00_01_00>(l0, l1)
                } else {
                    _mm512_shuffle_f32x4::<0b11_10_11_10>(l0, l1)
                };
                *s = _mm512_fmadd_ps(*w, v, *s);
            }
        }
    }
}

/// [`taps_stride2`] for `K = 3`, its loads and shuffles written out: the
/// generic loop measured 1.07-1.14x this one's time on 144 channels at
/// 56x56 (in place).
///
/// # Safety
/// As [`taps_stride2`] with `K = 3`.
#[inline(always)]
unsafe fn three_taps_stride2<const N: usize>(
    acc: &mut [__m512; N],
    src: *const f32,
    w: *const f32,
) {
    // SAFETY: the caller's contract (the last load is masked to its low
    // pixel, the `4 * N + 1`-th).
    unsafe {
        let w: [__m512; 3] = std::array::from_fn(|k| both_halves(w.add(k * CB)));
        let load = |j: usize| match j {
            j if j == 2 * N => _mm512_maskz_loadu_ps(0x00ff, src.add(j * PAIR)),
            j => _mm512_loadu_ps(src.add(j * PAIR)),
        };
        for (a, s) in acc.iter_mut().enumerate() {
            let (l0, l1, l2) = (load(2 * a), load(2 * a + 1), load(2 * a + 2));
            let even = _mm512_shuffle_f32x4::<0b01_00_01_00>(l0, l1);
            let odd = _mm512_shuffle_f32x4::<0b11_10_11_10>(l0, l1);
            let next = _mm512_shuffle_f32x4::<0b01_00_01_00>(l1, l2);
            *s = _mm512_fmadd_ps(w[0], even, *s);
            *s = _mm512_fmadd_ps(w[1], odd, *s);
            *s = _mm512_fmadd_ps(w[2], next, *s);
        }
    }
}

/// Runs one stride-2 tap row on [`taps_stride2`] for a kernel `kw` wide
/// ([`pairs_stride2`]).
///
/// # Safety
/// As [`taps_stride2`].
#[inline(always)]
unsafe fn stride2_row<const N: usize>(
    kw: usize,
    acc: &mut [__m512; N],
    src: *const f32,
    w: *const f32,
) {
    // SAFETY: the caller's contract.
    unsafe {
        if kw == 3 {
            three_taps_stride2::<N>(acc, src, w)
        } else {
            taps_stride2::<5, N>(acc, src, w)
        }
    }
}

/// Stride-2 layers with a kernel [`pairs_stride2`] takes, from the block's
/// padded input buffer `buf` (packed for `p`, `pw` pixels a row, with two
/// more pixels after it): each output row in chunks of at most [`CHUNK`]
/// pairs, the output's odd last pixel computed and not stored. Planes
/// under 56 wide, whose rows are too short for [`row`]'s groups of `2 * A`
/// pixels (two threads, against the AVX2 loop: 576 channels at 14x14 ->
/// 7x7 10.4 -> 8.0 us, 192 at 28x28 -> 14x14 12.5 -> 10.0); `wb`, `bb`,
/// `out` and `fuse` as for [`padded`].
///
/// # Safety
/// AVX-512F; `buf` holds the padded pixels plus two, `wb` `kh * kw * CB`
/// elements, `bb` `CB`, `out` the block's `out_h * out_w` pixels, `fuse` as
/// [`Fuse`] says; `p` has stride 2 and a kernel [`pairs_stride2`] takes.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
pub(super) unsafe fn padded_stride2(
    p: &Conv2dParams,
    buf: &[f32],
    pw: usize,
    wb: &[f32],
    bb: &[f32],
    out: *mut f32,
    fuse: Fuse,
) {
    debug_assert!(p.stride == (2, 2) && pairs_stride2(p.kernel_w, p.dilation.1));
    let (oh, ow, kh, kw) = (p.out_h(), p.out_w(), p.kernel_h, p.kernel_w);
    let pairs = ow.div_ceil(2);
    let chunks = pairs.div_ceil(CHUNK);
    let (bp, wp) = (buf.as_ptr(), wb.as_ptr());
    // SAFETY (whole body): output pixel (y, x)'s window starts at buffer
    // pixel (2y, 2x); a row's odd last pixel reads two pixels past its
    // window (inside the next row, or the buffer's two extra pixels); the
    // stores are the row's pixels.
    unsafe {
        let bias = both_halves(bb.as_ptr());
        for y in 0..oh {
            let mut a0 = 0;
            for c in 0..chunks {
                let n = (pairs - a0).div_ceil(chunks - c);
                let src = bp.add((2 * y * pw + 4 * a0) * CB);
                macro_rules! chunk {
                    ($($n:literal)*) => {
                        match n {
                            $($n => {
                                let mut acc = [bias; $n];
                                for ky in 0..kh {
                                    stride2_row::<$n>(kw, &mut acc, src.add(ky * pw * CB), wp.add(ky * kw * CB));
                                }
                                for (a, s) in acc.iter().enumerate() {
                                    let x = 2 * (a0 + a);
                                    let mask = if x + 1 < ow { 0xffff } else { 0x00ff };
                                    fuse.store_pair(out, (y * ow + x) * CB, mask, *s);
                                }
                            })*
                            _ => unreachable!("a chunk of {n} pairs"),
                        }
                    };
                }
                chunk!(1 2 3 4 5 6 7 8);
                a0 += n;
            }
        }
    }
}

/// Pairs per chunk of [`padded_stride2`], at most.
const CHUNK: usize = 8;

/// The block's output from its padded input buffer `buf` (packed for `p`,
/// stride 1, from a 64-byte boundary, with one more pixel after it), `taps`
/// the offsets of [`super::blocked`]'s geometry, `wb` a vector of weights per
/// tap and `bb` the bias: the output pixels' sums, through `fuse`, to `out`
/// (blocked, `CB` elements a pixel), as `stores` ([`plan`]) says. The
/// kernel is `kw` wide with dilation `dw` (taps in rows of `kw`).
///
/// # Safety
/// AVX-512F; `buf` holds the padded pixels plus one, `wb` `taps.len() * CB`
/// elements, `bb` `CB`, `out` the block's `out_h * out_w` pixels, `fuse` as
/// [`Fuse`] says; `stores` is [`plan`]'s for this layer.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
pub(super) unsafe fn padded(
    buf: &[f32],
    taps: &[usize],
    wb: &[f32],
    bb: &[f32],
    out: *mut f32,
    stores: &[PairStore],
    fuse: Fuse,
    (kw, dw): (usize, usize),
) {
    let pairs = stores.len();
    debug_assert!(pairs >= A);
    let (bp, wp) = (buf.as_ptr(), wb.as_ptr());
    // SAFETY (whole body): grid pixel q's window starts at buffer pixel q;
    // the last pair's reads end at the buffer's extra pixel; the stores are
    // the plan's, inside the block's output.
    unsafe {
        let bias = both_halves(bb.as_ptr());
        let mut g = 0;
        loop {
            let first = g.min(pairs - A);
            let base = bp.add(first * PAIR);
            let mut acc = [bias; A];
            for (r, offs) in taps.chunks_exact(kw).enumerate() {
                if shared_row((kw, dw), &mut acc, base.add(offs[0]), wp.add(kw * r * CB)) {
                    continue;
                }
                for (k, &off) in offs.iter().enumerate() {
                    let t = r * kw + k;
                    let w = both_halves(wp.add(t * CB));
                    let src = base.add(off);
                    for (a, s) in acc.iter_mut().enumerate() {
                        *s = _mm512_fmadd_ps(w, _mm512_loadu_ps(src.add(a * PAIR)), *s);
                    }
                }
            }
            // An array, so the stores unroll with the sums in registers.
            let group: &[PairStore; A] = stores[first..first + A].try_into().unwrap();
            for (s, st) in acc.iter().zip(group) {
                if st.mask != 0 {
                    fuse.store_pair(out, st.at as usize * CB, st.mask, *s);
                }
            }
            if first + A == pairs {
                return;
            }
            g += A;
        }
    }
}

/// One output row's `n` interior pixels (`n >= 2 * A`, every tap inside the
/// input) straight from the input, stride `sw` (1, or 2 for kernels
/// [`pairs_stride2`] takes, [`taps_stride2`]): `first` is the input pixel
/// that tap `(kys.start, 0)` of the first pixel reads, `row_step` the
/// elements from one tap row's input row to the next's; `wb` holds a vector
/// of weights per tap (`(ky, kx)` order, `kw` a row), `bb` the bias. The
/// sums go through `fuse` to the block's output `out.0`, from element
/// `out.1` on (the first pixel's place, `CB` elements a pixel). Kernels 3,
/// 5 or 7 wide with no dilation take [`row_taps`].
///
/// # Safety
/// AVX-512F; the `n + (kw - 1) * dw` pixels from `first` on each of the tap
/// rows are inside the input, `wb` and `bb` as said, `out.0 + out.1` valid
/// for `n` pixels, `fuse` as [`Fuse`] says (its residual at the block's
/// offsets).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
pub(super) unsafe fn row(
    first: *const f32,
    row_step: usize,
    kys: std::ops::Range<usize>,
    (kw, sw, dw): (usize, usize, usize),
    wb: &[f32],
    bb: &[f32],
    out: (*mut f32, usize),
    n: usize,
    fuse: Fuse,
) {
    // SAFETY: the caller's contract. Each stride has a loop of its own:
    // with both in one, the stride-1 loop ran 1.25x slower (112x112 and
    // 56x56 planes).
    unsafe {
        if sw == 2 {
            row_loop::<2>(first, row_step, kys, (kw, dw), wb, bb, out, n, fuse)
        } else {
            row_loop::<1>(first, row_step, kys, (kw, dw), wb, bb, out, n, fuse)
        }
    }
}

/// [`row`] for stride `SW`.
///
/// # Safety
/// As [`row`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn row_loop<const SW: usize>(
    first: *const f32,
    row_step: usize,
    kys: std::ops::Range<usize>,
    (kw, dw): (usize, usize),
    wb: &[f32],
    bb: &[f32],
    (out, at): (*mut f32, usize),
    n: usize,
    fuse: Fuse,
) {
    let sw = SW;
    debug_assert!(n >= 2 * A && (sw == 1 || (sw == 2 && pairs_stride2(kw, dw))));
    let wp = wb.as_ptr();
    // SAFETY (whole body): pixel x of the run reads the tap rows' pixels
    // x * sw + kx * dw, inside the input (the stride-2 loads' extra pixel
    // is masked); stores are the run's pixels.
    unsafe {
        let bias = both_halves(bb.as_ptr());
        let mut x0 = 0;
        loop {
            let mut acc = [bias; A];
            for (i, ky) in kys.clone().enumerate() {
                let base = first.add(i * row_step + x0 * sw * CB);
                if sw == 2 {
                    stride2_row::<A>(kw, &mut acc, base, wp.add(ky * kw * CB));
                    continue;
                }
                if shared_row((kw, dw), &mut acc, base, wp.add(ky * kw * CB)) {
                    continue;
                }
                for kx in 0..kw {
                    let w = both_halves(wp.add((ky * kw + kx) * CB));
                    let tap = base.add(kx * dw * CB);
                    for (a, s) in acc.iter_mut().enumerate() {
                        *s = _mm512_fmadd_ps(w, _mm512_loadu_ps(tap.add(a * PAIR)), *s);
                    }
                }
            }
            for (a, s) in acc.iter().enumerate() {
                fuse.store_pair(out, at + (x0 + 2 * a) * CB, 0xffff, *s);
            }
            if x0 + 2 * A == n {
                return;
            }
            x0 = (x0 + 2 * A).min(n - 2 * A);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(h: usize, w: usize, k: usize, pad: usize) -> Conv2dParams {
        Conv2dParams {
            batch: 1,
            in_channels: 8,
            in_h: h,
            in_w: w,
            out_channels: 8,
            kernel_h: k,
            kernel_w: k,
            stride: (1, 1),
            padding: crate::params::Padding2d::symmetric(pad, pad),
            dilation: (1, 1),
            groups: 8,
        }
    }

    /// Every output pixel is stored exactly once, with the plan's masks, and
    /// nothing else is.
    #[test]
    fn the_plan_stores_every_output_pixel_once() {
        for (h, w, k, pad) in [
            (14, 14, 3, 1),
            (7, 7, 3, 1),
            (14, 14, 5, 2),
            (9, 5, 1, 0),
            (5, 9, 3, 0),
            (28, 28, 3, 1),
        ] {
            let p = params(h, w, k, pad);
            let pw = p.padded_w();
            let stores = plan(&p, pw).expect("large enough for a group");
            let mut hits = vec![0; p.out_h() * p.out_w()];
            for s in &stores {
                for half in 0..2 {
                    if s.mask >> (8 * half) & 0xff != 0 {
                        hits[s.at as usize + half] += 1;
                    }
                }
            }
            assert!(hits.iter().all(|&n| n == 1), "{h}x{w} k{k}: {hits:?}");
        }
        // 3x3 outputs on a 5-wide grid: 14 grid pixels, fewer than a group.
        assert_eq!(plan(&params(3, 3, 3, 1), 5), None);
        let strided = Conv2dParams {
            stride: (2, 2),
            ..params(14, 14, 3, 1)
        };
        assert_eq!(plan(&strided, strided.padded_w()), None);
        // 7x7 outputs of a 5x5 kernel: an 11-wide grid, taken as its taps
        // share loads; with a dilation of 2 (a 15-wide grid) they do not.
        assert!(plan(&params(7, 7, 5, 2), 11).is_some());
        let dilated = Conv2dParams {
            dilation: (2, 2),
            padding: crate::params::Padding2d::symmetric(4, 4),
            ..params(7, 7, 5, 2)
        };
        assert_eq!(plan(&dilated, dilated.padded_w()), None);
    }
}
