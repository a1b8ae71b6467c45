//! The GEMM algorithm's f32 path for 1x1 layers (see [`applies`]) on the
//! [register tiles](crate::cpu::tile), im2col never materialised.
//!
//! For each `(image, group)`, `out[ocg, hw] = W[ocg, K] @ cols[K, hw]`, with
//! `K = icg * kh * kw`: the weight is `A` in PyTorch's own layout, and `cols`
//! (the unrolled patches) is only ever built a block at a time, straight
//! into the column panels the tile reads (`[kc][nr]` each). A 1x1 layer with
//! stride 1 and no padding copies its input rows as they lie. Tasks are
//! blocks of output pixels times blocks of output channels; each task's
//! output block starts from the bias in registers and gets the fused
//! epilogue (an activation) as soon as it is finished, while it is in cache.
//!
//! Within a task the reduction runs in blocks of [`KC`]; each row of tiles
//! then passes over the task's pixels, so a layer's weights (most of what
//! the late, small-image layers read) come from memory once per pixel block.

use std::any::TypeId;

use rayon::prelude::*;

use super::{threads_for, valid_range, Epilogue, SharedMut};
use crate::alloc::{check_len, KernelError, KernelResult};
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

/// Whether [`conv2d`] runs with elements of type `T`: f32 on a CPU with a
/// register tile (AVX2 or AVX-512). It takes any kernel, stride, padding,
/// dilation or groups.
pub fn supports<T: Float>() -> bool {
    TypeId::of::<T>() == TypeId::of::<f32>() && tile_kernel().is_some()
}

/// Whether the GEMM algorithm should run `p` here rather than on im2col and
/// the `gemm` crate: 1x1 kernels, whose columns are a copy of the input
/// (any stride or padding). Larger kernels unroll the same patches once per
/// block of output channels here, which measured slower on ResNet-50's
/// strided 3x3 layers (256 -> 256 at 28x28: 4.0 against 1.8 ms) and on RGB
/// input layers than im2col + GEMM or direct convolution.
pub fn applies<T: Float>(p: &Conv2dParams) -> bool {
    supports::<T>() && p.kernel_h == 1 && p.kernel_w == 1
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
        // SAFETY: T is f32 (checked by supports), so these are the same buffers.
        let cast =
            |s: &[T]| unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<f32>(), s.len()) };
        let (x, w, b) = (cast(input), cast(weight), bias.map(cast));
        // SAFETY: as above.
        let out = unsafe {
            std::slice::from_raw_parts_mut(output.as_mut_ptr().cast::<f32>(), output.len())
        };
        // SAFETY: as above; the epilogue takes f32 slices.
        let epilogue = epilogue.map(|f| {
            move |at: usize, s: &mut [f32]| {
                f(at, unsafe {
                    std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<T>(), s.len())
                })
            }
        });
        let epilogue = epilogue.as_ref().map(|f| f as Epilogue<f32>);
        if !out.is_empty() {
            gemm(kernel, p, x, w, b, out, epilogue)?;
        }
    }
    Ok(())
}

/// Row `k` of one image and group's unrolled patches (`k` = (input channel,
/// ky, kx)), output pixels `c0..c0 + dst.len()`, into `dst`; zero where the
/// window reads padding.
fn im2col_row(p: &Conv2dParams, img: &[f32], k: usize, c0: usize, dst: &mut [f32]) {
    let taps = p.kernel_h * p.kernel_w;
    let (ci, r) = (k / taps, k % taps);
    let (ky, kx) = (r / p.kernel_w, r % p.kernel_w);
    let plane = &img[ci * p.in_h * p.in_w..][..p.in_h * p.in_w];
    let (ow, (sh, sw)) = (p.out_w(), p.stride);
    let (off_y, off_x) = (ky * p.dilation.0, kx * p.dilation.1);
    let (lo, hi) = valid_range(ow, p.in_w, sw, off_x, p.padding.left);
    let mut c = c0;
    let mut rest = dst;
    while !rest.is_empty() {
        let (oy, ox0) = (c / ow, c % ow);
        let seg = (ow - ox0).min(rest.len());
        let (d, tail) = rest.split_at_mut(seg);
        let iy = oy * sh + off_y;
        if iy < p.padding.top || iy - p.padding.top >= p.in_h {
            d.fill(0.0);
        } else {
            let row = &plane[(iy - p.padding.top) * p.in_w..][..p.in_w];
            // Columns ox0..ox0+seg: zeros before lo, reads in lo..hi, zeros after.
            let a = lo.clamp(ox0, ox0 + seg);
            let b = hi.clamp(a, ox0 + seg);
            d[..a - ox0].fill(0.0);
            d[b - ox0..].fill(0.0);
            if a < b {
                let first = a * sw + off_x - p.padding.left;
                let d = &mut d[a - ox0..b - ox0];
                if sw == 1 {
                    d.copy_from_slice(&row[first..first + d.len()]);
                } else {
                    for (i, v) in d.iter_mut().enumerate() {
                        *v = row[first + i * sw];
                    }
                }
            }
        }
        c += seg;
        rest = tail;
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
    let (icg, ocg, groups) = (
        p.in_channels_per_group(),
        p.out_channels_per_group(),
        p.groups,
    );
    let kk = icg * p.kernel_h * p.kernel_w;
    let plane_in = p.in_h * p.in_w;
    let hw = p.out_h() * p.out_w();
    // A 1x1 kernel with stride 1 and no padding: the input rows are the columns.
    let direct_rows =
        p.kernel_h == 1 && p.kernel_w == 1 && p.stride == (1, 1) && p.padding == Default::default();
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
    let base = p.batch * groups * pixel_blocks;
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
        let img = &x[(n * p.in_channels + g * icg) * plane_in..][..icg * plane_in];
        let w = &w[g * ocg * kk..][..ocg * kk];
        let b = b.map(|b| &b[g * ocg..][..ocg]);
        let out_base = (n * p.out_channels + g * ocg) * hw;
        let width = c1 - c0;
        let nr = kernel.nr;
        let panels = width.div_ceil(nr);
        with_scratch::<f32, _>(KC.min(kk) * panels * nr, |packed| {
            let mut row = [0.0f32; PIXELS];
            let mut k0 = 0;
            while k0 < kk {
                let kcur = KC.min(kk - k0);
                // This block of the columns as panels, each [kcur][nr]:
                // every row of tiles then reads it contiguously.
                for k in 0..kcur {
                    let src: &[f32] = if direct_rows {
                        &img[(k0 + k) * hw + c0..][..width]
                    } else {
                        im2col_row(p, img, k0 + k, c0, &mut row[..width]);
                        &row[..width]
                    };
                    for (j, src) in src.chunks(nr).enumerate() {
                        packed[(j * kcur + k) * nr..][..src.len()].copy_from_slice(src);
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
                            a: w.as_ptr().add(o * kk + k0),
                            lda: kk,
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
                    let at = out_base + o * hw + c0;
                    // SAFETY: this task's finished block, as above.
                    f(at, unsafe {
                        std::slice::from_raw_parts_mut(out_ptr.0.add(at), width)
                    });
                }
            }
        })
    };
    let tasks = p.batch * groups * pixel_blocks * channel_blocks;
    if threads == 1 {
        (0..tasks).try_for_each(task)
    } else {
        (0..tasks).into_par_iter().try_for_each(task)
    }
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
            c(1, 12, 18, (9, 11), (1, 1), (2, 2), (0, 0, 0, 0), 1, 1),
            c(2, 16, 8, (8, 8), (1, 1), (3, 1), (0, 0, 0, 0), 1, 2),
            c(1, 8, 12, (6, 5), (1, 1), (1, 1), (1, 0, 2, 1), 1, 4),
            c(1, 3, 16, (23, 21), (3, 3), (2, 2), (1, 1, 1, 1), 1, 1),
            c(2, 3, 10, (30, 30), (7, 7), (2, 2), (3, 3, 3, 3), 1, 1),
            c(1, 20, 30, (14, 15), (3, 3), (1, 1), (1, 1, 1, 1), 1, 1),
            c(1, 16, 8, (9, 10), (3, 2), (1, 2), (0, 2, 1, 0), 2, 2),
            c(1, 4, 6, (3, 3), (3, 3), (1, 1), (4, 4, 4, 4), 1, 1),
            c(1, 40, 24, (30, 20), (5, 5), (2, 3), (2, 2, 2, 2), 1, 1),
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
                let mut got = vec![f32::NAN; p.output_len()];
                // The epilogue adds a residual (the output's index) and applies ReLU.
                want.iter_mut()
                    .enumerate()
                    .for_each(|(i, v)| *v = (*v - 1.0 + i as f32 * 1e-3).max(0.0));
                let relu = |at: usize, s: &mut [f32]| {
                    for (i, v) in s.iter_mut().enumerate() {
                        *v = (*v + (at + i) as f32 * 1e-3).max(0.0);
                    }
                };
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
