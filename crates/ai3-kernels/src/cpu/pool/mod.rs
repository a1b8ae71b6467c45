//! 2-D pooling on the CPU: maximum, average, adaptive average and adaptive maximum.
//!
//! Each kernel runs one rayon task per `(batch, channel)` plane; windows are
//! clipped to the input, so padding is never materialised. Max and average
//! pooling share one separable driver (`separable`); their channel-blocked
//! forms (`blocked`) reduce whole pixels of 8 channels.

mod adaptive;
mod avg;
mod blocked;
mod max;
mod separable;

pub use adaptive::{adaptive_avgpool2d, adaptive_maxpool2d};
pub use avg::avgpool2d;
pub use blocked::{avgpool2d_blocked, maxpool2d_blocked};
pub use max::maxpool2d;

use rayon::prelude::*;

use crate::alloc::{try_vec_with_capacity, KernelResult};

/// Runs `f(input_plane, output_plane)` for every plane, in parallel; the
/// first error (a refused scratch allocation) is returned.
pub(crate) fn for_each_plane<T, F>(
    input: &[T],
    in_plane: usize,
    output: &mut [T],
    out_plane: usize,
    f: F,
) -> KernelResult<()>
where
    T: Send + Sync,
    F: Fn(&[T], &mut [T]) -> KernelResult<()> + Sync,
{
    if out_plane == 0 || in_plane == 0 {
        return Ok(());
    }
    output
        .par_chunks_mut(out_plane)
        .zip(input.par_chunks(in_plane))
        .try_for_each(|(o, i)| f(i, o))
}

/// `f(i)` for `i` in `0..len`, collected into a vector allocated fallibly
/// (the per-row and per-column windows of an output plane).
pub(crate) fn try_table<U>(len: usize, f: impl Fn(usize) -> U) -> KernelResult<Vec<U>> {
    let mut v = try_vec_with_capacity(len, "pooling window table")?;
    v.extend((0..len).map(f));
    Ok(v)
}
