//! Fallible allocation, checked sizes and buffer-length checks for the kernels.
//!
//! Buffer sizes derive from what the user chose (input shapes, padding,
//! dilation), so a size can overflow and an allocation can fail. Neither may
//! abort the process or wrap around silently: every allocation whose size
//! comes from the problem goes through [`try_zeroed_vec`] or
//! [`try_vec_with_capacity`], sizes are computed with [`checked_product`] and
//! [`checked_sum`], and both report a [`KernelError`] that `ai3-core` turns
//! into `ai3.OutOfMemoryError` or `ai3.ShapeError`.
//!
//! On Linux a request larger than the memory and swap there are fails at once;
//! a smaller one may succeed and the pages be committed only when touched, as
//! for every program (PyTorch included).

use std::alloc::{alloc_zeroed, Layout};
use std::fmt;

/// What can stop a kernel, other than the user's C++ throwing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelError {
    /// The system refused `bytes` bytes for `what`.
    Alloc {
        /// The buffer, e.g. `"padded input copy"`.
        what: &'static str,
        /// Bytes asked for.
        bytes: usize,
    },
    /// The size of `what`, computed from the problem's dimensions, does not
    /// fit in a Rust allocation (`isize::MAX` bytes) or overflows `usize`.
    Overflow {
        /// The size that overflowed, e.g. `"conv2d padded input height"`.
        what: &'static str,
    },
    /// A buffer handed to a kernel has `got` elements where the problem needs
    /// `expected`: a bug in the caller, checked before any write.
    Length {
        /// The buffer, e.g. `"conv2d output"`.
        what: &'static str,
        /// Elements the problem needs.
        expected: usize,
        /// Elements given.
        got: usize,
    },
    /// Parameters that break a kernel's contract (a kernel larger than the
    /// padded input, a zero stride): a bug in the caller, which validates them.
    Precondition {
        /// What does not hold.
        what: &'static str,
    },
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelError::Alloc { what, bytes } => {
                write!(f, "cannot allocate {} for the {what}", format_bytes(*bytes))
            }
            KernelError::Overflow { what } => {
                write!(f, "the {what} overflows a 64-bit size")
            }
            KernelError::Length {
                what,
                expected,
                got,
            } => write!(f, "the {what} has {got} elements, expected {expected}"),
            KernelError::Precondition { what } => write!(f, "precondition violated: {what}"),
        }
    }
}

impl std::error::Error for KernelError {}

/// Result of a kernel.
pub type KernelResult<T = ()> = Result<T, KernelError>;

/// A byte count for people, in decimal units, with the exact count:
/// `64.0 TB (64000000000000 bytes)`.
///
/// ```
/// use ai3_kernels::alloc::format_bytes;
/// assert_eq!(format_bytes(64_000_000_000_000), "64.0 TB (64000000000000 bytes)");
/// assert_eq!(format_bytes(512), "512 bytes");
/// ```
pub fn format_bytes(bytes: usize) -> String {
    const UNITS: [&str; 6] = ["kB", "MB", "GB", "TB", "PB", "EB"];
    if bytes < 1000 {
        return format!("{bytes} bytes");
    }
    let mut value = bytes as f64 / 1000.0;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    format!("{value:.1} {} ({bytes} bytes)", UNITS[unit])
}

/// Types whose all-zero bytes are the value zero, so zeroed memory from the
/// allocator (which the OS hands out lazily) is a ready buffer of zeros.
///
/// # Safety
/// Every all-zero bit pattern of the type's size must be a valid value of it.
pub unsafe trait Zeroable: Copy {}

// SAFETY: zero bits are 0.0, 0 and a pair/triple of those.
unsafe impl Zeroable for f32 {}
// SAFETY: as above.
unsafe impl Zeroable for f64 {}
// SAFETY: as above.
unsafe impl Zeroable for u8 {}
// SAFETY: as above.
unsafe impl Zeroable for usize {}
// SAFETY: `Complex` is a `repr(C)` pair of `T`s, zero when both are.
unsafe impl<T: Zeroable> Zeroable for rustfft::num_complex::Complex<T> {}

/// Bytes of `len` values of `T`, or [`KernelError::Overflow`] when that
/// exceeds what one allocation may hold (`isize::MAX`).
#[inline]
pub fn byte_size<T>(len: usize, what: &'static str) -> KernelResult<usize> {
    len.checked_mul(std::mem::size_of::<T>())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or(KernelError::Overflow { what })
}

/// A `Vec` of `len` zeros, or an error instead of aborting when the size
/// overflows ([`KernelError::Overflow`]) or the system refuses the memory
/// ([`KernelError::Alloc`]). Like `vec![0.0; len]`, large buffers of types
/// aligned to at most 16 bytes come zeroed from the OS, page by page as they
/// are touched (`calloc`); more strictly aligned ones are zeroed when made.
pub fn try_zeroed_vec<T: Zeroable>(len: usize, what: &'static str) -> KernelResult<Vec<T>> {
    let bytes = byte_size::<T>(len, what)?;
    if bytes == 0 {
        // Nothing to allocate (`len` is 0, or `T` is zero-sized).
        // SAFETY: all-zero bytes are a valid `T` (`Zeroable`).
        return Ok(std::iter::repeat_with(|| unsafe { std::mem::zeroed() })
            .take(len)
            .collect());
    }
    let layout = Layout::array::<T>(len).map_err(|_| KernelError::Overflow { what })?;
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        return Err(KernelError::Alloc { what, bytes });
    }
    // SAFETY: allocated by the global allocator with the layout of `len` `T`s,
    // which is a Vec of capacity `len`'s; zeroed bytes are valid `T`s (`Zeroable`).
    Ok(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

/// An empty `Vec` with room for `capacity` elements, or an error instead of aborting.
pub fn try_vec_with_capacity<T>(capacity: usize, what: &'static str) -> KernelResult<Vec<T>> {
    let mut v = Vec::new();
    try_reserve(&mut v, capacity, what)?;
    Ok(v)
}

/// Makes `v` `len` long (new elements `value`), failing instead of aborting
/// when it must grow and cannot; shrinking keeps the capacity for reuse.
pub fn try_resize<T: Clone>(
    v: &mut Vec<T>,
    len: usize,
    value: T,
    what: &'static str,
) -> KernelResult<()> {
    if len > v.len() {
        try_reserve(v, len - v.len(), what)?;
    }
    v.resize(len, value);
    Ok(())
}

/// Room for `additional` more elements in `v`.
fn try_reserve<T>(v: &mut Vec<T>, additional: usize, what: &'static str) -> KernelResult<()> {
    let total = v
        .len()
        .checked_add(additional)
        .ok_or(KernelError::Overflow { what })?;
    let bytes = byte_size::<T>(total, what)?;
    v.try_reserve_exact(additional)
        .map_err(|_| KernelError::Alloc { what, bytes })
}

/// The product of `factors`, or [`KernelError::Overflow`] naming `what`.
#[inline]
pub fn checked_product(what: &'static str, factors: &[usize]) -> KernelResult<usize> {
    factors
        .iter()
        .try_fold(1usize, |acc, &f| acc.checked_mul(f))
        .ok_or(KernelError::Overflow { what })
}

/// The sum of `terms`, or [`KernelError::Overflow`] naming `what`.
#[inline]
pub fn checked_sum(what: &'static str, terms: &[usize]) -> KernelResult<usize> {
    terms
        .iter()
        .try_fold(0usize, |acc, &t| acc.checked_add(t))
        .ok_or(KernelError::Overflow { what })
}

/// `Ok` when the buffer `what` has the `expected` length; a release-build
/// check kernels make before writing through raw pointers.
#[inline]
pub fn check_len(what: &'static str, got: usize, expected: usize) -> KernelResult<()> {
    if got == expected {
        Ok(())
    } else {
        Err(KernelError::Length {
            what,
            expected,
            got,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_vec_is_zero_and_of_the_length_asked() {
        for len in [0, 1, 1000, 1 << 20] {
            let v: Vec<f64> = try_zeroed_vec(len, "test").unwrap();
            assert_eq!(v.len(), len);
            assert!(v.iter().all(|&x| x == 0.0));
        }
        let v: Vec<usize> = try_zeroed_vec(3, "test").unwrap();
        assert_eq!(v, [0, 0, 0]);
    }

    #[test]
    fn an_impossible_allocation_is_an_error_not_an_abort() {
        // 2^57 f64 are 2^60 bytes: a valid layout, larger than any machine's memory.
        let len = 1usize << 57;
        let err = try_zeroed_vec::<f64>(len, "huge buffer").unwrap_err();
        assert_eq!(
            err,
            KernelError::Alloc {
                what: "huge buffer",
                bytes: 1 << 60
            }
        );
        assert!(err
            .to_string()
            .contains("1.2 EB (1152921504606846976 bytes)"));
        let err = try_vec_with_capacity::<f32>(1 << 60, "huge capacity").unwrap_err();
        assert!(matches!(err, KernelError::Alloc { bytes, .. } if bytes == 1 << 62));
        let mut v = vec![1.0f32; 4];
        assert!(try_resize(&mut v, 1 << 60, 0.0, "grown").is_err());
        assert_eq!(v, [1.0; 4], "a failed growth leaves the vector as it was");
        try_resize(&mut v, 2, 0.0, "shrunk").unwrap();
        assert_eq!(v, [1.0; 2]);
    }

    #[test]
    fn sizes_past_isize_max_overflow() {
        let err = try_zeroed_vec::<f32>(usize::MAX / 2, "wide").unwrap_err();
        assert_eq!(err, KernelError::Overflow { what: "wide" });
        assert!(try_zeroed_vec::<u8>(isize::MAX as usize + 1, "bytes").is_err());
        assert_eq!(
            checked_product("p", &[1 << 32, 1 << 32]),
            Err(KernelError::Overflow { what: "p" })
        );
        assert_eq!(checked_product("p", &[3, 5, 7]), Ok(105));
        assert_eq!(checked_product("p", &[]), Ok(1));
        assert!(checked_sum("s", &[usize::MAX, 1]).is_err());
        assert_eq!(checked_sum("s", &[1, 2, 3]), Ok(6));
    }

    #[test]
    fn lengths_are_checked() {
        assert_eq!(check_len("out", 4, 4), Ok(()));
        let err = check_len("out", 3, 4).unwrap_err();
        assert_eq!(err.to_string(), "the out has 3 elements, expected 4");
    }

    #[test]
    fn bytes_read_for_people() {
        assert_eq!(format_bytes(0), "0 bytes");
        assert_eq!(format_bytes(999), "999 bytes");
        assert_eq!(format_bytes(1500), "1.5 kB (1500 bytes)");
        assert_eq!(
            format_bytes(64_000_384_000_576),
            "64.0 TB (64000384000576 bytes)"
        );
        assert!(format_bytes(usize::MAX).contains("EB"));
    }
}
