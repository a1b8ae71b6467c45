//! The f32 AVX-512 register tile the packed linear layer and flash attention
//! share: `C[m x n] (+)= A[m x kc] @ B[kc x n]` for `m <= 12` rows and
//! `n <= 32` columns, with `A` read by rows (one value broadcast per row and
//! step) and `B` by rows of up to 32 values (two vectors per step). The 24
//! accumulators stay in registers for the whole reduction.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

/// Most rows of a tile.
pub(crate) const MR: usize = 12;

/// Where a tile's sums start.
#[derive(Clone, Copy)]
pub(crate) enum Init {
    /// From zero.
    Zero,
    /// From a row of `NR` values (a bias, padded) repeated for every row.
    Row(*const f32),
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
/// The CPU has AVX-512F; `a` holds `m` rows of `kc` values at stride `lda`,
/// `b` `kc` rows of `n` values at stride `ldb`, `c` `m` rows of `n` values at
/// stride `ldc` (and `Init::Row` a row of `NR` values); `c` overlaps neither.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn run(m: usize, t: &Tile) {
    // SAFETY: as the caller guarantees.
    unsafe {
        match m {
            12 => tile::<12>(t),
            11 => tile::<11>(t),
            10 => tile::<10>(t),
            9 => tile::<9>(t),
            8 => tile::<8>(t),
            7 => tile::<7>(t),
            6 => tile::<6>(t),
            5 => tile::<5>(t),
            4 => tile::<4>(t),
            3 => tile::<3>(t),
            2 => tile::<2>(t),
            _ => tile::<1>(t),
        }
    }
}

#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn tile<const M: usize>(t: &Tile) {
    let (m0, m1) = (lane_mask(t.n), lane_mask(t.n.saturating_sub(16)));
    // SAFETY (whole function): see `run`; lanes outside the masks are never
    // read from `b` or `c` nor written to `c`.
    let mut acc: [[__m512; 2]; M] = unsafe {
        match t.init {
            Init::Zero => [[_mm512_setzero_ps(); 2]; M],
            Init::Row(row) => [[_mm512_loadu_ps(row), _mm512_loadu_ps(row.add(16))]; M],
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
