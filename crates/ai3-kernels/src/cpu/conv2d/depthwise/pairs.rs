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

/// [`row_taps`] of a 3-wide kernel for stride 2: pair `a` (output pixels `2a` and `2a + 1`)
/// reads input pixels `4a + kx` and `4a + 2 + kx` from `src`, the low (tap
/// 0), high (tap 1) and again low (tap 2, one load on) halves of two
/// neighbouring aligned loads, gathered by one shuffle each. The last load
/// reads its low half only: the pixel after it may lie past the input.
///
/// # Safety
/// AVX-512F; `src` valid for reads of `(4 * A + 1) * CB` elements, `w` of
/// `3 * CB`.
#[inline(always)]
unsafe fn three_taps_stride2(acc: &mut [__m512; A], src: *const f32, w: *const f32) {
    // SAFETY: the caller's contract (the last load is masked to its low
    // pixel, the `4 * A + 1`-th).
    unsafe {
        let w: [__m512; 3] = std::array::from_fn(|k| both_halves(w.add(k * CB)));
        let load = |j: usize| match j {
            j if j == 2 * A => _mm512_maskz_loadu_ps(0x00ff, src.add(j * PAIR)),
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
/// input) straight from the input, stride `sw` (1, or 2 for kernels 3 wide
/// with no dilation, [`three_taps_stride2`]): `first` is the input pixel
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
    (out, at): (*mut f32, usize),
    n: usize,
    fuse: Fuse,
) {
    debug_assert!(n >= 2 * A && (sw == 1 || (sw == 2 && kw == 3 && dw == 1)));
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
                    three_taps_stride2(&mut acc, base, wp.add(ky * 3 * CB));
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
