//! The element trait every kernel is generic over.

use std::any::TypeId;
use std::fmt::Debug;
use std::iter::Sum;
use std::ops::{AddAssign, MulAssign};

/// A floating-point element type a kernel can compute in (f32 and f64).
///
/// Kernels are written once against this trait instead of being copied per dtype.
pub trait Float:
    num_traits::Float
    + num_traits::FromPrimitive
    // Signed makes every Float a rustfft::FftNum, so the FFT convolution is generic too.
    + num_traits::Signed
    + Default
    + Debug
    + Send
    + Sync
    + Sum
    + AddAssign
    + MulAssign
    // Zeroed memory from the allocator is a buffer of zeros (`alloc::try_zeroed_vec`).
    + crate::alloc::Zeroable
    + 'static
{
    /// `exp(x)` for each element of `xs`, in place, accurate to a few ulp.
    /// f32 uses a polynomial on 16 lanes with AVX-512, on 8 with AVX2, else
    /// a branch-free one the compiler vectorises (softmax's exponentials
    /// otherwise cost as much as attention's two GEMMs); f64 calls the C
    /// library.
    fn exp_in_place(xs: &mut [Self]) {
        xs.iter_mut().for_each(|x| *x = x.exp());
    }
}

/// Lanes of independent partial sums in [`lane_sum`]: the compiler
/// vectorises sums it may split.
pub(crate) const LANES: usize = 8;

/// `v` as f32 values, when `T` is f32.
pub(crate) fn as_f32<T: Float>(v: &[T]) -> Option<&[f32]> {
    (TypeId::of::<T>() == TypeId::of::<f32>())
        // SAFETY: T is f32, so this is the same slice.
        .then(|| unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), v.len()) })
}

/// `v` as mutable f32 values, when `T` is f32.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn as_f32_mut<T: Float>(v: &mut [T]) -> Option<&mut [f32]> {
    (TypeId::of::<T>() == TypeId::of::<f32>())
        // SAFETY: T is f32, so this is the same slice.
        .then(|| unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), v.len()) })
}

/// The sum of `f(v)` over `x` in f64, over [`LANES`] partial sums: fast
/// (vectorised in a caller compiled for a vector ISA, see `multiversion!`)
/// and more accurate than one running sum.
#[inline(always)]
pub(crate) fn lane_sum<T: Float>(x: &[T], f: impl Fn(T) -> f64) -> f64 {
    let mut acc = [0.0f64; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder().iter().map(|&v| f(v)).sum::<f64>();
    for c in chunks {
        for i in 0..LANES {
            acc[i] += f(c[i]);
        }
    }
    acc.iter().sum::<f64>() + rest
}

/// The sum of `f(v)` over `x` in f32, over 16 partial sums added pairwise
/// at the end: [`lane_sum`] for sums that f32 holds well enough (a
/// layer norm's rows), vectorised the same way.
#[inline(always)]
pub(crate) fn lane_sum_f32(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    const L: usize = 16;
    let mut acc = [0.0f32; L];
    let chunks = x.chunks_exact(L);
    let rest: f32 = chunks.remainder().iter().map(|&v| f(v)).sum();
    for c in chunks {
        for i in 0..L {
            acc[i] += f(c[i]);
        }
    }
    let mut w = L;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            acc[i] += acc[i + w];
        }
    }
    acc[0] + rest
}

impl Float for f32 {
    fn exp_in_place(xs: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if crate::isa::avx512() {
            // SAFETY: avx512f is available.
            unsafe { avx512::exp_in_place(xs) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if crate::isa::level() >= crate::isa::Isa::Avx2 {
            // SAFETY: AVX2 and FMA are available.
            unsafe { avx2::exp_in_place(xs) };
            return;
        }
        xs.iter_mut().for_each(|x| *x = exp_f32(*x));
    }
}

/// Cephes' `expf`: `ln 2` in two parts for the reduction `x - n ln 2`, and
/// the coefficients of its polynomial for `exp(r)`, highest degree first.
#[cfg(target_arch = "x86_64")]
const EXP_LN2: [f32; 2] = [0.693_359_4, -2.121_944_4e-4];
#[cfg(target_arch = "x86_64")]
const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];

/// f32 `exp` on 16 lanes at a time.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    /// `exp(x)` on 16 lanes: `x = n ln 2 + r` with `|r| <= ln 2 / 2`, a
    /// degree-6 polynomial for `exp(r)` (Cephes' `expf` coefficients) and
    /// `scalef` for the `2^n`, which gives 0 and infinity past the range
    /// (subnormal results on the way to 0); NaN stays NaN.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn exp(x: __m512) -> __m512 {
        // min/max return their second operand where one is NaN: x goes second.
        let x = _mm512_max_ps(
            _mm512_set1_ps(-110.0),
            _mm512_min_ps(_mm512_set1_ps(100.0), x),
        );
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(super::EXP_LN2[0]), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(super::EXP_LN2[1]), r);
        let mut p = _mm512_set1_ps(super::EXP_POLY[0]);
        for c in &super::EXP_POLY[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(*c));
        }
        let p = _mm512_fmadd_ps(
            _mm512_mul_ps(p, r),
            r,
            _mm512_add_ps(r, _mm512_set1_ps(1.0)),
        );
        _mm512_scalef_ps(p, n)
    }

    /// [`exp`] over `xs` in place, the tail masked.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn exp_in_place(xs: &mut [f32]) {
        let mut chunks = xs.chunks_exact_mut(16);
        for c in &mut chunks {
            // SAFETY: c holds 16 values.
            unsafe { _mm512_storeu_ps(c.as_mut_ptr(), exp(_mm512_loadu_ps(c.as_ptr()))) };
        }
        let rest = chunks.into_remainder();
        let m = ((1u32 << rest.len()) - 1) as __mmask16;
        // SAFETY: the mask covers exactly the rest.len() < 16 values.
        unsafe {
            let v = exp(_mm512_maskz_loadu_ps(m, rest.as_ptr()));
            _mm512_mask_storeu_ps(rest.as_mut_ptr(), m, v);
        }
    }
}

/// f32 `exp` on 8 lanes at a time.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    /// `x = n ln 2 + r` with `|r| <= ln 2 / 2` on 8 lanes: `n` (integral)
    /// and `exp(r)` by the polynomial of Cephes' `expf`, `x` finite or NaN.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn reduced(x: __m256) -> (__m256, __m256) {
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(super::EXP_LN2[0]), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(super::EXP_LN2[1]), r);
        let mut p = _mm256_set1_ps(super::EXP_POLY[0]);
        for c in &super::EXP_POLY[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
        }
        let p = _mm256_fmadd_ps(
            _mm256_mul_ps(p, r),
            r,
            _mm256_add_ps(r, _mm256_set1_ps(1.0)),
        );
        (n, p)
    }

    /// `exp(x)` on 8 lanes: [`super::avx512::exp`]'s reduction and
    /// polynomial, with the `2^n` built in the exponent bits as
    /// [`super::exp_f32`] does; 0 below -87.5, infinity above 88.7228, NaN
    /// stays NaN.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn exp(x: __m256) -> __m256 {
        let (lo, hi) = (_mm256_set1_ps(-87.5), _mm256_set1_ps(88.722_8));
        // min/max return their second operand where one is NaN: x goes second.
        let xc = _mm256_max_ps(lo, _mm256_min_ps(hi, x));
        let (n, p) = reduced(xc);
        // 2^(n-1) * 2: n reaches 128 at the top of the range, one past f32's exponents.
        let bits = _mm256_max_epi32(
            _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(126)),
            _mm256_setzero_si256(),
        );
        let scale = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(bits));
        let y = _mm256_mul_ps(_mm256_mul_ps(p, scale), _mm256_set1_ps(2.0));
        // Outside the range: the exact limits (NaN compares false, keeping y's NaN).
        let y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps::<_CMP_LT_OQ>(x, lo));
        _mm256_blendv_ps(
            y,
            _mm256_set1_ps(f32::INFINITY),
            _mm256_cmp_ps::<_CMP_GT_OQ>(x, hi),
        )
    }

    /// [`exp`] over `xs` in place, the tail by [`super::exp_f32`].
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn exp_in_place(xs: &mut [f32]) {
        let mut chunks = xs.chunks_exact_mut(8);
        for c in &mut chunks {
            // SAFETY: c holds 8 values; the CPU has AVX2 and FMA (the caller's promise).
            unsafe { _mm256_storeu_ps(c.as_mut_ptr(), exp(_mm256_loadu_ps(c.as_ptr()))) };
        }
        for x in chunks.into_remainder() {
            *x = super::exp_f32(*x);
        }
    }
}

impl Float for f64 {}

/// `exp(x)` in f32 without branches: `2^n * p(r)` with `x = n ln2 + r`,
/// `|r| <= ln2 / 2`, `p` a degree-6 polynomial (relative error below 2e-7
/// over the whole range); underflow gives 0, overflow +inf, NaN stays NaN.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let xc = x.clamp(-87.5, 88.7228);
    // Round to nearest by the 1.5 * 2^23 trick: plain SSE2, so the loop vectorises.
    const SHIFT: f32 = 12_582_912.0;
    let n = (xc * LOG2E + SHIFT) - SHIFT;
    let r = xc - n * LN2_HI - n * LN2_LO;
    // Taylor coefficients 1/k! up to k = 6, in Horner form.
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // 2^(n-1) * 2: n reaches 128 at the top of the range, one past f32's exponents.
    let scale = f32::from_bits(((n as i32 + 126).max(0) as u32) << 23);
    let y = p * scale * 2.0;
    // Outside the clamped range: exact limits (NaN compares false everywhere, and
    // keeps its NaN through the clamp and the arithmetic).
    if x < -87.5 {
        0.0
    } else if x > 88.7228 {
        f32::INFINITY
    } else {
        y
    }
}

#[cfg(test)]
mod tests {
    use super::{exp_f32, Float};

    #[test]
    fn exp_in_place_is_accurate_everywhere() {
        let mut xs: Vec<f32> = (-2200..2200).map(|i| i as f32 * 0.05).collect();
        xs.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e-30,
            -1e-30,
        ]);
        let mut got = xs.clone();
        f32::exp_in_place(&mut got);
        for (&x, &g) in xs.iter().zip(&got) {
            let want = (x as f64).exp();
            let ok = if x.is_nan() {
                g.is_nan()
            } else if want > f32::MAX as f64 {
                g == f32::INFINITY
            } else {
                // Near the bottom of the normal range the portable path flushes to 0.
                ((g as f64) - want).abs() <= 4e-7 * want + 4.0 * f32::MIN_POSITIVE as f64
            };
            assert!(ok, "exp({x}) = {g}, want {want}");
        }
    }

    #[test]
    fn exp_f32_is_accurate_everywhere() {
        let mut x = -100.0f32;
        while x < 100.0 {
            let (got, want) = (exp_f32(x) as f64, (x as f64).exp());
            if want < f32::MIN_POSITIVE as f64 * 4.0 {
                assert!(got <= f32::MIN_POSITIVE as f64 * 8.0, "{x}: {got}");
            } else if want > f32::MAX as f64 * 0.999 {
                assert!(
                    got == f64::INFINITY || (got - want).abs() <= 3e-7 * want,
                    "{x}"
                );
            } else {
                assert!((got - want).abs() <= 3e-7 * want, "{x}: {got} vs {want}");
            }
            x += 0.0137;
        }
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(0.0), 1.0);
    }
}
