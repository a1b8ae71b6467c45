//! The thread pool every kernel runs in.
//!
//! Graph runs enter this pool, so rayon work inside kernels (and inside the
//! `gemm` crate) uses its threads. The Python package sizes it from
//! `AI3_NUM_THREADS` or, by default, follows `torch.get_num_threads()`.
//!
//! ## Sharing the cores with PyTorch's OpenMP threads
//!
//! After each of its parallel regions, GNU OpenMP (PyTorch's CPU runtime)
//! keeps its worker threads spinning for milliseconds, waiting for the next
//! region. ai3 layers that run right after PyTorch work (every swapped layer,
//! and converted models called between PyTorch calls) would share the cores
//! with those spinning threads and run up to twice as slowly. So when the
//! front end registers the runtime's `GOMP_parallel` entry point
//! ([`set_openmp_parallel`]), [`install_parking_openmp`] runs the work from
//! inside one OpenMP parallel region: one of its threads runs the work in
//! ai3's pool, the others block on a condition variable until it is done,
//! asleep instead of spinning.

use std::ffi::c_void;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};

use crate::error::{Error, Result};

static POOL: RwLock<Option<Arc<rayon::ThreadPool>>> = RwLock::new(None);

/// Uses `n` threads from now on (a new pool; calls already running keep theirs).
pub fn set_num_threads(n: usize) -> Result<()> {
    if n == 0 {
        return Err(Error::invalid(
            "threads",
            "the number of threads must be positive",
        ));
    }
    if num_threads() == n && current().is_some() {
        return Ok(());
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("ai3-{i}"))
        .build()
        .map_err(|e| Error::internal("threads", format!("cannot start {n} threads: {e}")))?;
    *POOL.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(pool));
    Ok(())
}

fn current() -> Option<Arc<rayon::ThreadPool>> {
    POOL.read().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Threads kernels use: the configured pool's, or rayon's global default.
pub fn num_threads() -> usize {
    current().map_or_else(rayon::current_num_threads, |p| p.current_num_threads())
}

/// Runs `f` inside the configured pool (or rayon's global pool if none is set).
pub fn install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    match current() {
        Some(pool) => pool.install(f),
        None => f(),
    }
}

/// The GNU OpenMP ABI's `GOMP_parallel(fn, data, num_threads, flags)`: runs
/// `fn(data)` on every thread of a new team (`num_threads` 0: the default
/// count) and returns when all have finished. LLVM's and Intel's OpenMP
/// runtimes export it too.
pub type OpenMpParallel = unsafe extern "C" fn(extern "C" fn(*mut c_void), *mut c_void, u32, u32);

static OPENMP_PARALLEL: AtomicUsize = AtomicUsize::new(0);

/// Registers the `GOMP_parallel` whose idle threads [`install_parking_openmp`]
/// parks, or with `None` stops parking.
///
/// # Safety
/// `parallel` must stay callable for as long as the process runs (a function
/// of a loaded OpenMP runtime, which is never unloaded) and behave as
/// `GOMP_parallel` does: call its first argument with its second on each
/// thread of a team, then return.
pub unsafe fn set_openmp_parallel(parallel: Option<OpenMpParallel>) {
    OPENMP_PARALLEL.store(parallel.map_or(0, |f| f as usize), Ordering::Release);
}

/// Whether an OpenMP runtime is registered for parking.
pub fn parks_openmp() -> bool {
    OPENMP_PARALLEL.load(Ordering::Acquire) != 0
}

/// One [`install_parking_openmp`] call, shared by the threads of its OpenMP team.
struct Park<F, R> {
    job: Mutex<Option<F>>,
    result: Mutex<Option<std::thread::Result<R>>>,
    done: Mutex<bool>,
    finished: Condvar,
}

/// Each OpenMP thread's part: the first to arrive runs the job in ai3's pool,
/// the others sleep until it is done.
extern "C" fn park_thread<F: FnOnce() -> R + Send, R: Send>(data: *mut c_void) {
    // SAFETY: `data` is the `Park` that `install_parking_openmp` keeps alive
    // until `GOMP_parallel` has returned, i.e. until every thread is out of here.
    let park = unsafe { &*(data as *const Park<F, R>) };
    let job = park.job.lock().unwrap_or_else(|p| p.into_inner()).take();
    let mut done = park.done.lock().unwrap_or_else(|p| p.into_inner());
    match job {
        Some(f) => {
            drop(done);
            // A panic must not unwind through OpenMP's C frames: it is carried over.
            let result = catch_unwind(AssertUnwindSafe(|| install(f)));
            *park.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
            *park.done.lock().unwrap_or_else(|p| p.into_inner()) = true;
            park.finished.notify_all();
        }
        None => {
            while !*done {
                done = park.finished.wait(done).unwrap_or_else(|p| p.into_inner());
            }
        }
    }
}

/// Like [`install`], but with the idle threads of the registered OpenMP
/// runtime asleep meanwhile (see the module documentation); the same as
/// [`install`] when none is registered.
pub fn install_parking_openmp<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let address = OPENMP_PARALLEL.load(Ordering::Acquire);
    if address == 0 {
        return install(f);
    }
    // SAFETY: only `set_openmp_parallel` stores non-zero values, and they are
    // `OpenMpParallel` functions that stay callable (its contract).
    let parallel: OpenMpParallel = unsafe { std::mem::transmute::<usize, OpenMpParallel>(address) };
    run_parking(parallel, f)
}

fn run_parking<F: FnOnce() -> R + Send, R: Send>(parallel: OpenMpParallel, f: F) -> R {
    let park = Park {
        job: Mutex::new(Some(f)),
        result: Mutex::new(None),
        done: Mutex::new(false),
        finished: Condvar::new(),
    };
    // SAFETY: `park` outlives the call, which returns only after every thread
    // of the team has left `park_thread`.
    unsafe {
        parallel(
            park_thread::<F, R>,
            &park as *const Park<F, R> as *mut c_void,
            0,
            0,
        )
    };
    let Park { job, result, .. } = park;
    match result.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(Ok(r)) => r,
        Some(Err(panic)) => resume_unwind(panic),
        // A runtime that ran no thread at all: run the work here.
        None => {
            let f = job.into_inner().unwrap_or_else(|p| p.into_inner());
            install(f.expect("the job runs at most once"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for `GOMP_parallel` with a team of three threads.
    unsafe extern "C" fn team_of_three(
        f: extern "C" fn(*mut c_void),
        data: *mut c_void,
        _: u32,
        _: u32,
    ) {
        let data = data as usize;
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(move || f(data as *mut c_void));
            }
        });
    }

    /// A stand-in for a runtime that starts no thread.
    unsafe extern "C" fn no_team(_: extern "C" fn(*mut c_void), _: *mut c_void, _: u32, _: u32) {}

    #[test]
    fn parked_work_runs_once_and_returns_its_result() {
        let runs = AtomicUsize::new(0);
        let out = run_parking(team_of_three, || {
            runs.fetch_add(1, Ordering::SeqCst);
            7
        });
        assert_eq!(out, 7);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(run_parking(no_team, || 5), 5);
    }

    #[test]
    fn a_panic_in_parked_work_reaches_the_caller() {
        let caught = catch_unwind(|| run_parking(team_of_three, || panic!("boom")));
        let payload = caught.expect_err("the panic must come through");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"boom"));
    }

    #[test]
    fn work_runs_with_the_configured_count() {
        set_num_threads(3).unwrap();
        assert_eq!(num_threads(), 3);
        assert_eq!(install(rayon::current_num_threads), 3);
        assert!(set_num_threads(0).is_err());
        set_num_threads(1).unwrap();
        assert_eq!(install(rayon::current_num_threads), 1);
    }
}
