//! f32 linear layers on AVX-512 with the weight packed once, when the layer
//! is built: panels of [`NR`] output features, each stored `[in_features][NR]`,
//! so the micro-kernel reads one contiguous row of `NR` weights per step of
//! the reduction and broadcasts one input value per row against it.
//!
//! The micro-kernel holds an `MR x NR` block of the output in registers
//! (24 of the 32 vector registers). Tasks are blocks of rows times groups of
//! panels; within a task the reduction runs in blocks of [`KC`], so that one
//! panel's block stays in L1 while every row block of the task passes over
//! it, and the rows' block stays in L2 across panels.

use rayon::prelude::*;

use crate::alloc::{try_zeroed_vec, KernelResult};
use crate::params::LinearParams;

/// Output features per panel: two vectors of 16 lanes.
pub const NR: usize = 32;
/// Rows per micro-kernel call.
const MR: usize = 12;
/// Rows per task (a multiple of [`MR`]).
const MB: usize = 8 * MR;
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
        std::arch::is_x86_feature_detected!("avx512f")
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
    use std::arch::x86_64::*;

    use super::*;
    use crate::cpu::conv2d::SharedMut;

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
                let cols = NR.min(nf - q * NR);
                let masks = (lane_mask(cols), lane_mask(cols.saturating_sub(16)));
                // SAFETY (whole block): the panel holds kf * NR values from
                // q * kf * NR; rows i..i+m of x and out exist.
                let b = unsafe { w.data.as_ptr().add(q * kf * NR + k0 * NR) };
                let init = if k0 > 0 {
                    Init::Load
                } else {
                    match &w.bias {
                        Some(bias) => Init::Bias(unsafe { bias.as_ptr().add(q * NR) }),
                        None => Init::Zero,
                    }
                };
                let mut i = r0;
                while i < r1 {
                    let m = MR.min(r1 - i);
                    let a = unsafe { x.as_ptr().add(i * kf + k0) };
                    let c = unsafe { out.add(i * nf + q * NR) };
                    let call = Call {
                        a,
                        lda: kf,
                        b,
                        kc,
                        c,
                        ldc: nf,
                        init,
                        masks,
                    };
                    unsafe {
                        match m {
                            12 => micro::<12>(&call),
                            11 => micro::<11>(&call),
                            10 => micro::<10>(&call),
                            9 => micro::<9>(&call),
                            8 => micro::<8>(&call),
                            7 => micro::<7>(&call),
                            6 => micro::<6>(&call),
                            5 => micro::<5>(&call),
                            4 => micro::<4>(&call),
                            3 => micro::<3>(&call),
                            2 => micro::<2>(&call),
                            _ => micro::<1>(&call),
                        }
                    }
                    i += m;
                }
            }
            k0 += kc;
        }
    }

    /// The first `n` of 16 lanes.
    fn lane_mask(n: usize) -> __mmask16 {
        if n >= 16 {
            0xFFFF
        } else {
            ((1u32 << n) - 1) as __mmask16
        }
    }

    /// Where an output block starts from.
    #[derive(Clone, Copy)]
    enum Init {
        Zero,
        Bias(*const f32),
        /// The partial sums of earlier reduction blocks, in the output.
        Load,
    }

    /// One micro-kernel call: `m` rows of `a` (stride `lda`) over `kc`
    /// reduction steps of the panel block `b`, into `c` (stride `ldc`).
    struct Call {
        a: *const f32,
        lda: usize,
        b: *const f32,
        kc: usize,
        c: *mut f32,
        ldc: usize,
        init: Init,
        masks: (__mmask16, __mmask16),
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn micro<const M: usize>(call: &Call) {
        let (m0, m1) = call.masks;
        // SAFETY (whole function): the caller hands M rows of kc values of
        // a, kc rows of NR values of b, and M rows of the output whose lanes
        // outside the masks are never touched.
        let mut acc: [[__m512; 2]; M] = unsafe {
            match call.init {
                Init::Zero => [[_mm512_setzero_ps(); 2]; M],
                Init::Bias(bias) => {
                    let v = [_mm512_loadu_ps(bias), _mm512_loadu_ps(bias.add(16))];
                    [v; M]
                }
                Init::Load => std::array::from_fn(|i| {
                    let c = call.c.add(i * call.ldc);
                    [
                        _mm512_maskz_loadu_ps(m0, c),
                        _mm512_maskz_loadu_ps(m1, c.add(16)),
                    ]
                }),
            }
        };
        let rows: [*const f32; M] = std::array::from_fn(|i| unsafe { call.a.add(i * call.lda) });
        for k in 0..call.kc {
            unsafe {
                let b0 = _mm512_loadu_ps(call.b.add(k * NR));
                let b1 = _mm512_loadu_ps(call.b.add(k * NR + 16));
                for i in 0..M {
                    let a = _mm512_set1_ps(*rows[i].add(k));
                    acc[i][0] = _mm512_fmadd_ps(a, b0, acc[i][0]);
                    acc[i][1] = _mm512_fmadd_ps(a, b1, acc[i][1]);
                }
            }
        }
        for (i, v) in acc.iter().enumerate() {
            unsafe {
                let c = call.c.add(i * call.ldc);
                _mm512_mask_storeu_ps(c, m0, v[0]);
                _mm512_mask_storeu_ps(c.add(16), m1, v[1]);
            }
        }
    }
}
