//! The thread pool every kernel runs in.
//!
//! Graph runs enter this pool, so rayon work inside kernels (and inside the
//! `gemm` crate) uses its threads. The Python package sizes it from
//! `AI3_NUM_THREADS` or, by default, follows `torch.get_num_threads()`.
//!
//! ## After `fork`
//!
//! A forked child has only the thread that called `fork`; the pool's threads
//! stayed in the parent, and a pool without its threads never finishes any
//! work. A `pthread_atfork` handler therefore forgets the pool in the child
//! (there is no thread to join or signal) and turns parking off; the child's
//! next run builds a fresh pool of the same size. The handler also holds the
//! pool's lock across `fork`, so no child starts with it held by a thread it
//! does not have.
//!
//! ## Sharing the cores with PyTorch's OpenMP threads
//!
//! After each of its parallel regions, GNU OpenMP (PyTorch's CPU runtime)
//! keeps its worker threads spinning for milliseconds, waiting for the next
//! region. ai3 layers that run right after PyTorch work (every swapped layer,
//! and converted models called between PyTorch calls) would share the cores
//! with those spinning threads and run up to twice as slowly. So
//! [`park_openmp`] looks up `GOMP_parallel` in the OpenMP runtime that
//! `libtorch_cpu` itself links (found among the loaded objects, opened with
//! `RTLD_NOLOAD`, never loaded by ai3), and [`install_parking_openmp`] then runs
//! the work from inside one OpenMP parallel region: one of its threads runs
//! the work in ai3's pool, the others block on a condition variable until it
//! is done, asleep instead of spinning.
//!
//! Only the thread that turned parking on parks. OpenMP gives every thread
//! that opens a parallel region a team of its own, so parking from every
//! calling thread would start one more team per thread, all spinning after
//! their region. Other threads run without parking, and a forked child never
//! parks: its runtime's teams stayed in the parent.

use std::ffi::c_void;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

static POOL: RwLock<Option<Arc<rayon::ThreadPool>>> = RwLock::new(None);
/// The thread count last asked for (0: never), kept so that a forked child
/// rebuilds a pool of the same size.
static WANTED: AtomicUsize = AtomicUsize::new(0);

/// Uses `n` threads from now on (a new pool; calls already running keep
/// theirs). One thread needs no pool: runs go on the calling thread (see
/// [`install`]), and a pool built before is let go.
pub fn set_num_threads(n: usize) -> Result<()> {
    if n == 0 {
        return Err(Error::invalid(
            "threads",
            "the number of threads must be positive",
        ));
    }
    fork::watch();
    let pooled = n > 1;
    if WANTED.load(Ordering::Acquire) == n && configured().is_some() == pooled {
        return Ok(());
    }
    WANTED.store(n, Ordering::Release);
    if !pooled {
        *POOL.write().unwrap_or_else(|p| p.into_inner()) = None;
        return Ok(());
    }
    build(n).map(|_| ())
}

/// Starts a pool of `n` threads and makes it the configured one.
fn build(n: usize) -> Result<Arc<rayon::ThreadPool>> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("ai3-{i}"))
        .build()
        .map_err(|e| Error::internal("threads", format!("cannot start {n} threads: {e}")))?;
    let pool = Arc::new(pool);
    *POOL.write().unwrap_or_else(|p| p.into_inner()) = Some(pool.clone());
    Ok(pool)
}

fn configured() -> Option<Arc<rayon::ThreadPool>> {
    POOL.read().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The pool runs use: the configured one, built now if no count was set yet
/// (with one thread per core) or if a fork left this process without it.
/// `None` only if no thread can be started.
///
/// rayon's global pool is never used: after a fork it would wait forever on
/// threads that stayed in the parent.
fn current() -> Option<Arc<rayon::ThreadPool>> {
    configured().or_else(|| build(num_threads()).ok())
}

/// Threads kernels use: the configured count, else one per core.
pub fn num_threads() -> usize {
    match WANTED.load(Ordering::Acquire) {
        0 => cores(),
        n => n,
    }
}

/// The cores this process may run on. Asked once: on Linux it reads the
/// cgroup's CPU quota from files, tens of microseconds, and every call of a
/// model asks.
fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Runs `f` inside ai3's pool; with one thread configured, on the calling
/// thread itself ([`run_on_caller`]): a pool of one would only hand the run
/// to its worker and back. That hand-off, with PyTorch's OpenMP team of two
/// around, made the calls wait for the scheduler's 4-ms ticks: a converted
/// mobilenet_v2 at batch 1 with `AI3_NUM_THREADS=1` (torch on 2 threads, a
/// 2-core Zen 4) took 13.3-13.6 ms a call (median), the calls falling on
/// 8.0, 12.0 and 16.0 ms, and takes 9.4-9.8 on the calling thread.
pub fn install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if num_threads() == 1 {
        return run_on_caller(f);
    }
    match current() {
        Some(pool) => pool.install(f),
        None => f(),
    }
}

/// Runs `f` on this worker of ai3's pool while the pool's other workers
/// stay awake: each runs a job that takes the pool's pending work as it
/// appears (`rayon::yield_now`) and waits for more between jobs, until `f`
/// returns.
/// For a graph run, whose nodes each split their work across the pool: a
/// rayon worker left without work sleeps after a few microseconds (its
/// CPU halts), and waking it for the next node takes a system call and an
/// interrupt to that CPU (on a virtual machine, through the host). This is
/// the wait OpenMP's and oneTBB's spinning workers avoid, for the length of
/// one run only.
///
/// Between jobs a worker gives its core away (`sched_yield`) rather than
/// spinning on it: where another process takes one of the cores, a worker
/// that kept spinning on it took the time slices the worker doing the work
/// there needed (two threads on a 2-core Zen 4 with a busy loop pinned to
/// the second core: mobilenet_v2 at batch 1 22.1 -> 11.9 ms a call, ONNX
/// Runtime 14.4; with the busy loop free to move, resnet50 145 -> 90 ms,
/// ONNX Runtime 98, OpenVINO 70); alone on the cores the same time
/// (mobilenet_v2 4.02 and 4.04 ms, efficientnet_b0 6.36 and 6.45, within
/// the runs' spread). Where another thread wants a worker's core all along,
/// the workers sit the runs out for a while (see `Helpers::help`): with
/// the busy loop free to move, resnet50 at batch 1 84.1 ms a call against
/// 95.8 without (OpenVINO 80.0 in the same run).
///
/// Only when the pool has no more threads than the process has cores: a
/// spinning worker sharing a core would slow the one doing the work. Runs
/// `f` alone outside a pool and on a pool of one. Mobilenet_v2, batch 1,
/// two threads: 1.96 -> 1.88 ms; efficientnet_b0 batch 1 0.95x the time,
/// squeezenet1_1 0.98x, batch 10 (mobilenet_v2, resnet50) 0.98x.
pub fn with_workers_awake<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let threads = rayon::current_num_threads();
    let Some(me) = rayon::current_thread_index() else {
        return f();
    };
    if threads < 2 || threads > cores() {
        return f();
    }
    /// Ends the helpers' jobs when dropped, however `f` ends.
    struct Done<'a>(&'a Helpers);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            self.0.finish();
        }
    }
    let helpers = Helpers::default();
    let helpers = &helpers;
    rayon::scope(|s| {
        for _ in 1..threads {
            s.spawn(move |_| {
                // Taken back by `f`'s own thread (after `f`, as the scope
                // ends; inside `f` it cannot be, since stealing takes the
                // oldest jobs first, but spinning there would never let `f`
                // finish).
                if rayon::current_thread_index() == Some(me) {
                    return;
                }
                helpers.help();
            });
        }
        let _done = Done(helpers);
        ai3_kernels::cpu::par::assume_workers_awake(f)
    })
}

/// A wait on a yielded core longer than this: the core went to another
/// thread (of this machine, or of the host's other guests) meanwhile.
const LONG_YIELD: Duration = Duration::from_micros(500);
/// The span over which the time lost to long yields is summed.
const WINDOW: Duration = Duration::from_millis(50);
/// How long workers sit out graph runs once their cores were taken for
/// more than a quarter of a [`WINDOW`].
const SIT_OUT: Duration = Duration::from_millis(100);

/// How much the pool's workers lost their cores lately (times in
/// nanoseconds since [`epoch_ns`]'s epoch).
struct Contention {
    /// Start of the current window.
    start: AtomicU64,
    /// Time lost to long yields in it.
    lost: AtomicU64,
    /// Until when the workers sit out.
    until: AtomicU64,
}

/// This process's record.
static CONTENTION: Contention = Contention::new();

impl Contention {
    const fn new() -> Self {
        Contention {
            start: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            until: AtomicU64::new(0),
        }
    }

    /// Records `lost` nanoseconds of a worker's core taken by another
    /// thread, at `now`; whether the cores were taken often enough that the
    /// workers should sit out (they will, from `now` for [`SIT_OUT`]).
    fn taken(&self, lost: u64, now: u64) -> bool {
        let window = WINDOW.as_nanos() as u64;
        if now.saturating_sub(self.start.load(Ordering::Relaxed)) >= window {
            self.start.store(now, Ordering::Relaxed);
            self.lost.store(0, Ordering::Relaxed);
        }
        if self.lost.fetch_add(lost, Ordering::Relaxed) + lost > window / 4 {
            self.until
                .fetch_max(now + SIT_OUT.as_nanos() as u64, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Whether the workers sit out at `now`.
    fn sitting_out(&self, now: u64) -> bool {
        now < self.until.load(Ordering::Relaxed)
    }
}

/// Nanoseconds since this process first asked.
fn epoch_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// The other workers of one [`with_workers_awake`] run.
#[derive(Default)]
struct Helpers {
    done: AtomicBool,
    lock: Mutex<()>,
    finished: Condvar,
}

impl Helpers {
    /// A worker's part: takes the pool's pending work as it appears and
    /// gives its core away between jobs, until the run is done. A worker
    /// whose core another thread takes holds its share of a layer until the
    /// scheduler gives the core back, and the layer waits for it. Where that
    /// is no passing event (a host taking a virtual core for a millisecond,
    /// a few times a second here) but another thread that wants the core
    /// all along (the yields came back late for more than a quarter of
    /// [`WINDOW`]), the workers sit the runs out for [`SIT_OUT`] (asleep,
    /// taking no work) and each run's own thread does every share.
    fn help(&self) {
        if CONTENTION.sitting_out(epoch_ns()) {
            return self.sit_out();
        }
        while !self.done.load(Ordering::Acquire) {
            if rayon::yield_now() != Some(rayon::Yield::Executed) {
                let asked = Instant::now();
                std::thread::yield_now();
                let waited = asked.elapsed();
                if waited > LONG_YIELD && CONTENTION.taken(waited.as_nanos() as u64, epoch_ns()) {
                    return self.sit_out();
                }
            }
        }
    }

    /// Sleeps until the run is done.
    fn sit_out(&self) {
        let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        while !self.done.load(Ordering::Acquire) {
            guard = self.finished.wait(guard).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Ends the run: the helping workers return, the sitting ones wake.
    fn finish(&self) {
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.done.store(true, Ordering::Release);
        self.finished.notify_all();
    }
}

thread_local! {
    /// This thread's pool of one: the thread itself as its only worker (see
    /// [`run_on_caller`]). Built on first use; `None` when this thread is
    /// already a worker of another pool (ai3's, or another library's).
    static CALLER_POOL: Option<rayon::ThreadPool> = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .use_current_thread()
        .build()
        .ok();
}

/// Runs `f` on the calling thread alone, waking no other thread: its
/// kernels see one thread (`rayon::current_num_threads()` is 1 there, and
/// their parallel loops run in place). For runs too small to pay for handing
/// the work to the pool and back, two thread switches that cost more than a
/// small layer's whole computation.
///
/// The calling thread becomes, once and for good, the only worker of a pool
/// of its own. rayon never frees such a pool's bookkeeping (a few kilobytes
/// per thread that ever calls this). A forked child keeps a working pool: it
/// has no thread besides the one that forked. Called from a worker of
/// another pool (a nested run), `f` runs in place in that pool.
pub fn run_on_caller<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let mut f = Some(f);
    let ran = CALLER_POOL
        .try_with(|pool| {
            pool.as_ref()
                .map(|pool| pool.install(f.take().expect("not run yet")))
        })
        .ok()
        .flatten();
    match (ran, f) {
        (Some(r), _) => r,
        // Another pool's worker (its threads run `f`'s parallel loops), or a
        // thread being torn down.
        (None, Some(f)) => f(),
        (None, None) => unreachable!("run_on_caller: the work ran but returned nothing"),
    }
}

/// The GNU OpenMP ABI's `GOMP_parallel(fn, data, num_threads, flags)`: runs
/// `fn(data)` on every thread of a new team (`num_threads` 0: the default
/// count) and returns when all have finished. LLVM's and Intel's OpenMP
/// runtimes export it too.
type OpenMpParallel = unsafe extern "C" fn(extern "C" fn(*mut c_void), *mut c_void, u32, u32);

/// `GOMP_parallel` of PyTorch's runtime while parking is on, else 0.
static OPENMP_PARALLEL: AtomicUsize = AtomicUsize::new(0);
/// Set in a forked child: parking stays off there.
static FORKED: AtomicBool = AtomicBool::new(false);
/// Identifies the thread that parks (see [`this_thread`]); 0 for none.
static PARKING_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static THREAD_MARK: u8 = const { 0 };
}

/// A number unique to the calling thread among the live threads (the address
/// of one of its thread-locals).
fn this_thread() -> usize {
    THREAD_MARK.with(|m| m as *const u8 as usize)
}

/// Turns parking on, for runs started from the calling thread, or off.
/// Returns whether it is on: it stays off when `libtorch_cpu` is not loaded,
/// links no OpenMP runtime, or this process is a forked child.
pub fn park_openmp(on: bool) -> bool {
    fork::watch();
    let parallel = match on && !FORKED.load(Ordering::Acquire) {
        true => openmp::torch_gomp_parallel(),
        false => None,
    };
    PARKING_THREAD.store(this_thread(), Ordering::Release);
    OPENMP_PARALLEL.store(parallel.map_or(0, |f| f as usize), Ordering::Release);
    parallel.is_some()
}

/// Whether parking is on (for the thread that turned it on).
pub fn parks_openmp() -> bool {
    OPENMP_PARALLEL.load(Ordering::Acquire) != 0
}

/// Finds `GOMP_parallel` in the OpenMP runtime PyTorch's CPU library links.
#[cfg(target_os = "linux")]
mod openmp {
    use std::ffi::{c_int, c_void, CStr, CString};

    use super::OpenMpParallel;

    /// The path of the loaded object whose file name starts with `prefix`.
    fn loaded_object(prefix: &[u8]) -> Option<CString> {
        struct Search<'a> {
            prefix: &'a [u8],
            found: Option<CString>,
        }
        unsafe extern "C" fn visit(
            info: *mut libc::dl_phdr_info,
            _size: usize,
            data: *mut c_void,
        ) -> c_int {
            // SAFETY: `dl_iterate_phdr` passes a valid entry and our `data`,
            // the `Search` below, which outlives the iteration.
            let (info, search) = unsafe { (&*info, &mut *(data as *mut Search)) };
            if info.dlpi_name.is_null() {
                return 0;
            }
            // SAFETY: a non-null `dlpi_name` is a NUL-terminated path.
            let path = unsafe { CStr::from_ptr(info.dlpi_name) };
            let name = path.to_bytes().rsplit(|&b| b == b'/').next().unwrap_or(&[]);
            if name.starts_with(search.prefix) {
                search.found = Some(path.to_owned());
                return 1;
            }
            0
        }
        let mut search = Search {
            prefix,
            found: None,
        };
        // SAFETY: `visit` matches the callback type and only reads what it is given.
        unsafe { libc::dl_iterate_phdr(Some(visit), &mut search as *mut Search as *mut c_void) };
        search.found
    }

    pub(super) fn torch_gomp_parallel() -> Option<OpenMpParallel> {
        let path = loaded_object(b"libtorch_cpu.")?;
        // SAFETY: RTLD_NOLOAD only returns a handle on a library already
        // loaded (it runs no initialiser). The handle is never closed, so the
        // library, and the runtime it links, stay loaded for good.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
        if handle.is_null() {
            return None;
        }
        // dlsym on a handle searches the library, then its dependencies: the
        // symbol found is the one libtorch_cpu's own calls reach.
        // SAFETY: a valid handle and a NUL-terminated name.
        let symbol = unsafe { libc::dlsym(handle, c"GOMP_parallel".as_ptr()) };
        // SAFETY: `GOMP_parallel` has this signature in every runtime that exports it.
        (!symbol.is_null())
            .then(|| unsafe { std::mem::transmute::<*mut c_void, OpenMpParallel>(symbol) })
    }
}

#[cfg(not(target_os = "linux"))]
mod openmp {
    pub(super) fn torch_gomp_parallel() -> Option<super::OpenMpParallel> {
        None
    }
}

/// The `pthread_atfork` handlers (see the module documentation).
#[cfg(unix)]
mod fork {
    use std::cell::RefCell;
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Once, RwLockWriteGuard};

    use super::{FORKED, OPENMP_PARALLEL, POOL};

    type Held = RwLockWriteGuard<'static, Option<Arc<rayon::ThreadPool>>>;

    thread_local! {
        /// The pool's lock, held by the forking thread from `prepare` to `parent` or `child`.
        static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
    }

    extern "C" fn prepare() {
        let guard = POOL.write().unwrap_or_else(|p| p.into_inner());
        let _ = HELD.try_with(|h| *h.borrow_mut() = Some(guard));
    }

    extern "C" fn parent() {
        let _ = HELD.try_with(|h| drop(h.borrow_mut().take()));
    }

    extern "C" fn child() {
        FORKED.store(true, Ordering::Release);
        OPENMP_PARALLEL.store(0, Ordering::Release);
        let _ = HELD.try_with(|h| {
            if let Some(mut pool) = h.borrow_mut().take() {
                // Its threads are not in this process: nothing to signal or join.
                std::mem::forget(pool.take());
            }
        });
    }

    /// Registers the handlers, once per process.
    pub(super) fn watch() {
        static ONCE: Once = Once::new();
        // SAFETY: the handlers are plain functions that live for the whole process.
        ONCE.call_once(|| unsafe {
            libc::pthread_atfork(Some(prepare), Some(parent), Some(child));
        });
    }
}

#[cfg(not(unix))]
mod fork {
    pub(super) fn watch() {}
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

/// Like [`install`], but with the idle threads of PyTorch's OpenMP runtime
/// asleep meanwhile (see the module documentation); the same as [`install`]
/// when parking is off or the calling thread is not the one that turned it on.
pub fn install_parking_openmp<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let address = OPENMP_PARALLEL.load(Ordering::Acquire);
    if address == 0 || PARKING_THREAD.load(Ordering::Acquire) != this_thread() {
        return install(f);
    }
    // SAFETY: only `park_openmp` stores non-zero values: `GOMP_parallel` of a
    // runtime that stays loaded.
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

    /// A pool of `n` threads of its own, so the test does not depend on the
    /// configured one.
    fn pool_of(n: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .unwrap()
    }

    #[test]
    fn workers_sit_out_only_once_their_cores_were_taken_for_a_quarter_of_a_window() {
        let c = Contention::new();
        let (window, quarter) = (WINDOW.as_nanos() as u64, WINDOW.as_nanos() as u64 / 4);
        let t0 = 10 * window;
        // Passing events (a host's millisecond) do not add up to a quarter
        // of a window, and a new window forgets the old one's losses.
        let most = 3 * quarter / 4;
        assert!(!c.taken(most, t0));
        assert!(!c.taken(most, t0 + window));
        assert!(!c.sitting_out(t0 + window));
        // A core taken all along does, for SIT_OUT from then.
        assert!(c.taken(quarter - most + 1, t0 + window + 1));
        let sit = SIT_OUT.as_nanos() as u64;
        assert!(c.sitting_out(t0 + window + sit));
        assert!(!c.sitting_out(t0 + window + 1 + sit));
    }

    #[test]
    fn sitting_out_the_helpers_take_no_work_and_the_run_is_still_done() {
        // The process's record, set to sit out now (other tests running
        // meanwhile only lose their helpers for a while).
        CONTENTION
            .until
            .fetch_max(epoch_ns() + SIT_OUT.as_nanos() as u64, Ordering::Relaxed);
        let pool = pool_of(2);
        for _ in 0..20 {
            let sum: u64 = pool.install(|| {
                with_workers_awake(|| {
                    use rayon::prelude::*;
                    (0..10_000u64).into_par_iter().sum()
                })
            });
            assert_eq!(sum, 10_000 * 9_999 / 2);
        }
    }

    #[test]
    fn awake_workers_run_the_work_and_stop_with_it() {
        // Outside any pool, and on a pool of one: `f` alone.
        assert_eq!(with_workers_awake(|| 3), 3);
        assert_eq!(pool_of(1).install(|| with_workers_awake(|| 4)), 4);
        let pool = pool_of(2);
        for _ in 0..50 {
            // Parallel work inside, whose halves the spinning worker takes;
            // a join whose stolen half is the slow one, so `f`'s thread
            // waits for the spinning worker, and one the other way round.
            let nap = || std::thread::sleep(std::time::Duration::from_micros(200));
            let (sum, _) = pool.install(|| {
                with_workers_awake(|| {
                    use rayon::prelude::*;
                    let sum: u64 = (0..10_000u64).into_par_iter().sum();
                    (sum, (rayon::join(|| (), nap), rayon::join(nap, || ())))
                })
            });
            assert_eq!(sum, 10_000 * 9_999 / 2);
        }
        // A panic in `f` reaches the caller; the spinners stop, and the pool
        // still runs work after it.
        let caught = catch_unwind(AssertUnwindSafe(|| {
            pool.install(|| with_workers_awake(|| panic!("in f")))
        }));
        assert!(caught.is_err());
        assert_eq!(pool.install(|| with_workers_awake(|| 5)), 5);
        // More threads than cores: no spinner, the work still runs.
        let many = pool_of(cores() + 1);
        assert_eq!(many.install(|| with_workers_awake(|| 6)), 6);
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

    static TEAMS: AtomicUsize = AtomicUsize::new(0);

    /// `team_of_three` that counts the teams it starts.
    unsafe extern "C" fn counted_team(
        f: extern "C" fn(*mut c_void),
        data: *mut c_void,
        n: u32,
        x: u32,
    ) {
        TEAMS.fetch_add(1, Ordering::SeqCst);
        unsafe { team_of_three(f, data, n, x) }
    }

    #[test]
    fn only_the_thread_that_turned_parking_on_parks() {
        // No libtorch_cpu in a test binary: nothing to park.
        assert!(!park_openmp(true));
        assert!(!parks_openmp());
        assert_eq!(install_parking_openmp(|| 4), 4);
        // As if PyTorch's runtime had been found from this thread.
        PARKING_THREAD.store(this_thread(), Ordering::Release);
        OPENMP_PARALLEL.store(counted_team as OpenMpParallel as usize, Ordering::Release);
        assert_eq!(install_parking_openmp(|| 1), 1);
        assert_eq!(TEAMS.load(Ordering::SeqCst), 1);
        let other = std::thread::spawn(|| install_parking_openmp(|| 2)).join();
        assert_eq!(other.unwrap(), 2);
        assert_eq!(
            TEAMS.load(Ordering::SeqCst),
            1,
            "another thread started a team"
        );
        assert!(!park_openmp(false));
        assert_eq!(install_parking_openmp(|| 3), 3);
        assert_eq!(TEAMS.load(Ordering::SeqCst), 1);
    }

    /// Held by the tests that set the configured thread count, which is
    /// the process's: another test could change it under them.
    static CONFIGURED: Mutex<()> = Mutex::new(());

    fn configured_count() -> std::sync::MutexGuard<'static, ()> {
        CONFIGURED.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[test]
    fn work_on_the_caller_runs_on_that_thread_alone() {
        let _count = configured_count();
        set_num_threads(2).unwrap();
        let caller = std::thread::current().id();
        let (threads, ids) = run_on_caller(|| {
            use rayon::prelude::*;
            let ids: Vec<_> = (0..64)
                .into_par_iter()
                .map(|_| std::thread::current().id())
                .collect();
            (rayon::current_num_threads(), ids)
        });
        assert_eq!(threads, 1);
        assert!(ids.iter().all(|&id| id == caller));
        // The thread can still hand work to ai3's pool afterwards, and a run
        // nested in the pool stays in the pool.
        let (pool_thread, nested) = install(|| {
            let here = std::thread::current().id();
            (here, run_on_caller(|| std::thread::current().id()))
        });
        assert_ne!(pool_thread, caller);
        assert_eq!(nested, pool_thread);
        // A fresh thread gets a pool of its own.
        let other = std::thread::spawn(|| run_on_caller(rayon::current_num_threads)).join();
        assert_eq!(other.unwrap(), 1);
    }

    #[test]
    fn work_runs_with_the_configured_count() {
        let _count = configured_count();
        let caller = std::thread::current().id();
        set_num_threads(3).unwrap();
        assert_eq!(num_threads(), 3);
        assert_eq!(install(rayon::current_num_threads), 3);
        assert_ne!(install(|| std::thread::current().id()), caller);
        assert!(set_num_threads(0).is_err());
        // One thread: the work runs on the calling thread, handed to no pool.
        set_num_threads(1).unwrap();
        assert!(configured().is_none(), "a pool kept for one thread");
        assert_eq!(install(rayon::current_num_threads), 1);
        assert_eq!(install(|| std::thread::current().id()), caller);
        let other = std::thread::spawn(move || install(|| std::thread::current().id()) == caller);
        assert!(
            !other.join().unwrap(),
            "another thread's work ran on this one"
        );
        set_num_threads(2).unwrap();
    }
}
