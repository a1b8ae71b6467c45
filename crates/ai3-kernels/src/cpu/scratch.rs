//! Per-thread scratch buffers shared by the kernels (im2col columns,
//! Winograd tiles, the rows of separable pooling).

use std::any::Any;
use std::cell::RefCell;

use crate::alloc::{try_zeroed_vec, KernelResult};
use crate::Float;

thread_local! {
    static SCRATCH_F32: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static SCRATCH_F64: RefCell<Vec<f64>> = const { RefCell::new(Vec::new()) };
}

/// What scratch allocations are called in errors.
const WHAT: &str = "per-thread scratch buffer";

/// Runs `f` on a scratch buffer of `len` elements whose contents are
/// unspecified (left over from earlier calls): `f` must write every element
/// it later reads.
///
/// The buffer is kept per thread and reused, so hot loops neither allocate nor
/// pay page faults on fresh zeroed memory each call. A nested call on the same
/// thread (rayon may run another task while this one waits) gets a fresh
/// allocation instead. Only growing the buffer allocates, and a growth the
/// system refuses is an error, never an abort.
pub(crate) fn with_scratch<T: Float, R>(
    len: usize,
    f: impl FnOnce(&mut [T]) -> R,
) -> KernelResult<R> {
    with_scratch_named(len, WHAT, f)
}

/// [`with_scratch`] for a buffer that errors call `what` (a refused
/// allocation names the buffer the kernel needed, e.g. `"padded input
/// copy"`).
pub(crate) fn with_scratch_named<T: Float, R>(
    len: usize,
    what: &'static str,
    f: impl FnOnce(&mut [T]) -> R,
) -> KernelResult<R> {
    fn run<T: Float, U: Float, R>(
        cell: &RefCell<Vec<U>>,
        len: usize,
        what: &'static str,
        f: impl FnOnce(&mut [T]) -> R,
    ) -> KernelResult<R> {
        match cell.try_borrow_mut() {
            Ok(mut buf) => {
                if buf.len() < len {
                    // Freed first, so the old and new buffers never coexist.
                    *buf = Vec::new();
                    *buf = try_zeroed_vec(len, what)?;
                }
                match (&mut *buf as &mut dyn Any).downcast_mut::<Vec<T>>() {
                    Some(v) => Ok(f(&mut v[..len])),
                    None => Ok(f(&mut try_zeroed_vec(len, what)?)),
                }
            }
            Err(_) => Ok(f(&mut try_zeroed_vec(len, what)?)),
        }
    }
    let t = std::any::TypeId::of::<T>();
    if t == std::any::TypeId::of::<f32>() {
        SCRATCH_F32.with(|c| run(c, len, what, f))
    } else if t == std::any::TypeId::of::<f64>() {
        SCRATCH_F64.with(|c| run(c, len, what, f))
    } else {
        Ok(f(&mut try_zeroed_vec(len, what)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_growth_is_an_error_and_later_calls_still_work() {
        with_scratch::<f32, _>(8, |b| b.fill(1.0)).unwrap();
        let err = with_scratch::<f32, _>(1 << 60, |_| ()).unwrap_err();
        assert!(matches!(err, crate::KernelError::Alloc { bytes, .. } if bytes == 1 << 62));
        assert_eq!(with_scratch::<f32, _>(8, |b| b.len()).unwrap(), 8);
    }
}
