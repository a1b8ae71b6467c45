//! The one place the kernels call into the `gemm` crate.

use gemm::Parallelism;

use crate::Float;

/// A row-major-ish view of a matrix: base pointer plus row and column strides
/// in elements, so transposed or interleaved operands need no copy.
#[derive(Clone, Copy)]
pub(crate) struct MatPtr<T> {
    pub ptr: *const T,
    pub rs: usize,
    pub cs: usize,
}

// SAFETY: a read-only view; sharing it between threads only shares reads.
unsafe impl<T: Sync> Send for MatPtr<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for MatPtr<T> {}

/// `dst[m x n] = lhs[m x k] @ rhs[k x n]`, or `+=` when `accumulate`.
///
/// `dst` has unit column stride and row stride `dst_rs`.
///
/// # Safety
/// Every element addressed through the three views must be in bounds of a
/// live allocation, and `dst` must not overlap `lhs` or `rhs`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul<T: Float>(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut T,
    dst_rs: usize,
    accumulate: bool,
    lhs: MatPtr<T>,
    rhs: MatPtr<T>,
    parallelism: Parallelism,
) {
    let dst = MatMut {
        ptr: dst,
        rs: dst_rs,
        cs: 1,
    };
    // SAFETY: forwarded from the caller.
    unsafe { matmul_strided(m, n, k, dst, accumulate, lhs, rhs, parallelism) }
}

/// A mutable strided matrix view, like [`MatPtr`].
#[derive(Clone, Copy)]
pub(crate) struct MatMut<T> {
    pub ptr: *mut T,
    pub rs: usize,
    pub cs: usize,
}

/// [`matmul`] with any destination strides.
///
/// # Safety
/// As for [`matmul`].
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul_strided<T: Float>(
    m: usize,
    n: usize,
    k: usize,
    dst: MatMut<T>,
    accumulate: bool,
    lhs: MatPtr<T>,
    rhs: MatPtr<T>,
    parallelism: Parallelism,
) {
    let (dst_rs, dst_cs) = (dst.rs, dst.cs);
    let dst = dst.ptr;
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // An empty sum is zero; handled here so the gemm crate never sees it.
        if !accumulate {
            for i in 0..m {
                // SAFETY: the caller guarantees the m x n destination is in bounds.
                for j in 0..n {
                    // SAFETY: the caller guarantees the m x n destination is in bounds.
                    unsafe { *dst.add(i * dst_rs + j * dst_cs) = T::zero() };
                }
            }
        }
        return;
    }
    // SAFETY: forwarded from the caller; T is f32 or f64, which gemm supports.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            dst_cs as isize,
            dst_rs as isize,
            accumulate,
            lhs.ptr,
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.ptr,
            rhs.cs as isize,
            rhs.rs as isize,
            T::one(),
            T::one(),
            false,
            false,
            false,
            parallelism,
        )
    }
}
