//! The machine's ceilings, the roofline that engines' times are read
//! against: f32 multiply-add throughput (AVX-512 and AVX2, one thread and
//! every thread) and memory read bandwidth (a buffer far larger than any
//! cache, summed by every thread).
//!
//! `cargo bench -p ai3-benches --bench peak [-- THREADS]` prints one line a
//! measurement and a last line of JSON (`peak_gflops`, `read_gbs`, ...)
//! that `benches/roofline.py --peak` reads. Each figure is the best of five
//! runs, so a second in which the host takes a core does not lower it.

use std::hint::black_box;
use std::time::Instant;

/// Multiply-add instructions each thread issues per run.
const FMAS: usize = 1 << 28;
/// Independent accumulators: more than the FMA latency times the issue
/// width, so the units never wait on a result.
const CHAINS: usize = 12;
/// Bytes read per thread per pass of the bandwidth test.
const READ_BYTES: usize = 256 << 20;

fn main() {
    let threads = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mut json = vec![format!("\"threads\": {threads}")];
    let mut best_gflops = 0f64;
    for (name, lanes, run) in kernels() {
        for t in [1, threads] {
            let gflops = best_of(5, || {
                let secs = on_threads(t, |_| run(FMAS));
                (2 * lanes * FMAS * t) as f64 / secs / 1e9
            });
            println!("{name} multiply-add, {t} thread(s): {gflops:.1} GFLOP/s");
            json.push(format!("\"{name}_gflops_{t}t\": {gflops:.1}"));
            if t == threads {
                best_gflops = best_gflops.max(gflops);
            }
        }
    }
    json.push(format!("\"peak_gflops\": {best_gflops:.1}"));
    let buffers: Vec<Vec<f32>> = (0..threads)
        .map(|i| vec![i as f32 + 1.0; READ_BYTES / 4])
        .collect();
    let read = best_of(5, || {
        let secs = on_threads(threads, |i| {
            black_box(sum(&buffers[i]));
        });
        (READ_BYTES * threads) as f64 / secs / 1e9
    });
    println!("memory read, {threads} thread(s): {read:.1} GB/s");
    json.push(format!("\"read_gbs\": {read:.1}"));
    println!("{{{}}}", json.join(", "));
}

/// The largest of `n` measurements.
fn best_of(n: usize, mut f: impl FnMut() -> f64) -> f64 {
    (0..n).map(|_| f()).fold(0.0, f64::max)
}

/// Seconds `f(i)` takes on each of `t` threads started together: the
/// slowest thread's own time (each thread times itself, so the calling
/// thread, waiting on a core the workers hold, adds nothing).
fn on_threads(t: usize, f: impl Fn(usize) + Sync) -> f64 {
    let start = std::sync::Barrier::new(t);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..t)
            .map(|i| {
                let (start, f) = (&start, &f);
                s.spawn(move || {
                    start.wait();
                    let t0 = Instant::now();
                    f(i);
                    t0.elapsed().as_secs_f64()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("measuring thread"))
            .fold(0.0, f64::max)
    })
}

/// A sum the compiler cannot drop, read as fast as the loads go: eight
/// partial sums, vectorised.
fn sum(v: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    for c in v.chunks_exact(16) {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    acc.iter().sum()
}

type Kernel = (&'static str, usize, fn(usize));

/// The multiply-add loops this CPU runs, with their lanes.
fn kernels() -> Vec<Kernel> {
    let mut k: Vec<Kernel> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            k.push(("avx512", 16, |n| unsafe { x86::fma512(n) }));
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            k.push(("avx2", 8, |n| unsafe { x86::fma256(n) }));
        }
    }
    if k.is_empty() {
        eprintln!("no vector multiply-add this benchmark knows on this CPU");
    }
    k
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::CHAINS;
    use std::arch::x86_64::*;
    use std::hint::black_box;

    /// `n` AVX-512 multiply-adds in CHAINS independent chains.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fma512(n: usize) {
        let (b, c) = (
            _mm512_set1_ps(black_box(1.0f32)),
            _mm512_set1_ps(black_box(1e-9f32)),
        );
        let mut acc = [_mm512_set1_ps(black_box(0.5f32)); CHAINS];
        for _ in 0..n / CHAINS {
            for a in acc.iter_mut() {
                *a = _mm512_fmadd_ps(*a, b, c);
            }
        }
        black_box(acc);
    }

    /// `n` AVX2 multiply-adds in CHAINS independent chains.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn fma256(n: usize) {
        let (b, c) = (
            _mm256_set1_ps(black_box(1.0f32)),
            _mm256_set1_ps(black_box(1e-9f32)),
        );
        let mut acc = [_mm256_set1_ps(black_box(0.5f32)); CHAINS];
        for _ in 0..n / CHAINS {
            for a in acc.iter_mut() {
                *a = _mm256_fmadd_ps(*a, b, c);
            }
        }
        black_box(acc);
    }
}
