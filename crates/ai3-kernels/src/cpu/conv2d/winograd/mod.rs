//! Winograd F(2x2, 3x3) convolution (Lavin & Gray, 2016).
//!
//! Every 2x2 output tile comes from a 4x4 input tile: `Y = Aᵀ [(G g Gᵀ) ⊙
//! (Bᵀ d B)] A`. Summed over input channels, the elementwise product becomes,
//! for each of the 16 transform positions, a GEMM `(ocg x icg) @ (icg x
//! tiles)`, which is where the time goes. The filter transform `G g Gᵀ` is done
//! once by [`transform_filter`] when a model is built.
//!
//! Tiles are processed in blocks of whole tile rows (taken across the images
//! of the batch, so small images still give the GEMMs wide operands), one
//! block per task; a block's transformed input is laid out `[16, icg, tiles]`
//! and its products `[16, ocg, tiles]`, so the GEMMs see plain row-major
//! matrices and the transforms run along contiguous rows of tiles.
//!
//! Only 3x3 kernels with stride 1 and dilation 1 qualify ([`check`]); any
//! padding and any groups are fine.
//!
//! f32 layers without groups on a CPU with AVX2 and FMA run the same
//! algorithm on channel blocks instead ([`blocked`], chosen by
//! [`runs_blocked`]; [`prepare`] and [`conv2d_prepared`] pick the weights
//! and the kernel): 1.1-1.4x faster with NCHW input and output, 1.3-1.6x in
//! the blocked layout. This module's kernel is the one for f64, grouped
//! layers and CPUs without AVX2.

use rayon::prelude::*;

use super::{with_scratch, SharedMut, WORKSPACE_ELEMENTS};
use crate::alloc::{check_len, checked_product, try_zeroed_vec, KernelError, KernelResult};
use crate::cpu::matmul::{matmul, MatPtr};
use crate::params::Conv2dParams;
use crate::Float;

pub mod blocked;
mod transform;

use transform::{deinterleave, filter_tile, input_row, output_row};

/// Number of transform positions in a 4x4 tile.
const POSITIONS: usize = 16;

/// Tiles a block aims for: enough columns for the GEMMs to run at full speed
/// while a block's transformed input and products stay near the L2 cache.
const BLOCK_TILES: usize = 256;

/// Fewest tiles a block split off for another thread may have; below it the
/// threads share each block's GEMMs instead (see [`Plan::new`]).
const MIN_SPLIT_TILES: usize = 64;

/// Whether Winograd F(2x2, 3x3) can run `p`; the error names the unmet constraint.
///
/// ```
/// use ai3_kernels::cpu::conv2d::winograd;
/// use ai3_kernels::params::{Conv2dParams, Padding2d};
/// let p = Conv2dParams {
///     batch: 1, in_channels: 1, in_h: 8, in_w: 8, out_channels: 1,
///     kernel_h: 5, kernel_w: 5, stride: (1, 1), padding: Padding2d::default(),
///     dilation: (1, 1), groups: 1,
/// };
/// assert_eq!(winograd::check(&p).unwrap_err(), "winograd needs a 3x3 kernel, got 5x5");
/// ```
pub fn check(p: &Conv2dParams) -> Result<(), String> {
    if (p.kernel_h, p.kernel_w) != (3, 3) {
        return Err(format!(
            "winograd needs a 3x3 kernel, got {}x{}",
            p.kernel_h, p.kernel_w
        ));
    }
    if p.stride != (1, 1) {
        return Err(format!("winograd needs stride 1, got {:?}", p.stride));
    }
    if p.dilation != (1, 1) {
        return Err(format!("winograd needs dilation 1, got {:?}", p.dilation));
    }
    Ok(())
}

/// Length of the transformed filter [`transform_filter`] returns.
pub fn transformed_filter_len(p: &Conv2dParams) -> KernelResult<usize> {
    checked_product(
        "Winograd-transformed filter",
        &[POSITIONS, p.out_channels, p.in_channels_per_group()],
    )
}

/// [`check`] as a kernel error: running Winograd on a problem it cannot
/// take is a bug in the caller, which resolves algorithms through [`check`].
fn require(p: &Conv2dParams) -> KernelResult<()> {
    check(p).map_err(|_| KernelError::Precondition {
        what: "winograd F(2x2, 3x3) needs a 3x3 kernel, stride 1 and dilation 1",
    })
}

/// Transforms a `[out_channels, in_channels / groups, 3, 3]` weight into
/// `U = G g Gᵀ`, laid out `[groups, 16, ocg, icg]`: for each group and
/// transform position a row-major `ocg x icg` matrix, the left-hand side of
/// that position's GEMM.
///
/// Call it once when the model is built; `p` must pass [`check`].
pub fn transform_filter<T: Float>(p: &Conv2dParams, weight: &[T]) -> KernelResult<Vec<T>> {
    let mut u = try_zeroed_vec(transformed_filter_len(p)?, "Winograd-transformed filter")?;
    transform_filter_into(p, weight, &mut u)?;
    Ok(u)
}

/// [`transform_filter`] into `u` (of [`transformed_filter_len`] elements), so
/// the caller chooses where the transformed filter lives.
pub fn transform_filter_into<T: Float>(
    p: &Conv2dParams,
    weight: &[T],
    u: &mut [T],
) -> KernelResult<()> {
    require(p)?;
    p.check_sizes()?;
    check_len("conv2d weight", weight.len(), p.weight_len())?;
    check_len(
        "Winograd-transformed filter",
        u.len(),
        transformed_filter_len(p)?,
    )?;
    let icg = p.in_channels_per_group();
    let ocg = p.out_channels_per_group();
    let dst = SharedMut(u.as_mut_ptr());
    // One task per output channel; it writes row `o` of each of the 16
    // matrices, a few dozen input channels at a time, so the 16 write streams
    // (a matrix apart, which would alias in the caches one element at a time)
    // advance in runs of whole cache lines.
    (0..p.out_channels).into_par_iter().for_each(|o| {
        let dst = &dst;
        let (g, oo) = (o / ocg, o % ocg);
        let mut tiles = [[T::zero(); POSITIONS]; FILTER_RUN];
        for c0 in (0..icg).step_by(FILTER_RUN) {
            let n = FILTER_RUN.min(icg - c0);
            for (j, t) in tiles[..n].iter_mut().enumerate() {
                *t = filter_tile(&weight[(o * icg + c0 + j) * 9..][..9]);
            }
            for xi in 0..POSITIONS {
                // SAFETY: row `oo` of matrix (g, xi) is written by task `o` only,
                // and [c0, c0 + n) lies inside its icg elements.
                let row = unsafe {
                    std::slice::from_raw_parts_mut(
                        dst.0.add(((g * POSITIONS + xi) * ocg + oo) * icg + c0),
                        n,
                    )
                };
                for (d, t) in row.iter_mut().zip(&tiles[..n]) {
                    *d = t[xi];
                }
            }
        }
    });
    Ok(())
}

/// Whether `T` layers of `p` run on the channel-blocked kernel
/// ([`blocked`], which measured 1.1-1.4x faster than the NCHW one even with
/// NCHW input and output): f32, one group, AVX2 and FMA.
pub fn runs_blocked<T: Float>(p: &Conv2dParams) -> bool {
    std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() && blocked::applies(p)
}

/// How many forms of prepared weights there are ([`form`]).
pub const FORMS: usize = 2;

/// Which form of weights [`prepare`] writes for `T` layers of `p`: 0 for
/// F(2x2, 3x3) (either kernel), 1 for the blocked kernel's F(4x4, 3x3)
/// ([`blocked::edge`]). It follows the input size, so a caller that keeps
/// prepared weights for calls of several sizes keeps one per form.
pub fn form<T: Float>(p: &Conv2dParams) -> usize {
    usize::from(runs_blocked::<T>(p) && blocked::edge(p) == 4)
}

/// Length of the weights [`prepare`] writes for `T` layers of `p`.
pub fn prepared_len<T: Float>(p: &Conv2dParams) -> KernelResult<usize> {
    if runs_blocked::<T>(p) {
        blocked::packed_len(p)
    } else {
        transformed_filter_len(p)
    }
}

/// The weights (and bias) [`conv2d_prepared`] reads for `T` layers of `p`,
/// into `dst` of [`prepared_len`] elements: [`blocked::pack`]'s, or the
/// transformed filter of [`transform_filter_into`] (the bias then stays
/// apart). Depends only on the weight's geometry.
pub fn prepare<T: Float>(
    p: &Conv2dParams,
    weight: &[T],
    bias: Option<&[T]>,
    dst: &mut [T],
) -> KernelResult<()> {
    use crate::float::{as_f32, as_f32_mut};
    if runs_blocked::<T>(p) {
        if let (Some(w), Some(d)) = (as_f32(weight), as_f32_mut(dst)) {
            return blocked::pack(p, w, bias.and_then(as_f32), d);
        }
    }
    transform_filter_into(p, weight, dst)
}

/// NCHW Winograd convolution with weights from [`prepare`]; `bias` is the
/// layer's (the blocked kernel has it packed). Returns whether `epilogue`
/// was applied (by the blocked kernel, to each finished output row); the
/// NCHW kernel leaves it to the caller.
pub fn conv2d_prepared<T: Float>(
    p: &Conv2dParams,
    input: &[T],
    prepared: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
    epilogue: Option<super::Epilogue<T>>,
) -> KernelResult<bool> {
    #[cfg(target_arch = "x86_64")]
    if runs_blocked::<T>(p) {
        let run = |x: &[f32],
                   w: &[f32],
                   _: Option<&[f32]>,
                   out: &mut [f32],
                   e: Option<super::Epilogue<f32>>| {
            blocked::conv2d(p, false, x, w, out, e)
        };
        if let Some(done) = super::with_f32(input, prepared, None, output, epilogue, run) {
            return done.map(|()| true);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = epilogue;
    conv2d(p, input, prepared, bias, output).map(|()| false)
}

/// Input channels [`transform_filter`] transforms before writing them out.
const FILTER_RUN: usize = 64;

/// Distance in elements between consecutive transform positions' matrices:
/// `len` rounded up to whole 4 KiB pages plus one cache line, so the 16
/// streams the transforms read or write at once fall in different cache sets
/// instead of all aliasing one.
fn plane_stride<T>(len: usize) -> usize {
    let page = 4096 / std::mem::size_of::<T>();
    len.next_multiple_of(page) + 64 / std::mem::size_of::<T>()
}

/// How the tiles of one group are cut into blocks.
#[derive(Clone, Copy, Debug)]
struct Plan {
    tiles_w: usize,
    tiles_h: usize,
    /// Tile rows (over all images) per block.
    rows_per_block: usize,
    row_blocks: usize,
    /// Tile columns per block: all of them unless one row is too wide.
    cols_per_block: usize,
    col_blocks: usize,
}

impl Plan {
    /// The plan for F(2x2, 3x3).
    fn new(p: &Conv2dParams, threads: usize) -> Self {
        Self::for_edge(p, threads, 2)
    }

    /// The plan for output tiles of `edge x edge` pixels (input tiles of
    /// `edge + 2`).
    fn for_edge(p: &Conv2dParams, threads: usize, edge: usize) -> Self {
        let tiles_w = p.out_w().div_ceil(edge);
        let tiles_h = p.out_h().div_ceil(edge);
        let rows = p.batch * tiles_h;
        let positions = (edge + 2) * (edge + 2);
        let per_tile = positions * (p.in_channels_per_group() + p.out_channels_per_group());
        let target = BLOCK_TILES
            .min(WORKSPACE_ELEMENTS / threads / per_tile)
            .max(1);
        let (mut rows_per_block, cols_per_block) = if tiles_w <= target {
            ((target / tiles_w).max(1), tiles_w)
        } else {
            (1, tiles_w.div_ceil(tiles_w.div_ceil(target)))
        };
        let col_blocks = tiles_w.div_ceil(cols_per_block);
        // Give every thread at least one block when the rows allow it and the
        // blocks stay wide enough for their GEMMs. Otherwise the blocks run in
        // turn with their 16 GEMMs shared among the threads, so that each
        // transformed weight is read by one thread only: with few tiles the
        // GEMMs are bound by reading the weights.
        let want = threads.div_ceil(p.groups * col_blocks);
        if rows.div_ceil(rows_per_block) < want {
            let split = rows.div_ceil(want).max(1);
            if split * cols_per_block >= MIN_SPLIT_TILES {
                rows_per_block = split;
            }
        } else if p.groups * col_blocks == 1 && threads > 1 {
            // As many row blocks as a multiple of the threads, of even
            // height, so no thread is left with a short last block: 28 tile
            // rows of 28 (ResNet-50's 56x56 layers at batch 1) in blocks of
            // 9 gave 2 threads 18 and 10 rows, in blocks of 7 14 each.
            let blocks = rows.div_ceil(rows_per_block).next_multiple_of(threads);
            rows_per_block = rows.div_ceil(blocks.min(rows));
        }
        Self {
            tiles_w,
            tiles_h,
            rows_per_block,
            row_blocks: rows.div_ceil(rows_per_block),
            cols_per_block,
            col_blocks,
        }
    }
}

/// Winograd F(2x2, 3x3) 2-D convolution with a weight from [`transform_filter`]
/// (see the [module contract](super)); `p` must pass [`check`].
///
/// Tiles on the right and bottom edges that stick out of the output are
/// computed on zero-extended input and clipped when written.
///
/// Fails, before writing anything, when `p` does not pass [`check`] or a
/// buffer has the wrong length; a refused allocation of a block's scratch
/// fails the call (some of the output may then have been written).
pub fn conv2d<T: Float>(
    p: &Conv2dParams,
    input: &[T],
    transformed_filter: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
) -> KernelResult<()> {
    require(p)?;
    p.check_buffers(input.len(), bias.map(<[T]>::len), output.len())?;
    check_len(
        "Winograd-transformed filter",
        transformed_filter.len(),
        transformed_filter_len(p)?,
    )?;
    if output.is_empty() {
        return Ok(());
    }
    let threads = super::threads_for(p);
    let plan = Plan::new(p, threads);
    let blocks = plan.row_blocks * plan.col_blocks;
    let tasks = p.groups * blocks;
    let out = SharedMut(output.as_mut_ptr());
    let parallel = threads > 1 && tasks >= threads;
    // Blocks in turn share their GEMMs among the threads.
    let share_gemms = !parallel && threads > 1;
    let run = |task: usize| {
        let (g, b) = (task / blocks, task % blocks);
        let (rb, cb) = (b / plan.col_blocks, b % plan.col_blocks);
        let rows_total = p.batch * plan.tiles_h;
        let r0 = rb * plan.rows_per_block;
        let r1 = (r0 + plan.rows_per_block).min(rows_total);
        let c0 = cb * plan.cols_per_block;
        let c1 = (c0 + plan.cols_per_block).min(plan.tiles_w);
        // SAFETY: blocks cover disjoint (group, tile row, tile column) ranges,
        // so their output elements are disjoint.
        unsafe {
            block(
                p,
                &plan,
                input,
                transformed_filter,
                bias,
                g,
                (r0, r1),
                (c0, c1),
                out,
                share_gemms,
            )
        }
    };
    if parallel {
        (0..tasks).into_par_iter().with_max_len(1).try_for_each(run)
    } else {
        (0..tasks).try_for_each(run)
    }
}

/// Convolves group `g` over tile rows `rows` and tile columns `cols`.
///
/// # Safety
/// `out` must point to the whole output, and no other thread may touch the
/// output elements this block writes.
#[allow(clippy::too_many_arguments)]
unsafe fn block<T: Float>(
    p: &Conv2dParams,
    plan: &Plan,
    input: &[T],
    u: &[T],
    bias: Option<&[T]>,
    g: usize,
    rows: (usize, usize),
    cols: (usize, usize),
    out: SharedMut<T>,
    share_gemms: bool,
) -> KernelResult<()> {
    let icg = p.in_channels_per_group();
    let ocg = p.out_channels_per_group();
    let tw = cols.1 - cols.0;
    let nt = (rows.1 - rows.0) * tw;
    let u_g = &u[g * POSITIONS * ocg * icg..][..POSITIONS * ocg * icg];
    let v_stride = plane_stride::<T>(icg * nt);
    let m_stride = plane_stride::<T>(ocg * nt);
    let v_len = POSITIONS * v_stride;
    let m_len = POSITIONS * m_stride;
    let eo_len = 8 * (tw + 1);
    // Threads that share a block's GEMMs share its transforms too, by
    // channel ranges, each input range with tile-row buffers of its own.
    let parts = if share_gemms {
        2 * rayon::current_num_threads()
    } else {
        1
    };
    let (in_per, out_per) = (icg.div_ceil(parts).max(1), ocg.div_ceil(parts).max(1));
    let in_parts = icg.div_ceil(in_per);
    with_scratch::<T, _>(v_len + m_len + in_parts * eo_len, |buf| {
        let (v, rest) = buf.split_at_mut(v_len);
        let (m, eo) = rest.split_at_mut(m_len);
        let v_out = SharedMut(v.as_mut_ptr());
        let transform_in = |(i, eo): (usize, &mut [T])| {
            let (ebuf, obuf) = eo.split_at_mut(4 * (tw + 1));
            // SAFETY: v holds 16 planes of v_stride >= icg * nt elements;
            // channels of range i are written by this call only.
            unsafe {
                input_transform(
                    p,
                    plan,
                    input,
                    g,
                    rows,
                    cols,
                    (i * in_per, ((i + 1) * in_per).min(icg)),
                    v_out,
                    v_stride,
                    ebuf,
                    obuf,
                )
            }
        };
        if share_gemms {
            eo.par_chunks_mut(eo_len).enumerate().for_each(transform_in);
        } else {
            eo.chunks_mut(eo_len).enumerate().for_each(transform_in);
        }
        let v = &*v;
        let m_out = SharedMut(m.as_mut_ptr());
        let gemm = |xi: usize| {
            let lhs = MatPtr {
                ptr: u_g[xi * ocg * icg..].as_ptr(),
                rs: icg,
                cs: 1,
            };
            let rhs = MatPtr {
                ptr: v[xi * v_stride..].as_ptr(),
                rs: nt,
                cs: 1,
            };
            let m_out = &m_out;
            // SAFETY: u_g holds 16 ocg x icg matrices, v 16 icg x nt and m
            // 16 ocg x nt, each position's matrix written by its GEMM only;
            // the three are distinct buffers.
            unsafe {
                matmul(
                    ocg,
                    nt,
                    icg,
                    m_out.0.add(xi * m_stride),
                    nt,
                    false,
                    lhs,
                    rhs,
                    ::gemm::Parallelism::None,
                )
            };
        };
        if share_gemms {
            (0..POSITIONS).into_par_iter().for_each(gemm);
        } else {
            (0..POSITIONS).for_each(gemm);
        }

        let m = &*m;
        // SAFETY: forwarded from the caller; the output channels of range i
        // of the block are written by this call only.
        let transform_out = |i: usize| unsafe {
            let chans = (i * out_per, ((i + 1) * out_per).min(ocg));
            output_transform(p, plan, m, bias, g, rows, cols, chans, out)
        };
        let out_parts = ocg.div_ceil(out_per);
        if share_gemms {
            (0..out_parts).into_par_iter().for_each(transform_out);
        } else {
            (0..out_parts).for_each(transform_out);
        }
    })
}

use crate::isa::multiversion;

multiversion! {
    /// Writes `Bᵀ d B` of input channels `chans` of the block's tiles into
    /// `v` (`[16, icg, tiles]`, position planes `v_stride` apart).
    ///
    /// # Safety
    /// `v` holds 16 planes of `v_stride >= icg * tiles` elements, and no
    /// other thread touches channels `chans` of them meanwhile.
    unsafe fn input_transform<T>(
        p: &Conv2dParams,
        plan: &Plan,
        input: &[T],
        g: usize,
        rows: (usize, usize),
        cols: (usize, usize),
        chans: (usize, usize),
        v: SharedMut<T>,
        v_stride: usize,
        ebuf: &mut [T],
        obuf: &mut [T],
    ) => input_transform_impl
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn input_transform_impl<T: Float>(
    p: &Conv2dParams,
    plan: &Plan,
    input: &[T],
    g: usize,
    rows: (usize, usize),
    cols: (usize, usize),
    chans: (usize, usize),
    v: SharedMut<T>,
    v_stride: usize,
    ebuf: &mut [T],
    obuf: &mut [T],
) {
    let icg = p.in_channels_per_group();
    let plane_in = p.in_h * p.in_w;
    let tw = cols.1 - cols.0;
    let nt = (rows.1 - rows.0) * tw;
    // Input transform, one (channel, tile row) at a time.
    let x_start = (2 * cols.0) as isize - p.padding.left as isize;
    for c in chans.0..chans.1 {
        for (ri, r) in (rows.0..rows.1).enumerate() {
            let (n, ty) = (r / plan.tiles_h, r % plan.tiles_h);
            let plane = &input[(n * p.in_channels + g * icg + c) * plane_in..][..plane_in];
            for (i, (e, o)) in ebuf
                .chunks_exact_mut(tw + 1)
                .zip(obuf.chunks_exact_mut(tw + 1))
                .enumerate()
            {
                let y = (2 * ty + i) as isize - p.padding.top as isize;
                let row = (y >= 0 && y < p.in_h as isize)
                    .then(|| &plane[y as usize * p.in_w..][..p.in_w]);
                deinterleave(row, x_start, e, o);
            }
            // SAFETY: the caller's v holds 16 planes of v_stride >= icg * nt
            // elements, and channel c of each is this call's alone.
            let mut vs: [&mut [T]; POSITIONS] = std::array::from_fn(|xi| unsafe {
                std::slice::from_raw_parts_mut(v.0.add(xi * v_stride + c * nt + ri * tw), tw)
            });
            let e: [&[T]; 4] = std::array::from_fn(|i| &ebuf[i * (tw + 1)..][..tw + 1]);
            let o: [&[T]; 4] = std::array::from_fn(|i| &obuf[i * (tw + 1)..][..tw + 1]);
            input_row(e, o, &mut vs, tw);
        }
    }
}

multiversion! {
    /// Writes `Aᵀ m A` plus bias of output channels `chans` of the block's
    /// tiles (`m` is `[16, ocg, tiles]`) into the output.
    ///
    /// # Safety
    /// As for [`block`].
    unsafe fn output_transform<T>(
        p: &Conv2dParams,
        plan: &Plan,
        m: &[T],
        bias: Option<&[T]>,
        g: usize,
        rows: (usize, usize),
        cols: (usize, usize),
        chans: (usize, usize),
        out: SharedMut<T>,
    ) => output_transform_impl
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn output_transform_impl<T: Float>(
    p: &Conv2dParams,
    plan: &Plan,
    m: &[T],
    bias: Option<&[T]>,
    g: usize,
    rows: (usize, usize),
    cols: (usize, usize),
    chans: (usize, usize),
    out: SharedMut<T>,
) {
    let ocg = p.out_channels_per_group();
    let (oh, ow) = (p.out_h(), p.out_w());
    let tw = cols.1 - cols.0;
    let nt = (rows.1 - rows.0) * tw;
    let m_stride = m.len() / POSITIONS;
    // Output transform, one (output channel, tile row) at a time.
    let x0 = 2 * cols.0;
    let width = (2 * cols.1).min(ow) - x0;
    for oc in chans.0..chans.1 {
        let b = bias.map_or(T::zero(), |b| b[g * ocg + oc]);
        for (ri, r) in (rows.0..rows.1).enumerate() {
            let (n, ty) = (r / plan.tiles_h, r % plan.tiles_h);
            let plane = (n * p.out_channels + g * ocg + oc) * oh * ow;
            let ms: [&[T]; POSITIONS] =
                std::array::from_fn(|xi| &m[xi * m_stride + oc * nt + ri * tw..][..tw]);
            let y = 2 * ty;
            // SAFETY: rows y and y + 1 (when inside the output), columns
            // x0 .. x0 + width of this plane belong to this block alone.
            let row0 =
                unsafe { std::slice::from_raw_parts_mut(out.0.add(plane + y * ow + x0), width) };
            let row1 = (y + 1 < oh).then(|| unsafe {
                std::slice::from_raw_parts_mut(out.0.add(plane + (y + 1) * ow + x0), width)
            });
            output_row(&ms, tw, b, row0, row1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::test_util::{assert_close, cast, reference_conv, Rng};
    use crate::params::Padding2d;

    pub(super) fn params(
        batch: usize,
        ic: usize,
        oc: usize,
        groups: usize,
        hw: (usize, usize),
        padding: Padding2d,
    ) -> Conv2dParams {
        Conv2dParams {
            batch,
            in_channels: ic,
            in_h: hw.0,
            in_w: hw.1,
            out_channels: oc,
            kernel_h: 3,
            kernel_w: 3,
            stride: (1, 1),
            padding,
            dilation: (1, 1),
            groups,
        }
    }

    #[test]
    fn winograd_matches_reference() {
        check_grid();
    }

    #[test]
    fn winograd_matches_reference_on_two_threads() {
        crate::cpu::test_util::on_two_threads(check_grid);
    }

    /// Many tile rows in one column block: as many row blocks as a multiple
    /// of the threads, of even height, and the result still exact.
    #[test]
    fn row_blocks_balance_the_threads() {
        let p = params(2, 4, 5, 1, (200, 6), Padding2d::symmetric(1, 1));
        let plan = Plan::new(&p, 2);
        assert_eq!((plan.col_blocks, plan.row_blocks % 2), (1, 0));
        let rows = p.batch * plan.tiles_h;
        assert!(plan.row_blocks * plan.rows_per_block - rows < plan.rows_per_block);
        crate::cpu::test_util::on_two_threads(|| {
            let mut rng = Rng::new(12);
            let (input, weight) = (rng.vec(p.input_len()), rng.vec(p.weight_len()));
            let want = reference_conv(&p, &input, &weight, None);
            let u = transform_filter(&p, &weight).unwrap();
            let mut out = vec![f64::NAN; p.output_len()];
            conv2d(&p, &input, &u, None, &mut out).unwrap();
            assert_close(&out, &want, 1e-10, "winograd, balanced row blocks");
        });
    }

    /// None, symmetric, and asymmetric padding larger on one side.
    pub(super) fn paddings() -> [Padding2d; 3] {
        [
            Padding2d::default(),
            Padding2d::symmetric(1, 1),
            Padding2d {
                top: 2,
                bottom: 0,
                left: 1,
                right: 3,
            },
        ]
    }

    fn check_grid() {
        let mut rng = Rng::new(11);
        let paddings = paddings();
        // Odd and even output sizes, so partial edge tiles are covered.
        let sizes = [(3, 3), (5, 4), (7, 9), (8, 11), (10, 6)];
        let channels = [(3, 4, 1), (4, 6, 2), (4, 4, 4), (1, 1, 1)];
        for &padding in &paddings {
            for &hw in &sizes {
                for &(ic, oc, groups) in &channels {
                    for batch in [1, 3] {
                        let p = params(batch, ic, oc, groups, hw, padding);
                        assert!(check(&p).is_ok());
                        let input = rng.vec(p.input_len());
                        let weight = rng.vec(p.weight_len());
                        let bias_v = rng.vec(p.out_channels);
                        for bias in [None, Some(bias_v.as_slice())] {
                            let want = reference_conv(&p, &input, &weight, bias);
                            let what = format!("winograd {p:?} bias={}", bias.is_some());

                            let u = transform_filter(&p, &weight).unwrap();
                            let mut out = vec![f64::NAN; p.output_len()];
                            conv2d(&p, &input, &u, bias, &mut out).unwrap();
                            assert_close(&out, &want, 1e-10, &what);

                            let u32 = transform_filter(&p, &cast::<f32>(&weight)).unwrap();
                            let b32 = bias.map(cast::<f32>);
                            let mut out32 = vec![f32::NAN; p.output_len()];
                            conv2d(&p, &cast::<f32>(&input), &u32, b32.as_deref(), &mut out32)
                                .unwrap();
                            assert_close(&out32, &want, 1e-4, &what);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn winograd_blocks_large_images() {
        // 500 x 301 tiles exceed the workspace bound's tile block for these
        // channels, so several blocks (the last one partial) are exercised.
        let p = params(1, 2, 3, 1, (1000, 601), Padding2d::symmetric(1, 1));
        let mut rng = Rng::new(5);
        let input = rng.vec(p.input_len());
        let weight = rng.vec(p.weight_len());
        let want = reference_conv(&p, &input, &weight, None);
        let u = transform_filter(&p, &cast::<f32>(&weight)).unwrap();
        let mut out = vec![f32::NAN; p.output_len()];
        conv2d(&p, &cast::<f32>(&input), &u, None, &mut out).unwrap();
        assert_close(&out, &want, 1e-4, "winograd blocked");
    }

    #[test]
    fn wrong_lengths_and_unfit_problems_are_errors_before_any_write() {
        // Through the transform, so the plain weight's length is checked too.
        fn plain(
            p: &Conv2dParams,
            i: &[f32],
            w: &[f32],
            b: Option<&[f32]>,
            o: &mut [f32],
        ) -> KernelResult<()> {
            conv2d(p, i, &transform_filter(p, w)?, b, o)
        }
        crate::cpu::test_util::check_conv_lengths(plain);
        let p = crate::cpu::test_util::small_problem();
        let u = transform_filter(&p, &vec![1.0f32; p.weight_len()]).unwrap();
        let i = vec![1.0f32; p.input_len()];
        let mut out = vec![f32::NAN; p.output_len()];
        let short = conv2d(&p, &i, &u[1..], None, &mut out);
        assert!(
            matches!(short, Err(KernelError::Length { .. })),
            "{short:?}"
        );
        let strided = Conv2dParams {
            stride: (2, 2),
            ..p
        };
        let mut out2 = vec![f32::NAN; strided.output_len()];
        let unfit = conv2d(&strided, &i, &u, None, &mut out2);
        assert!(
            matches!(unfit, Err(KernelError::Precondition { .. })),
            "{unfit:?}"
        );
        assert!(out.iter().chain(&out2).all(|v| v.is_nan()));
    }

    #[test]
    fn check_names_the_unmet_constraint() {
        let ok = params(1, 2, 2, 1, (6, 6), Padding2d::default());
        assert_eq!(check(&ok), Ok(()));
        let k = Conv2dParams {
            kernel_h: 5,
            kernel_w: 5,
            ..ok
        };
        assert_eq!(
            check(&k),
            Err("winograd needs a 3x3 kernel, got 5x5".to_string())
        );
        let k = Conv2dParams {
            kernel_h: 3,
            kernel_w: 1,
            ..ok
        };
        assert_eq!(
            check(&k),
            Err("winograd needs a 3x3 kernel, got 3x1".to_string())
        );
        let s = Conv2dParams {
            stride: (2, 1),
            ..ok
        };
        assert_eq!(
            check(&s),
            Err("winograd needs stride 1, got (2, 1)".to_string())
        );
        let d = Conv2dParams {
            dilation: (2, 2),
            ..ok
        };
        assert_eq!(
            check(&d),
            Err("winograd needs dilation 1, got (2, 2)".to_string())
        );
    }
}
