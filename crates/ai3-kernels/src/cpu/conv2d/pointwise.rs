//! 1x1 convolution in f32 as a GEMM read straight from NCHW: the GEMM
//! algorithm's path for MobileNet's, SqueezeNet's and ResNet's pointwise
//! layers.
//!
//! For each `(image, group)`, `out[ocg, hw] = W[ocg, icg] @ x[icg, hw]`: the
//! weight is `A` in PyTorch's own layout, the input plane is `B` as it lies
//! (one row per input channel), so nothing is unrolled or packed. A strided
//! layer first gathers the pixels it reads into a compact plane. The
//! [register tile](crate::cpu::tile) of the process's ISA level holds a
//! block of output channels by pixels, starting from the bias; tasks are
//! blocks of pixels times blocks of output channels, and the fused epilogue
//! (an activation) runs on each task's finished block while it is in cache.
//!
//! Within a task the reduction runs in blocks of [`KC`] input channels; each
//! row of tiles then passes over the task's pixels, so a layer's weights
//! (most of what the late, small-image layers read) come from memory once.

use std::any::TypeId;

use rayon::prelude::*;

use super::{threads_for, SharedMut};
use crate::alloc::{check_len, KernelError, KernelResult};
use crate::cpu::scratch::with_scratch;
use crate::params::Conv2dParams;
use crate::Float;

/// Output pixels per task, at most (a multiple of every tile's width).
const PIXELS: usize = 256;

/// Output channels per task, at most: keeps the weight block a task streams
/// over (`CHANNELS x kc`) in L2.
const CHANNELS: usize = 192;

/// Input channels per reduction block: the block of the input a task reads
/// (`KC x PIXELS`, 128 KiB) stays in L2 while every row of tiles passes over
/// it, and each row of tiles' weights (`mr x KC`) in L1.
const KC: usize = 128;

/// Tasks per thread to aim for, so uneven tasks still balance.
const TASKS_PER_THREAD: usize = 4;

/// A function applied in place to finished output (a fused activation); it
/// must work on any slice.
pub type Epilogue<'a, T> = &'a (dyn Fn(&mut [T]) + Sync);

/// Whether this path takes `p` with elements of type `T`: f32, a register
/// tile for this CPU (AVX2 or AVX-512), a 1x1 kernel and no padding (any
/// stride, dilation or groups).
pub fn applies<T: Float>(p: &Conv2dParams) -> bool {
    TypeId::of::<T>() == TypeId::of::<f32>()
        && tile_kernel().is_some()
        && p.kernel_h == 1
        && p.kernel_w == 1
        && p.padding == Default::default()
}

#[cfg(target_arch = "x86_64")]
use crate::cpu::tile::Kernel;

#[cfg(target_arch = "x86_64")]
fn tile_kernel() -> Option<Kernel> {
    Kernel::get()
}

#[cfg(not(target_arch = "x86_64"))]
fn tile_kernel() -> Option<()> {
    None
}

/// 1x1 convolution (see the [module contract](super)) with `epilogue`
/// applied to the output. Fails, before writing anything, when a buffer has
/// the wrong length or `p` is not one [`applies`] takes; a strided layer's
/// compact plane is scratch, and a refused allocation of it fails the call.
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
    if !applies::<T>(p) {
        return Err(KernelError::Precondition {
            what: "pointwise conv2d needs f32, a 1x1 kernel, no padding and AVX2 or AVX-512",
        });
    }
    #[cfg(target_arch = "x86_64")]
    {
        let kernel = Kernel::get().expect("checked by applies");
        // SAFETY: T is f32 (checked by applies), so these are the same buffers.
        let cast =
            |s: &[T]| unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<f32>(), s.len()) };
        let (x, w, b) = (cast(input), cast(weight), bias.map(cast));
        // SAFETY: as above.
        let out = unsafe {
            std::slice::from_raw_parts_mut(output.as_mut_ptr().cast::<f32>(), output.len())
        };
        // SAFETY: as above; the epilogue takes f32 slices.
        let epilogue = epilogue.map(|f| {
            move |s: &mut [f32]| {
                f(unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<T>(), s.len()) })
            }
        });
        let epilogue = epilogue.as_ref().map(|f| f as Epilogue<f32>);
        run(kernel, p, x, w, b, out, epilogue)?;
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
fn run(
    kernel: Kernel,
    p: &Conv2dParams,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    out: &mut [f32],
    epilogue: Option<Epilogue<f32>>,
) -> KernelResult<()> {
    let hw = p.out_h() * p.out_w();
    if out.is_empty() {
        return Ok(());
    }
    if p.stride == (1, 1) {
        return gemm(kernel, p, p.batch, x, w, b, out, epilogue);
    }
    // A strided layer reads every stride-th pixel: gather them, an image at
    // a time, into a compact [in_channels, hw] plane.
    let (plane_in, ow) = (p.in_h * p.in_w, p.out_w());
    let (sh, sw) = p.stride;
    let per_image = p.in_channels * hw;
    with_scratch::<f32, _>(per_image, |compact| {
        for (n, out) in out.chunks_mut(p.out_channels * hw).enumerate() {
            let img = &x[n * p.in_channels * plane_in..][..p.in_channels * plane_in];
            compact
                .par_chunks_mut(hw)
                .with_min_len(if threads_for(p) == 1 { usize::MAX } else { 1 })
                .zip(img.par_chunks(plane_in))
                .for_each(|(dst, src)| {
                    for (oy, row) in dst.chunks_mut(ow).enumerate() {
                        let src = &src[oy * sh * p.in_w..];
                        for (ox, d) in row.iter_mut().enumerate() {
                            *d = src[ox * sw];
                        }
                    }
                });
            gemm(kernel, p, 1, compact, w, b, out, epilogue)?;
        }
        Ok(())
    })?
}

/// The GEMMs of `images` images whose input planes are `hw` pixels (the
/// output's) at `x`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn gemm(
    kernel: Kernel,
    p: &Conv2dParams,
    images: usize,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    out: &mut [f32],
    epilogue: Option<Epilogue<f32>>,
) -> KernelResult<()> {
    let (icg, ocg, groups) = (
        p.in_channels_per_group(),
        p.out_channels_per_group(),
        p.groups,
    );
    let hw = p.out_h() * p.out_w();
    // Blocks of at most PIXELS pixels, as even as whole tiles allow.
    let pixel_block = hw
        .div_ceil(hw.div_ceil(PIXELS))
        .next_multiple_of(kernel.nr)
        .min(PIXELS);
    let pixel_blocks = hw.div_ceil(pixel_block);
    let row_tiles = ocg.div_ceil(kernel.mr);
    // Blocks of output channels: at most CHANNELS, and enough of them that
    // every thread gets several tasks when there are few pixels.
    let threads = threads_for(p);
    let base = images * groups * pixel_blocks;
    let want = (TASKS_PER_THREAD * threads).div_ceil(base).max(1);
    let channel_blocks = want.max(ocg.div_ceil(CHANNELS)).min(row_tiles).max(1);
    let rows_per_block = row_tiles.div_ceil(channel_blocks) * kernel.mr;
    let channel_blocks = ocg.div_ceil(rows_per_block);

    let out_ptr = SharedMut(out.as_mut_ptr());
    let task = |t: usize| {
        let out_ptr = &out_ptr;
        let cb = t % channel_blocks;
        let rest = t / channel_blocks;
        let pb = rest % pixel_blocks;
        let rest = rest / pixel_blocks;
        let (g, n) = (rest % groups, rest / groups);
        let (o0, o1) = (cb * rows_per_block, ((cb + 1) * rows_per_block).min(ocg));
        let (c0, c1) = (pb * pixel_block, ((pb + 1) * pixel_block).min(hw));
        let x = &x[(n * p.in_channels + g * icg) * hw..][..icg * hw];
        let w = &w[g * ocg * icg..][..ocg * icg];
        let b = b.map(|b| &b[g * ocg..][..ocg]);
        let out_base = (n * p.out_channels + g * ocg) * hw;
        let width = c1 - c0;
        let nr = kernel.nr;
        let panels = width.div_ceil(nr);
        with_scratch::<f32, _>(KC.min(icg) * panels * nr, |packed| {
            let mut k0 = 0;
            while k0 < icg {
                let kcur = KC.min(icg - k0);
                // This block of the input as column panels, each [kcur][nr]:
                // every row of tiles then reads it contiguously.
                for (j, panel) in packed.chunks_mut(kcur * nr).take(panels).enumerate() {
                    let cols = nr.min(width - j * nr);
                    for (k, dst) in panel.chunks_exact_mut(nr).enumerate() {
                        let src = &x[(k0 + k) * hw + c0 + j * nr..][..cols];
                        dst[..cols].copy_from_slice(src);
                    }
                }
                let mut o = o0;
                while o < o1 {
                    let m = kernel.mr.min(o1 - o);
                    // SAFETY: rows o..o+m of `w` and of the bias exist; the
                    // task writes only rows o0..o1, columns c0..c1 of its
                    // image and group's output, which no other task writes;
                    // panel j of `packed` holds kcur rows of nr values; the
                    // CPU has the kernel's features (`Kernel::get` chose it).
                    unsafe {
                        let init = match (k0, b) {
                            (0, Some(b)) => Init::PerRow(b.as_ptr().add(o)),
                            (0, None) => Init::Zero,
                            _ => Init::Load,
                        };
                        let mut tile = Tile {
                            a: w.as_ptr().add(o * icg + k0),
                            lda: icg,
                            b: packed.as_ptr(),
                            ldb: nr,
                            kc: kcur,
                            c: out_ptr.0.add(out_base + o * hw + c0),
                            ldc: hw,
                            n: 0,
                            init,
                        };
                        for j in 0..panels {
                            tile.n = nr.min(width - j * nr);
                            tile.b = packed.as_ptr().add(j * kcur * nr);
                            (kernel.run)(m, &tile);
                            tile.c = tile.c.add(nr);
                        }
                    }
                    o += m;
                }
                k0 += kcur;
            }
            if let Some(f) = epilogue {
                for o in o0..o1 {
                    // SAFETY: this task's finished block, as above.
                    f(unsafe {
                        std::slice::from_raw_parts_mut(out_ptr.0.add(out_base + o * hw + c0), width)
                    });
                }
            }
        })
    };
    let tasks = images * groups * pixel_blocks * channel_blocks;
    if threads == 1 {
        (0..tasks).try_for_each(task)
    } else {
        (0..tasks).into_par_iter().try_for_each(task)
    }
}

#[cfg(target_arch = "x86_64")]
use crate::cpu::tile::{Init, Tile};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::conv2d::gemm;
    use crate::params::Padding2d;

    fn params(
        batch: usize,
        ic: usize,
        oc: usize,
        hw: (usize, usize),
        stride: usize,
        groups: usize,
    ) -> Conv2dParams {
        Conv2dParams {
            batch,
            in_channels: ic,
            in_h: hw.0,
            in_w: hw.1,
            out_channels: oc,
            kernel_h: 1,
            kernel_w: 1,
            stride: (stride, stride),
            padding: Padding2d::default(),
            dilation: (1, 1),
            groups,
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

    /// Against the generic im2col + GEMM kernel: tile row and column tails,
    /// several reduction blocks, several tasks, strides, groups, with and
    /// without bias, and an epilogue.
    #[test]
    fn matches_im2col_gemm() {
        if !applies::<f32>(&params(1, 1, 1, (1, 1), 1, 1)) {
            eprintln!("skipped: this CPU has no AVX2 tile");
            return;
        }
        crate::cpu::conv2d::SHARE_SMALL.store(true, std::sync::atomic::Ordering::Relaxed);
        let cases = [
            params(1, 3, 5, (1, 1), 1, 1),
            params(2, 17, 13, (7, 7), 1, 1),
            params(1, 300, 40, (5, 9), 1, 1),
            params(1, 64, 400, (3, 3), 1, 1),
            params(3, 24, 36, (17, 19), 1, 1),
            params(1, 12, 18, (9, 11), 2, 1),
            params(2, 16, 8, (8, 8), 3, 2),
            params(1, 8, 12, (6, 5), 1, 4),
            params(1, 40, 24, (30, 20), 1, 1),
        ];
        for p in cases {
            for with_bias in [false, true] {
                let x = values(p.input_len(), 1);
                let w = values(p.weight_len(), 2);
                let b = values(p.out_channels, 3);
                let b = with_bias.then_some(&b[..]);
                let mut want = vec![0.0f32; p.output_len()];
                gemm::conv2d(&p, &x, &w, b, &mut want).unwrap();
                want.iter_mut().for_each(|v| *v = v.max(0.0));
                let mut got = vec![f32::NAN; p.output_len()];
                let relu = |s: &mut [f32]| s.iter_mut().for_each(|v| *v = v.max(0.0));
                conv2d(&p, &x, &w, b, &mut got, Some(&relu)).unwrap();
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                        "{p:?} bias {with_bias} at {i}: {g} vs {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn refuses_what_it_does_not_take() {
        let mut p = params(1, 4, 4, (3, 3), 1, 1);
        p.kernel_h = 3;
        p.kernel_w = 3;
        let x = vec![0.0f32; p.input_len()];
        let w = vec![0.0f32; p.weight_len()];
        let mut out = vec![0.0f32; p.output_len()];
        assert!(conv2d(&p, &x, &w, None, &mut out, None).is_err());
        let p = params(1, 4, 4, (3, 3), 1, 1);
        let x = vec![0.0f64; p.input_len()];
        let w = vec![0.0f64; p.weight_len()];
        let mut out = vec![0.0f64; p.output_len()];
        assert!(conv2d(&p, &x, &w, None, &mut out, None).is_err());
    }
}
