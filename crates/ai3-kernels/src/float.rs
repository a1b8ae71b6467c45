//! The element trait every kernel is generic over.

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
    /// f32 uses a branch-free polynomial the compiler vectorises (softmax's
    /// exponentials otherwise cost as much as attention's two GEMMs); f64
    /// calls the C library.
    fn exp_in_place(xs: &mut [Self]) {
        xs.iter_mut().for_each(|x| *x = x.exp());
    }
}

impl Float for f32 {
    fn exp_in_place(xs: &mut [f32]) {
        xs.iter_mut().for_each(|x| *x = exp_f32(*x));
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
    use super::exp_f32;

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
