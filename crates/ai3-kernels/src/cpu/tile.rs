//! The f32 register tiles the packed linear layer, flash attention and 1x1
//! convolution share: `C[m x n] (+)= A[m x kc] @ B[kc x n]` for `m <= MR`
//! rows and `n <= NR` columns, with `A` read by rows (one value broadcast per
//! row and step) and `B` by rows of up to `NR` values (two vectors per step).
//! The accumulators stay in registers for the whole reduction.
//!
//! One tile per [ISA level](crate::isa): [`avx512`] (12 x 32, 24 of the 32
//! vector registers) and [`avx2`] (6 x 16, 12 of the 16). [`Kernel::get`]
//! picks the one this process runs.

#![cfg(target_arch = "x86_64")]

/// Where a tile's sums start.
#[derive(Clone, Copy)]
pub(crate) enum Init {
    /// From zero.
    Zero,
    /// From a row of `NR` values (a bias, padded) repeated for every row.
    Row(*const f32),
    /// From one value per row (`m` values: a convolution's bias per output
    /// channel) repeated along the row.
    PerRow(*const f32),
    /// From what the output holds (partial sums, or a result to add to).
    Load,
}

/// One tile: `m` rows of `a` (row stride `lda`), `kc` rows of `b` (row
/// stride `ldb`, the first `n` values of each read), into `c` (row stride
/// `ldc`, the first `n` columns of each row written).
#[derive(Clone, Copy)]
pub(crate) struct Tile {
    pub a: *const f32,
    pub lda: usize,
    pub b: *const f32,
    pub ldb: usize,
    pub kc: usize,
    pub c: *mut f32,
    pub ldc: usize,
    pub n: usize,
    pub init: Init,
}

/// A tile of one ISA level: its shape and the function that runs it.
#[derive(Clone, Copy)]
pub(crate) struct Kernel {
    /// Most rows of a tile.
    pub mr: usize,
    /// Most columns of a tile.
    pub nr: usize,
    /// Computes a tile of `m` rows (`1..=mr`) and `n` columns (`1..=nr`).
    ///
    /// # Safety
    /// The CPU has the level's features; `a` holds `m` rows of `kc` values
    /// at stride `lda`, `b` `kc` rows of `n` values at stride `ldb`, `c` `m`
    /// rows of `n` values at stride `ldc` (`Init::Row` a row of `nr` values,
    /// `Init::PerRow` `m` values); `c` overlaps none of them.
    pub run: unsafe fn(usize, &Tile),
}

impl Kernel {
    /// The tile for this process's [level](crate::isa::level), or `None` on
    /// the portable level.
    pub(crate) fn get() -> Option<Kernel> {
        match crate::isa::level() {
            crate::isa::Isa::Avx512 => Some(Kernel {
                mr: avx512::MR,
                nr: avx512::NR,
                run: avx512::run,
            }),
            crate::isa::Isa::Avx2 => Some(Kernel {
                mr: avx2::MR,
                nr: avx2::NR,
                run: avx2::run,
            }),
            crate::isa::Isa::Portable => None,
        }
    }
}

/// Dispatches a run-time row count to the tile of that many rows.
macro_rules! by_rows {
    ($m:expr, $t:expr, $tile:ident, $($rows:literal)+) => {
        match $m {
            $($rows => $tile::<$rows>($t),)+
            _ => $tile::<1>($t),
        }
    };
}

/// Steps of the reduction ahead of the one a tile computes at which it
/// prefetches `b`: 2 KiB ahead for a row of 32 values. This machine's
/// hardware prefetcher alone streams a classifier's weight (hundreds of MB,
/// read once) at a third of the rate it reaches with these hints.
const PREFETCH_STEPS: usize = 16;

/// Hints the cache to fetch `lines` cache lines of `b`'s row
/// [`PREFETCH_STEPS`] rows (stride `ldb`) ahead of `b`. Only a hint: the
/// address may lie past the buffer, where it is never dereferenced.
#[inline(always)]
fn prefetch_ahead(b: *const f32, ldb: usize, lines: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let ahead = b.wrapping_add(PREFETCH_STEPS * ldb) as *const i8;
    for l in 0..lines {
        // SAFETY: a prefetch does not fault, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l)) };
    }
}

/// The AVX-512 tile: 12 rows of 32 columns.
pub(crate) mod avx512 {
    use super::{Init, Tile};
    use std::arch::x86_64::*;

    /// Most rows of a tile.
    pub(crate) const MR: usize = 12;
    /// Most columns of a tile.
    pub(crate) const NR: usize = 32;

    /// The first `n` of 16 lanes.
    fn lane_mask(n: usize) -> __mmask16 {
        if n >= 16 {
            0xFFFF
        } else {
            ((1u32 << n) - 1) as __mmask16
        }
    }

    /// Computes `t` for `m` rows (`1..=MR`).
    ///
    /// # Safety
    /// The CPU has AVX-512F; otherwise as [`super::Kernel::run`].
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn run(m: usize, t: &Tile) {
        // SAFETY: as the caller guarantees.
        unsafe { by_rows!(m, t, tile, 12 11 10 9 8 7 6 5 4 3 2) }
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile<const M: usize>(t: &Tile) {
        let (m0, m1) = (lane_mask(t.n), lane_mask(t.n.saturating_sub(16)));
        // SAFETY (whole function): see `run`; lanes outside the masks are
        // never read from `b` or `c` nor written to `c`.
        let mut acc: [[__m512; 2]; M] = unsafe {
            match t.init {
                Init::Zero => [[_mm512_setzero_ps(); 2]; M],
                Init::Row(row) => [[_mm512_loadu_ps(row), _mm512_loadu_ps(row.add(16))]; M],
                Init::PerRow(col) => std::array::from_fn(|i| [_mm512_set1_ps(*col.add(i)); 2]),
                Init::Load => std::array::from_fn(|i| {
                    let c = t.c.add(i * t.ldc);
                    [
                        _mm512_maskz_loadu_ps(m0, c),
                        _mm512_maskz_loadu_ps(m1, c.add(16)),
                    ]
                }),
            }
        };
        let rows: [*const f32; M] = std::array::from_fn(|i| unsafe { t.a.add(i * t.lda) });
        for k in 0..t.kc {
            unsafe {
                let b = t.b.add(k * t.ldb);
                super::prefetch_ahead(b, t.ldb, 2);
                let b0 = _mm512_maskz_loadu_ps(m0, b);
                let b1 = _mm512_maskz_loadu_ps(m1, b.add(16));
                for i in 0..M {
                    let a = _mm512_set1_ps(*rows[i].add(k));
                    acc[i][0] = _mm512_fmadd_ps(a, b0, acc[i][0]);
                    acc[i][1] = _mm512_fmadd_ps(a, b1, acc[i][1]);
                }
            }
        }
        for (i, v) in acc.iter().enumerate() {
            unsafe {
                let c = t.c.add(i * t.ldc);
                _mm512_mask_storeu_ps(c, m0, v[0]);
                _mm512_mask_storeu_ps(c.add(16), m1, v[1]);
            }
        }
    }
}

/// The AVX2+FMA tile: 6 rows of 16 columns (of at most 8, one vector per row).
pub(crate) mod avx2 {
    use super::{Init, Tile};
    use std::arch::x86_64::*;

    /// Most rows of a tile.
    pub(crate) const MR: usize = 6;
    /// Most columns of a tile.
    pub(crate) const NR: usize = 16;

    /// Lane masks for the first `n` of 16 columns, as two 8-lane vectors.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn lane_masks(n: usize) -> [__m256i; 2] {
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let n = n.min(16) as i32;
        [
            _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lanes),
            _mm256_cmpgt_epi32(_mm256_set1_epi32(n - 8), lanes),
        ]
    }

    /// Computes `t` for `m` rows (`1..=MR`).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; otherwise as [`super::Kernel::run`].
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn run(m: usize, t: &Tile) {
        // SAFETY: as the caller guarantees.
        unsafe {
            if m <= 2 && t.n > NR / 2 {
                // Too few rows to hide the latency of the multiply-adds.
                match (m, t.n >= NR) {
                    (2, true) => split_reduction::<2, 2, true>(t),
                    (2, false) => split_reduction::<2, 2, false>(t),
                    (_, true) => split_reduction::<1, 4, true>(t),
                    (_, false) => split_reduction::<1, 4, false>(t),
                }
            } else if t.n >= NR {
                by_rows!(m, t, full, 6 5 4 3 2)
            } else if t.n <= NR / 2 {
                by_rows!(m, t, narrow, 6 5 4 3 2)
            } else {
                by_rows!(m, t, masked, 6 5 4 3 2)
            }
        }
    }

    /// A tile with all 16 columns: plain loads and stores.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn full<const M: usize>(t: &Tile) {
        // SAFETY: see `run`.
        unsafe { tile::<M, true>(t) }
    }

    /// A tile with fewer columns: masked loads and stores, which never touch
    /// the lanes past `n`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn masked<const M: usize>(t: &Tile) {
        // SAFETY: see `run`.
        unsafe { tile::<M, false>(t) }
    }

    /// A tile of at most 8 columns (a row's tail, such as the last pixel of
    /// a 7x7 plane): one vector per row, so half the products of
    /// [`masked`]'s two.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn narrow<const M: usize>(t: &Tile) {
        // SAFETY (whole function): see `run`; `t.n <= 8`.
        unsafe {
            let [m0, _] = lane_masks(t.n);
            let mut acc: [__m256; M] = match t.init {
                Init::Zero => [_mm256_setzero_ps(); M],
                Init::Row(row) => [_mm256_maskload_ps(row, m0); M],
                Init::PerRow(col) => std::array::from_fn(|i| _mm256_set1_ps(*col.add(i))),
                Init::Load => std::array::from_fn(|i| _mm256_maskload_ps(t.c.add(i * t.ldc), m0)),
            };
            let rows: [*const f32; M] = std::array::from_fn(|i| t.a.add(i * t.lda));
            for k in 0..t.kc {
                let b0 = _mm256_maskload_ps(t.b.add(k * t.ldb), m0);
                for i in 0..M {
                    let a = _mm256_broadcast_ss(&*rows[i].add(k));
                    acc[i] = _mm256_fmadd_ps(a, b0, acc[i]);
                }
            }
            for (i, v) in acc.iter().enumerate() {
                _mm256_maskstore_ps(t.c.add(i * t.ldc), m0, *v);
            }
        }
    }

    /// A tile of `M` rows (1 or 2) with the reduction split into `U`
    /// parts, each with its own accumulators, summed at the end: one row of
    /// one tile's two vectors is a chain of dependent multiply-adds, which
    /// would run at a quarter of the FMA units' rate (a batch of one through
    /// a classifier). The reduction is read as four consecutive stretches
    /// side by side, so that a weight streamed from memory (read once, by a
    /// batch of one) is read as four sequential streams at once: one stream
    /// a core is as far as the hardware prefetcher runs ahead (Zen 3, two
    /// threads, 151 MB read: 20-23 GB/s with one stream a thread, 26-33
    /// with two to eight; 1 x 9216 -> 4096 0.75x the time).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn split_reduction<const M: usize, const U: usize, const FULL: bool>(t: &Tile) {
        // SAFETY (whole function): see `run`; unless FULL, masked loads and
        // stores never touch the lanes past `n`.
        unsafe {
            const { assert!(M * U <= 4, "four accumulator pairs") };
            let [m0, m1] = lane_masks(t.n);
            let mut acc = [[_mm256_setzero_ps(); 2]; 4];
            for (i, acc) in acc.iter_mut().enumerate().take(M) {
                *acc = start::<FULL>(t, i, [m0, m1]);
            }
            // STREAMS stretches of the reduction, stretch s (steps s * len ..
            // (s + 1) * len) into accumulator set j = (s % U) * M + i for
            // row i; the steps past STREAMS * len go to set i.
            const STREAMS: usize = 4;
            const { assert!(STREAMS.is_multiple_of(U), "whole stretches per part") };
            let len = t.kc / STREAMS;
            let whole = len * STREAMS;
            for k in 0..len {
                for s in 0..STREAMS {
                    let ks = s * len + k;
                    let b = t.b.add(ks * t.ldb);
                    super::prefetch_ahead(b, t.ldb, 1);
                    let (b0, b1) = (load::<FULL>(b, m0), load::<FULL>(b.add(8), m1));
                    for i in 0..M {
                        let a = _mm256_broadcast_ss(&*t.a.add(i * t.lda + ks));
                        let j = (s % U) * M + i;
                        acc[j][0] = _mm256_fmadd_ps(a, b0, acc[j][0]);
                        acc[j][1] = _mm256_fmadd_ps(a, b1, acc[j][1]);
                    }
                }
            }
            for k in whole..t.kc {
                let b = t.b.add(k * t.ldb);
                let (b0, b1) = (load::<FULL>(b, m0), load::<FULL>(b.add(8), m1));
                for (i, acc) in acc.iter_mut().enumerate().take(M) {
                    let a = _mm256_broadcast_ss(&*t.a.add(i * t.lda + k));
                    acc[0] = _mm256_fmadd_ps(a, b0, acc[0]);
                    acc[1] = _mm256_fmadd_ps(a, b1, acc[1]);
                }
            }
            for i in 0..M {
                let mut v = acc[i];
                for u in 1..U {
                    let p = acc[u * M + i];
                    v = [_mm256_add_ps(v[0], p[0]), _mm256_add_ps(v[1], p[1])];
                }
                finish::<FULL>(t, i, [m0, m1], v);
            }
        }
    }

    /// Where row `i` of `t`'s sums starts (see [`Init`]).
    ///
    /// # Safety
    /// As [`run`], for row `i`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn start<const FULL: bool>(t: &Tile, i: usize, [m0, m1]: [__m256i; 2]) -> [__m256; 2] {
        // SAFETY: as the caller guarantees.
        unsafe {
            match t.init {
                Init::Zero => [_mm256_setzero_ps(); 2],
                Init::Row(row) => [_mm256_loadu_ps(row), _mm256_loadu_ps(row.add(8))],
                Init::PerRow(col) => [_mm256_set1_ps(*col.add(i)); 2],
                Init::Load => {
                    let c = t.c.add(i * t.ldc);
                    [load::<FULL>(c, m0), load::<FULL>(c.add(8), m1)]
                }
            }
        }
    }

    /// Stores row `i` of `t`'s sums.
    ///
    /// # Safety
    /// As [`run`], for row `i`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn finish<const FULL: bool>(t: &Tile, i: usize, [m0, m1]: [__m256i; 2], v: [__m256; 2]) {
        // SAFETY: as the caller guarantees.
        unsafe {
            let c = t.c.add(i * t.ldc);
            store::<FULL>(c, m0, v[0]);
            store::<FULL>(c.add(8), m1, v[1]);
        }
    }

    /// Eight values at `p`, of the lanes set in `m` unless `FULL`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load<const FULL: bool>(p: *const f32, m: __m256i) -> __m256 {
        // SAFETY: the caller's pointer holds the lanes read.
        unsafe {
            if FULL {
                _mm256_loadu_ps(p)
            } else {
                _mm256_maskload_ps(p, m)
            }
        }
    }

    /// Stores the lanes of `v` set in `m` (all of them if `FULL`) at `p`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn store<const FULL: bool>(p: *mut f32, m: __m256i, v: __m256) {
        // SAFETY: the caller's pointer holds the lanes written.
        unsafe {
            if FULL {
                _mm256_storeu_ps(p, v)
            } else {
                _mm256_maskstore_ps(p, m, v)
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const M: usize, const FULL: bool>(t: &Tile) {
        // SAFETY (whole function): see `run`.
        unsafe {
            let [m0, m1] = lane_masks(t.n);
            let mut acc: [[__m256; 2]; M] = std::array::from_fn(|i| start::<FULL>(t, i, [m0, m1]));
            let rows: [*const f32; M] = std::array::from_fn(|i| t.a.add(i * t.lda));
            for k in 0..t.kc {
                let b = t.b.add(k * t.ldb);
                super::prefetch_ahead(b, t.ldb, 1);
                let b0 = load::<FULL>(b, m0);
                let b1 = load::<FULL>(b.add(8), m1);
                for i in 0..M {
                    let a = _mm256_broadcast_ss(&*rows[i].add(k));
                    acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
                    acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
                }
            }
            for (i, v) in acc.into_iter().enumerate() {
                finish::<FULL>(t, i, [m0, m1], v);
            }
        }
    }
}
