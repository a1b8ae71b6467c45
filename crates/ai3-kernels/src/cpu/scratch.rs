//! Per-thread scratch buffers shared by the kernels (im2col columns,
//! Winograd tiles, the rows of separable pooling).

use std::any::Any;
use std::cell::RefCell;

use crate::Float;

thread_local! {
    static SCRATCH_F32: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static SCRATCH_F64: RefCell<Vec<f64>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on a scratch buffer of `len` elements whose contents are
/// unspecified (left over from earlier calls): `f` must write every element
/// it later reads.
///
/// The buffer is kept per thread and reused, so hot loops neither allocate nor
/// pay page faults on fresh zeroed memory each call. A nested call on the same
/// thread (rayon may run another task while this one waits) gets a fresh
/// allocation instead.
pub(crate) fn with_scratch<T: Float, R>(len: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
    fn run<T: Float, U: Float, R>(
        cell: &RefCell<Vec<U>>,
        len: usize,
        f: impl FnOnce(&mut [T]) -> R,
    ) -> R {
        match cell.try_borrow_mut() {
            Ok(mut buf) => {
                if buf.len() < len {
                    *buf = vec![U::zero(); len];
                }
                match (&mut *buf as &mut dyn Any).downcast_mut::<Vec<T>>() {
                    Some(v) => f(&mut v[..len]),
                    None => f(&mut vec![T::zero(); len]),
                }
            }
            Err(_) => f(&mut vec![T::zero(); len]),
        }
    }
    let t = std::any::TypeId::of::<T>();
    if t == std::any::TypeId::of::<f32>() {
        SCRATCH_F32.with(|c| run(c, len, f))
    } else if t == std::any::TypeId::of::<f64>() {
        SCRATCH_F64.with(|c| run(c, len, f))
    } else {
        f(&mut vec![T::zero(); len])
    }
}
