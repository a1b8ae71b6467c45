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
}

impl Float for f32 {}
impl Float for f64 {}
