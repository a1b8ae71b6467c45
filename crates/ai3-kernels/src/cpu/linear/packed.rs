//! f32 linear layers with the weight packed once, when the layer is built:
//! panels of `nr` output features (the register tile's columns: 32 on
//! AVX-512, 16 on AVX2), each stored `[in_features][nr]`, so the
//! micro-kernel reads one contiguous row of `nr` weights per step of the
//! reduction and broadcasts one input value per row against it.
//!
//! The micro-kernel (`crate::cpu::tile`) holds an `mr x nr` block of the
//! output in registers. Tasks are blocks of rows times groups of panels;
//! within a task the reduction runs in blocks of `KC`, so that one panel's
//! block stays in L1 while every row block of the task passes over it, and
//! the rows' block stays in L2 across panels. Packing once matters most for
//! few rows (a batch of images through a classifier): the product then
//! streams its weight, and a GEMM that packs per call reads it three times.

// The packed path exists on x86-64 only; elsewhere the layer is never packed
// and only the portable entry points are used.
#![cfg_attr(not(target_arch = "x86_64"), allow(unused, clippy::needless_return))]

use rayon::prelude::*;

use crate::alloc::{try_zeroed_vec, KernelResult};
use crate::params::LinearParams;

/// Rows per task, about (tasks take whole tiles of rows).
const MB: usize = 96;
/// Rows that may form a single block when the weight is the larger
/// operand: their reduction block (`KC` values each) fills about half an
/// L2 cache.
const ONE_BLOCK_ROWS: usize = 512;
/// Reduction length per pass.
const KC: usize = 256;

/// A weight `[out_features, in_features]` packed into panels, with its bias
/// padded to whole panels.
#[derive(Debug, Clone)]
pub struct PackedWeight {
    data: Vec<f32>,
    bias: Option<Vec<f32>>,
    in_features: usize,
    out_features: usize,
    /// Output features per panel: the columns of the tile that runs it.
    nr: usize,
}

impl PackedWeight {
    /// Packs `weight` (`[out_features, in_features]`, PyTorch's layout) and
    /// `bias` for this process's register tile; `None` on the portable ISA
    /// level, where this kernel cannot run. A refused allocation is an error.
    pub fn new(
        weight: &[f32],
        bias: Option<&[f32]>,
        out_features: usize,
        in_features: usize,
    ) -> KernelResult<Option<Self>> {
        let Some(nr) = tile_columns() else {
            return Ok(None);
        };
        let panels = out_features.div_ceil(nr);
        let mut data: Vec<f32> = try_zeroed_vec(panels * in_features * nr, "packed weight")?;
        for (j, row) in weight.chunks_exact(in_features.max(1)).enumerate() {
            let (panel, lane) = (j / nr, j % nr);
            let base = panel * in_features * nr + lane;
            for (k, &v) in row.iter().enumerate().take(in_features) {
                data[base + k * nr] = v;
            }
        }
        let bias = match bias {
            Some(b) => {
                let mut padded: Vec<f32> = try_zeroed_vec(panels * nr, "packed bias")?;
                padded[..b.len()].copy_from_slice(b);
                Some(padded)
            }
            None => None,
        };
        Ok(Some(PackedWeight {
            data,
            bias,
            in_features,
            out_features,
            nr,
        }))
    }

    /// Input features of each row the packed weight multiplies.
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// Output features it makes of each row.
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// Bytes the packed copy holds.
    pub fn bytes(&self) -> usize {
        (self.data.len() + self.bias.as_ref().map_or(0, Vec::len)) * 4
    }
}

/// Whether this process runs the packed kernel (AVX-512 or AVX2+FMA). Where
/// it does, it runs every f32 linear layer: on AVX2 (a Zen 4, two threads,
/// paired with the gemm crate, which packs the input too) it took 0.35x the
/// gemm crate's time on 10 x 9216 -> 4096, 0.66-0.90x on ConvNeXt's MLP
/// (3136 x 96 -> 384, 784 x 768 -> 192), 0.80-0.87x on 128 x 4096 -> 4096,
/// 2048 x 256 -> 256 and 197 x 768 -> 2304, and 0.95-1.0x on 144 x 768 ->
/// 3072 and 512 x 1024 -> 1024.
pub fn available() -> bool {
    tile_columns().is_some()
}

/// The columns of this process's register tile, `None` without one.
fn tile_columns() -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        crate::cpu::tile::Kernel::get().map(|k| k.nr)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// A function applied in place to a finished run of one output row (a
/// fused residual and activation), given the run's offset in the output.
pub type Epilogue<'a> = &'a (dyn Fn(usize, &mut [f32]) + Sync);

/// `output = epilogue(input @ weightᵀ + bias)` with the packed weight;
/// `input` is `[rows, in_features]`, `output` `[rows, out_features]`. The
/// epilogue runs on each task's block of the output as soon as it is
/// finished, while it is still in cache. The buffers' lengths must match `p`,
/// and `p` the packed weight (a mismatch panics: callers check shapes first).
pub fn linear(
    p: &LinearParams,
    x: &[f32],
    w: &PackedWeight,
    out: &mut [f32],
    epilogue: Option<Epilogue>,
) {
    assert!(
        p.in_features == w.in_features
            && p.out_features == w.out_features
            && x.len() == p.rows * p.in_features
            && out.len() == p.rows * p.out_features,
        "packed linear: buffers do not match {p:?}"
    );
    if p.rows == 0 || p.out_features == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let kernel = crate::cpu::tile::Kernel::get()
            .filter(|k| k.nr == w.nr)
            .expect("packed linear: the weight was packed for this process's tile");
        tiled::run(p, x, w, kernel, out, epilogue);
    }
}

#[cfg(target_arch = "x86_64")]
mod tiled {
    use super::*;
    use crate::cpu::conv2d::SharedMut;
    use crate::cpu::tile::{Init, Kernel, Tile};

    pub(super) fn run(
        p: &LinearParams,
        x: &[f32],
        w: &PackedWeight,
        kernel: Kernel,
        out: &mut [f32],
        epilogue: Option<Epilogue>,
    ) {
        let (rows, nf, nr) = (p.rows, p.out_features, w.nr);
        let panels = nf.div_ceil(nr);
        let threads = rayon::current_num_threads();
        // Row blocks of whole tiles, as equal as the tiles allow: 196 rows
        // in blocks of 96, 96 and 4 left one thread with twice the other's
        // work (196 x 384 -> 1536: 0.68 ms, 192 rows 0.47).
        let tiles = rows.div_ceil(kernel.mr);
        // Fewer rows than output features (ConvNeXt's MLP at 14x14: 196 x
        // 384 -> 1536 and back): the weight is the larger operand, and
        // larger than a core's L2, so each row block would stream it once
        // more. All the rows then form one block, their reduction blocks
        // (at most ONE_BLOCK_ROWS x KC) staying in L2, and the tasks split
        // the panels (those two layers alone: 0.90-0.91x the time with
        // blocks of MB rows; 392 x 384 -> 1536 0.93x; not where the rows
        // outnumber the features: 784 x 768 -> 192 1.09x).
        let row_blocks = if rows <= nf && rows <= ONE_BLOCK_ROWS {
            1
        } else {
            rows.div_ceil(MB).min(tiles)
        };
        // Enough tasks to balance the threads, and a multiple of their
        // count where the panels allow: few rows split the panels too.
        let mut groups = (4 * threads).div_ceil(row_blocks).clamp(1, panels);
        while (row_blocks * groups) % threads != 0 && groups < panels {
            groups += 1;
        }
        let out_ptr = &SharedMut(out.as_mut_ptr());
        (0..row_blocks * groups).into_par_iter().for_each(|t| {
            let (rt, g) = (t / groups, t % groups);
            let r0 = rt * tiles / row_blocks * kernel.mr;
            let r1 = ((rt + 1) * tiles / row_blocks * kernel.mr).min(rows);
            let q0 = g * panels / groups;
            let q1 = (g + 1) * panels / groups;
            // SAFETY: the kernel is this process's (checked by the caller);
            // task t writes only rows r0..r1 of panels q0..q1, which no other
            // task writes; every index is inside the checked buffers.
            unsafe { task(p, x, w, kernel, out_ptr.0, r0..r1, q0..q1) };
            if let Some(f) = epilogue {
                let (c0, c1) = (q0 * nr, (q1 * nr).min(nf));
                for i in r0..r1 {
                    // SAFETY: the task's own finished block, as above.
                    let row = unsafe {
                        std::slice::from_raw_parts_mut(out_ptr.0.add(i * nf + c0), c1 - c0)
                    };
                    f(i * nf + c0, row);
                }
            }
        });
    }

    /// Rows `rows` of panels `panels` of the output.
    ///
    /// # Safety
    /// The CPU runs `kernel`; the ranges lie inside the checked buffers.
    unsafe fn task(
        p: &LinearParams,
        x: &[f32],
        w: &PackedWeight,
        kernel: Kernel,
        out: *mut f32,
        rows: std::ops::Range<usize>,
        panels: std::ops::Range<usize>,
    ) {
        let (kf, nf, nr) = (p.in_features, p.out_features, w.nr);
        let (r0, r1) = (rows.start, rows.end);
        // The reduction is blocked so that a panel's block serves every
        // tile of rows from L1; rows of one tile read each panel once, as
        // one sequential stream.
        let block = if r1 - r0 <= kernel.mr { kf } else { KC };
        let mut k0 = 0;
        while k0 < kf {
            let kc = block.min(kf - k0);
            for q in panels.clone() {
                // SAFETY (whole block): the panel holds kf * nr values from
                // q * kf * nr; rows i..i+m of x and out exist.
                let init = if k0 > 0 {
                    Init::Load
                } else {
                    match &w.bias {
                        Some(bias) => Init::Row(unsafe { bias.as_ptr().add(q * nr) }),
                        None => Init::Zero,
                    }
                };
                let mut t = Tile {
                    a: unsafe { x.as_ptr().add(r0 * kf + k0) },
                    lda: kf,
                    b: unsafe { w.data.as_ptr().add(q * kf * nr + k0 * nr) },
                    ldb: nr,
                    kc,
                    c: unsafe { out.add(r0 * nf + q * nr) },
                    ldc: nf,
                    n: nr.min(nf - q * nr),
                    init,
                };
                let mut i = r0;
                while i < r1 {
                    let m = kernel.mr.min(r1 - i);
                    unsafe { (kernel.run)(m, &t) };
                    t.a = unsafe { t.a.add(m * kf) };
                    t.c = unsafe { t.c.add(m * nf) };
                    i += m;
                }
            }
            k0 += kc;
        }
    }
}
