//! 2-D convolution on the CPU, one file per algorithm.
//!
//! All algorithms share one contract: contiguous NCHW input, weight
//! `[out_channels, in_channels / groups, kernel_h, kernel_w]` (Winograd takes
//! its own pre-transformed weight instead), optional bias `[out_channels]`,
//! implicit zero padding given per side, and an output buffer of
//! [`Conv2dParams::output_len`](crate::params::Conv2dParams::output_len)
//! elements that is fully overwritten.

pub mod depthwise;
pub mod direct;
pub mod fft;
pub mod gemm;
pub mod smm;
pub mod tiled;
pub mod winograd;

mod padded;
pub use padded::padded_copy_elements;

use rayon::prelude::*;

use crate::alloc::KernelResult;
pub(crate) use crate::cpu::scratch::with_scratch;
use crate::params::Conv2dParams;

/// Upper bound, in elements, on the scratch buffers (im2col columns,
/// Winograd tiles) one call allocates, so memory stays bounded for large images.
pub(crate) const WORKSPACE_ELEMENTS: usize = 8 << 20;

/// Multiply-accumulates below which a convolution runs on the calling thread
/// only: waking another thread costs tens of microseconds, more than such a
/// convolution takes on one.
const SERIAL_MACS: usize = 1 << 20;
/// [`SERIAL_MACS`] where the pool's other workers are awake
/// ([`crate::cpu::par::workers_awake`], a graph run): handing them work
/// costs a few microseconds. On Zen 1 (two threads, 60 1x1 convolutions
/// in a converted model, batch 1), sharing took 0.7x the time per layer of
/// 64 -> 64 and 32 -> 32 channels at 7x7 and 14x14 (200K-800K
/// multiply-accumulates; 14 -> 10 us at 200K), where a layer of 50K
/// stayed as fast on one thread.
const SERIAL_MACS_AWAKE: usize = 1 << 17;

/// Set by the tests that run kernels on two threads, so that their small
/// problems still take the parallel paths they are there to check.
#[cfg(test)]
pub(crate) static SHARE_SMALL: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Threads a convolution may use: 1 when it is too small to share.
pub(crate) fn threads_for(p: &Conv2dParams) -> usize {
    threads_for_macs(p.macs())
}

/// Threads for a convolution whose kernel takes as long as `macs`
/// multiply-accumulates of the register-tiled ones (see [`SERIAL_MACS`]).
pub(crate) fn threads_for_macs(macs: usize) -> usize {
    let serial = if crate::cpu::par::workers_awake() {
        SERIAL_MACS_AWAKE
    } else {
        SERIAL_MACS
    };
    let small = macs < serial;
    #[cfg(test)]
    let small = small && !SHARE_SMALL.load(std::sync::atomic::Ordering::Relaxed);
    if small {
        1
    } else {
        rayon::current_num_threads()
    }
}

/// Fewest items per rayon task for the parallel loops of `p` (for
/// `with_min_len`): all of them when `p` is too small to share, so the loop
/// runs inline and wakes no other thread.
pub(crate) fn min_len(p: &Conv2dParams) -> usize {
    if threads_for(p) == 1 {
        usize::MAX
    } else {
        1
    }
}

/// The output indices `o` in `[start, end)` for which the input index
/// `o * stride + offset - pad` lands inside `[0, in_len)`.
///
/// Computing this range once per kernel tap lets the algorithms skip the
/// padded border without materialising a padded copy of the input.
#[inline]
pub(crate) fn valid_range(
    out_len: usize,
    in_len: usize,
    stride: usize,
    offset: usize,
    pad: usize,
) -> (usize, usize) {
    let start = if offset >= pad {
        0
    } else {
        (pad - offset).div_ceil(stride)
    };
    let end = if offset >= in_len + pad {
        0
    } else {
        (in_len + pad - offset).div_ceil(stride)
    };
    let end = end.min(out_len);
    (start.min(end), end)
}

/// How much of the machine one `(image, group)` task may use.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TaskBudget {
    /// Scratch elements the task may allocate.
    pub workspace: usize,
    /// Threads the task may use inside: all of them when tasks run one after
    /// another, 1 when tasks already run in parallel (or the layer is small).
    pub threads: usize,
}

/// Runs `task(image, group, output_of_that_image_and_group, budget)` for every
/// `(image, group)` pair; each pair owns a contiguous
/// `[out_channels / groups, out_h, out_w]` block of the output.
///
/// With at least as many pairs as threads (large batches, depthwise) the pairs
/// run in parallel, each single-threaded with a share of the workspace;
/// otherwise they run in turn and parallelise inside, so small batches still
/// use every core. The first task error (a refused allocation) is returned.
pub(crate) fn for_each_image_group<T, F>(
    p: &Conv2dParams,
    output: &mut [T],
    task: F,
) -> KernelResult<()>
where
    T: Send,
    F: Fn(usize, usize, &mut [T], TaskBudget) -> KernelResult<()> + Sync,
{
    let block = p.out_channels_per_group() * p.out_h() * p.out_w();
    if block == 0 {
        return Ok(());
    }
    let tasks = p.batch * p.groups;
    let threads = threads_for(p);
    if threads > 1 && tasks >= threads {
        let budget = TaskBudget {
            workspace: (WORKSPACE_ELEMENTS / threads).max(1),
            threads: 1,
        };
        output
            .par_chunks_mut(block)
            .enumerate()
            .try_for_each(|(t, out)| task(t / p.groups, t % p.groups, out, budget))
    } else {
        let budget = TaskBudget {
            workspace: WORKSPACE_ELEMENTS,
            threads,
        };
        output
            .chunks_mut(block)
            .enumerate()
            .try_for_each(|(t, out)| task(t / p.groups, t % p.groups, out, budget))
    }
}

/// A function the kernels that fuse their epilogue (depthwise, tiled) apply
/// in place to finished output, a block at a time while it is in cache (a
/// residual and an activation): `f(at, s)` gets output elements
/// `at..at + s.len()`.
pub type Epilogue<'a, T> = &'a (dyn Fn(usize, &mut [T]) + Sync);

/// `f` run on the f32 views of a convolution's buffers and epilogue, when
/// `T` is f32 (for the f32-only kernels, all x86-64); `None` otherwise.
#[cfg(target_arch = "x86_64")]
pub(crate) fn with_f32<T: crate::Float, R>(
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
    epilogue: Option<Epilogue<T>>,
    f: impl FnOnce(&[f32], &[f32], Option<&[f32]>, &mut [f32], Option<Epilogue<f32>>) -> R,
) -> Option<R> {
    use crate::float::{as_f32, as_f32_mut};
    let (x, w, out) = (as_f32(input)?, as_f32(weight)?, as_f32_mut(output)?);
    let b = bias.map(|b| as_f32(b).expect("T is f32"));
    // SAFETY: T is f32 (the casts above succeeded), so the epilogue's f32
    // slices are T slices.
    let e = epilogue.map(|g| {
        move |at: usize, s: &mut [f32]| {
            g(at, unsafe {
                std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<T>(), s.len())
            })
        }
    });
    Some(f(x, w, b, out, e.as_ref().map(|g| g as Epilogue<f32>)))
}

/// A raw output pointer shared by tasks that write disjoint parts of one buffer.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut<T>(pub *mut T);

// SAFETY: only used to hand disjoint regions of one buffer to parallel tasks.
unsafe impl<T: Send> Send for SharedMut<T> {}
// SAFETY: as above; no two tasks touch the same element.
unsafe impl<T: Send> Sync for SharedMut<T> {}

#[cfg(test)]
mod tests {
    use super::valid_range;

    #[test]
    fn valid_range_matches_brute_force() {
        for out_len in 0..6 {
            for in_len in 1..6 {
                for stride in 1..4 {
                    for offset in 0..5 {
                        for pad in 0..4 {
                            let ok: Vec<usize> = (0..out_len)
                                .filter(|&o| {
                                    let i = (o * stride + offset) as isize - pad as isize;
                                    i >= 0 && (i as usize) < in_len
                                })
                                .collect();
                            let (s, e) = valid_range(out_len, in_len, stride, offset, pad);
                            let got: Vec<usize> = (s..e).collect();
                            assert_eq!(got, ok, "{out_len} {in_len} {stride} {offset} {pad}");
                        }
                    }
                }
            }
        }
    }
}
