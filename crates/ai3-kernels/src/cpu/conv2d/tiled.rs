//! The GEMM algorithm's f32 path (see [`applies`] for the layers it takes)
//! on the register tiles (`crate::cpu::tile`), im2col never materialised whole.
//!
//! For each `(image, group)`, `out[ocg, hw] = W[ocg, K] @ cols[K, hw]`, with
//! `K = icg * kh * kw`: the weight is `A` in PyTorch's own layout, and `cols`
//! (the unrolled patches) is built a block of output pixels (a *job*) at a
//! time, straight into the column panels the tile reads (`[kc][nr]` each).
//! A 1x1 layer with stride 1 and no padding reads its input rows as they
//! lie: in place when a task has few output channels, else copied into
//! panels (see `IN_PLACE_ROWS`). Tasks are jobs times blocks of output
//! channels; each task's output block starts from the bias in registers and
//! gets the fused epilogue (residual, activation) as soon as it is finished,
//! while it is in cache.
//!
//! Columns that must be unrolled (larger or strided kernels) are packed once
//! per job: by the task that owns the whole job when there are enough jobs
//! for the threads, else by all threads together before the channel blocks
//! share them (`shared_columns`). A 1x1 layer's input rows are cheap
//! enough to read again per channel block.
//!
//! Within a task the reduction runs in blocks of `KC`; each row of tiles
//! then passes over the job's pixels, so a layer's weights (most of what
//! the late, small-image layers read) come from memory once per job.

// The register-tile driver exists on x86-64 only; elsewhere `supports` is
// false and only the portable entry points are used.
#![cfg_attr(not(target_arch = "x86_64"), allow(unused))]

use std::any::TypeId;

use rayon::prelude::*;

use super::{threads_for, Epilogue, SharedMut};
use crate::alloc::{check_len, try_zeroed_vec, KernelError, KernelResult};
use crate::cpu::scratch::with_scratch;
use crate::params::Conv2dParams;
use crate::Float;

/// Output pixels per task, at most (a multiple of every tile's width).
const PIXELS: usize = 256;

/// Output channels per task, at most: keeps the weight block a task streams
/// over (`CHANNELS x KC`) in L2.
const CHANNELS: usize = 192;

/// Reduction steps per block: the block of columns a task packs (`KC x
/// PIXELS`, 128 KiB) stays in L2 while every row of tiles passes over it,
/// and each row of tiles' weights (`mr x KC`) in L1.
const KC: usize = 128;

/// Tasks per thread to aim for, so uneven tasks still balance.
const TASKS_PER_THREAD: usize = 4;

/// Output channels per task up to which a 1x1 layer's input rows are read
/// in place (strided, by every row of tiles) rather than packed into
/// panels. Packing copies a task's columns once for all its rows, so it
/// pays only when many rows of tiles reuse them, the more so when the rows
/// lie more than a page apart (each row read in place then costs a TLB
/// entry). Measured on 2 threads with AVX2 (6-row tiles): reading in place
/// took 0.4-0.95x the time with 12-48 channels per task (384 -> 48 at 13x13,
/// batch 1: 0.10 -> 0.04 ms; 96 -> 24 and 144 -> 24 at 56x56, batch 1 and
/// 10; 1024 -> 256 at 14x14, batch 1: 0.87 -> 0.78 ms), 0.93-1.0x with 64-96
/// on planes of at most 1024 pixels (512 -> 128 at 28x28, 576 -> 96 at
/// 14x14 batch 10) but 1.05-1.13x on larger ones (256 -> 64 at 56x56), and
/// 1.0-1.1x with 128 or more.
const IN_PLACE_ROWS: usize = 48;

/// [`IN_PLACE_ROWS`] for input planes of at most [`PAGE_FLOATS`].
const IN_PLACE_ROWS_NEAR: usize = 96;

/// f32 values in a 4 KiB page.
const PAGE_FLOATS: usize = 1024;

#[cfg(test)]
thread_local! {
    /// Forces input rows in place (`Some(true)`) or packed for the 1x1
    /// layers that could read them in place, so tests cover both.
    static IN_PLACE_OVERRIDE: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Whether [`conv2d`] runs with elements of type `T`: f32 on a CPU with a
/// register tile (AVX2 or AVX-512). It takes any kernel, stride, padding,
/// dilation or groups.
pub fn supports<T: Float>() -> bool {
    TypeId::of::<T>() == TypeId::of::<f32>() && tile_kernel().is_some()
}

/// Whether the GEMM algorithm should run `p` here rather than on im2col and
/// the `gemm` crate: 1x1 kernels, whose columns are a copy of the input (any
/// stride or padding), and larger kernels when there are enough blocks of
/// output pixels for every thread to unroll its own columns (64 -> 64 3x3 at
/// 56x56: 1.9-2.7 ms against 2.5-3.6 ms for im2col + GEMM, 2 threads). With
/// fewer, the columns are unrolled once and shared, which measured slower
/// than im2col + GEMM on ResNet-50's strided 3x3 layers (128 -> 128 at 56x56:
/// 3.4-3.8 against 3.0-3.5 ms).
pub fn applies<T: Float>(p: &Conv2dParams) -> bool {
    supports::<T>() && {
        #[cfg(target_arch = "x86_64")]
        let own = Kernel::get().is_some_and(|k| {
            let l = Layout::new(k, p);
            !l.shares_columns(l.jobs(p), threads_for(p))
        });
        #[cfg(not(target_arch = "x86_64"))]
        let own = false;
        (p.kernel_h == 1 && p.kernel_w == 1) || own
    }
}

#[cfg(target_arch = "x86_64")]
use crate::cpu::tile::{Init, Kernel, Tile};

#[cfg(target_arch = "x86_64")]
fn tile_kernel() -> Option<Kernel> {
    Kernel::get()
}

#[cfg(not(target_arch = "x86_64"))]
fn tile_kernel() -> Option<()> {
    None
}

/// Convolution (see the [module contract](super)) with `epilogue` applied
/// to the output. Fails, before writing anything, when a buffer has the
/// wrong length or [`supports`] does not hold; the packed panels are
/// per-thread scratch, and a refused allocation of them fails the call.
pub fn conv2d<T: Float>(
    p: &Conv2dParams,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
    epilogue: Option<Epilogue<T>>,
) -> KernelResult<()> {
    p.check_buffers(input.len(), bias.map(<[T]>::len), output.len())?;
    check_len("conv2d weight", weight.len(), p.weight_len())?;
    if !supports::<T>() {
        return Err(KernelError::Precondition {
            what: "the tiled GEMM convolution needs f32 and AVX2 or AVX-512",
        });
    }
    #[cfg(target_arch = "x86_64")]
    {
        let kernel = Kernel::get().expect("checked by supports");
        let run =
            |x: &[f32], w: &[f32], b: Option<&[f32]>, out: &mut [f32], e: Option<Epilogue<f32>>| {
                if out.is_empty() {
                    return Ok(());
                }
                gemm(kernel, p, x, w, b, out, e)
            };
        super::with_f32(input, weight, bias, output, epilogue, run)
            .expect("T is f32 (checked by supports)")?;
    }
    Ok(())
}

/// The blocking of one layer: which pixels and output channels each task
/// covers, and how the columns are packed.
#[cfg(target_arch = "x86_64")]
struct Layout {
    kernel: Kernel,
    icg: usize,
    ocg: usize,
    /// Reduction length: `icg * kh * kw`.
    kk: usize,
    plane_in: usize,
    /// Output pixels per image.
    hw: usize,
    /// A 1x1 kernel with stride 1 and no padding: the input rows are the columns.
    direct_rows: bool,
    pixel_block: usize,
    pixel_blocks: usize,
    /// Panels of a full pixel block: the stride of a job's packed columns.
    max_panels: usize,
}

/// Where a task's columns are read: panel `j` (`nr` columns, `kcur` rows
/// at stride `ldb`) starts at `ptr + j * panel`. Packed panels have `ldb =
/// nr` and `panel = kcur * nr`; input rows read in place have `ldb` = the
/// plane and `panel = nr`.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Columns {
    ptr: *const f32,
    ldb: usize,
    panel: usize,
}

#[cfg(target_arch = "x86_64")]
impl Columns {
    /// Panels of `[kcur][nr]` as [`Layout::pack`] leaves them.
    fn packed(packed: &[f32], kcur: usize, nr: usize) -> Self {
        Columns {
            ptr: packed.as_ptr(),
            ldb: nr,
            panel: kcur * nr,
        }
    }
}

/// One block of output pixels of one image and group: the columns a set of
/// tasks shares.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Job {
    n: usize,
    g: usize,
    /// First pixel and number of pixels.
    c0: usize,
    width: usize,
}

#[cfg(target_arch = "x86_64")]
impl Layout {
    fn new(kernel: Kernel, p: &Conv2dParams) -> Self {
        let hw = p.out_h() * p.out_w();
        // Blocks of at most PIXELS pixels, as even as whole tiles allow.
        let pixel_block = hw
            .div_ceil(hw.div_ceil(PIXELS))
            .next_multiple_of(kernel.nr)
            .min(PIXELS);
        Layout {
            kernel,
            icg: p.in_channels_per_group(),
            ocg: p.out_channels_per_group(),
            kk: p.in_channels_per_group() * p.kernel_h * p.kernel_w,
            plane_in: p.in_h * p.in_w,
            hw,
            direct_rows: p.kernel_h == 1
                && p.kernel_w == 1
                && p.stride == (1, 1)
                && p.padding == Default::default(),
            pixel_block,
            pixel_blocks: hw.div_ceil(pixel_block),
            max_panels: pixel_block / kernel.nr,
        }
    }

    /// Whether the threads pack each job's columns together and share them
    /// (few jobs for the threads, and columns that cost more to unroll than
    /// to copy) rather than each task packing its own.
    fn shares_columns(&self, jobs: usize, threads: usize) -> bool {
        threads > 1 && !self.direct_rows && jobs < TASKS_PER_THREAD * threads
    }

    fn jobs(&self, p: &Conv2dParams) -> usize {
        p.batch * p.groups * self.pixel_blocks
    }

    fn job(&self, p: &Conv2dParams, j: usize) -> Job {
        let pb = j % self.pixel_blocks;
        let rest = j / self.pixel_blocks;
        let c0 = pb * self.pixel_block;
        Job {
            n: rest / p.groups,
            g: rest % p.groups,
            c0,
            width: self.pixel_block.min(self.hw - c0),
        }
    }

    /// Reduction rows `k0..k0 + kcur` of `job`'s columns into `packed` as
    /// panels of `[kcur][nr]`, one per `nr` pixels.
    fn pack(
        &self,
        p: &Conv2dParams,
        x: &[f32],
        job: Job,
        k0: usize,
        kcur: usize,
        packed: &mut [f32],
    ) {
        let nr = self.kernel.nr;
        let img = &x[(job.n * p.in_channels + job.g * self.icg) * self.plane_in..]
            [..self.icg * self.plane_in];
        let mut row = [0.0f32; PIXELS];
        for k in 0..kcur {
            let src: &[f32] = if self.direct_rows {
                &img[(k0 + k) * self.hw + job.c0..][..job.width]
            } else {
                super::gemm::im2col_row(p, img, k0 + k, job.c0, &mut row[..job.width]);
                &row[..job.width]
            };
            match nr {
                16 => to_panels::<16>(src, packed, kcur, k),
                32 => to_panels::<32>(src, packed, kcur, k),
                _ => unreachable!("tiles are 16 or 32 columns wide"),
            }
        }
    }

    /// A 1x1 layer's input rows `k0..` of `job`, read where they lie
    /// ([`Layout::direct_rows`]).
    fn rows_in_place(&self, p: &Conv2dParams, x: &[f32], job: Job, k0: usize) -> Columns {
        let at = (job.n * p.in_channels + job.g * self.icg + k0) * self.plane_in + job.c0;
        Columns {
            ptr: x[at..].as_ptr(),
            ldb: self.plane_in,
            panel: self.kernel.nr,
        }
    }

    /// Output channels `o0..o1` of `job` over reduction rows `k0..k0 + kcur`,
    /// whose columns `cols` locates (packed as [`Layout::pack`] leaves them,
    /// or input rows in place): the first rows start from the bias, later
    /// ones add to the output.
    ///
    /// # Safety
    /// `out` is the layer's output; no other thread writes rows `o0..o1`,
    /// pixels of `job` of it meanwhile. Each of `cols`'s panels holds `kcur`
    /// rows of `nr` readable values (the last panel the job's remaining
    /// columns) and stays unchanged meanwhile.
    #[allow(clippy::too_many_arguments)]
    unsafe fn multiply(
        &self,
        p: &Conv2dParams,
        w: &[f32],
        b: Option<&[f32]>,
        job: Job,
        (o0, o1): (usize, usize),
        (k0, kcur): (usize, usize),
        cols: Columns,
        out: *mut f32,
    ) {
        let (kernel, kk, hw, nr) = (self.kernel, self.kk, self.hw, self.kernel.nr);
        let w = &w[job.g * self.ocg * kk..][..self.ocg * kk];
        let b = b.map(|b| &b[job.g * self.ocg..][..self.ocg]);
        let out_base = (job.n * p.out_channels + job.g * self.ocg) * hw;
        let panels = job.width.div_ceil(nr);
        let mut o = o0;
        while o < o1 {
            let m = kernel.mr.min(o1 - o);
            // SAFETY: rows o..o+m of `w` and of the bias exist; the caller
            // owns rows o0..o1, pixels c0..c0+width of this image and group's
            // output; `cols` holds the panels read (the caller's promise); the
            // CPU has the kernel's features (`Kernel::get` chose it).
            unsafe {
                let init = match (k0, b) {
                    (0, Some(b)) => Init::PerRow(b.as_ptr().add(o)),
                    (0, None) => Init::Zero,
                    _ => Init::Load,
                };
                let mut tile = Tile {
                    a: w.as_ptr().add(o * kk + k0),
                    lda: kk,
                    b: cols.ptr,
                    ldb: cols.ldb,
                    kc: kcur,
                    c: out.add(out_base + o * hw + job.c0),
                    ldc: hw,
                    n: 0,
                    init,
                };
                for j in 0..panels {
                    tile.n = nr.min(job.width - j * nr);
                    tile.b = cols.ptr.add(j * cols.panel);
                    (kernel.run)(m, &tile);
                    tile.c = tile.c.add(nr);
                }
            }
            o += m;
        }
    }

    /// Applies `epilogue` to output channels `o0..o1` of `job`, finished.
    ///
    /// # Safety
    /// As for [`Layout::multiply`].
    unsafe fn finish(
        &self,
        p: &Conv2dParams,
        job: Job,
        (o0, o1): (usize, usize),
        out: *mut f32,
        epilogue: Epilogue<f32>,
    ) {
        let out_base = (job.n * p.out_channels + job.g * self.ocg) * self.hw;
        for o in o0..o1 {
            let at = out_base + o * self.hw + job.c0;
            // SAFETY: the caller's finished block.
            epilogue(at, unsafe {
                std::slice::from_raw_parts_mut(out.add(at), job.width)
            });
        }
    }

    /// Whether a task with `rows` output channels reads a 1x1 layer's input
    /// rows in place (see [`IN_PLACE_ROWS`]).
    fn reads_in_place(&self, rows: usize) -> bool {
        self.direct_rows
            && (rows <= IN_PLACE_ROWS
                || (rows <= IN_PLACE_ROWS_NEAR && self.plane_in <= PAGE_FLOATS))
    }

    /// Rows per channel block when each job's channels are split in `blocks`.
    fn rows_per_block(&self, blocks: usize) -> usize {
        let row_tiles = self.ocg.div_ceil(self.kernel.mr);
        row_tiles.div_ceil(blocks.clamp(1, row_tiles)) * self.kernel.mr
    }
}

/// Row `k` of every panel of `[kcur][NR]` in `packed` from one row of
/// columns, `NR` at a time (fixed-size copies, not a `memcpy` call each).
#[cfg(target_arch = "x86_64")]
fn to_panels<const NR: usize>(src: &[f32], packed: &mut [f32], kcur: usize, k: usize) {
    let mut whole = src.chunks_exact(NR);
    for (j, src) in whole.by_ref().enumerate() {
        let dst: &mut [f32; NR] = (&mut packed[(j * kcur + k) * NR..][..NR])
            .try_into()
            .unwrap();
        *dst = src.try_into().unwrap();
    }
    let rest = whole.remainder();
    if !rest.is_empty() {
        let j = src.len() / NR;
        packed[(j * kcur + k) * NR..][..rest.len()].copy_from_slice(rest);
    }
}

#[cfg(target_arch = "x86_64")]
fn gemm(
    kernel: Kernel,
    p: &Conv2dParams,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    out: &mut [f32],
    epilogue: Option<Epilogue<f32>>,
) -> KernelResult<()> {
    let l = Layout::new(kernel, p);
    let threads = threads_for(p);
    let jobs = l.jobs(p);
    let out_ptr = SharedMut(out.as_mut_ptr());
    if l.shares_columns(jobs, threads) {
        return shared_columns(&l, p, x, w, b, &out_ptr, epilogue, threads);
    }
    // Otherwise each task packs the columns it multiplies, or reads input
    // rows in place. Those are cheap to read again, so their channels are
    // split into blocks (at most CHANNELS, and enough for every thread to get
    // several tasks); unrolled columns are packed once per job.
    let channel_blocks = match l.direct_rows {
        true => (TASKS_PER_THREAD * threads)
            .div_ceil(jobs)
            .max(l.ocg.div_ceil(CHANNELS)),
        false => 1,
    };
    let rows_per_block = l.rows_per_block(channel_blocks);
    let channel_blocks = l.ocg.div_ceil(rows_per_block);
    let in_place = l.reads_in_place(rows_per_block);
    #[cfg(test)]
    let in_place = l.direct_rows && IN_PLACE_OVERRIDE.get().unwrap_or(in_place);
    let task = |t: usize| {
        let out_ptr = &out_ptr;
        let job = l.job(p, t / channel_blocks);
        let cb = t % channel_blocks;
        let rows = (cb * rows_per_block, ((cb + 1) * rows_per_block).min(l.ocg));
        let panels = job.width.div_ceil(kernel.nr);
        let scratch = if in_place {
            0
        } else {
            KC.min(l.kk) * panels * kernel.nr
        };
        with_scratch::<f32, _>(scratch, |packed| {
            for k0 in (0..l.kk).step_by(KC) {
                let kcur = KC.min(l.kk - k0);
                let cols = if in_place {
                    l.rows_in_place(p, x, job, k0)
                } else {
                    l.pack(p, x, job, k0, kcur, packed);
                    Columns::packed(packed, kcur, kernel.nr)
                };
                // SAFETY: task t alone writes these rows and pixels.
                unsafe { l.multiply(p, w, b, job, rows, (k0, kcur), cols, out_ptr.0) };
            }
            if let Some(f) = epilogue {
                // SAFETY: as above.
                unsafe { l.finish(p, job, rows, out_ptr.0, f) };
            }
        })
    };
    let tasks = jobs * channel_blocks;
    if threads == 1 {
        (0..tasks).try_for_each(task)
    } else {
        (0..tasks).into_par_iter().try_for_each(task)
    }
}

/// Bytes of packed columns [`shared_columns`] holds at a time, at most (or
/// one job's, if more).
#[cfg(target_arch = "x86_64")]
const SHARED_BYTES: usize = 8 << 20;

/// [`gemm`] for layers with few jobs and unrolled columns: per round of
/// jobs, every job's columns are packed once, in parallel by reduction
/// blocks, then multiplied in parallel by blocks of output channels.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn shared_columns(
    l: &Layout,
    p: &Conv2dParams,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    out: &SharedMut<f32>,
    epilogue: Option<Epilogue<f32>>,
    threads: usize,
) -> KernelResult<()> {
    let nr = l.kernel.nr;
    let job_len = l.kk * l.max_panels * nr;
    let slice_len = KC * l.max_panels * nr;
    let jobs = l.jobs(p);
    let per_round = (SHARED_BYTES / (job_len * 4)).clamp(1, jobs);
    let mut buf = try_zeroed_vec::<f32>(per_round * job_len, "conv2d packed columns")?;
    for first in (0..jobs).step_by(per_round) {
        let round = per_round.min(jobs - first);
        let buf = &mut buf[..round * job_len];
        buf.par_chunks_mut(job_len)
            .enumerate()
            .for_each(|(j, packed)| {
                let job = l.job(p, first + j);
                packed
                    .par_chunks_mut(slice_len)
                    .enumerate()
                    .for_each(|(s, slice)| {
                        let k0 = s * KC;
                        let kcur = KC.min(l.kk - k0);
                        l.pack(p, x, job, k0, kcur, slice);
                    });
            });
        let buf = &*buf;
        let want = (TASKS_PER_THREAD * threads).div_ceil(round);
        let rows_per_block = l.rows_per_block(want);
        let channel_blocks = l.ocg.div_ceil(rows_per_block);
        (0..round * channel_blocks).into_par_iter().for_each(|t| {
            let (j, cb) = (t / channel_blocks, t % channel_blocks);
            let job = l.job(p, first + j);
            let rows = (cb * rows_per_block, ((cb + 1) * rows_per_block).min(l.ocg));
            let packed = &buf[j * job_len..][..job_len];
            for k0 in (0..l.kk).step_by(KC) {
                let kcur = KC.min(l.kk - k0);
                let cols = Columns::packed(&packed[k0 * l.max_panels * nr..], kcur, nr);
                // SAFETY: task t alone writes these rows and pixels.
                unsafe { l.multiply(p, w, b, job, rows, (k0, kcur), cols, out.0) };
            }
            if let Some(f) = epilogue {
                // SAFETY: as above.
                unsafe { l.finish(p, job, rows, out.0, f) };
            }
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::conv2d::gemm;
    use crate::params::Padding2d;

    struct Case {
        batch: usize,
        ic: usize,
        oc: usize,
        hw: (usize, usize),
        k: (usize, usize),
        stride: (usize, usize),
        pad: (usize, usize, usize, usize),
        dilation: usize,
        groups: usize,
    }

    impl Case {
        fn params(&self) -> Conv2dParams {
            let (top, bottom, left, right) = self.pad;
            Conv2dParams {
                batch: self.batch,
                in_channels: self.ic,
                in_h: self.hw.0,
                in_w: self.hw.1,
                out_channels: self.oc,
                kernel_h: self.k.0,
                kernel_w: self.k.1,
                stride: self.stride,
                padding: Padding2d {
                    top,
                    bottom,
                    left,
                    right,
                },
                dilation: (self.dilation, self.dilation),
                groups: self.groups,
            }
        }
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 9) % 2001) as f32
                    / 1000.0
                    - 1.0
            })
            .collect()
    }

    /// Against the generic im2col + GEMM kernel: 1x1 layers read in place and
    /// unrolled ones, tile row and column tails, several reduction, pixel and
    /// channel blocks, strides, padding (asymmetric, and larger than the
    /// kernel), dilation, groups, with and without bias, and an epilogue.
    #[test]
    fn matches_im2col_gemm() {
        if tile_kernel().is_none() {
            eprintln!("skipped: this CPU has no AVX2 tile");
            return;
        }
        crate::cpu::conv2d::SHARE_SMALL.store(true, std::sync::atomic::Ordering::Relaxed);
        let c = |batch, ic, oc, hw, k, stride, pad, dilation, groups| Case {
            batch,
            ic,
            oc,
            hw,
            k,
            stride,
            pad,
            dilation,
            groups,
        };
        let cases = [
            c(1, 3, 5, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 1, 1),
            c(2, 17, 13, (7, 7), (1, 1), (1, 1), (0, 0, 0, 0), 1, 1),
            c(1, 300, 40, (5, 9), (1, 1), (1, 1), (0, 0, 0, 0), 1, 1),
            c(1, 64, 400, (3, 3), (1, 1), (1, 1), (0, 0, 0, 0), 1, 1),
            c(3, 24, 36, (17, 19), (1, 1), (1, 1), (0, 0, 0, 0), 1, 1),
            // Many output channels per task: rows packed unless forced.
            c(2, 16, 200, (20, 20), (1, 1), (1, 1), (0, 0, 0, 0), 1, 1),
            c(1, 12, 18, (9, 11), (1, 1), (2, 2), (0, 0, 0, 0), 1, 1),
            c(2, 16, 8, (8, 8), (1, 1), (3, 1), (0, 0, 0, 0), 1, 2),
            c(1, 8, 12, (6, 5), (1, 1), (1, 1), (1, 0, 2, 1), 1, 4),
            c(1, 3, 16, (23, 21), (3, 3), (2, 2), (1, 1, 1, 1), 1, 1),
            c(2, 3, 10, (30, 30), (7, 7), (2, 2), (3, 3, 3, 3), 1, 1),
            c(1, 20, 30, (14, 15), (3, 3), (1, 1), (1, 1, 1, 1), 1, 1),
            c(1, 16, 8, (9, 10), (3, 2), (1, 2), (0, 2, 1, 0), 2, 2),
            c(1, 4, 6, (3, 3), (3, 3), (1, 1), (4, 4, 4, 4), 1, 1),
            c(1, 40, 24, (30, 20), (5, 5), (2, 3), (2, 2, 2, 2), 1, 1),
            // Many jobs: each task unrolls its own columns.
            c(3, 8, 20, (40, 40), (3, 3), (1, 1), (1, 1, 1, 1), 1, 1),
            // Few jobs: columns packed once and shared, in two rounds
            // (2304 x 256 columns per job, three jobs per round).
            c(1, 256, 16, (32, 32), (3, 3), (1, 1), (1, 1, 1, 1), 1, 1),
            c(2, 64, 40, (15, 15), (1, 1), (2, 2), (0, 0, 0, 0), 1, 2),
        ];
        for case in &cases {
            let p = case.params();
            for with_bias in [false, true] {
                let x = values(p.input_len(), 1);
                let w = values(p.weight_len(), 2);
                let b = values(p.out_channels, 3);
                let b = with_bias.then_some(&b[..]);
                let mut want = vec![0.0f32; p.output_len()];
                gemm::conv2d(&p, &x, &w, b, &mut want).unwrap();
                want.iter_mut().for_each(|v| *v += 1.0);
                // The epilogue adds a residual (the output's index) and applies ReLU.
                want.iter_mut()
                    .enumerate()
                    .for_each(|(i, v)| *v = (*v - 1.0 + i as f32 * 1e-3).max(0.0));
                let relu = |at: usize, s: &mut [f32]| {
                    for (i, v) in s.iter_mut().enumerate() {
                        *v = (*v + (at + i) as f32 * 1e-3).max(0.0);
                    }
                };
                // 1x1 rows read as the layout chooses, packed, and in place.
                for force in [None, Some(false), Some(true)] {
                    IN_PLACE_OVERRIDE.set(force);
                    let mut got = vec![f32::NAN; p.output_len()];
                    conv2d(&p, &x, &w, b, &mut got, Some(&relu)).unwrap();
                    for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                            "{p:?} bias {with_bias} in place {force:?} at {i}: {g} vs {e}"
                        );
                    }
                }
                IN_PLACE_OVERRIDE.set(None);
            }
        }
    }

    #[test]
    fn refuses_f64() {
        let p = Case {
            batch: 1,
            ic: 4,
            oc: 4,
            hw: (3, 3),
            k: (1, 1),
            stride: (1, 1),
            pad: (0, 0, 0, 0),
            dilation: 1,
            groups: 1,
        }
        .params();
        let x = vec![0.0f64; p.input_len()];
        let w = vec![0.0f64; p.weight_len()];
        let mut out = vec![0.0f64; p.output_len()];
        assert!(conv2d(&p, &x, &w, None, &mut out, None).is_err());
    }
}
