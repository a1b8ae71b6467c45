//! The register tile the blocked convolution kernels share: the 1x1 kernel
//! ([`super::pointwise`]), the direct kernel (its taps) and the Winograd
//! kernel's products all accumulate `OB` blocks of 8 output channels by `P`
//! pixels. Per input channel of a tap, the tile loads the `OB` blocks'
//! weight vectors once and broadcasts each pixel's value, feeding `OB * P`
//! FMAs; the sums start from the bias and stay in registers for the whole
//! reduction. [`run`] computes one tile; [`row`] the tiles along a run of
//! pixels, which on AVX2 a 1x1 tile (the 1x1 kernel, Winograd's products)
//! does in one loop with its set-up done once.
//!
//! One tile per [ISA level](crate::isa), its shape given by [`shape`]:
//! - AVX2: 2 blocks by 6 pixels, 12 of the 16 ymm registers (3 blocks by
//!   3 pixels for the last 3 of an odd block count, see [`BlockTiles`]);
//! - AVX-512: 4 blocks by 12 pixels, two blocks side by side in each zmm
//!   register (the layout's blocks stay 8 wide, so a zmm's halves are
//!   loaded from, and stored to, two blocks), 24 of the 32 registers. Twice
//!   the lanes per FMA, and fewer broadcasts per FMA, than the AVX2 tile.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::BLOCK as CB;

/// Output blocks per tile, at most, on any level.
pub(crate) const OBT_MAX: usize = 4;

/// The tile's shape on this CPU: (output blocks, pixels), each at most.
pub(crate) fn shape() -> (usize, usize) {
    if crate::isa::avx512() {
        (4, 12)
    } else {
        (2, 6)
    }
}

/// A layer's output blocks split into register tiles: the first block and
/// the block count of each tile, in order.
///
/// On AVX2 an odd count of at least 3 ends in one tile of 3 blocks (run as
/// two tiles of at most 3 pixels each, 9 sums) rather than in a tile of one
/// block (6 sums, one weight vector per 6 FMAs, fewer independent chains
/// than 2 FMA units of 4 cycles' latency keep busy). Measured on a Zen 4
/// without AVX-512, the 1x1 kernel alone, paired: 144 -> 24 and 96 -> 24 at
/// 56x56 0.64x and 0.69x the time, 24 -> 72 at 56x56 0.68x, 112 -> 40 at
/// 28x28 0.86x.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockTiles {
    blocks: usize,
    obt: usize,
}

impl BlockTiles {
    /// The tiles of `blocks` output blocks on this CPU.
    pub(crate) fn new(blocks: usize) -> Self {
        Self::with_tile(blocks, shape().0)
    }
    fn with_tile(blocks: usize, obt: usize) -> Self {
        Self { blocks, obt }
    }
    /// Whether the last tile takes 3 blocks.
    fn ends_in_three(&self) -> bool {
        self.obt == 2 && self.blocks >= 3 && self.blocks % 2 == 1
    }
    /// Tiles.
    pub(crate) fn count(&self) -> usize {
        if self.ends_in_three() {
            self.blocks / 2
        } else {
            self.blocks.div_ceil(self.obt)
        }
    }
    /// Tile `i`'s first block and block count (`i` below [`Self::count`]).
    pub(crate) fn get(&self, i: usize) -> (usize, usize) {
        let ob = i * self.obt;
        if self.ends_in_three() && i + 1 == self.count() {
            (ob, 3)
        } else {
            (ob, self.obt.min(self.blocks - ob))
        }
    }
}

/// Where one register tile reads and writes.
#[derive(Clone, Copy)]
pub(crate) struct Tile<'a> {
    /// The first pixel's window's top-left (its only pixel for a 1x1
    /// convolution), input block 0, lane 0.
    pub x: *const f32,
    /// Elements between input blocks.
    pub x_block: usize,
    /// Input blocks.
    pub icb: usize,
    /// Input channels in the last block (the lanes past them are skipped).
    pub last_lanes: usize,
    /// Offset of each tap from the window's top-left.
    pub taps: &'a [usize],
    /// Elements between the windows of consecutive output pixels.
    pub step: usize,
    /// The first output block's packed weights: per input block, per tap,
    /// per input lane, 8 output lanes (16, the pair's, with `w_pairs`).
    pub w: *const f32,
    /// Elements between output blocks' packed weights; with `w_pairs`,
    /// between pairs of blocks.
    pub w_stride: usize,
    /// AVX-512 only: the packed weights hold blocks in pairs, the two
    /// blocks' 8 output lanes side by side for each input lane (16 values,
    /// one zmm load), pairs `w_stride` apart; a tile's first block is the
    /// first of a pair. See [`super::PackedWeights`].
    pub w_pairs: bool,
    /// The first output block's bias (the next blocks' follow it).
    pub bias: *const f32,
    /// The first pixel of the first output block.
    pub out: *mut f32,
    /// Elements between output blocks.
    pub out_block: usize,
    /// Whether the output is channel-blocked (pixels of 8 lanes) rather
    /// than NCHW.
    pub blocked: bool,
    /// NCHW: elements between output channels' planes.
    pub lane: usize,
    /// NCHW: channels of each output block of the tile.
    pub valid: [usize; OBT_MAX],
    /// Blocked output only: the residual added to the sums before they are
    /// stored, at the same offsets from this pointer as the output from
    /// `out` (null: none).
    pub residual: *const f32,
    /// Blocked output only: the bounds the sums are clamped to, after the
    /// residual, before they are stored (ReLU, ReLU6; NaN passes through).
    pub clamp: Option<(f32, f32)>,
    /// What the sums start from: the bias, or (blocked output only) the
    /// output's values (a reduction split over input channels, continued),
    /// or the output's values plus the bias (a residual the output holds).
    pub start: Start,
}

/// What a tile's sums start from ([`Tile::start`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Start {
    /// The bias.
    Bias,
    /// The blocked output's values: a reduction split over input channels,
    /// continued from the sums the last chunk stored.
    Output,
    /// The blocked output's values plus the bias: the first chunk of a
    /// reduction whose output holds the residual to add (written in place
    /// of it, see `pointwise::conv2d_onto_residual`).
    OutputAndBias,
}

impl Tile<'_> {
    /// The same tile from its pixel `p` on.
    fn skip_pixels(&self, p: usize) -> Self {
        let px_out = if self.blocked { CB } else { 1 };
        Self {
            x: self.x.wrapping_add(p * self.step),
            out: self.out.wrapping_add(p * px_out),
            // Null (no residual) stays null.
            residual: if self.residual.is_null() {
                self.residual
            } else {
                self.residual.wrapping_add(p * CB)
            },
            ..*self
        }
    }
}

/// One register tile of `nob` output blocks by `np` pixels, each at most
/// what [`shape`] gives, or 3 blocks on AVX2 (see [`BlockTiles`]).
///
/// # Safety
/// AVX2 and FMA, and AVX-512 when [`crate::isa::avx512`]; every read and
/// write `t` describes is inside its buffer.
pub(crate) unsafe fn run(nob: usize, np: usize, t: &Tile<'_>) {
    // SAFETY: the caller's contract.
    unsafe {
        if crate::isa::avx512() {
            run_avx512(nob, np, t)
        } else {
            run_avx2(nob, np, t)
        }
    }
}

/// Register tiles of `nob` output blocks (at most what [`shape`] gives, or
/// 3 on AVX2) over `np` consecutive pixels from `t`'s first, in tiles of
/// equal size ([`equal_tiles`]): [`run`] for each, and on AVX2 a 1x1
/// tile's runs of equal tiles each in one loop ([`avx2_row`]).
///
/// # Safety
/// As [`run`], for all `np` pixels.
pub(crate) unsafe fn row(nob: usize, np: usize, t: &Tile<'_>) {
    // SAFETY: the caller's contract.
    unsafe {
        if crate::isa::avx512() {
            for (p, n) in equal_tiles(np, shape().1) {
                run_avx512(nob, n, &t.skip_pixels(p));
            }
        } else {
            row_avx2(nob, np, t)
        }
    }
}

/// `pixels` split into `pixels.div_ceil(most)` tiles of equal size (one
/// pixel apart at most), in order: the first pixel and the count of each.
/// 49 pixels in tiles of at most 6 are 4 of 6 and 5 of 5, not 8 of 6 and
/// one of 1.
pub(crate) fn equal_tiles(pixels: usize, most: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut tiles = pixels.div_ceil(most);
    let mut p = 0;
    std::iter::from_fn(move || {
        (p < pixels).then(|| {
            let n = (pixels - p).div_ceil(tiles);
            tiles -= 1;
            p += n;
            (p - n, n)
        })
    })
}

/// [`equal_tiles`] as runs of tiles of one size: `(first pixel, pixels a
/// tile, tiles)`, the tiles of the larger size first, runs of no tiles
/// left out.
fn equal_groups(pixels: usize, most: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    let tiles = pixels.div_ceil(most);
    // `k` tiles of `n` pixels, then `tiles - k` of `n - 1`.
    let n = pixels.div_ceil(tiles.max(1));
    let k = (pixels + tiles).saturating_sub(n * tiles);
    [(0, n, k), (k * n, n.saturating_sub(1), tiles - k)]
        .into_iter()
        .filter(|g| g.2 > 0)
}

#[target_feature(enable = "avx2,fma")]
unsafe fn row_avx2(nob: usize, np: usize, t: &Tile<'_>) {
    // SAFETY (whole body): the caller's contract, tile by tile.
    unsafe {
        if !(t.blocked && t.step == CB && t.taps == [0] && t.last_lanes == CB) {
            // Other tiles (the direct kernel's taps) reduce long enough for
            // a call per tile not to count (measured: the same time).
            for (p, n) in equal_tiles(np, 6) {
                run_avx2(nob, n, &t.skip_pixels(p));
            }
            return;
        }
        for (p, n, k) in equal_groups(np, 6) {
            let tp = t.skip_pixels(p);
            match (nob, n) {
                (2, 6) => avx2_row::<2, 6>(k, &tp),
                (2, 5) => avx2_row::<2, 5>(k, &tp),
                (1, 6) => avx2_row::<1, 6>(k, &tp),
                (1, 5) => avx2_row::<1, 5>(k, &tp),
                // Tiles of 3 blocks by 3 pixels (see run_avx2).
                (3, 6) => avx2_row::<3, 3>(2 * k, &tp),
                _ => {
                    for i in 0..k {
                        run_avx2(nob, n, &tp.skip_pixels(i * n));
                    }
                }
            }
        }
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn run_avx2(nob: usize, np: usize, t: &Tile<'_>) {
    debug_assert!(!t.w_pairs, "weights are packed in pairs for AVX-512 only");
    macro_rules! dispatch {
        ($($ob:literal, $p:literal);*) => {
            match (nob, np) {
                $(($ob, $p) => avx2::<$ob, $p>(t),)*
                _ => unreachable!("tile of {nob} blocks by {np} pixels"),
            }
        };
    }
    if nob == 3 && np > 3 {
        // Two tiles of at most 3 pixels: 3 blocks by 6 pixels would need
        // more registers than there are.
        let h = np.div_ceil(2);
        // SAFETY: the caller's contract, split by pixels.
        unsafe {
            run_avx2(3, h, t);
            run_avx2(3, np - h, &t.skip_pixels(h));
        }
        return;
    }
    // SAFETY: the caller's contract, for the instance that matches.
    unsafe {
        dispatch!(3, 3; 3, 2; 3, 1;
            2, 6; 2, 5; 2, 4; 2, 3; 2, 2; 2, 1; 1, 6; 1, 5; 1, 4; 1, 3; 1, 2; 1, 1)
    }
}

#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn run_avx512(nob: usize, np: usize, t: &Tile<'_>) {
    assert!(
        t.blocked || t.start == Start::Bias,
        "a reduction is continued from a blocked output only"
    );
    macro_rules! pixels {
        ($z:literal, $step:expr, $pairs:literal) => {
            pixels!($z, $step, $pairs: 1 2 3 4 5 6 7 8 9 10 11 12)
        };
        ($z:literal, $step:expr, $pairs:literal: $($p:literal)*) => {
            match np {
                $($p => avx512::<$z, $p, { $step }, $pairs>(nob, t),)*
                _ => unreachable!("tile of {nob} blocks by {np} pixels"),
            }
        };
    }
    // One or two zmm rows of sums by the tile's block count.
    macro_rules! blocks {
        ($step:expr, $pairs:literal) => {
            match nob {
                3 | 4 => pixels!(2, $step, $pairs),
                1 | 2 => pixels!(1, $step, $pairs),
                _ => unreachable!("tile of {nob} blocks by {np} pixels"),
            }
        };
    }
    // The steps between windows with instances of their own (see
    // `avx512`): stride 1 and 2 on whole input blocks, an RGB input's
    // stride 2 and 4 (3 values a pixel); any other step is read at run
    // time, and only without pairs.
    // SAFETY: the caller's contract, for the instance that matches.
    unsafe {
        match (t.step, t.w_pairs) {
            (CB, true) => blocks!(CB, true),
            (CB, false) => blocks!(CB, false),
            (STRIDE_2, true) => blocks!(STRIDE_2, true),
            (STRIDE_2, false) => blocks!(STRIDE_2, false),
            (RGB_STRIDE_2, false) => blocks!(RGB_STRIDE_2, false),
            (RGB_STRIDE_4, false) => blocks!(RGB_STRIDE_4, false),
            (_, false) => blocks!(0, false),
            (_, true) => unreachable!("weights in pairs only with a step of 1 or 2 blocks"),
        }
    }
}

/// The step between windows of a stride-2 layer on whole input blocks.
const STRIDE_2: usize = 2 * CB;
/// The step between windows of a stride-2 layer reading an RGB image in
/// place (3 values a pixel: `direct::blocked`'s compact copy).
const RGB_STRIDE_2: usize = 6;
/// As [`RGB_STRIDE_2`] at stride 4 (ConvNeXt's 4x4 stem).
const RGB_STRIDE_4: usize = 12;

/// Calls `step(xt, wt, l)` for every input lane `l` of every tap of every
/// input block: `xt` the tap's first window pixel, `wt` its packed weights
/// (lane `l`'s at `l * 8` elements on, or `l * 16` with `t.w_pairs`).
#[inline(always)]
unsafe fn reduce(t: &Tile<'_>, mut step: impl FnMut(*const f32, *const f32, usize)) {
    let ntaps = t.taps.len();
    // Elements of one input lane's weights for the tile's first block (or
    // pair of blocks).
    let wl = if t.w_pairs { 2 * CB } else { CB };
    // SAFETY (whole body): offsets inside the buffers the caller vouches for.
    unsafe {
        for b in 0..t.icb {
            let xb = t.x.add(b * t.x_block);
            let wb = t.w.add(b * ntaps * CB * wl);
            let lanes = if b + 1 == t.icb { t.last_lanes } else { CB };
            for (k, &off) in t.taps.iter().enumerate() {
                let (xt, wt) = (xb.add(off), wb.add(k * CB * wl));
                if lanes == CB {
                    // A whole block: a constant count the compiler unrolls.
                    for l in 0..CB {
                        step(xt, wt, l);
                    }
                } else if lanes == 3 {
                    // An RGB input layer's channels, unrolled too.
                    for l in 0..3 {
                        step(xt, wt, l);
                    }
                } else {
                    for l in 0..lanes {
                        step(xt, wt, l);
                    }
                }
            }
        }
    }
}

/// Stores output block `o`'s `P` pixel vectors, `get(p)` giving pixel `p`.
#[inline(always)]
unsafe fn store<const P: usize>(t: &Tile<'_>, o: usize, get: impl Fn(usize) -> __m256) {
    // SAFETY (whole body): the caller vouches for the output's range.
    unsafe {
        let out = t.out.add(o * t.out_block);
        if t.blocked {
            // Padding lanes have zero weights and bias: they store zeros
            // (plus the residual's padding lanes, zero or finite, clamped).
            let res = t.residual.wrapping_add(o * t.out_block);
            match (t.residual.is_null(), t.clamp) {
                (true, None) => {
                    for p in 0..P {
                        _mm256_storeu_ps(out.add(p * CB), get(p));
                    }
                }
                (true, Some((lo, hi))) => {
                    let (lo, hi) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
                    for p in 0..P {
                        _mm256_storeu_ps(out.add(p * CB), clamp(get(p), lo, hi));
                    }
                }
                (false, c) => {
                    let (lo, hi) = c.unwrap_or((f32::NEG_INFINITY, f32::INFINITY));
                    let (lo, hi) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
                    for p in 0..P {
                        let v = _mm256_add_ps(get(p), _mm256_loadu_ps(res.add(p * CB)));
                        _mm256_storeu_ps(out.add(p * CB), clamp(v, lo, hi));
                    }
                }
            }
            return;
        }
        let mut tmp = [[0.0f32; CB]; P];
        for (p, v) in tmp.iter_mut().enumerate() {
            _mm256_storeu_ps(v.as_mut_ptr(), get(p));
        }
        for c in 0..t.valid[o] {
            for (p, v) in tmp.iter().enumerate() {
                *out.add(c * t.lane + p) = v[c];
            }
        }
    }
}

/// `v` clamped to `[lo, hi]`, NaN lanes kept: `max` and `min` return their
/// second operand when either is NaN.
#[inline(always)]
pub(crate) unsafe fn clamp(v: __m256, lo: __m256, hi: __m256) -> __m256 {
    // SAFETY: register-only AVX operations.
    unsafe { _mm256_min_ps(hi, _mm256_max_ps(lo, v)) }
}

/// [`clamp`] on a zmm vector (two blocks, or two pixels of one block).
///
/// # Safety
/// AVX-512F.
#[inline(always)]
pub(crate) unsafe fn clamp512(v: __m512, lo: __m512, hi: __m512) -> __m512 {
    // SAFETY: register-only AVX-512F operations.
    unsafe { _mm512_min_ps(hi, _mm512_max_ps(lo, v)) }
}

/// The AVX2 tile's first sums ([`Tile::start`]): the bias, the blocked
/// output's values from `out` (the tile's first pixel), or both added.
#[inline(always)]
unsafe fn start<const OB: usize, const P: usize>(
    t: &Tile<'_>,
    out: *const f32,
) -> [[__m256; P]; OB] {
    // SAFETY: the caller vouches for the bias and the tile's output range.
    unsafe {
        let out = |o: usize, p: usize| _mm256_loadu_ps(out.add(o * t.out_block + p * CB));
        let bias = |o: usize| _mm256_loadu_ps(t.bias.add(o * CB));
        match t.start {
            Start::Bias => std::array::from_fn(|o| [bias(o); P]),
            Start::Output => std::array::from_fn(|o| std::array::from_fn(|p| out(o, p))),
            Start::OutputAndBias => {
                std::array::from_fn(|o| std::array::from_fn(|p| _mm256_add_ps(out(o, p), bias(o))))
            }
        }
    }
}

/// The AVX2 tile for `OB` blocks by `P` pixels, unrolled.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2<const OB: usize, const P: usize>(t: &Tile<'_>) {
    // SAFETY (whole body): reads and writes stay in the ranges the caller
    // vouches for.
    unsafe {
        let mut acc = start::<OB, P>(t, t.out);
        reduce(t, |xt, wt, l| {
            let wv: [__m256; OB] =
                std::array::from_fn(|o| _mm256_loadu_ps(wt.add(o * t.w_stride + l * CB)));
            for p in 0..P {
                let xv = _mm256_broadcast_ss(&*xt.add(p * t.step + l));
                for o in 0..OB {
                    acc[o][p] = _mm256_fmadd_ps(wv[o], xv, acc[o][p]);
                }
            }
        });
        for o in 0..OB {
            store::<P>(t, o, |p| acc[o][p]);
        }
    }
}

/// `tiles` AVX2 tiles of `OB` blocks by `P` pixels, one after the other
/// along the pixels, of a 1x1 tile (one tap, pixels one block apart, whole
/// input blocks, blocked output): [`avx2`] for each, in one loop that
/// keeps its pointers in registers, rather than one call each (whose
/// set-up, about 45 cycles a tile on a Zen 4, was as long as the FMAs of a
/// 16-channel reduction).
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2_row<const OB: usize, const P: usize>(tiles: usize, t: &Tile<'_>) {
    let (x_block, icb, w_stride, out_block) = (t.x_block, t.icb, t.w_stride, t.out_block);
    // SAFETY (whole body): reads and writes stay in the ranges the caller
    // vouches for, `tiles * P` pixels from `t`'s first.
    unsafe {
        for i in 0..tiles {
            let x = t.x.add(i * P * CB);
            let mut acc = start::<OB, P>(t, t.out.add(i * P * CB));
            if OB == 2 && P == 6 {
                // SAFETY: as the loop below; `acc` is 2 x 6 by the check.
                reduce_2x6(
                    &mut *acc.as_mut_ptr().cast::<[[__m256; 6]; 2]>(),
                    x,
                    x_block,
                    t.w,
                    w_stride,
                    icb,
                );
            } else {
                for b in 0..icb {
                    let (xb, wb) = (x.add(b * x_block), t.w.add(b * CB * CB));
                    for l in 0..CB {
                        let wv: [__m256; OB] =
                            std::array::from_fn(|o| _mm256_loadu_ps(wb.add(o * w_stride + l * CB)));
                        for p in 0..P {
                            let xv = _mm256_broadcast_ss(&*xb.add(p * CB + l));
                            for o in 0..OB {
                                acc[o][p] = _mm256_fmadd_ps(wv[o], xv, acc[o][p]);
                            }
                        }
                    }
                }
            }
            let out = t.out.add(i * P * CB);
            let res = t.residual.wrapping_add(i * P * CB);
            for o in 0..OB {
                let (out, res) = (out.add(o * out_block), res.wrapping_add(o * out_block));
                for p in 0..P {
                    let mut v = acc[o][p];
                    if !t.residual.is_null() {
                        v = _mm256_add_ps(v, _mm256_loadu_ps(res.add(p * CB)));
                    }
                    if let Some((lo, hi)) = t.clamp {
                        v = clamp(v, _mm256_set1_ps(lo), _mm256_set1_ps(hi));
                    }
                    _mm256_storeu_ps(out.add(p * CB), v);
                }
            }
        }
    }
}

/// One input lane of the 2-block by 6-pixel tile ([`reduce_2x6`]): the
/// lane's two weight vectors, then per pixel a broadcast and two FMAs;
/// then the next lane.
macro_rules! lane_2x6 {
    () => {
        concat!(
            "vmovups {w0}, ymmword ptr [{w}]\n",
            "vmovups {w1}, ymmword ptr [{w} + {ws}]\n",
            "vbroadcastss {xv}, dword ptr [{x}]\n",
            "vfmadd231ps {a0}, {w0}, {xv}\n",
            "vfmadd231ps {b0}, {w1}, {xv}\n",
            "vbroadcastss {xv}, dword ptr [{x} + 32]\n",
            "vfmadd231ps {a1}, {w0}, {xv}\n",
            "vfmadd231ps {b1}, {w1}, {xv}\n",
            "vbroadcastss {xv}, dword ptr [{x} + 64]\n",
            "vfmadd231ps {a2}, {w0}, {xv}\n",
            "vfmadd231ps {b2}, {w1}, {xv}\n",
            "vbroadcastss {xv}, dword ptr [{x} + 96]\n",
            "vfmadd231ps {a3}, {w0}, {xv}\n",
            "vfmadd231ps {b3}, {w1}, {xv}\n",
            "vbroadcastss {xv}, dword ptr [{x} + 128]\n",
            "vfmadd231ps {a4}, {w0}, {xv}\n",
            "vfmadd231ps {b4}, {w1}, {xv}\n",
            "vbroadcastss {xv}, dword ptr [{x} + 160]\n",
            "vfmadd231ps {a5}, {w0}, {xv}\n",
            "vfmadd231ps {b5}, {w1}, {xv}\n",
            "add {w}, 32\n",
            "add {x}, 4\n",
        )
    };
}

/// The reduction of a 1x1 AVX2 tile of 2 output blocks by 6 pixels over
/// `icb` whole input blocks, into `acc`: `x` the first pixel of input
/// block 0 (blocks `x_block` elements apart), `w` the first block's packed
/// weights (the second block's `w_stride` elements on). In assembly: the
/// 12 sums, two weight vectors and one broadcast take 15 of the 16 ymm
/// registers, and compiled from intrinsics LLVM loaded the next lane's
/// weights early and kept one sum on the stack, stored and reloaded every
/// lane. On Zen 1 (one thread, the 1x1 kernel alone, hot) the layers of
/// MobileNetV2 took 0.96-0.99x the time (16 -> 96 at 112x112 0.92x).
///
/// # Safety
/// AVX2 and FMA; the reads stay inside the caller's buffers.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn reduce_2x6(
    acc: &mut [[__m256; 6]; 2],
    x: *const f32,
    x_block: usize,
    w: *const f32,
    w_stride: usize,
    icb: usize,
) {
    if icb == 0 {
        return;
    }
    let [a, b] = acc;
    // SAFETY: the caller's contract; reads only, each input block's 8
    // lanes of 6 pixels and the two blocks' 8 weight vectors.
    unsafe {
        std::arch::asm!(
            "2:",
            lane_2x6!(),
            lane_2x6!(),
            lane_2x6!(),
            lane_2x6!(),
            lane_2x6!(),
            lane_2x6!(),
            lane_2x6!(),
            lane_2x6!(),
            "add {x}, {xs}",
            "dec {n}",
            "jnz 2b",
            w = inout(reg) w => _,
            x = inout(reg) x => _,
            n = inout(reg) icb => _,
            ws = in(reg) w_stride * size_of::<f32>(),
            xs = in(reg) x_block.wrapping_sub(CB).wrapping_mul(size_of::<f32>()),
            w0 = out(ymm_reg) _,
            w1 = out(ymm_reg) _,
            xv = out(ymm_reg) _,
            a0 = inout(ymm_reg) a[0],
            a1 = inout(ymm_reg) a[1],
            a2 = inout(ymm_reg) a[2],
            a3 = inout(ymm_reg) a[3],
            a4 = inout(ymm_reg) a[4],
            a5 = inout(ymm_reg) a[5],
            b0 = inout(ymm_reg) b[0],
            b1 = inout(ymm_reg) b[1],
            b2 = inout(ymm_reg) b[2],
            b3 = inout(ymm_reg) b[3],
            b4 = inout(ymm_reg) b[4],
            b5 = inout(ymm_reg) b[5],
            options(nostack, readonly),
        );
    }
}

/// The AVX-512 tile's first sums for blocks `lo` and `hi` (see
/// [`Tile::start`]): the bias, what the output holds from the tile's first
/// pixel, or both added. Inlined, as `pair` is, so that the sums stay in
/// registers: as a closure in the tile, the 1x1 kernel took 1.5-2x the
/// time on an Intel Xeon (its sums kept in memory throughout).
#[inline(always)]
unsafe fn start512<const P: usize>(t: &Tile<'_>, lo: usize, hi: usize) -> [__m512; P] {
    // SAFETY: the caller vouches for the bias and the tile's output range.
    unsafe {
        if t.start == Start::Bias {
            return [pair(t.bias, CB, lo, hi); P];
        }
        let mut sums: [__m512; P] =
            std::array::from_fn(|p| pair(t.out.add(p * CB), t.out_block, lo, hi));
        if t.start == Start::OutputAndBias {
            let bias = pair(t.bias, CB, lo, hi);
            for v in &mut sums {
                *v = _mm512_add_ps(*v, bias);
            }
        }
        sums
    }
}

/// Blocks `lo` and `hi` of 8 values each, `stride` apart from `at`, as
/// one zmm vector (`hi` in the upper half).
#[inline(always)]
unsafe fn pair(at: *const f32, stride: usize, lo: usize, hi: usize) -> __m512 {
    // SAFETY: the caller vouches for both blocks.
    unsafe {
        let l = _mm256_castps_pd(_mm256_loadu_ps(at.add(lo * stride)));
        let h = _mm256_castps_pd(_mm256_loadu_ps(at.add(hi * stride)));
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castpd256_pd512(l), h))
    }
}

/// Half `h` (0 low, 1 high) of `v`.
#[inline(always)]
unsafe fn half(v: __m512, h: usize) -> __m256 {
    // SAFETY: register-only AVX-512F operations.
    unsafe {
        if h == 0 {
            _mm512_castps512_ps256(v)
        } else {
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))
        }
    }
}

/// The AVX-512 tile for `nob` blocks (`2 * Z - 1` or `2 * Z`, `Z` 1 or 2)
/// by `P` pixels, unrolled: block `o` in half `o % 2` of zmm `o / 2`. With
/// an odd `nob` the last zmm's upper half repeats its lower block, and is
/// not stored. The two rows of sums are separate arrays, each indexed by
/// constants only, so that they stay in registers.
///
/// `STEP`: the elements between the windows of consecutive pixels when it
/// is a constant (0: `t.step`, read at run time), so that every pixel's
/// value is at a constant offset from one pointer. With a run-time step
/// each of the 12 pixels took a register of its own, more than there are,
/// and the loop reloaded spilled addresses from the stack at every step:
/// on an Intel Xeon with AVX-512 (the direct kernel alone, one thread,
/// hot, 5 paired rounds) constant steps took 0.49x the time on ResNet's
/// 7x7 stride-2 RGB stem, 0.54-0.56x on 3x3 stride-2 RGB stems, 0.49x on
/// ConvNeXt's 4x4 stride-4 one (63 against 127 GFLOP/s, two runs),
/// 0.74-0.95x on stride-2 3x3 layers of 128
/// to 512 channels and 0.93x on ConvNeXt's 2x2 stride-2 downsampling.
///
/// `PAIRS` ([`Tile::w_pairs`]): each zmm of weights is one load, rather
/// than two half loads and an insert (a shuffle, on the port that also
/// does half the FMAs on Intel's cores with two FMA units).
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn avx512<const Z: usize, const P: usize, const STEP: usize, const PAIRS: bool>(
    nob: usize,
    t: &Tile<'_>,
) {
    let step = if STEP > 0 { STEP } else { t.step };
    let (hi0, hi1) = (1.min(nob - 1), 3.min(nob - 1));
    // SAFETY (whole body): reads and writes stay in the ranges the caller
    // vouches for (blocks below nob).
    unsafe {
        let mut a0 = start512::<P>(t, 0, hi0);
        let mut a1 = if Z == 2 {
            start512::<P>(t, 2, hi1)
        } else {
            [_mm512_setzero_ps(); P]
        };
        reduce(t, |xt, wt, l| {
            let (w0, w1) = if PAIRS {
                let w = wt.add(l * 2 * CB);
                let w0 = _mm512_loadu_ps(w);
                (
                    w0,
                    if Z == 2 {
                        _mm512_loadu_ps(w.add(t.w_stride))
                    } else {
                        w0
                    },
                )
            } else {
                let w0 = pair(wt.add(l * CB), t.w_stride, 0, hi0);
                (
                    w0,
                    if Z == 2 {
                        pair(wt.add(l * CB), t.w_stride, 2, hi1)
                    } else {
                        w0
                    },
                )
            };
            for p in 0..P {
                let xv = _mm512_set1_ps(*xt.add(p * step + l));
                a0[p] = _mm512_fmadd_ps(w0, xv, a0[p]);
                if Z == 2 {
                    a1[p] = _mm512_fmadd_ps(w1, xv, a1[p]);
                }
            }
        });
        if t.blocked {
            store_blocked512(t, 0, hi0, nob > 1, &mut a0);
            if Z == 2 {
                store_blocked512(t, 2, hi1, nob > 3, &mut a1);
            }
            return;
        }
        let lo0: [__m256; P] = std::array::from_fn(|p| half(a0[p], 0));
        store::<P>(t, 0, |p| lo0[p]);
        if nob > 1 {
            let hi: [__m256; P] = std::array::from_fn(|p| half(a0[p], 1));
            store::<P>(t, 1, |p| hi[p]);
        }
        if Z == 2 {
            let lo1: [__m256; P] = std::array::from_fn(|p| half(a1[p], 0));
            store::<P>(t, 2, |p| lo1[p]);
            if nob > 3 {
                let hi: [__m256; P] = std::array::from_fn(|p| half(a1[p], 1));
                store::<P>(t, 3, |p| hi[p]);
            }
        }
    }
}

/// Stores one zmm row of sums `acc` (blocks `lo` and `hi` in its halves;
/// the upper half only when `store_hi`) to the blocked output, adding the
/// residual and clamping on whole zmm vectors: half the operations of
/// doing it per block, which counts in layers with few input channels
/// (a 24-channel reduction is about 300 cycles of FMAs a tile).
#[inline(always)]
unsafe fn store_blocked512<const P: usize>(
    t: &Tile<'_>,
    lo: usize,
    hi: usize,
    store_hi: bool,
    acc: &mut [__m512; P],
) {
    // SAFETY (whole body): the caller vouches for the output's range and
    // the residual's, blocks `lo` and `hi` (which are below the tile's
    // block count).
    unsafe {
        if !t.residual.is_null() {
            for (p, a) in acc.iter_mut().enumerate() {
                *a = _mm512_add_ps(*a, pair(t.residual.add(p * CB), t.out_block, lo, hi));
            }
        }
        if let Some((l, h)) = t.clamp {
            let (l, h) = (_mm512_set1_ps(l), _mm512_set1_ps(h));
            for a in acc.iter_mut() {
                *a = clamp512(*a, l, h);
            }
        }
        let (out_lo, out_hi) = (t.out.add(lo * t.out_block), t.out.add(hi * t.out_block));
        for (p, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(out_lo.add(p * CB), half(*a, 0));
            if store_hi {
                _mm256_storeu_ps(out_hi.add(p * CB), half(*a, 1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{equal_groups, equal_tiles, BlockTiles};

    /// The tiles cover every block once, in order, each within its level's
    /// tile (AVX2's 2 blocks, or 3 for the last of an odd count of at least
    /// 3; AVX-512's 4).
    #[test]
    fn block_tiles_cover_every_block_once() {
        for obt in [2, 4] {
            for blocks in 0..40 {
                let t = BlockTiles::with_tile(blocks, obt);
                let mut next = 0;
                for i in 0..t.count() {
                    let (ob, nob) = t.get(i);
                    assert_eq!(ob, next, "{blocks} blocks, tile {i} of {obt}");
                    let most = if obt == 2 && i + 1 == t.count() && blocks >= 3 {
                        2 + blocks % 2
                    } else {
                        obt
                    };
                    assert!(
                        nob >= 1 && nob <= most,
                        "{blocks} blocks: tile {i} has {nob}"
                    );
                    next += nob;
                }
                assert_eq!(next, blocks, "{blocks} blocks in tiles of {obt}");
            }
        }
        assert_eq!(BlockTiles::with_tile(3, 2).get(0), (0, 3));
        assert_eq!(BlockTiles::with_tile(1, 2).get(0), (0, 1));
    }

    /// Equal tiles cover the pixels once, in order, at most `most` each and
    /// one pixel apart at most; their runs of one size give the same tiles.
    #[test]
    fn equal_tiles_and_their_runs() {
        for most in [3, 6, 12] {
            for pixels in 0..200 {
                let tiles: Vec<_> = equal_tiles(pixels, most).collect();
                assert_eq!(tiles.len(), pixels.div_ceil(most), "{pixels} by {most}");
                let mut next = 0;
                for &(p, n) in &tiles {
                    assert_eq!(p, next, "{pixels} by {most}");
                    assert!(n >= 1 && n <= most && n + 1 >= tiles[0].1, "{pixels}: {n}");
                    next += n;
                }
                assert_eq!(next, pixels, "{pixels} by {most}");
                let runs: Vec<_> = equal_groups(pixels, most)
                    .flat_map(|(p, n, k)| (0..k).map(move |i| (p + i * n, n)))
                    .collect();
                assert_eq!(runs, tiles, "{pixels} by {most}");
            }
        }
    }
}
