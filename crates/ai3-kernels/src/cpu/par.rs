//! How kernels split work across threads: the elementwise kernels' chunks
//! and rows, and whether the pool's workers are known to be awake
//! ([`assume_workers_awake`]), which lowers the size worth sharing.

use std::cell::Cell;

use rayon::prelude::*;

thread_local! {
    /// Whether the pool's other workers are awake on this thread's behalf
    /// ([`assume_workers_awake`]).
    static AWAKE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with the kernels it calls on this thread told that the pool's
/// other workers stay awake, waiting for work, all the while (as a graph
/// run keeps them between its nodes): handing them part of a layer then
/// costs a few microseconds rather than the tens of waking a sleeping
/// thread, so smaller layers are worth sharing (see
/// [`workers_awake`]). The caller keeps the workers awake; this only says so.
pub fn assume_workers_awake<R>(f: impl FnOnce() -> R) -> R {
    /// Restores the flag however `f` ends.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            AWAKE.with(|a| a.set(self.0));
        }
    }
    let _restore = Restore(AWAKE.with(|a| a.replace(true)));
    f()
}

/// Whether this thread runs inside [`assume_workers_awake`].
pub fn workers_awake() -> bool {
    AWAKE.with(Cell::get)
}

/// Below this many elements threading costs more than it saves.
pub(crate) const PARALLEL_MIN: usize = 1 << 15;
/// Elements per rayon task: large enough to amortise scheduling.
pub(crate) const CHUNK: usize = 1 << 14;

/// Calls `f(r, row)` for every `inner`-long row `r` of `output`, in parallel
/// (rows grouped into tasks of about [`CHUNK`] elements) when `output` is large.
///
/// Only the loop over a task's rows is generic over `f`; the tasks reach rayon
/// through [`for_each_chunk`], so rayon's machinery is compiled once per element
/// type rather than once per caller's closure (it was most of the graph core's
/// compile time).
pub(crate) fn for_each_row<T: Send, F: Fn(usize, &mut [T]) + Sync>(
    output: &mut [T],
    inner: usize,
    f: F,
) {
    if inner == 0 {
        return;
    }
    let rows_per_task = (CHUNK / inner).max(1);
    let task = |t: usize, block: &mut [T]| {
        for (i, row) in block.chunks_mut(inner).enumerate() {
            f(t * rows_per_task + i, row);
        }
    };
    if output.len() >= PARALLEL_MIN {
        for_each_chunk(output, rows_per_task * inner, &task);
    } else {
        task(0, output);
    }
}

/// Calls `f(t, chunk)` for every `len`-long chunk `t` of `output` (the last may
/// be shorter; `len` must not be 0), in parallel. `f` is a trait object so that rayon is
/// instantiated once per element type; a task should be large enough that one
/// indirect call per chunk does not matter.
pub(crate) fn for_each_chunk<T: Send>(
    output: &mut [T],
    len: usize,
    f: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    output
        .par_chunks_mut(len)
        .enumerate()
        .for_each(|(t, chunk)| f(t, chunk));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assumed_awake_holds_inside_and_is_restored_however_f_ends() {
        assert!(!workers_awake());
        assert!(assume_workers_awake(
            || assume_workers_awake(workers_awake) && workers_awake()
        ));
        assert!(!workers_awake());
        let panicked = std::panic::catch_unwind(|| assume_workers_awake(|| panic!("in f")));
        assert!(panicked.is_err());
        assert!(!workers_awake());
        // Only the calling thread is told.
        assume_workers_awake(|| {
            assert!(!std::thread::spawn(workers_awake).join().expect("joined"));
        });
    }

    #[test]
    fn awake_workers_share_smaller_convolutions() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("pool");
        let macs = 200_000;
        let shared =
            pool.install(|| assume_workers_awake(|| crate::cpu::conv2d::threads_for_macs(macs)));
        assert_eq!(shared, 2);
    }

    #[test]
    fn every_row_is_visited_once_with_its_index() {
        for (rows, inner) in [(3, 5), (PARALLEL_MIN / 7 + 3, 7), (1, PARALLEL_MIN + 1)] {
            let mut out = vec![usize::MAX; rows * inner];
            for_each_row(&mut out, inner, |r, row| row.fill(r));
            for (r, row) in out.chunks(inner).enumerate() {
                assert!(row.iter().all(|&v| v == r));
            }
        }
    }

    #[test]
    fn every_chunk_is_visited_once_with_its_index_and_length() {
        for (len, chunk) in [(10, 3), (9, 3), (1, 5), (CHUNK * 3 + 7, CHUNK)] {
            let mut out = vec![(usize::MAX, 0); len];
            for_each_chunk(&mut out, chunk, &|t, c| {
                let n = c.len();
                c.iter_mut().for_each(|v| *v = (t, n));
            });
            for (i, &(t, n)) in out.iter().enumerate() {
                assert_eq!(t, i / chunk);
                assert_eq!(n, chunk.min(len - t * chunk));
            }
        }
    }
}
