//! 1x1 convolution (no padding, one group) in the blocked layout: a plain
//! GEMM over the channels, no im2col, on the blocked kernels' register
//! tile (`cpu/blocked/tile.rs`: a few output blocks of 8 channels by a few
//! pixels, per input channel one weight vector per block and a broadcast
//! of each pixel's value). The vectors run over output channels,
//! so planes of any size (7x7, 14x14) fill every lane, which an NCHW GEMM
//! vectorised over the pixels cannot.
//!
//! Work is split into tasks of (image, group of output blocks whose weights
//! stay in L2, run of pixels). Within a task, each register tile of output
//! blocks sweeps the run's pixels, its weights in L1 throughout, where a
//! run's input can be made small enough to stay in L1 (see
//! `sweep_input_bytes`: on AVX-512 on large planes only), or where a tile
//! of output blocks' weights fits there; a reduction too deep for either is
//! split into chunks of input channels that fit, swept one after the other,
//! each continuing the sums the last stored (on AVX-512, whose tile of
//! weights is four times the size, a reduction of more than
//! `AVX512_CHUNK_BLOCKS` input blocks is always split). A narrow layer (at
//! most 64 output channels) keeps long runs and always sweeps its reduction
//! in such chunks: its input meets few tiles of output blocks, so its first
//! read is what counts. Otherwise each tile of pixels is used by every
//! block of the group while it is in L1. The fused epilogue (a residual, an
//! activation) runs on each finished output strip. On AVX-512 the weights
//! are packed in pairs of output blocks (see [`pack`]), one zmm vector per
//! input channel.
//!
//! A strided layer (ResNet's 1x1 stride-2 downsampling) first gathers the
//! pixels it reads into a contiguous blocked copy (per-thread scratch, a
//! quarter of the input at stride 2), then runs as a stride-1 one.

// Elsewhere than x86-64 only the shape and the packing are used.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use crate::alloc::{check_len, checked_product, KernelResult};
use crate::cpu::conv2d::Epilogue;

#[cfg(target_arch = "x86_64")]
use super::tile::Start;
use super::{Fused, PackedWeights, BLOCK};

/// Register tiles per task, at most, along the pixels.
const TASK_TILES: usize = 16;
/// Bytes of packed weights one task's group of output blocks may take: about
/// half an L2 cache.
const GROUP_BYTES: usize = 192 << 10;

/// Register tiles of pixels a run needs, at least, for its tiles of output
/// blocks to sweep it.
const SWEEP_TILES: usize = 4;

/// Output blocks, at most, of a narrow layer (a squeeze, a bottleneck's
/// reduction to 64 channels): its reduction is always split into chunks
/// (see `run`).
const NARROW_BLOCKS: usize = 8;

/// Input blocks, at most, of a chunk of the reduction on AVX-512: deeper
/// reductions are split into equal chunks of at most this many, each swept
/// over the run's pixels by every tile of output blocks in turn (see
/// `run`), so that a tile's weights for the chunk (4 blocks by 192
/// channels, 24 KB) stay in L1 while the input streams from L2, rather
/// than each tile of pixels streaming all of a tile of blocks' weights
/// (128 KB for 1024 input channels) from L2. On an Intel Xeon with AVX-512
/// and a 48 KB L1 (the kernel alone over 25 ResNet-50, MobileNetV2 and
/// GoogLeNet shapes, paired rounds) that took 0.95x the time (geometric
/// mean) on two threads with the weights cold, 0.95x on one thread hot;
/// at batch 10 0.85-0.93x on 1024 -> 256 at 14x14 and 512 -> 128 at
/// 28x28, at batch 1 0.91-1.02x on 1024 -> 256 and 1024 -> 512 at 14x14.
/// Chunks of at most 16 blocks measured 0.96x (two threads), of 32 and 48
/// 0.97x and 0.98x (one thread).
const AVX512_CHUNK_BLOCKS: usize = 24;

/// Bytes of a run's input a sweep keeps in L1 on AVX2, and on AVX-512 for
/// large planes ([`sweep_input_bytes`]): most of a 32 KB L1 data cache.
const SWEEP_L1_BYTES: usize = 28 << 10;

/// Bytes of one block of an input plane, at least, for AVX-512 to sweep
/// ([`sweep_input_bytes`]): four pages, 23x23 pixels and more.
const SWEEP_PLANE_BYTES: usize = 16 << 10;

/// Bytes of a task's input, at most, for each register tile of output
/// blocks to sweep all the task's pixels in turn, its weights and the run's
/// input in L1 all the while, rather than each tile of pixels meeting every
/// block of the group in turn, the group's weights streamed from L2 for
/// each tile of pixels. Runs are shortened to fit, down to [`SWEEP_TILES`]
/// tiles of pixels; layers with more input channels than that allows keep
/// the other order unless a tile of output blocks' weights fits in as
/// many bytes (see `run`).
///
/// On AVX2, measured on a Zen 4 (the 1x1 kernel alone, two threads, buffers
/// cold, paired), sweeping took 0.69x the time on 64 -> 256 at 56x56, 0.73x
/// on 96 -> 576 at 14x14, 0.78x on 64 -> 384 at 14x14 and 0.83x on 40 ->
/// 240 at 28x28: layers whose group of weights outgrows L1; with runs
/// shortened to fit, 0.84x on 128 -> 512 at 28x28, 0.90-0.95x on 128 -> 128
/// at 56x56, 0.91x on 192 -> 64 at 28x28. Sweeping an input that does not
/// fit L1 (a run of 40 or more input blocks read from L2, block by block,
/// for each tile of output blocks) made some reductions slower when the
/// tile's weights did not fit either. On AVX-512 (whose tile is twice as
/// wide and four times as tall) sweeping, narrow layers' chunks included,
/// lost: on an Intel Xeon with AVX-512 and a 48 KB L1 (the kernel alone,
/// one thread, hot, 5 paired rounds over 35 MobileNetV2, ResNet-50 and
/// SqueezeNet shapes) 1.045x the time with 28 KB, 1.024x with 40 KB
/// (geometric means; narrow layers 1.07-1.15x), so 0 keeps the other order
/// there for small planes (large ones: see the end). Prefetching the next
/// tile of pixels' input while the current one runs measured 1.02-1.03x.
///
/// In whole networks on a Zen 4 with AVX-512 at batch 10, sweeping with
/// 28 KB showed no steady gain either. Builds in processes of their own
/// (fastest call of 6 alternating processes a build) read 1.11x the time
/// on densenet121, 1.04x on googlenet, 0.94x on efficientnet_b0; calls
/// alternating between the two rules in one process, 0.96-0.97x on
/// densenet121, 0.96-1.02x on googlenet, 0.90-0.98x on efficientnet_b0
/// (fastest call; its tenth percentile 0.97-0.99x), 0.89-1.06x on
/// mobilenet_v2, 1.00x on resnet50; at batch 1 0.94-1.02x: the host's
/// noise, not a rule to change. (A prefetch, in `tile::reduce`, of each
/// input block's pixels one or two register tiles ahead fared the same. In
/// a network an input read from memory rather than cache, 18 input blocks'
/// streams at once, is what makes layers such as 144 -> 32 at 28x28 take
/// twice their time alone, and the prefetch took that layer from 0.76 to
/// 0.47 ms in mobilenet_v2 at batch 10; but whole networks moved 0.89-1.08x
/// the time by network and batch on the median of calls alternating in one
/// process, 0.90-1.05x on the fastest, in no steady direction.)
///
/// On AVX-512 the sweep is kept for large planes, each block of the plane
/// at least [`SWEEP_PLANE_BYTES`]: in a network their input and residual
/// come from L3 rather than L2, and the other order reads and writes, for
/// each tile of pixels, one stream per input block and two per output
/// block (72 on 64 -> 256), more than the prefetchers follow. On an Intel
/// Xeon (model 207, 48 KB L1, 2 MB L2; the kernel alone, two threads, the
/// input and output rotated over 48 MB of buffers, the two orders
/// alternating in one process, 580 calls each, medians) the sweep took
/// 0.57-0.75x the time on 64 -> 256 at 56x56, 0.65x on 64 -> 192 at 56x56,
/// 0.70-0.81x on 64 -> 128 and 128 -> 128 at 56x56, 0.75-0.91x on 24 -> 144
/// at 56x56, 0.76x on 40 -> 240 at 28x28, 0.84-0.90x on 16 -> 96 at
/// 112x112, 0.86x on 144 -> 24 and 96 -> 24 at 56x56, 0.88-0.92x on 128 ->
/// 512 at 28x28, 0.94-1.04x on the other 28x28 layers measured; at 14x14 and
/// 7x7 (96 -> 576, 160 -> 960) 1.02-1.12x, hence the bound. Whole networks
/// (the two rules alternating call by call in one process, 150 calls at
/// batch 1, 40 at batch 10, medians): resnet50 0.97x at both batches,
/// mobilenet_v2 0.96x and 0.93x, densenet121 0.93x and 0.95x,
/// efficientnet_b0 0.99x and 0.97x, squeezenet1_1 and googlenet at batch 1
/// 1.00x.
fn sweep_input_bytes(plane: usize) -> usize {
    if !crate::isa::avx512() || plane * BLOCK * size_of::<f32>() >= SWEEP_PLANE_BYTES {
        SWEEP_L1_BYTES
    } else {
        0
    }
}

/// The shape of a blocked 1x1 convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pointwise {
    /// Images.
    pub batch: usize,
    /// Input channels.
    pub in_channels: usize,
    /// Output channels.
    pub out_channels: usize,
    /// Pixels per output plane (`h * w`).
    pub plane: usize,
    /// A strided layer's input plane and strides; `None`: stride 1, the
    /// input plane the output's.
    pub subsample: Option<Subsample>,
}

/// The input plane and strides of a strided 1x1 convolution: output pixel
/// `(y, x)` reads input pixel `(y * stride.0, x * stride.1)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subsample {
    /// Input plane height.
    pub in_h: usize,
    /// Input plane width.
    pub in_w: usize,
    /// Strides (height, width), each at least 1.
    pub stride: (usize, usize),
}

impl Subsample {
    /// The output plane's height and width.
    pub fn out_hw(&self) -> (usize, usize) {
        let out = |i: usize, s: usize| if i == 0 { 0 } else { (i - 1) / s.max(1) + 1 };
        (out(self.in_h, self.stride.0), out(self.in_w, self.stride.1))
    }
}

impl Pointwise {
    /// Pixels per input plane.
    pub(super) fn in_plane(&self) -> usize {
        self.subsample.map_or(self.plane, |u| u.in_h * u.in_w)
    }
    fn in_blocks(&self) -> usize {
        self.in_channels.div_ceil(BLOCK)
    }
    fn out_blocks(&self) -> usize {
        self.out_channels.div_ceil(BLOCK)
    }
    /// The packed weights' layout: a row per input channel (padded to
    /// blocks).
    pub(super) fn weights(&self) -> PackedWeights {
        PackedWeights::new(self.out_blocks(), self.in_blocks() * BLOCK, true)
    }
    /// Elements of the packed weights and bias ([`pack`]).
    pub fn packed_len(&self) -> KernelResult<usize> {
        let w = checked_product(
            "packed 1x1 weights",
            &[
                self.out_blocks().next_multiple_of(self.weights().unit()),
                self.in_blocks(),
                BLOCK,
                BLOCK,
            ],
        )?;
        w.checked_add(self.out_blocks() * BLOCK)
            .ok_or(crate::KernelError::Overflow {
                what: "packed 1x1 weights",
            })
    }
    /// Multiply-accumulates of one call.
    pub fn macs(&self) -> usize {
        [self.batch, self.in_channels, self.out_channels, self.plane]
            .iter()
            .fold(1usize, |a, &b| a.saturating_mul(b))
    }
}

/// Packs `weight` (`[out_channels, in_channels]`) and `bias` for
/// [`conv2d`]: `[out_block][in_channel (padded to blocks)][8 output lanes]`,
/// or on AVX-512 `[pair of out_blocks][in_channel][2][8 output lanes]`
/// (`PackedWeights`: each input channel's weights for two blocks side by
/// side, one zmm vector, which the tile loads at once rather than as two
/// halves and an insert), then the bias padded to whole blocks; the
/// padding is zero. On
/// an Intel Xeon with AVX-512 the pairs took 0.95x the time (geometric
/// mean; 0.81-1.02x by shape) over 35 MobileNetV2, ResNet-50 and
/// SqueezeNet shapes (the kernel alone, one thread, hot, 5 paired rounds),
/// 0.98x on two threads with the buffers cold; end to end (two builds in
/// their own processes, alternating turns, 6 rounds) mobilenet_v2 batch 1
/// 0.92x and resnet50 0.98x. The layout is the CPU level's, which is fixed for the process
/// ([`crate::isa::level`]).
pub fn pack<T: crate::Float>(
    s: &Pointwise,
    weight: &[T],
    bias: Option<&[T]>,
    packed: &mut [T],
) -> KernelResult<()> {
    check_len("1x1 weight", weight.len(), s.out_channels * s.in_channels)?;
    if let Some(b) = bias {
        check_len("1x1 bias", b.len(), s.out_channels)?;
    }
    check_len("packed 1x1 weights", packed.len(), s.packed_len()?)?;
    let layout = s.weights();
    let (w, b) = packed.split_at_mut(layout.len());
    w.fill(T::zero());
    b.fill(T::zero());
    for o in 0..s.out_channels {
        let (ob, l) = (o / BLOCK, o % BLOCK);
        for i in 0..s.in_channels {
            w[layout.at(ob, i, l)] = weight[o * s.in_channels + i];
        }
        if let Some(bias) = bias {
            b[o] = bias[o];
        }
    }
    Ok(())
}

/// Checks [`conv2d`]'s arguments: a strided layer's planes, the buffers'
/// lengths, the fused bounds, and that the blocked kernels run here.
pub(super) fn check(
    s: &Pointwise,
    input: &[f32],
    packed: &[f32],
    output: &[f32],
    fused: Fused<'_>,
) -> KernelResult<()> {
    if let Some(u) = s.subsample {
        let (h, w) = u.out_hw();
        if u.stride.0 == 0 || u.stride.1 == 0 || h * w != s.plane {
            return Err(crate::KernelError::Precondition {
                what: "a strided 1x1 convolution's output plane is its input's subsampled",
            });
        }
    }
    check_len(
        "1x1 input",
        input.len(),
        super::blocked_len(s.batch, s.in_channels, s.in_plane())?,
    )?;
    check_len("packed 1x1 weights", packed.len(), s.packed_len()?)?;
    check_len(
        "1x1 output",
        output.len(),
        super::blocked_len(s.batch, s.out_channels, s.plane)?,
    )?;
    fused.check(output.len())?;
    if !super::available() {
        return Err(crate::KernelError::Precondition {
            what: "the blocked 1x1 convolution needs AVX2 and FMA",
        });
    }
    Ok(())
}

/// The 1x1 convolution `s` from blocked `input` with weights [`pack`]ed
/// into `packed`, into blocked `output`, with `fused` applied in registers
/// and then `epilogue` to each finished strip (offsets in the blocked
/// output). Needs [`available`](super::available).
pub fn conv2d(
    s: &Pointwise,
    input: &[f32],
    packed: &[f32],
    output: &mut [f32],
    fused: Fused<'_>,
    epilogue: Option<Epilogue<f32>>,
) -> KernelResult<()> {
    checked_run(s, input, packed, output, fused, epilogue, false)
}

/// [`conv2d`] written in place of the residual it adds: `output` holds the
/// residual (in the output's blocked layout) on entry, and the sums start
/// from it (plus the bias) rather than reading it from a tensor of its own;
/// `clamp` then applies as [`Fused::clamp`], and `epilogue` to each finished
/// strip. ONNX Runtime's fused `Conv` + `Sum` does the same: the output's
/// lines are read and written once, where a separate residual is read from
/// one buffer and the output written to another (whose lines the cache
/// fetches before they are written). On an Intel Xeon with AVX-512 (the
/// kernel alone, the two ways alternating in one process, 380 rounds,
/// medians) that took 64 -> 256 at 56x56 0.62-0.66x the time on two
/// threads (0.77-0.79x on one), 128 -> 512 at 28x28 0.65-0.75x (0.74-0.87x),
/// 256 -> 1024 at 14x14 0.87-0.92x (0.93-0.94x).
pub fn conv2d_onto_residual(
    s: &Pointwise,
    input: &[f32],
    packed: &[f32],
    output: &mut [f32],
    clamp: Option<(f32, f32)>,
    epilogue: Option<Epilogue<f32>>,
) -> KernelResult<()> {
    let fused = Fused {
        residual: None,
        clamp,
    };
    checked_run(s, input, packed, output, fused, epilogue, true)
}

/// [`conv2d`], or with `onto_residual` [`conv2d_onto_residual`], after
/// [`check`].
fn checked_run(
    s: &Pointwise,
    input: &[f32],
    packed: &[f32],
    output: &mut [f32],
    fused: Fused<'_>,
    epilogue: Option<Epilogue<f32>>,
    onto_residual: bool,
) -> KernelResult<()> {
    check(s, input, packed, output, fused)?;
    #[cfg(target_arch = "x86_64")]
    run_strided(
        s,
        input,
        packed,
        output,
        fused,
        epilogue,
        sweep_input_bytes(s.plane),
        onto_residual,
    )?;
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (fused, epilogue, onto_residual);
    Ok(())
}

/// [`run`] for a layer of any stride: a strided one's pixels gathered
/// first ([`subsample`]) into per-thread scratch, a refused allocation of
/// which is the only error.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn run_strided(
    s: &Pointwise,
    input: &[f32],
    packed: &[f32],
    output: &mut [f32],
    fused: Fused<'_>,
    epilogue: Option<Epilogue<f32>>,
    sweep_bytes: usize,
    onto_residual: bool,
) -> KernelResult<()> {
    // The layer's own input, or the strided one's gathered pixels.
    let mut go = |s: &Pointwise, x: &[f32]| {
        run(
            s,
            x,
            packed,
            0,
            output,
            fused,
            epilogue,
            sweep_bytes,
            onto_residual,
        )
    };
    let Some(u) = s.subsample else {
        go(s, input);
        return Ok(());
    };
    let len = super::blocked_len(s.batch, s.in_channels, s.plane)?;
    crate::cpu::scratch::with_scratch_named(len, "subsampled 1x1 input", |x| {
        subsample(s, &u, input, x);
        let s = Pointwise {
            subsample: None,
            ..*s
        };
        go(&s, x)
    })
}

/// Gathers into `out` (blocked, `s.plane` pixels a block) the input pixels
/// the strided 1x1 convolution `s` reads from blocked `input`, in parallel
/// over blocks when the layer is large enough for two threads.
#[cfg(target_arch = "x86_64")]
fn subsample(s: &Pointwise, u: &Subsample, input: &[f32], out: &mut [f32]) {
    use rayon::prelude::*;

    let ((oh, ow), (sh, sw)) = (u.out_hw(), u.stride);
    let (in_block, out_block) = (u.in_h * u.in_w * BLOCK, s.plane * BLOCK);
    if out_block == 0 {
        return;
    }
    let gather = |(c, o): (usize, &mut [f32])| {
        let x = &input[c * in_block..][..in_block];
        for y in 0..oh {
            let (row, o) = (&x[y * sh * u.in_w * BLOCK..], &mut o[y * ow * BLOCK..]);
            for (i, px) in o[..ow * BLOCK].chunks_exact_mut(BLOCK).enumerate() {
                px.copy_from_slice(&row[i * sw * BLOCK..][..BLOCK]);
            }
        }
    };
    if crate::cpu::conv2d::threads_for_macs(s.macs()) > 1 {
        out.par_chunks_mut(out_block).enumerate().for_each(gather);
    } else {
        out.chunks_mut(out_block).enumerate().for_each(gather);
    }
}

/// [`conv2d`] of a stride-1 layer whose images each have weights of their
/// own: image `n`'s packed weights start at `n * w_image` in `packed`, the
/// bias (one for all) ends it. Its arguments checked as [`conv2d`]'s, but
/// `packed`'s length.
pub(super) fn conv2d_per_image(
    s: &Pointwise,
    input: &[f32],
    packed: &[f32],
    w_image: usize,
    output: &mut [f32],
    fused: Fused<'_>,
    epilogue: Option<Epilogue<f32>>,
) {
    debug_assert!(s.subsample.is_none());
    debug_assert_eq!(
        packed.len(),
        s.weights().len() + (s.batch.max(1) - 1) * w_image + s.out_blocks() * BLOCK,
        "per-image weights"
    );
    #[cfg(target_arch = "x86_64")]
    run(
        s,
        input,
        packed,
        w_image,
        output,
        fused,
        epilogue,
        sweep_input_bytes(s.plane),
        false,
    );
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (s, input, packed, w_image, output, fused, epilogue);
}

/// [`conv2d`] past its checks, with runs swept by tiles of output blocks
/// where `sweep_bytes` ([`sweep_input_bytes`]) allows; image `n` reads its
/// weights from `n * w_image` in `packed` (0: one set for all), whose last
/// elements are the bias. With `onto_residual`, the output holds the
/// residual on entry ([`conv2d_onto_residual`]).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn run(
    s: &Pointwise,
    input: &[f32],
    packed: &[f32],
    w_image: usize,
    output: &mut [f32],
    fused: Fused<'_>,
    epilogue: Option<Epilogue<f32>>,
    sweep_bytes: usize,
    onto_residual: bool,
) {
    use rayon::prelude::*;

    use crate::cpu::conv2d::{threads_for_macs, SharedMut};

    let (icb, ocb, plane) = (s.in_blocks(), s.out_blocks(), s.plane);
    if s.batch == 0 || plane == 0 {
        return;
    }
    let layout = s.weights();
    let w_stride = layout.stride();
    // A group starts on a unit of the packed weights (a tile on a pair,
    // where they are packed in pairs).
    let unit = layout.unit();
    let units = ocb.div_ceil(unit);
    // Groups of output blocks whose weights fit GROUP_BYTES, and runs of
    // pixels, at least a few tasks per thread when the plane allows and as
    // many for every thread, each group and run as large as the others
    // (one block, one tile of pixels, apart at most), so that threads
    // finish together. On Zen 1 (two threads, the kernel alone, hot,
    // paired rounds) 960 -> 160 at 7x7 in groups of 6, 6, 6 and 2 blocks
    // took about 1.1x the time of four groups of 5, and 32 -> 192 at 28x28
    // in nine runs of pixels (five for one thread, four for the other)
    // 1.1x the time of ten.
    let (obt, pt) = super::tile::shape();
    let task_pixels = TASK_TILES * pt;
    let threads = threads_for_macs(s.macs());
    // Split by output blocks, a thread reads every input channel, half of
    // them written by the other core in the layer before. Tried and not
    // kept on a 2-core Zen 4 with AVX-512: where the layer reads at least as
    // many bytes of input as of weights, tasks of runs of pixels alone (each
    // doing every group in turn), so that a thread reads the pixels it
    // wrote itself where the layer before split the same way. Alone (8
    // layers, each one's output the next one's input, the two splits
    // alternating in one process, 400 rounds, two runs) that took 64 ->
    // 64 at 28x28 from 59-62 to 38-43 us a layer at the tenth
    // percentile (0.61x and 0.74x; 31-37 us when every layer reads the
    // same input), 128 -> 128 at 14x14 0.84x and 0.92x; layers it did
    // not change read 0.97-1.07x. In networks at batch 1 (calls
    // alternating in one process, 120-150 each, tenth percentile) it was
    // noise:
    // mobilenet_v2 0.98-1.00x, efficientnet_b0 0.95x, squeezenet1_1
    // 0.99x, resnet50 0.98x, googlenet 1.03-1.05x, densenet121 1.03x. A
    // 1x1 layer's input there mostly comes from a depthwise, 3x3 or
    // concatenated layer, whose kernels split by channel blocks, so no
    // split of the 1x1 layer reads it from its own core; the gain would
    // need every blocked kernel to split an image by the same rows.
    // The other way round, expansions at large planes (24 -> 144 at
    // 56x56) split by output blocks in halves like the depthwise layer
    // that reads them, read 0.97-1.02x on mobilenet_v2 and 0.98x on
    // efficientnet_b0 (the same measure): noise too.
    let mut groups = (ocb * icb * BLOCK * BLOCK * 4)
        .div_ceil(GROUP_BYTES)
        .clamp(1, units);
    if s.batch * plane.div_ceil(task_pixels) < 4 * threads {
        // Few pixels (7x7, 14x14 at batch 1): the groups are the tasks, as
        // many for every thread.
        groups = groups.next_multiple_of(threads).min(ocb.div_ceil(obt));
    }
    let tiles = plane.div_ceil(pt);
    let mut runs = plane
        .div_ceil(task_pixels)
        .max((4 * threads).div_ceil(s.batch * groups));
    // A narrow layer (at most NARROW_BLOCKS output blocks) keeps its runs
    // long and always splits its reduction into chunks (see `chunk`).
    let narrow = icb > 0 && ocb <= NARROW_BLOCKS && sweep_bytes > 0 && !crate::isa::avx512();
    // Otherwise runs short enough for their input to stay in L1 while each
    // tile of output blocks sweeps them, if that leaves a few tiles of
    // pixels a run.
    let sweep_tiles = sweep_bytes / (icb.max(1) * BLOCK * size_of::<f32>()) / pt;
    let input_fits = !narrow && sweep_tiles >= SWEEP_TILES;
    if input_fits {
        runs = runs.max(tiles.div_ceil(sweep_tiles));
    }
    while !(s.batch * groups * runs).is_multiple_of(threads) && runs < tiles {
        runs += 1;
    }
    let runs = runs.clamp(1, tiles);
    // Group g's blocks, run r's pixels.
    let group_of = |g: usize| {
        let edge = |g: usize| (g * units / groups * unit).min(ocb);
        (edge(g), edge(g + 1))
    };
    let run_of = |r: usize| {
        let (t0, t1) = (r * tiles / runs, (r + 1) * tiles / runs);
        (t0 * pt, (t1 * pt).min(plane))
    };
    let run_len = tiles.div_ceil(runs) * pt;
    // Otherwise a sweep still pays where a tile of output blocks' weights
    // stay in L1: it then streams from L2 a tile of pixels' input (`pt`
    // pixels a block) where the other order streams a tile of blocks'
    // weights (`obt * BLOCK` a block, more). On AVX2 (Zen 4, the kernel
    // alone, two threads, cold, three paired rounds) 320 -> 1280 at 7x7
    // took 0.90x the time, 448 -> 128 at 28x28 0.94x, 320 -> 128 at 28x28
    // 0.96x, 384 -> 96 at 14x14 0.97x.
    let weights_fit = icb * obt * BLOCK * BLOCK * size_of::<f32>() <= sweep_bytes;
    // Where neither fits, the reduction is split into equal chunks of
    // input blocks, each swept in turn, its run's input within
    // `sweep_bytes`: the tiles of output blocks start each chunk from the
    // sums the last one stored, and the fused residual and clamp come with
    // the last. On AVX2 (Zen 1, the kernel alone, two threads, hot, 11
    // paired rounds) that took 0.83-0.95x the time on the deep layers of
    // MobileNetV2, EfficientNet, ResNet-50 and GoogLeNet measured (960 ->
    // 320 at 7x7 0.89x, 576 -> 96 at 14x14 0.90x, 512 -> 128 at 28x28
    // 0.84x, 2048 -> 512 at 7x7 0.93x, 832 -> 128 at 7x7 0.91x; 576 -> 160
    // at 7x7 0.98-1.00x), about the same with chunks of 24-48 KB of input
    // (this budget, 28 KB, lies between); chunking layers whose tile of
    // weights fits already measured 0.93-1.08x, so they keep one chunk.
    // AVX-512 has a rule of its own: AVX512_CHUNK_BLOCKS.
    //
    // A narrow layer's input meets at most NARROW_BLOCKS / 2 tiles of output
    // blocks, so reading it into L1 the first time is most of what it
    // costs: its runs stay long and its reduction is split into chunks
    // whose input, and one tile of blocks' weights, fit `sweep_bytes`, so
    // that the first tile of blocks reads a few long sequential stretches
    // of input (one a block of the chunk) that the hardware prefetcher
    // follows, and the others find them in L1. Shortening the runs for the
    // whole reduction's input to fit L1 instead makes many short stretches.
    // On a Zen 3 (the kernel alone, buffers cold, a fused ReLU, the two
    // orders alternating in one process, 9 rounds), two threads: 256 -> 32
    // at 27x27 batch 10 0.69x the time, 384 -> 64 at 13x13 0.82x, 128 -> 16
    // at 55x55 0.82x, 192 -> 32 at 28x28 0.82x, 256 -> 64 at 56x56 0.87x,
    // 144 -> 24 at 56x56 0.86x, 512 -> 64 at 13x13 0.97x; wider layers
    // measured 1.02-1.04x that way (576 -> 96 at 14x14, 1024 -> 256 at
    // 14x14, 2048 -> 512 at 7x7), so they keep the rules above.
    // Input blocks of each of the equal chunks the reduction splits into,
    // a chunk at most `most` blocks (at least one).
    let equal_chunks = |most: usize| icb.div_ceil(icb.div_ceil(most.max(1)).max(1));
    // As many chunks as `sweep_bytes` needs when each block of a chunk
    // takes `per_block` bytes.
    let chunks_of = |per_block: usize| equal_chunks(sweep_bytes / per_block);
    let px_block = run_len * BLOCK * size_of::<f32>();
    let chunk = if narrow {
        chunks_of(px_block + obt * BLOCK * BLOCK * size_of::<f32>())
    } else if crate::isa::avx512() {
        equal_chunks(AVX512_CHUNK_BLOCKS)
    } else if input_fits || weights_fit || sweep_bytes == 0 {
        icb
    } else {
        chunks_of(px_block)
    };
    // No input channel: each tile stores its bias (and the fused residual
    // and clamp), which only the other order does without a chunk to sweep.
    let sweep = icb > 0 && (narrow || input_fits || weights_fit || chunk < icb);
    let tasks = s.batch * groups * runs;
    let bias = &packed[packed.len() - ocb * BLOCK..];
    let out = SharedMut(output.as_mut_ptr());
    let task = |t: usize| {
        let out = &out;
        let (n, rest) = (t / (groups * runs), t % (groups * runs));
        let (g, r) = (rest / runs, rest % runs);
        let ((ob0, ob1), (p0, p1)) = (group_of(g), run_of(r));
        let x = &input[n * icb * plane * BLOCK..][..icb * plane * BLOCK];
        let block_tiles = super::tile::BlockTiles::new(ob1 - ob0);
        // The register tiles of blocks from `ob` (in the group) from pixel
        // p, over input blocks c0..c1: the sums continued past c0 > 0, the
        // fused residual and clamp applied after the last block.
        let tile_chunk = |ob: usize, p: usize, c0: usize, c1: usize| {
            let ob = ob0 + ob;
            let at = ((n * ocb + ob) * plane + p) * BLOCK;
            let last = c1 == icb;
            let mut t = tile(
                x.as_ptr().wrapping_add(p * BLOCK),
                plane * BLOCK,
                icb,
                packed.as_ptr().wrapping_add(n * w_image + layout.start(ob)),
                w_stride,
                layout.pairs,
                bias.as_ptr().wrapping_add(ob * BLOCK),
                out.0.wrapping_add(at),
                plane * BLOCK,
                if last {
                    Fused {
                        residual: fused.residual.map(|r| &r[at..]),
                        clamp: fused.clamp,
                    }
                } else {
                    Fused::default()
                },
            );
            t.x = t.x.wrapping_add(c0 * plane * BLOCK);
            t.w = t.w.wrapping_add(c0 * BLOCK * BLOCK * unit);
            t.icb = c1 - c0;
            t.start = match (c0 > 0, onto_residual) {
                (true, _) => Start::Output,
                (false, true) => Start::OutputAndBias,
                (false, false) => Start::Bias,
            };
            t
        };
        let tile_at = |ob: usize, p: usize| tile_chunk(ob, p, 0, icb);
        // SAFETY (both orders): AVX2 and FMA (checked by the caller); a tile
        // reads its pixels of every input block of image n, the weights and
        // bias of its blocks, and writes those pixels of those output
        // blocks, which this task alone owns (the residual, checked, has
        // the output's length).
        if sweep {
            for c0 in (0..icb).step_by(chunk) {
                let c1 = (c0 + chunk).min(icb);
                for i in 0..block_tiles.count() {
                    let (ob, nob) = block_tiles.get(i);
                    unsafe { super::tile::row(nob, p1 - p0, &tile_chunk(ob, p0, c0, c1)) };
                }
            }
        } else {
            for (p, np) in super::tile::equal_tiles(p1 - p0, pt) {
                for i in 0..block_tiles.count() {
                    let (ob, nob) = block_tiles.get(i);
                    unsafe { super::tile::run(nob, np, &tile_at(ob, p0 + p)) };
                }
            }
        }
        if let Some(e) = epilogue {
            for ob in ob0..ob1 {
                let at = ((n * ocb + ob) * plane + p0) * BLOCK;
                // SAFETY: this strip belongs to this task's output.
                let strip =
                    unsafe { std::slice::from_raw_parts_mut(out.0.add(at), (p1 - p0) * BLOCK) };
                e(at, strip);
            }
        }
    };
    if threads > 1 && tasks > 1 {
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// Where the register tiles ([`super::tile`]) of a 1x1 convolution read
/// and write: `x` points at the first pixel in input block 0, with blocks
/// `x_stride` apart (`icb` of them); `w` at the first output block's packed
/// weights, blocks `w_stride` apart (pairs of blocks, where `w_pairs`,
/// see [`super::tile::Tile::w_pairs`]); `bias` at its bias; `out` at the first
/// pixel in the first output block, blocks `out_stride` apart; `fused`'s
/// residual, if any, at the same place in its tensor (the rest of which
/// follows).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn tile(
    x: *const f32,
    x_stride: usize,
    icb: usize,
    w: *const f32,
    w_stride: usize,
    w_pairs: bool,
    bias: *const f32,
    out: *mut f32,
    out_stride: usize,
    fused: Fused<'_>,
) -> super::tile::Tile<'static> {
    super::tile::Tile {
        x,
        x_block: x_stride,
        icb,
        last_lanes: BLOCK,
        taps: &[0],
        step: BLOCK,
        w,
        w_stride,
        w_pairs,
        bias,
        out,
        out_block: out_stride,
        blocked: true,
        lane: 0,
        valid: [BLOCK; super::tile::OBT_MAX],
        residual: fused.residual.map_or(std::ptr::null(), |r| r.as_ptr()),
        clamp: fused.clamp,
        start: Start::Bias,
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
pub(super) mod tests {
    use super::*;
    use crate::cpu::blocked::{blocked_len, from_blocked, to_blocked};
    use crate::cpu::test_util::{cast, Rng};

    /// A layer's random operands, in f64 and NCHW, and what they make.
    pub(in crate::cpu::blocked) struct Case {
        pub s: Pointwise,
        pub x: Vec<f64>,
        pub w: Vec<f64>,
        pub b: Vec<f64>,
        pub residual: Vec<f64>,
        /// The input and residual in the blocked layout, the weights and
        /// bias (if `bias`) packed, all f32.
        pub xb: Vec<f32>,
        pub rb: Vec<f32>,
        pub packed: Vec<f32>,
    }

    impl Case {
        pub fn new(s: Pointwise, bias: bool, seed: u64) -> Self {
            let mut rng = Rng::new(seed);
            let x = rng.vec(s.batch * s.in_channels * s.in_plane());
            let w = rng.vec(s.out_channels * s.in_channels);
            let b = rng.vec(s.out_channels);
            let residual = rng.vec(s.batch * s.out_channels * s.plane);
            let xb = blocked(&x, s.batch, s.in_channels, s.in_plane());
            let rb = blocked(&residual, s.batch, s.out_channels, s.plane);
            let mut packed = vec![f32::NAN; s.packed_len().unwrap()];
            let bf: Vec<f32> = cast(&b);
            pack(&s, &cast::<f32>(&w), bias.then_some(&bf[..]), &mut packed).unwrap();
            let b = if bias { b } else { vec![0.0; s.out_channels] };
            Case {
                s,
                x,
                w,
                b,
                residual,
                xb,
                rb,
                packed,
            }
        }

        /// The layer in f64, NCHW, with input channel `i` of image `n`
        /// first multiplied by `scale[n % batch][i]` if given (`scale`'s
        /// images), then the residual added and a ReLU.
        pub fn want(&self, scale: Option<(&[f64], usize)>) -> Vec<f64> {
            let s = &self.s;
            let in_plane = s.in_plane();
            // The input pixel output pixel q reads.
            let src = |q: usize| match s.subsample {
                None => q,
                Some(u) => {
                    let ow = u.out_hw().1;
                    (q / ow) * u.stride.0 * u.in_w + (q % ow) * u.stride.1
                }
            };
            let mut want = vec![0.0f64; self.residual.len()];
            for n in 0..s.batch {
                for o in 0..s.out_channels {
                    for q in 0..s.plane {
                        let mut acc = self.b[o];
                        for i in 0..s.in_channels {
                            let c =
                                scale.map_or(1.0, |(v, images)| v[n % images * s.in_channels + i]);
                            acc += self.w[o * s.in_channels + i]
                                * self.x[(n * s.in_channels + i) * in_plane + src(q)]
                                * c;
                        }
                        let k = (n * s.out_channels + o) * s.plane + q;
                        want[k] = (acc + self.residual[k]).max(0.0);
                    }
                }
            }
            want
        }

        /// The residual and a ReLU as an epilogue over the blocked output,
        /// and as fused.
        pub fn epilogue(&self) -> impl Fn(usize, &mut [f32]) + Sync + '_ {
            |at: usize, strip: &mut [f32]| {
                for (o, r) in strip.iter_mut().zip(&self.rb[at..]) {
                    *o = (*o + r).max(0.0);
                }
            }
        }
        pub fn fused(&self) -> Fused<'_> {
            Fused {
                residual: Some(&self.rb),
                clamp: Some((0.0, f32::INFINITY)),
            }
        }

        /// Checks the blocked output `ob` against `want`: finite (padding
        /// lanes too), and within f32's rounding of the reduction.
        pub fn check(&self, ob: &[f32], want: &[f64], what: &str) {
            let s = &self.s;
            assert!(ob.iter().all(|v| v.is_finite()), "{s:?} {what}");
            let mut got = vec![0.0f32; want.len()];
            from_blocked(s.batch, s.out_channels, s.plane, ob, &mut got).unwrap();
            let tol = 1e-4 * (s.in_channels.max(1) as f64).sqrt();
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                assert!(
                    (*g as f64 - w).abs() <= tol * (1.0 + w.abs()),
                    "{s:?} {what} at {i}: {g} vs {w}"
                );
            }
        }
    }

    /// A stride-1 layer: `(batch, in_channels, out_channels, plane)`.
    pub(in crate::cpu::blocked) fn plain(
        (batch, in_channels, out_channels, plane): (usize, usize, usize, usize),
    ) -> Pointwise {
        Pointwise {
            batch,
            in_channels,
            out_channels,
            plane,
            subsample: None,
        }
    }

    /// `v` (`[n, c, plane]`) in the blocked layout, as f32.
    pub(in crate::cpu::blocked) fn blocked(
        v: &[f64],
        n: usize,
        c: usize,
        plane: usize,
    ) -> Vec<f32> {
        let mut out = vec![0.0f32; blocked_len(n, c, plane).unwrap()];
        to_blocked(n, c, plane, &cast::<f32>(v), &mut out).unwrap();
        out
    }

    fn case(s: Pointwise, bias: bool) {
        let c = Case::new(
            s,
            bias,
            (s.in_channels * 13 + s.out_channels * 7 + s.plane) as u64,
        );
        let want = c.want(None);
        let e = c.epilogue();
        // Through conv2d, then each loop order whatever the ISA level's
        // choice (never sweeping, sweeping where runs fit, deep reductions
        // in chunks, and in many small chunks with a budget of 4 KB); the
        // residual and ReLU as an epilogue, fused, and with the output
        // holding the residual on entry (`conv2d_onto_residual`).
        let runs = [None, Some(0), Some(SWEEP_L1_BYTES), Some(4 << 10)];
        let relu = Some((0.0, f32::INFINITY));
        let fusions = [
            (Fused::default(), Some(&e as Epilogue<f32>), false),
            (c.fused(), None, false),
            (
                Fused {
                    residual: None,
                    clamp: relu,
                },
                None,
                true,
            ),
        ];
        for (sweep, (fused, epilogue, onto)) in
            runs.into_iter().flat_map(|r| fusions.map(|f| (r, f)))
        {
            let mut ob = if onto {
                c.rb.clone()
            } else {
                vec![f32::NAN; c.rb.len()]
            };
            match (sweep, onto) {
                (None, false) => conv2d(&s, &c.xb, &c.packed, &mut ob, fused, epilogue).unwrap(),
                (None, true) => {
                    conv2d_onto_residual(&s, &c.xb, &c.packed, &mut ob, relu, epilogue).unwrap()
                }
                (Some(bytes), _) => {
                    run_strided(&s, &c.xb, &c.packed, &mut ob, fused, epilogue, bytes, onto)
                        .unwrap()
                }
            }
            let what = format!("fused={} onto={onto} sweep={sweep:?}", epilogue.is_none());
            c.check(&ob, &want, &what);
        }
    }

    /// Partial blocks in and out, an odd number of output blocks, planes
    /// that leave partial tiles and several tasks, groups of blocks smaller
    /// than the layer (many input channels), both loop orders.
    fn grid() {
        let cases = [
            (1, 8, 8, 1),
            (1, 3, 5, 7),
            (2, 16, 24, 49),
            (1, 11, 19, 13),
            (1, 40, 40, 196),
            (3, 24, 144, 100),
            (1, 2000, 24, 9),
            (1, 32, 16, 1000),
            (2, 20, 72, 784),
            (1, 16, 40, 3136),
            // One output block: tiles of one block, whole and one pixel short.
            (1, 24, 8, 100),
            // Runs shortened for their input to fit sweep_input_bytes.
            (1, 128, 24, 784),
            // Too many input channels for a run of SWEEP_TILES tiles, or a
            // tile of blocks' weights, to fit sweep_input_bytes (on AVX-512,
            // more than AVX512_CHUNK_BLOCKS): chunks of input channels, with
            // a residual and a clamp applied after the last chunk only.
            (1, 512, 16, 196),
            (2, 1000, 40, 49),
            (1, 968, 24, 14),
            // No input channel: the output is the bias, fused or not.
            (1, 0, 16, 49),
            (2, 0, 72, 30),
            // A narrow layer (SqueezeNet's squeeze at batch 2): long runs,
            // its reduction in chunks.
            (2, 256, 32, 729),
            // Groups of output blocks and runs of pixels that do not
            // divide evenly: four groups of 5 blocks (tiles of 2 and 3),
            // and 131 tiles of pixels in ten runs.
            (1, 960, 160, 49),
            (1, 32, 192, 784),
            // An odd block count in groups: on AVX-512 (weights in pairs of
            // blocks) the groups start on pairs, the last pair half padding.
            (1, 1000, 136, 49),
        ]
        .map(plain);
        // Strided: ResNet's downsampling (even and odd planes), unequal
        // and larger strides, one pixel, partial blocks, several images.
        let strided = [
            (1, 64, 128, (56, 56), (2, 2)),
            (2, 40, 24, (15, 13), (2, 2)),
            (1, 11, 19, (9, 10), (2, 3)),
            (1, 16, 16, (7, 7), (3, 1)),
            (1, 24, 8, (1, 1), (2, 2)),
            (3, 512, 40, (14, 14), (2, 2)),
        ]
        .map(|(batch, ic, oc, (in_h, in_w), stride)| {
            let u = Subsample { in_h, in_w, stride };
            let (h, w) = u.out_hw();
            Pointwise {
                subsample: Some(u),
                ..plain((batch, ic, oc, h * w))
            }
        });
        for s in cases.into_iter().chain(strided) {
            for bias in [true, false] {
                case(s, bias);
            }
        }
    }

    #[test]
    fn a_strided_plane_that_is_not_the_subsampled_input_is_an_error() {
        if !crate::cpu::blocked::available() {
            return;
        }
        let s = Pointwise {
            batch: 1,
            in_channels: 8,
            out_channels: 8,
            plane: 16,
            subsample: Some(Subsample {
                in_h: 7,
                in_w: 7,
                stride: (2, 2),
            }),
        };
        let x = vec![0.0; blocked_len(1, 8, 49).unwrap()];
        let packed = vec![0.0; s.packed_len().unwrap()];
        let mut out = vec![0.0; blocked_len(1, 8, 16).unwrap()];
        // 7x7 at stride 2 is 4x4: right.
        conv2d(&s, &x, &packed, &mut out, Fused::default(), None).unwrap();
        for bad in [
            Pointwise { plane: 9, ..s },
            Pointwise {
                subsample: Some(Subsample {
                    in_h: 7,
                    in_w: 7,
                    stride: (0, 2),
                }),
                ..s
            },
        ] {
            let mut out = vec![0.0; blocked_len(1, 8, bad.plane).unwrap()];
            let err = conv2d(&bad, &x, &packed, &mut out, Fused::default(), None).unwrap_err();
            assert!(err.to_string().contains("strided 1x1"), "{err}");
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
}
