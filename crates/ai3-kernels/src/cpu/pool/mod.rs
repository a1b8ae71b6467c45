//! 2-D pooling on the CPU: maximum, average, adaptive average and adaptive maximum.
//!
//! Each kernel runs one rayon task per `(batch, channel)` plane; windows are
//! clipped to the input, so padding is never materialised.

mod adaptive;
mod avg;
mod max;

pub use adaptive::{adaptive_avgpool2d, adaptive_maxpool2d};
pub use avg::avgpool2d;
pub use max::maxpool2d;

use rayon::prelude::*;

/// Runs `f(input_plane, output_plane)` for every plane, in parallel.
pub(crate) fn for_each_plane<T, F>(
    input: &[T],
    in_plane: usize,
    output: &mut [T],
    out_plane: usize,
    f: F,
) where
    T: Send + Sync,
    F: Fn(&[T], &mut [T]) + Sync,
{
    if out_plane == 0 || in_plane == 0 {
        return;
    }
    output
        .par_chunks_mut(out_plane)
        .zip(input.par_chunks(in_plane))
        .for_each(|(o, i)| f(i, o));
}
