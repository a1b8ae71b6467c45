//! f32 linear layers on AVX-512 with the weight packed once, when the layer
//! is built: panels of [`NR`] output features, each stored `[in_features][NR]`,
//! so the micro-kernel reads one contiguous row of `NR` weights per step of
//! the reduction and broadcasts one input value per row against it.
//!
//! The micro-kernel ([`crate::cpu::tile`]) holds a `12 x NR` block of the
//! output in registers (24 of the 32 vector registers). Tasks are blocks of rows times groups of
//! panels; within a task the reduction runs in blocks of [`KC`], so that one
//! panel's block stays in L1 while every row block of the task passes over
//! it, and the rows' block stays in L2 across panels.

// The packed AVX-512 path exists on x86-64 only; elsewhere the layer is
// never packed and only the portable entry points are used.
#![cfg_attr(not(target_arch = "x86_64"), allow(unused, clippy::needless_return))]

use rayon::prelude::*;

use crate::alloc::{try_zeroed_vec, KernelResult};
use crate::params::LinearParams;

/// Output features per panel: the columns of one register tile.
pub const NR: usize = 32;
/// Rows per task (a multiple of the tile's 12 rows).
const MB: usize = 96;
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
}

impl PackedWeight {
    /// Packs `weight` (`[out_features, in_features]`, PyTorch's layout) and
    /// `bias`; `None` when the CPU lacks AVX-512, where this kernel cannot run.
    /// A refused allocation is an error.
    pub fn new(
        weight: &[f32],
        bias: Option<&[f32]>,
        out_features: usize,
        in_features: usize,
    ) -> KernelResult<Option<Self>> {
        if !available() {
            return Ok(None);
        }
        let panels = out_features.div_ceil(NR);
        let mut data: Vec<f32> = try_zeroed_vec(panels * in_features * NR, "packed weight")?;
        for (j, row) in weight.chunks_exact(in_features.max(1)).enumerate() {
            let (panel, lane) = (j / NR, j % NR);
            let base = panel * in_features * NR + lane;
            for (k, &v) in row.iter().enumerate().take(in_features) {
                data[base + k * NR] = v;
            }
        }
        let bias = match bias {
            Some(b) => {
                let mut padded: Vec<f32> = try_zeroed_vec(panels * NR, "packed bias")?;
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
        }))
    }

    /// Bytes the packed copy holds.
    pub fn bytes(&self) -> usize {
        (self.data.len() + self.bias.as_ref().map_or(0, Vec::len)) * 4
    }
}

/// Whether this CPU runs the packed kernel.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::isa::avx512()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// An elementwise function applied in place to finished output (a fused activation).
pub type Epilogue<'a> = &'a (dyn Fn(&mut [f32]) + Sync);

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
        assert!(available(), "packed linear needs AVX-512");
        avx512::run(p, x, w, out, epilogue);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;
    use crate::cpu::conv2d::SharedMut;
    use crate::cpu::tile::{avx512 as tile, Init, Tile};
    use tile::MR;

    pub(super) fn run(
        p: &LinearParams,
        x: &[f32],
        w: &PackedWeight,
        out: &mut [f32],
        epilogue: Option<Epilogue>,
    ) {
        let (rows, nf) = (p.rows, p.out_features);
        let panels = nf.div_ceil(NR);
        let row_tasks = rows.div_ceil(MB);
        // Enough tasks to balance the threads: few rows split the panels too.
        let want = 4 * rayon::current_num_threads();
        let groups = if row_tasks >= want {
            1
        } else {
            want.div_ceil(row_tasks).min(panels)
        };
        let per_group = panels.div_ceil(groups);
        let groups = panels.div_ceil(per_group);
        let out_ptr = &SharedMut(out.as_mut_ptr());
        (0..row_tasks * groups).into_par_iter().for_each(|t| {
            let (rt, g) = (t / groups, t % groups);
            let r0 = rt * MB;
            let r1 = (r0 + MB).min(rows);
            let q0 = g * per_group;
            let q1 = (q0 + per_group).min(panels);
            // SAFETY: avx512f is available (checked by the caller); task t
            // writes only rows r0..r1 of panels q0..q1, which no other task
            // writes; every index is inside the checked buffers.
            unsafe { task(p, x, w, out_ptr.0, r0, r1, q0, q1) };
            if let Some(f) = epilogue {
                let (c0, c1) = (q0 * NR, (q1 * NR).min(nf));
                for i in r0..r1 {
                    // SAFETY: the task's own finished block, as above.
                    let row = unsafe {
                        std::slice::from_raw_parts_mut(out_ptr.0.add(i * nf + c0), c1 - c0)
                    };
                    f(row);
                }
            }
        });
    }

    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn task(
        p: &LinearParams,
        x: &[f32],
        w: &PackedWeight,
        out: *mut f32,
        r0: usize,
        r1: usize,
        q0: usize,
        q1: usize,
    ) {
        let (kf, nf) = (p.in_features, p.out_features);
        let mut k0 = 0;
        while k0 < kf {
            let kc = KC.min(kf - k0);
            for q in q0..q1 {
                // SAFETY (whole block): the panel holds kf * NR values from
                // q * kf * NR; rows i..i+m of x and out exist.
                let init = if k0 > 0 {
                    Init::Load
                } else {
                    match &w.bias {
                        Some(bias) => Init::Row(unsafe { bias.as_ptr().add(q * NR) }),
                        None => Init::Zero,
                    }
                };
                let mut t = Tile {
                    a: unsafe { x.as_ptr().add(r0 * kf + k0) },
                    lda: kf,
                    b: unsafe { w.data.as_ptr().add(q * kf * NR + k0 * NR) },
                    ldb: NR,
                    kc,
                    c: unsafe { out.add(r0 * nf + q * NR) },
                    ldc: nf,
                    n: NR.min(nf - q * NR),
                    init,
                };
                let mut i = r0;
                while i < r1 {
                    let m = MR.min(r1 - i);
                    unsafe { tile::run(m, &t) };
                    t.a = unsafe { t.a.add(m * kf) };
                    t.c = unsafe { t.c.add(m * nf) };
                    i += m;
                }
            }
            k0 += kc;
        }
    }
}
