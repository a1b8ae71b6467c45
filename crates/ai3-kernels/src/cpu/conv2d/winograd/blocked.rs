//! Winograd F(2x2, 3x3) and F(4x4, 3x3) in the channel-blocked layout
//! (NCHW8c, see [`crate::cpu::blocked`]), for f32 on AVX2 and FMA. Layers
//! with enough tiles take the larger ones ([`edge`]); below, the 2x2 case
//! is described (4x4 output tiles read 6x6 input tiles, with 36 positions).
//!
//! The same algorithm as the NCHW kernel ([`super::conv2d`]), with the
//! vectors running over 8 channels instead of a row of tiles: the input
//! transform reads a tile's 4x4 pixels of one channel block as 16 vectors
//! and stores its 16 transform positions the same way, so the transformed
//! input of a block of tiles is, per position, a blocked "image" whose
//! pixels are the tiles (`[16][in block][tile][8]`). Each position's
//! product over the input channels is then a 1x1 convolution of that image,
//! which the blocked convolutions' register tile computes (as in
//! [`crate::cpu::blocked::pointwise`]; wider with AVX-512), into
//! `[16][out block][tile][8]`;
//! the output transform turns each tile's 16 vectors into its 2x2 output
//! pixels, adds the bias and stores them as blocked pixels, and the fused
//! epilogue (a residual, an activation) runs on each finished output row.
//! No reorder at either end, every lane useful at any plane size.
//!
//! Tiles are cut into blocks as the NCHW kernel cuts them (its `Plan`):
//! a block per task when there are enough for the threads, else the blocks
//! in turn with each phase shared among the threads (input transform by
//! channel blocks, products by position and group of output blocks, output
//! transform by output blocks).
//!
//! Weights are packed once ([`pack`]): the transformed filter `G g Gᵀ` as
//! `[position][out block][in channel (padded to blocks)][8 output lanes]`,
//! then the bias padded to blocks. The padding lanes get zero weights and
//! bias, so padding lanes in come to nothing and padding lanes out are zero.

// Elsewhere than x86-64 only the packing is used.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_imports))]

use rayon::prelude::*;

use super::transform::{filter_tile, filter_tile4};
use super::{plane_stride, require, Plan};
use crate::alloc::{check_len, checked_product, KernelError, KernelResult};
use crate::cpu::blocked::{check_conv_buffers, BLOCK as CB};
use crate::cpu::conv2d::{threads_for, Epilogue, SharedMut};
use crate::cpu::scratch::with_scratch_named;
use crate::params::Conv2dParams;

/// Whether this kernel takes `p`: what Winograd takes ([`super::check`]),
/// one group, on a CPU with the blocked kernels (the caller checks that the
/// elements are f32).
pub fn applies(p: &Conv2dParams) -> bool {
    super::check(p).is_ok() && p.groups == 1 && crate::cpu::blocked::available()
}

fn blocks(c: usize) -> usize {
    c.div_ceil(CB)
}

/// Edge of the output tiles this kernel computes `p` in: 4, F(4x4, 3x3),
/// for layers with at least 16 such tiles over the batch (a 13x13 plane),
/// else 2, F(2x2, 3x3).
///
/// F(4x4, 3x3) multiplies 36 transform positions per 16 output pixels
/// against F(2x2, 3x3)'s 64, with transforms costing about the same per
/// pixel; but its transformed weights are 36/16 as large and each is read
/// once per block of tiles, so layers with few tiles keep 2x2 ones.
/// Measured in the networks (2 threads, AVX2, ms summed over the layers of
/// one shape, F(4x4) against F(2x2)): batch 1, ResNet-50's 64 at 56x56 1.53
/// against 2.67, 128 at 28x28 1.51 against 3.16, 256 at 14x14 3.78 against
/// 4.85, but 512 at 7x7 (4 tiles) 2.94 against 2.77; DenseNet's 128 -> 32
/// at 56/28/14/7 3.39/1.76/1.59/0.70 against 5.03/2.45/1.68/0.55;
/// SqueezeNet's 16 -> 64 at 55x55 0.32 against 0.46, 64 -> 256 at 13x13
/// 0.40 against 0.43; GoogLeNet's 7x7 layers 0.42-0.56 against 0.28-0.41.
/// Batch 10: ResNet-50's 7x7 layers (40 tiles) 12.0 against 18.3, the
/// others 0.67-0.82x; DenseNet's 0.65-0.72x.
pub fn edge(p: &Conv2dParams) -> usize {
    let tiles = p.batch * p.out_h().div_ceil(4) * p.out_w().div_ceil(4);
    if tiles >= LARGE_TILE_MIN_TILES {
        4
    } else {
        2
    }
}

/// Fewest 4x4 output tiles (over the batch) for F(4x4, 3x3) ([`edge`]): a
/// 13x13 or 14x14 plane has 16, a 7x7 one 4.
const LARGE_TILE_MIN_TILES: usize = 16;

/// Transform positions of tiles with output edge `edge`.
fn positions(edge: usize) -> usize {
    (edge + 2) * (edge + 2)
}

/// Elements of the packed transformed weights and bias ([`pack`]).
pub fn packed_len(p: &Conv2dParams) -> KernelResult<usize> {
    packed_len_for(p, edge(p))
}

/// [`packed_len`] for output tiles of `edge` pixels.
fn packed_len_for(p: &Conv2dParams, edge: usize) -> KernelResult<usize> {
    let w = checked_product(
        "packed blocked Winograd weights",
        &[
            positions(edge),
            blocks(p.out_channels),
            blocks(p.in_channels),
            CB,
            CB,
        ],
    )?;
    w.checked_add(blocks(p.out_channels) * CB)
        .ok_or(KernelError::Overflow {
            what: "packed blocked Winograd weights",
        })
}

/// Transforms `weight` (`[out][in][3][3]`, one group) and packs it with
/// `bias` for [`conv2d`] (see the module docs), for the tiles [`edge`]
/// gives; lanes past the channel counts are zero.
pub fn pack(
    p: &Conv2dParams,
    weight: &[f32],
    bias: Option<&[f32]>,
    packed: &mut [f32],
) -> KernelResult<()> {
    pack_for(p, edge(p), weight, bias, packed)
}

/// [`pack`] for output tiles of `edge` (2 or 4) pixels.
fn pack_for(
    p: &Conv2dParams,
    edge: usize,
    weight: &[f32],
    bias: Option<&[f32]>,
    packed: &mut [f32],
) -> KernelResult<()> {
    require(p)?;
    p.check_sizes()?;
    if p.groups != 1 {
        return Err(KernelError::Precondition {
            what: "the blocked Winograd convolution needs one group",
        });
    }
    p.check_weights(weight.len(), bias.map(<[f32]>::len))?;
    check_len(
        "packed blocked Winograd weights",
        packed.len(),
        packed_len_for(p, edge)?,
    )?;
    packed.fill(0.0);
    let (ic, ocb) = (p.in_channels, blocks(p.out_channels));
    let icp = blocks(ic) * CB;
    let (w, b) = packed.split_at_mut(positions(edge) * ocb * icp * CB);
    for o in 0..p.out_channels {
        let (ob, l) = (o / CB, o % CB);
        for i in 0..ic {
            let g = &weight[(o * ic + i) * 9..][..9];
            let (small, large);
            let u: &[f32] = if edge == 4 {
                large = filter_tile4(g);
                &large
            } else {
                small = filter_tile(g);
                &small
            };
            for (xi, &v) in u.iter().enumerate() {
                w[((xi * ocb + ob) * icp + i) * CB + l] = v;
            }
        }
    }
    if let Some(bias) = bias {
        b[..p.out_channels].copy_from_slice(bias);
    }
    Ok(())
}

/// Winograd F(2x2, 3x3) or F(4x4, 3x3) ([`edge`]) with weights [`pack`]ed
/// into `packed`, from `input` into `output`, both in the blocked layout when `blocked`, else
/// both NCHW (each tile row's input transposed into channel blocks, each
/// tile's output pixels scattered to their planes). `epilogue` runs on each
/// finished output row, with offsets in the output's layout: a row of a
/// block of 8 channels when blocked, else a row of one channel.
///
/// Fails, before writing anything, when a buffer has the wrong length or
/// `p` is not [`applies`]; a refused scratch allocation fails the call
/// (some of the output may then have been written).
pub fn conv2d(
    p: &Conv2dParams,
    blocked: bool,
    input: &[f32],
    packed: &[f32],
    output: &mut [f32],
    epilogue: Option<Epilogue<f32>>,
) -> KernelResult<()> {
    conv2d_for(p, edge(p), blocked, input, packed, output, epilogue)
}

/// [`conv2d`] in output tiles of `edge` (2 or 4) pixels.
fn conv2d_for(
    p: &Conv2dParams,
    edge: usize,
    blocked: bool,
    input: &[f32],
    packed: &[f32],
    output: &mut [f32],
    epilogue: Option<Epilogue<f32>>,
) -> KernelResult<()> {
    require(p)?;
    p.check_sizes()?;
    check_conv_buffers(p, (blocked, blocked), input.len(), output.len())?;
    check_len(
        "packed blocked Winograd weights",
        packed.len(),
        packed_len_for(p, edge)?,
    )?;
    if !applies(p) {
        return Err(KernelError::Precondition {
            what: "the blocked Winograd convolution needs one group, AVX2 and FMA",
        });
    }
    if output.is_empty() {
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    {
        let threads = threads_for(p);
        let plan = Plan::for_edge(p, threads, edge);
        let blocks = plan.row_blocks * plan.col_blocks;
        let parallel = threads > 1 && blocks >= threads;
        let shared = !parallel && threads > 1;
        let out = SharedMut(output.as_mut_ptr());
        let run = |b: usize| {
            let out = &out;
            let (rb, cb) = (b / plan.col_blocks, b % plan.col_blocks);
            let r0 = rb * plan.rows_per_block;
            let r1 = (r0 + plan.rows_per_block).min(p.batch * plan.tiles_h);
            let c0 = cb * plan.cols_per_block;
            let c1 = (c0 + plan.cols_per_block).min(plan.tiles_w);
            let tiles = Tiles {
                plan: &plan,
                rows: (r0, r1),
                cols: (c0, c1),
                blocked,
            };
            // SAFETY: AVX2 and FMA (`applies`); blocks cover disjoint (tile
            // row, tile column) ranges, so their output pixels are disjoint.
            unsafe {
                if edge == 4 {
                    block::<4, 6>(p, &tiles, input, packed, out, epilogue, shared)
                } else {
                    block::<2, 4>(p, &tiles, input, packed, out, epilogue, shared)
                }
            }
        };
        if parallel {
            (0..blocks)
                .into_par_iter()
                .with_max_len(1)
                .try_for_each(run)
        } else {
            (0..blocks).try_for_each(run)
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = epilogue;
        Ok(())
    }
}

/// A block of tiles: tile rows `rows` (over the images of the batch) by
/// tile columns `cols`.
struct Tiles<'a> {
    plan: &'a Plan,
    rows: (usize, usize),
    cols: (usize, usize),
    /// Whether input and output are blocked (else NCHW).
    blocked: bool,
}

impl Tiles<'_> {
    fn width(&self) -> usize {
        self.cols.1 - self.cols.0
    }
    fn len(&self) -> usize {
        (self.rows.1 - self.rows.0) * self.width()
    }
    /// Pixels of one input row the block's tiles of output edge `m` read:
    /// `m * width + 2`.
    fn row_pixels(&self, m: usize) -> usize {
        m * self.width() + 2
    }
    /// Image and tile row in it of the block's `ri`-th tile row.
    fn row(&self, ri: usize) -> (usize, usize) {
        let r = self.rows.0 + ri;
        (r / self.plan.tiles_h, r % self.plan.tiles_h)
    }
}

/// Zero initial accumulators for the products (the bias comes with the
/// output transform).
#[cfg(target_arch = "x86_64")]
static ZEROS: [f32; crate::cpu::blocked::tile::OBT_MAX * CB] =
    [0.0; crate::cpu::blocked::tile::OBT_MAX * CB];

/// Convolves one block of tiles into `out` (the whole blocked output), in
/// output tiles of `M x M` pixels from input tiles of `N x N` (`N = M + 2`).
///
/// # Safety
/// AVX2 and FMA; `out` points at the whole output, and no other thread
/// touches the block's output pixels meanwhile.
#[cfg(target_arch = "x86_64")]
unsafe fn block<const M: usize, const N: usize>(
    p: &Conv2dParams,
    tiles: &Tiles<'_>,
    input: &[f32],
    packed: &[f32],
    out: &SharedMut<f32>,
    epilogue: Option<Epilogue<f32>>,
    shared: bool,
) -> KernelResult<()> {
    use crate::cpu::blocked::pointwise::tile;
    use crate::cpu::blocked::tile::row;

    let positions = N * N;
    let (icb, ocb) = (blocks(p.in_channels), blocks(p.out_channels));
    let icp = icb * CB;
    let nt = tiles.len();
    let v_stride = plane_stride::<f32>(icb * nt * CB);
    let m_stride = plane_stride::<f32>(ocb * nt * CB);
    let (v_len, m_len) = (positions * v_stride, positions * m_stride);
    // N input rows of the tiles, per input-transform task.
    let rows_len = N * tiles.row_pixels(M) * CB;
    let parts = if shared { icb } else { 1 };
    let w_stride = icp * CB;
    let bias = &packed[positions * ocb * w_stride..];
    let len = v_len + m_len + parts * rows_len;
    with_scratch_named::<f32, _>(len, "Winograd transform buffers", |buf| {
        let (v, rest) = buf.split_at_mut(v_len);
        let (m, rows) = rest.split_at_mut(m_len);
        let (v, m) = (SharedMut(v.as_mut_ptr()), SharedMut(m.as_mut_ptr()));
        let (v, m) = (&v, &m);
        // SAFETY (the three phases): AVX2 and FMA (the caller's); each task
        // writes its own rows buffer and channel blocks of v, its own
        // (position, output blocks) of m, its own output channels of the
        // block's pixels.
        let transform_in = |(ib, rows): (usize, &mut [f32])| unsafe {
            input_transform::<M, N>(p, tiles, input, ib, rows, v.0, v_stride);
        };
        let block_tiles = crate::cpu::blocked::tile::BlockTiles::new(ocb);
        let groups = block_tiles.count();
        let product = |task: usize| {
            let xi = task / groups;
            let (ob, nob) = block_tiles.get(task % groups);
            // SAFETY: position xi's transformed input holds icb blocks of nt
            // tiles, its product ocb blocks of nt tiles; the packed weights
            // ocb blocks of icp * 8 per position.
            unsafe {
                row(
                    nob,
                    nt,
                    &tile(
                        v.0.add(xi * v_stride),
                        nt * CB,
                        icb,
                        packed.as_ptr().add((xi * ocb + ob) * w_stride),
                        w_stride,
                        false,
                        ZEROS.as_ptr(),
                        m.0.add(xi * m_stride + ob * nt * CB),
                        nt * CB,
                        Default::default(),
                    ),
                )
            };
        };
        let transform_out = |ob: usize| unsafe {
            output_transform::<M, N>(
                p,
                tiles,
                m.0,
                m_stride,
                &bias[ob * CB..],
                ob,
                out.0,
                epilogue,
            );
        };
        if shared {
            rows.par_chunks_mut(rows_len)
                .enumerate()
                .for_each(transform_in);
            (0..positions * groups).into_par_iter().for_each(product);
            (0..ocb).into_par_iter().for_each(transform_out);
        } else {
            for ib in 0..icb {
                transform_in((ib, &mut rows[..]));
            }
            (0..positions * groups).for_each(product);
            (0..ocb).for_each(transform_out);
        }
    })
}

/// `Bᵀ` applied to one column of an input tile: F(2x2, 3x3)'s when `N` is
/// 4, F(4x4, 3x3)'s (interpolation points 0, ±1, ±2) when 6.
///
/// # Safety
/// AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn input_1d<const N: usize>(
    d: [std::arch::x86_64::__m256; N],
) -> [std::arch::x86_64::__m256; N] {
    use std::arch::x86_64::*;
    // SAFETY: AVX2 and FMA (the caller's).
    unsafe {
        let mut t = d;
        if N == 4 {
            t[0] = _mm256_sub_ps(d[0], d[2]);
            t[1] = _mm256_add_ps(d[1], d[2]);
            t[2] = _mm256_sub_ps(d[2], d[1]);
            t[3] = _mm256_sub_ps(d[1], d[3]);
        } else {
            let (four, five, two) = (
                _mm256_set1_ps(4.0),
                _mm256_set1_ps(5.0),
                _mm256_set1_ps(2.0),
            );
            // 4 d0 - 5 d2 + d4; the middle four from two sums and two
            // differences; 4 d1 - 5 d3 + d5.
            t[0] = _mm256_fnmadd_ps(five, d[2], _mm256_fmadd_ps(four, d[0], d[4]));
            let (a, b) = (_mm256_add_ps(d[1], d[2]), _mm256_add_ps(d[3], d[4]));
            t[1] = _mm256_fnmadd_ps(four, a, b);
            let (a, b) = (_mm256_sub_ps(d[1], d[2]), _mm256_sub_ps(d[4], d[3]));
            t[2] = _mm256_fmadd_ps(four, a, b);
            let (a, b) = (_mm256_sub_ps(d[3], d[1]), _mm256_sub_ps(d[4], d[2]));
            t[3] = _mm256_fmadd_ps(two, a, b);
            t[4] = _mm256_fnmadd_ps(two, a, b);
            t[5] = _mm256_fnmadd_ps(five, d[3], _mm256_fmadd_ps(four, d[1], d[5]));
        }
        t
    }
}

/// `Aᵀ` applied to one column of a product tile (`N` positions into `M`
/// pixels), for the `N` of [`input_1d`].
///
/// # Safety
/// AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn output_1d<const M: usize, const N: usize>(
    m: [std::arch::x86_64::__m256; N],
) -> [std::arch::x86_64::__m256; M] {
    use std::arch::x86_64::*;
    // SAFETY: AVX2 and FMA (the caller's).
    unsafe {
        let mut y = [_mm256_setzero_ps(); M];
        if N == 4 {
            y[0] = _mm256_add_ps(_mm256_add_ps(m[0], m[1]), m[2]);
            y[1] = _mm256_sub_ps(_mm256_sub_ps(m[1], m[2]), m[3]);
        } else {
            let (a, b) = (_mm256_add_ps(m[1], m[2]), _mm256_sub_ps(m[1], m[2]));
            let (c, d) = (_mm256_add_ps(m[3], m[4]), _mm256_sub_ps(m[3], m[4]));
            y[0] = _mm256_add_ps(_mm256_add_ps(m[0], a), c);
            y[1] = _mm256_fmadd_ps(_mm256_set1_ps(2.0), d, b);
            y[2] = _mm256_fmadd_ps(_mm256_set1_ps(4.0), c, a);
            y[3] = _mm256_add_ps(_mm256_fmadd_ps(_mm256_set1_ps(8.0), d, b), m[5]);
        }
        y
    }
}

/// `Bᵀ d B` of input block `ib` of the block's tiles into `v` (`N * N`
/// planes `v_stride` apart, each `[in block][tile][8]`), each tile row's
/// `N` input rows first copied into `rows` as blocked pixels with zero
/// borders.
///
/// # Safety
/// AVX2 and FMA; `rows` holds `N` rows of [`Tiles::row_pixels`] blocked
/// pixels; `v` holds `N * N` planes of `v_stride >= icb * tiles * 8`
/// elements, and no other thread touches block `ib` of them meanwhile.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // row i of every column: indexed reads
#[target_feature(enable = "avx2,fma")]
unsafe fn input_transform<const M: usize, const N: usize>(
    p: &Conv2dParams,
    tiles: &Tiles<'_>,
    input: &[f32],
    ib: usize,
    rows: &mut [f32],
    v: *mut f32,
    v_stride: usize,
) {
    use std::arch::x86_64::*;

    let (ic, icb) = (p.in_channels, blocks(p.in_channels));
    let (h, w) = (p.in_h as isize, p.in_w as isize);
    let (tw, nt, rp) = (tiles.width(), tiles.len(), tiles.row_pixels(M));
    let plane = p.in_h * p.in_w;
    let lanes = CB.min(ic - ib * CB);
    // The tiles read columns x_start .. x_start + rp, of which lo .. hi
    // (relative to x_start) are inside the input.
    let x_start = (M * tiles.cols.0) as isize - p.padding.left as isize;
    let lo = (-x_start).clamp(0, rp as isize) as usize;
    let hi = (w - x_start).clamp(lo as isize, rp as isize) as usize;
    let rows = &mut rows[..N * rp * CB];
    for ri in 0..tiles.rows.1 - tiles.rows.0 {
        let (n, ty) = tiles.row(ri);
        let y0 = (M * ty) as isize - p.padding.top as isize;
        for (i, dst) in rows.chunks_exact_mut(rp * CB).enumerate() {
            let y = y0 + i as isize;
            if y < 0 || y >= h || lo == hi {
                dst.fill(0.0);
                continue;
            }
            dst[..lo * CB].fill(0.0);
            dst[hi * CB..].fill(0.0);
            let inside = &mut dst[lo * CB..hi * CB];
            let x = (x_start + lo as isize) as usize;
            let at = y as usize * p.in_w + x;
            if tiles.blocked {
                inside
                    .copy_from_slice(&input[((n * icb + ib) * plane + at) * CB..][..inside.len()]);
            } else {
                let base = (n * ic + ib * CB) * plane + at;
                for l in 0..CB {
                    let px = inside.iter_mut().skip(l).step_by(CB);
                    if l < lanes {
                        px.zip(&input[base + l * plane..][..hi - lo])
                            .for_each(|(d, &s)| *d = s);
                    } else {
                        px.for_each(|d| *d = 0.0);
                    }
                }
            }
        }
        for t in 0..tw {
            // SAFETY (whole block): the tile's N x N pixels lie in `rows`;
            // v's writes stay in tile ri * tw + t of block ib.
            unsafe {
                // Bᵀ over the rows of each column, then over the columns.
                let c: [[__m256; N]; N] = std::array::from_fn(|j| {
                    input_1d::<N>(std::array::from_fn(|i| {
                        _mm256_loadu_ps(rows.as_ptr().add((i * rp + M * t + j) * CB))
                    }))
                });
                let dst = v.add((ib * nt + ri * tw + t) * CB);
                for i in 0..N {
                    let row = input_1d::<N>(std::array::from_fn(|j| c[j][i]));
                    for (j, r) in row.into_iter().enumerate() {
                        _mm256_storeu_ps(dst.add((N * i + j) * v_stride), r);
                    }
                }
            }
        }
    }
}

/// `Aᵀ m A` plus the bias of output block `ob` of the block's tiles, stored
/// into `out` (clipped to the output) as blocked pixels, or scattered to the
/// block's channel planes when NCHW; then `epilogue` on each finished row.
///
/// # Safety
/// AVX2 and FMA; `m` holds `N * N` planes `m_stride` apart of `[out block]
/// [tile][8]`; `out` points at the whole output, whose pixels of block
/// `ob`'s channels in the block's tiles no other thread touches meanwhile.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)] // row r of every column
#[target_feature(enable = "avx2,fma")]
unsafe fn output_transform<const M: usize, const N: usize>(
    p: &Conv2dParams,
    tiles: &Tiles<'_>,
    m: *const f32,
    m_stride: usize,
    bias: &[f32],
    ob: usize,
    out: *mut f32,
    epilogue: Option<Epilogue<f32>>,
) {
    use std::arch::x86_64::*;

    let (oc, ocb) = (p.out_channels, blocks(p.out_channels));
    let (oh, ow) = (p.out_h(), p.out_w());
    let (tw, nt) = (tiles.width(), tiles.len());
    let x_first = M * tiles.cols.0;
    let width = (M * tiles.cols.1).min(ow) - x_first;
    let lanes = CB.min(oc - ob * CB);
    // SAFETY (whole body): reads stay in tile row ri's tiles of block ob of
    // each plane of m, writes in the block's pixels of block ob's channels.
    unsafe {
        let b = _mm256_loadu_ps(bias.as_ptr());
        for ri in 0..tiles.rows.1 - tiles.rows.0 {
            let (n, ty) = tiles.row(ri);
            // Where pixel (y, x) of lane 0 goes, and how far apart lanes are.
            let (plane, px, lane) = if tiles.blocked {
                ((n * ocb + ob) * oh * ow * CB, CB, 1)
            } else {
                ((n * oc + ob * CB) * oh * ow, 1, oh * ow)
            };
            let put = |yy: usize, xx: usize, v: __m256| {
                let at = out.add(plane + (yy * ow + xx) * px);
                if tiles.blocked {
                    _mm256_storeu_ps(at, v);
                } else {
                    let mut lane_values = [0.0f32; CB];
                    _mm256_storeu_ps(lane_values.as_mut_ptr(), v);
                    for (l, &x) in lane_values[..lanes].iter().enumerate() {
                        *at.add(l * lane) = x;
                    }
                }
            };
            let y = M * ty;
            let rows_in = (oh - y).min(M);
            for t in 0..tw {
                let src = m.add((ob * nt + ri * tw + t) * CB);
                // Aᵀ over the rows of each column, then over the columns.
                let s: [[__m256; M]; N] = std::array::from_fn(|j| {
                    output_1d::<M, N>(std::array::from_fn(|i| {
                        _mm256_loadu_ps(src.add((N * i + j) * m_stride))
                    }))
                });
                let x = x_first + M * t;
                let cols_in = (ow - x).min(M);
                for r in 0..rows_in {
                    let row = output_1d::<M, N>(std::array::from_fn(|j| s[j][r]));
                    for (c, v) in row.into_iter().enumerate().take(cols_in) {
                        put(y + r, x + c, _mm256_add_ps(v, b));
                    }
                }
            }
            if let Some(e) = epilogue {
                for yy in y..(y + M).min(oh) {
                    let row = plane + (yy * ow + x_first) * px;
                    if tiles.blocked {
                        e(
                            row,
                            std::slice::from_raw_parts_mut(out.add(row), width * CB),
                        );
                    } else {
                        for l in 0..lanes {
                            let at = row + l * lane;
                            e(at, std::slice::from_raw_parts_mut(out.add(at), width));
                        }
                    }
                }
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::cpu::blocked::{blocked_len, from_blocked, to_blocked};
    use crate::cpu::test_util::{cast, reference_conv, Rng};
    use crate::params::Padding2d;

    fn params(
        batch: usize,
        ic: usize,
        oc: usize,
        hw: (usize, usize),
        pad: Padding2d,
    ) -> Conv2dParams {
        super::super::tests::params(batch, ic, oc, 1, hw, pad)
    }

    /// Runs `p` in both layouts, with or without the bias and with or
    /// without a residual and a ReLU fused, against the f64 reference
    /// computed here; blocked padding lanes out must be zero.
    fn relu_of_sum(residual: &[f32]) -> impl Fn(usize, &mut [f32]) + Sync + '_ {
        move |at, s| {
            for (o, r) in s.iter_mut().zip(&residual[at..]) {
                *o = (*o + r).max(0.0);
            }
        }
    }

    fn case(p: &Conv2dParams, bias: bool, fuse: bool, seed: u64) {
        for edge in [2, 4] {
            case_for(p, edge, bias, fuse, seed);
        }
    }

    fn case_for(p: &Conv2dParams, edge: usize, bias: bool, fuse: bool, seed: u64) {
        let mut rng = Rng::new(seed);
        let x = rng.vec(p.input_len());
        let w = rng.vec(p.weight_len());
        let b = rng.vec(p.out_channels);
        let residual = rng.vec(p.output_len());
        let mut want = reference_conv(p, &x, &w, bias.then_some(&b[..]));
        if fuse {
            for (o, r) in want.iter_mut().zip(&residual) {
                *o = (*o + r).max(0.0);
            }
        }
        let mut packed = vec![f32::NAN; packed_len_for(p, edge).unwrap()];
        let bf = cast::<f32>(&b);
        pack_for(
            p,
            edge,
            &cast::<f32>(&w),
            bias.then_some(&bf[..]),
            &mut packed,
        )
        .unwrap();
        let tol = 1e-4 * (p.in_channels.max(1) as f64 * 9.0).sqrt();
        let check = |got: &[f32], layout: &str| {
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (*g as f64 - w).abs() <= tol * (1.0 + w.abs()),
                    "{layout} {edge}x{edge} tiles {p:?} bias={bias} fuse={fuse} at {i}: {g} vs {w}"
                );
            }
        };

        // Blocked.
        let (plane_in, plane_out) = (p.in_h * p.in_w, p.out_h() * p.out_w());
        let mut xb = vec![f32::NAN; blocked_len(p.batch, p.in_channels, plane_in).unwrap()];
        to_blocked(p.batch, p.in_channels, plane_in, &cast::<f32>(&x), &mut xb).unwrap();
        let out_len = blocked_len(p.batch, p.out_channels, plane_out).unwrap();
        let mut rb = vec![0.0f32; out_len];
        to_blocked(
            p.batch,
            p.out_channels,
            plane_out,
            &cast::<f32>(&residual),
            &mut rb,
        )
        .unwrap();
        let e = relu_of_sum(&rb);
        let mut ob = vec![f32::NAN; out_len];
        conv2d_for(
            p,
            edge,
            true,
            &xb,
            &packed,
            &mut ob,
            fuse.then_some(&e as Epilogue<f32>),
        )
        .unwrap();
        for (k, v) in ob.iter().enumerate() {
            let block = k / (plane_out * CB) % blocks(p.out_channels);
            if block * CB + k % CB >= p.out_channels {
                assert_eq!(*v, 0.0, "{p:?}: padding lane at {k}");
            }
        }
        let mut got = vec![f32::NAN; p.output_len()];
        from_blocked(p.batch, p.out_channels, plane_out, &ob, &mut got).unwrap();
        check(&got, "blocked");

        // NCHW.
        let r = cast::<f32>(&residual);
        let e = relu_of_sum(&r);
        let mut got = vec![f32::NAN; p.output_len()];
        let x = cast::<f32>(&x);
        conv2d_for(
            p,
            edge,
            false,
            &x,
            &packed,
            &mut got,
            fuse.then_some(&e as Epilogue<f32>),
        )
        .unwrap();
        check(&got, "NCHW");
    }

    fn grid() {
        let paddings = super::super::tests::paddings();
        let mut seed = 1;
        // Odd and even output sizes (partial edge tiles), partial channel
        // blocks in and out, an odd number of output blocks, and planes
        // large enough for several blocks of tiles.
        for &pad in &paddings {
            for &hw in &[(3, 3), (5, 4), (7, 9), (8, 11), (14, 14)] {
                for &(ic, oc) in &[(3, 5), (8, 8), (16, 24), (11, 19)] {
                    for batch in [1, 3] {
                        seed += 1;
                        let p = params(batch, ic, oc, hw, pad);
                        case(&p, seed % 2 == 0, seed % 3 != 0, seed);
                    }
                }
            }
        }
        for p in [
            params(1, 32, 40, (56, 56), Padding2d::symmetric(1, 1)),
            params(2, 24, 16, (30, 200), Padding2d::symmetric(1, 1)),
            params(10, 40, 48, (14, 14), Padding2d::symmetric(1, 1)),
            // No input channel: the output is the bias.
            params(2, 0, 12, (6, 5), Padding2d::symmetric(1, 1)),
        ] {
            seed += 1;
            case(&p, true, true, seed);
        }
    }

    #[test]
    fn matches_the_reference_on_one_thread_and_two() {
        if !crate::cpu::blocked::available() {
            return;
        }
        grid();
        crate::cpu::test_util::on_two_threads(grid);
    }

    #[test]
    fn large_tiles_need_sixteen_of_them() {
        let pad = Padding2d::symmetric(1, 1);
        for (batch, hw, want) in [
            (1, 7, 2),
            (3, 7, 2),
            (4, 7, 4),
            (1, 13, 4),
            (1, 14, 4),
            (1, 56, 4),
        ] {
            let p = params(batch, 64, 64, (hw, hw), pad);
            assert_eq!(edge(&p), want, "batch {batch}, {hw}x{hw}");
            let positions = want * want + 4 * want + 4;
            let len = positions * 64 * 64 + 64;
            assert_eq!(packed_len(&p).unwrap(), len, "batch {batch}, {hw}x{hw}");
        }
    }

    #[test]
    fn bad_lengths_and_unfit_problems_are_errors_before_any_write() {
        if !crate::cpu::blocked::available() {
            return;
        }
        let p = params(1, 4, 4, (6, 6), Padding2d::symmetric(1, 1));
        let mut packed = vec![0.0f32; packed_len(&p).unwrap()];
        pack(&p, &vec![1.0; p.weight_len()], None, &mut packed).unwrap();
        let x = vec![1.0f32; blocked_len(1, 4, 36).unwrap()];
        let mut out = vec![f32::NAN; blocked_len(1, 4, 36).unwrap()];
        for blocked in [true, false] {
            let short = conv2d(&p, blocked, &x[1..], &packed, &mut out, None);
            assert!(
                matches!(short, Err(KernelError::Length { .. })),
                "{short:?}"
            );
        }
        let short = conv2d(&p, true, &x, &packed[1..], &mut out, None);
        assert!(
            matches!(short, Err(KernelError::Length { .. })),
            "{short:?}"
        );
        let grouped = Conv2dParams { groups: 2, ..p };
        let unfit = conv2d(&grouped, true, &x, &packed, &mut out, None);
        assert!(
            matches!(unfit, Err(KernelError::Precondition { .. })),
            "{unfit:?}"
        );
        let strided = Conv2dParams {
            stride: (2, 2),
            ..p
        };
        let unfit = pack(&strided, &vec![1.0; p.weight_len()], None, &mut packed);
        assert!(
            matches!(unfit, Err(KernelError::Precondition { .. })),
            "{unfit:?}"
        );
        assert!(out.iter().all(|v| v.is_nan()));
    }
}
