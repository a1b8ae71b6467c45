//! The thread pool every kernel runs in.
//!
//! Graph runs enter this pool, so rayon work inside kernels (and inside the
//! `gemm` crate) uses its threads. The Python package sizes it from
//! `AI3_NUM_THREADS` or, by default, follows `torch.get_num_threads()`.

use std::sync::{Arc, RwLock};

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

#[cfg(test)]
mod tests {
    use super::*;

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
