//! Owned tensor memory, and the freed buffers kept for the next call.
//!
//! A swapped layer returns a new output every call, which PyTorch frees a
//! layer or two later. For outputs of a megabyte and more, glibc hands such
//! memory back to the system on free (it was mapped for the allocation, or
//! the arena it came from is trimmed), so the next call's output faults
//! every page in afresh: 3000 page faults for a 12 MB output, 2-3 ms of a
//! 4 ms depthwise layer (96 channels 56x56, batch 10). Which thread
//! allocates only moved the unmapping around (mobilenet_v2 swapped, batch
//! 10, ran bimodal at 81-125 ms). So ai3 keeps freed buffers of
//! [`MIN_BYTES`] and more, up to [`MAX_BYTES`] in all, and gives them to the
//! next allocation they fit; the oldest go first past the cap.
//!
//! The pool's lock is only ever tried, never waited for: a thread that finds
//! it taken allocates or frees as if the pool were not there. So a process
//! forked while another thread held it (a DataLoader worker) never blocks
//! on a lock no thread will release; it just stops keeping buffers.

use std::mem::MaybeUninit;
use std::sync::Mutex;

/// Smallest buffer kept: below it glibc reuses freed memory itself.
const MIN_BYTES: usize = 256 << 10;

/// Bytes of freed buffers kept at most.
const MAX_BYTES: usize = 256 << 20;

/// Buffers kept at most.
const MAX_BUFFERS: usize = 64;

/// A kept buffer serves requests down to this fraction of its size (in
/// eighths), so small requests do not pin large buffers.
const MIN_FILL_EIGHTHS: usize = 6;

/// The freed buffers, oldest first, and their bytes.
struct Kept<B> {
    buffers: Vec<Vec<B>>,
    bytes: usize,
}

/// Owned, aligned memory of `B` blocks, given back to [`Pool`] when dropped.
pub(crate) struct Buffer<B: Copy + 'static> {
    blocks: Vec<MaybeUninit<B>>,
    pool: &'static Pool<B>,
}

impl<B: Copy + 'static> Buffer<B> {
    /// The memory.
    pub(crate) fn as_slice(&self) -> &[MaybeUninit<B>] {
        &self.blocks
    }

    /// The memory, writable.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [MaybeUninit<B>] {
        &mut self.blocks
    }
}

impl<B: Copy + 'static> Drop for Buffer<B> {
    fn drop(&mut self) {
        self.pool.give(std::mem::take(&mut self.blocks));
    }
}

/// Freed buffers of blocks `B`, kept for reuse.
pub(crate) struct Pool<B> {
    kept: Mutex<Kept<MaybeUninit<B>>>,
}

impl<B: Copy + 'static> Pool<B> {
    /// An empty pool.
    pub(crate) const fn new() -> Self {
        Pool {
            kept: Mutex::new(Kept {
                buffers: Vec::new(),
                bytes: 0,
            }),
        }
    }

    /// A buffer of `len` blocks, contents unspecified: a kept one it fits
    /// (the smallest), else `fresh(len)`'s.
    pub(crate) fn take<E>(
        &'static self,
        len: usize,
        fresh: impl FnOnce(usize) -> Result<Vec<MaybeUninit<B>>, E>,
    ) -> Result<Buffer<B>, E> {
        let block = size_of::<B>();
        let kept = (len * block >= MIN_BYTES)
            .then(|| self.kept.try_lock().ok())
            .flatten();
        if let Some(mut kept) = kept {
            let fits = |v: &Vec<MaybeUninit<B>>| {
                v.capacity() >= len && len * 8 >= v.capacity() * MIN_FILL_EIGHTHS
            };
            let best = (kept.buffers.iter().enumerate())
                .filter(|(_, v)| fits(v))
                .min_by_key(|(_, v)| v.capacity())
                .map(|(i, _)| i);
            if let Some(i) = best {
                let mut blocks = kept.buffers.remove(i);
                kept.bytes -= blocks.capacity() * block;
                // SAFETY: MaybeUninit needs no initialisation; within capacity.
                unsafe { blocks.set_len(len) };
                return Ok(Buffer { blocks, pool: self });
            }
        }
        self.fresh(len, fresh)
    }

    /// A buffer of `len` blocks that `fresh(len)` makes (not a kept one:
    /// for memory that must come zeroed), kept when dropped.
    pub(crate) fn fresh<E>(
        &'static self,
        len: usize,
        fresh: impl FnOnce(usize) -> Result<Vec<MaybeUninit<B>>, E>,
    ) -> Result<Buffer<B>, E> {
        Ok(Buffer {
            blocks: fresh(len)?,
            pool: self,
        })
    }

    /// Keeps `blocks` for a later [`Self::take`] when large enough, dropping
    /// the oldest kept buffers past the caps.
    fn give(&self, blocks: Vec<MaybeUninit<B>>) {
        let bytes = blocks.capacity() * size_of::<B>();
        if !(MIN_BYTES..=MAX_BYTES).contains(&bytes) {
            return;
        }
        let Ok(mut kept) = self.kept.try_lock() else {
            return;
        };
        kept.bytes += bytes;
        kept.buffers.push(blocks);
        while kept.bytes > MAX_BYTES || kept.buffers.len() > MAX_BUFFERS {
            let old = kept.buffers.remove(0);
            kept.bytes -= old.capacity() * size_of::<B>();
        }
    }

    /// Bytes kept now.
    #[cfg(test)]
    fn kept_bytes(&self) -> usize {
        self.kept.lock().unwrap().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh(len: usize) -> Result<Vec<MaybeUninit<u64>>, ()> {
        let mut v = Vec::with_capacity(len);
        // SAFETY: uninitialised values of MaybeUninit are valid.
        unsafe { v.set_len(len) };
        Ok(v)
    }

    #[test]
    fn freed_buffers_come_back_to_requests_they_fit() {
        static POOL: Pool<u64> = Pool::new();
        let big = MIN_BYTES / 8; // blocks of 8 bytes
        let a = POOL.take(big * 2, fresh).unwrap();
        let at = a.as_slice().as_ptr();
        drop(a);
        assert_eq!(POOL.kept_bytes(), 2 * MIN_BYTES);
        // Too small a request for it: a fresh buffer.
        let small = POOL.take(big, fresh).unwrap();
        assert_ne!(small.as_slice().as_ptr(), at);
        // A request it fits takes it, with the length asked for.
        let b = POOL.take(big * 2 - 5, fresh).unwrap();
        assert_eq!(b.as_slice().as_ptr(), at);
        assert_eq!(b.as_slice().len(), big * 2 - 5);
        assert_eq!(POOL.kept_bytes(), 0);
        drop((b, small));
        assert_eq!(POOL.kept_bytes(), 3 * MIN_BYTES);
        // Small buffers are not kept.
        drop(POOL.take(16, fresh).unwrap());
        assert_eq!(POOL.kept_bytes(), 3 * MIN_BYTES);
    }

    #[test]
    fn a_taken_lock_is_not_waited_for() {
        static POOL: Pool<u64> = Pool::new();
        let big = MIN_BYTES / 8;
        drop(POOL.take(big, fresh).unwrap());
        let held = POOL.kept.lock().unwrap();
        // Neither call blocks: the take allocates, the drop frees.
        let b = POOL.take(big, fresh).unwrap();
        drop(b);
        drop(held);
        assert_eq!(POOL.kept_bytes(), MIN_BYTES, "the first buffer only");
    }

    #[test]
    fn the_oldest_buffers_go_past_the_cap() {
        static POOL: Pool<u64> = Pool::new();
        let each = MAX_BYTES / 3 / 8;
        let bufs: Vec<_> = (0..4).map(|_| POOL.take(each, fresh).unwrap()).collect();
        let first = bufs[0].as_slice().as_ptr();
        drop(bufs);
        assert_eq!(POOL.kept_bytes(), 3 * each * 8);
        // The first freed was dropped: no kept buffer is at its address.
        let again: Vec<_> = (0..3).map(|_| POOL.take(each, fresh).unwrap()).collect();
        assert!(again.iter().all(|b| b.as_slice().as_ptr() != first));
        assert_eq!(POOL.kept_bytes(), 0);
    }
}
