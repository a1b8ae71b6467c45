//! The algorithm registry: for each (operation, algorithm, device), whether it
//! is available in this build, whether it supports a given problem (and why
//! not), and the scratch memory it needs.
//!
//! Algorithm names appear only here. `SUPPORTED_ALGORITHMS`, `'default'`,
//! and every "which algorithm" error message are derived from [`REGISTRY`].
//! Adding an algorithm means adding a kernel, an entry below, and a match arm
//! in the operation that dispatches to it.

use std::fmt;

use ai3_kernels::cpu::attention::flash;
use ai3_kernels::cpu::conv2d::{depthwise, direct, fft, padded_copy_elements, tiled, winograd};
use ai3_kernels::custom::{self, CustomOp};
use ai3_kernels::params::{AttentionParams, Conv2dParams, LinearParams};

use crate::dtype::DType;
use crate::error::{Error, Result};

mod op_kind;
pub use op_kind::OpKind;

/// The algorithms ai3 knows, across all operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// The textbook loop nest.
    Direct,
    /// Scalar matrix multiplication with zero packing.
    Smm,
    /// Lowering to matrix multiplication (im2col for convolution).
    Gemm,
    /// Winograd minimal filtering, F(2x2, 3x3).
    Winograd,
    /// Products of Fourier transforms (convolution theorem).
    Fft,
    /// The user's C++ implementation from `cpp_custom/`.
    Custom,
    /// cuDNN's implicit GEMM (`CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM`).
    ImplicitGemm,
    /// cuDNN's implicit GEMM with a precomputed index (`..._IMPLICIT_PRECOMP_GEMM`).
    ImplicitPrecompGemm,
    /// cuDNN's Winograd with separate transform kernels (`..._WINOGRAD_NONFUSED`).
    WinogradNonfused,
    /// cuDNN's tiled FFT (`..._FFT_TILING`).
    FftTiling,
    /// cuDNN's heuristic choice (`cudnnGetConvolutionForwardAlgorithm_v7`).
    Guess,
    /// cuDNN's timed choice (`cudnnFindConvolutionForwardAlgorithm`), per layer signature.
    Find,
    /// Attention with the whole score matrix materialised.
    Naive,
    /// Attention tiled with an online softmax (FlashAttention's recurrence).
    Flash,
}

impl Algorithm {
    /// The name used in selectors and messages.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Direct => "direct",
            Algorithm::Smm => "smm",
            Algorithm::Gemm => "gemm",
            Algorithm::Winograd => "winograd",
            Algorithm::Fft => "fft",
            Algorithm::Custom => "custom",
            Algorithm::ImplicitGemm => "implicit gemm",
            Algorithm::ImplicitPrecompGemm => "implicit precomp gemm",
            Algorithm::WinogradNonfused => "winograd nonfused",
            Algorithm::FftTiling => "fft tiling",
            Algorithm::Guess => "guess",
            Algorithm::Find => "find",
            Algorithm::Naive => "naive",
            Algorithm::Flash => "flash",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Kinds of device an algorithm can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// Host CPU.
    Cpu,
    /// NVIDIA GPU through CUDA.
    Cuda,
}

impl DeviceKind {
    /// Name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        }
    }
}

/// The concrete problem an algorithm is asked to solve, for support checks
/// and workspace sizes.
#[derive(Clone, Copy, Debug)]
pub enum Problem {
    /// A convolution with its full geometry, in this element type.
    Conv2d(Conv2dParams, DType),
    /// A fully connected layer.
    Linear(LinearParams),
    /// Scaled dot-product attention.
    Attention(AttentionParams),
    /// Any operation whose algorithms accept every valid configuration.
    Elementwise {
        /// Number of elements touched.
        numel: usize,
    },
}

impl Problem {
    /// Rough cost in multiply-adds, saturating: those of a convolution, a
    /// linear layer or attention, and for other operations 8 per element
    /// (their time goes to memory traffic, about that of 8 multiply-adds in
    /// a GEMM). It only decides whether a run is worth spreading over threads.
    pub fn work(&self) -> usize {
        match self {
            Problem::Conv2d(p, _) => p.macs(),
            Problem::Linear(p) => p
                .rows
                .saturating_mul(p.in_features)
                .saturating_mul(p.out_features),
            Problem::Attention(p) => [p.heads, p.q_len, p.kv_len, p.head_dim + p.v_dim]
                .iter()
                .fold(p.batch, |a, &d| a.saturating_mul(d)),
            Problem::Elementwise { numel } => numel.saturating_mul(8),
        }
    }
}

/// One row of the registry.
pub struct AlgorithmInfo {
    /// The operation.
    pub op: OpKind,
    /// The algorithm.
    pub algorithm: Algorithm,
    /// The device kind it runs on.
    pub device: DeviceKind,
    /// One line on what it does, for listings.
    pub summary: &'static str,
    /// `Err(reason)` when this build or machine cannot run it at all.
    pub available: fn() -> std::result::Result<(), String>,
    /// `Err(reason)` when it cannot solve this problem.
    pub supports: fn(&Problem) -> std::result::Result<(), String>,
    /// Scratch bytes it needs beyond input, output and prepared weights.
    pub workspace_bytes: fn(&Problem, DType) -> usize,
    /// Whether `'default'` should pick it for this problem when it supports it;
    /// `'default'` falls back to the first supporting row if no row prefers the problem.
    pub preferred: fn(&Problem) -> bool,
}

fn everywhere(_: &Problem) -> bool {
    true
}

/// Groups with fewer input channels than this (an RGB input layer, depthwise
/// convolutions) are left to direct convolution by `'default'`.
const FEW_INPUT_CHANNELS: usize = 16;

/// Fewest input channels per group for which `'default'` takes Winograd.
///
/// Its input transform costs per tile in proportion to the input channels,
/// and below this it outweighs the 2.25x fewer multiplications in the NCHW
/// kernel these figures are from (the blocked kernel takes thinner layers,
/// [`thin_but_blocked_winograd`]). Measured
/// (2 threads, AVX2, batch 1, ms, Winograd against the best other): DenseNet's
/// 128 -> 32 at 56/28/14/7 1.49/0.48/0.19/0.09 against 2.15/0.66/0.21/0.10,
/// GoogLeNet-like 48 -> 64 at 28x28 0.40 against 0.43, 48 -> 48 even; but
/// 32 -> 128 at 27x27 0.53 against 0.47, 16 -> 64 at 55x55 0.55 against 0.46,
/// 32 -> 96 at 28x28 0.44 against 0.40, 24 -> 64 at 14x14 0.13 against 0.10.
const WINOGRAD_MIN_CHANNELS: usize = 48;

/// Whether a layer has too few input channels per group for Winograd (see
/// [`WINOGRAD_MIN_CHANNELS`]) and is not one that Winograd's blocked kernel
/// takes anyway ([`thin_but_blocked_winograd`]).
fn too_thin_for_winograd(p: &Conv2dParams, dtype: DType) -> bool {
    p.in_channels_per_group() < WINOGRAD_MIN_CHANNELS && !thin_but_blocked_winograd(p, dtype)
}

/// Fewest input channels of a thin layer (fewer than
/// [`WINOGRAD_MIN_CHANNELS`] inputs or at most [`THIN_OUTPUTS`] outputs) that
/// Winograd's blocked kernel takes, given [`THIN_WINOGRAD_TILES`].
const THIN_WINOGRAD_CHANNELS: usize = 16;

/// Fewest 2x2 output tiles (over the batch) of a thin layer that
/// Winograd's blocked kernel takes: 14x14 at batch 3, 28x28 at batch 1.
const THIN_WINOGRAD_TILES: usize = 128;

/// Fewest input channels of a thin layer that Winograd's blocked kernel
/// takes from [`MIN_WINOGRAD_TILES`] tiles on (DenseNet's 128 -> 32).
const WIDE_THIN_WINOGRAD_CHANNELS: usize = 128;

/// Whether Winograd's channel-blocked kernel (f32, one group, AVX2 and FMA)
/// runs a thin 3x3 layer faster than the blocked direct kernel: with at
/// least [`THIN_WINOGRAD_CHANNELS`] inputs and [`THIN_WINOGRAD_TILES`]
/// tiles, or [`WIDE_THIN_WINOGRAD_CHANNELS`] inputs and
/// [`MIN_WINOGRAD_TILES`]. Measured in the networks (2 threads, AVX2, ms
/// summed over the layers of that shape, each with its ReLU, Winograd
/// against direct; batch 1 unless said): SqueezeNet's 16 -> 64 at 55x55
/// 0.46 against 0.71, batch 10 5.2 against 7.3; GoogLeNet's 16 -> 32 at
/// 28x28 0.061 against 0.085, batch 10 0.37 against 0.57, and at 14x14
/// batch 10 16 -> 48 0.13 against 0.23, 24 -> 64 0.46 against 0.84;
/// DenseNet's 128 -> 32 at 14x14 1.64 against 2.48 (24 layers), 7x7 0.55
/// against 0.59. Left to direct, few tiles and inputs: at 14x14 16 -> 48
/// 0.064 against 0.041, 24 -> 64 0.156 against 0.116, 32 -> 64 0.077
/// against 0.068, 32 -> 128 0.126 against 0.120; 32 -> 128 at 7x7 0.062
/// against 0.045. (Before the Winograd products ran a row of tiles in one
/// loop, the limits were 32 inputs and 128 tiles.)
fn thin_but_blocked_winograd(p: &Conv2dParams, dtype: DType) -> bool {
    let tiles = p.batch * p.out_h().div_ceil(2) * p.out_w().div_ceil(2);
    let channels = p.in_channels_per_group();
    dtype == DType::F32
        && winograd::runs_blocked::<f32>(p)
        && ((channels >= THIN_WINOGRAD_CHANNELS && tiles >= THIN_WINOGRAD_TILES)
            || (channels >= WIDE_THIN_WINOGRAD_CHANNELS && tiles >= MIN_WINOGRAD_TILES))
}

/// Winograd for layers with at least [`WINOGRAD_MIN_CHANNELS`] input
/// channels per group and [`MIN_WINOGRAD_TILES`] output tiles, however few
/// the pixels: at 13x13 64 -> 64 measured 0.13 ms against 0.14 (direct) and
/// 0.17 (GEMM), 64 -> 256 0.40 against 0.45; at 7x7 128 -> 128 0.20 against
/// 0.30, 512 -> 512 1.30 against GEMM's 2.08.
fn winograd_preferred(problem: &Problem) -> bool {
    matches!(problem, Problem::Conv2d(p, dtype) if {
        let tiles = p.batch * p.out_h().div_ceil(2) * p.out_w().div_ceil(2);
        !too_thin_for_winograd(p, *dtype) && tiles >= MIN_WINOGRAD_TILES && !blocked_direct_preferred(p, *dtype)
    })
}

/// Whether direct convolution's channel-blocked kernel (f32, one group,
/// AVX2 and FMA: see `direct::blocked`) takes `p`: stride-1 layers with a
/// kernel larger than 1x1 and at least [`FEW_INPUT_CHANNELS`] inputs,
/// except the 3x3 ones Winograd runs as fast (those with many input
/// channels, unless they have at most [`THIN_OUTPUTS`] outputs, and the
/// thin ones with many tiles, [`thin_but_blocked_winograd`]). Measured (2
/// threads, AVX2, ms, the blocked kernel against what `'default'` ran
/// before, Winograd's NCHW kernel then): DenseNet's 128 -> 32 at 14x14 0.111 against 0.146 (Winograd),
/// 7x7 0.055 against 0.085, at batch 10 0.39-0.41 against 0.41-0.44;
/// SqueezeNet's 16 -> 64 at 55x55 0.349 against 0.429 (GEMM's tiles);
/// GoogLeNet's 5x5 32 -> 64 at 14x14 0.133 against 0.244 and AlexNet's 64
/// -> 192 at 27x27 2.49 against 3.29 (GEMM); Inception's 1x7 and 7x1
/// layers at 17x17 0.40-0.92 against 0.53-1.07. Alone, DenseNet's thin
/// layers at 28x28 measured even with Winograd (0.39-0.56 against
/// 0.41-0.55) and at 56x56 slower (1.49 against 1.33), but the blocked
/// kernel also reads and writes the channel-blocked layout, so with them
/// DenseNet's dense blocks run blocked from end to end: densenet121 0.92x
/// the time with them on Winograd at batch 1, 0.93x at batch 10 (own
/// processes, alternating). Left to the others: 256 -> 256 at 14x14 (1.33
/// against 0.92), 1x1 strided layers (see
/// [`strided_blocked_direct`], which once left the 3x3 ones out too: 128
/// -> 128 stride 2 at 56x56 measured 1.76 against GEMM's 1.70 before the
/// tile's later changes), RGB input layers (3 -> 32 3x3 stride 2 0.35
/// against 0.25). The 3x3 figures predate Winograd's blocked products
/// running a row of tiles in one loop; since then Winograd takes the thin
/// layers [`thin_but_blocked_winograd`] names, DenseNet's and SqueezeNet's
/// among them.
fn blocked_direct_preferred(p: &Conv2dParams, dtype: DType) -> bool {
    let blocked = match dtype {
        DType::F32 => direct::runs_blocked::<f32>(p),
        DType::F64 => direct::runs_blocked::<f64>(p),
    };
    let beats_winograd = (p.in_channels_per_group() < WINOGRAD_MIN_CHANNELS
        || p.out_channels <= THIN_OUTPUTS)
        && !thin_but_blocked_winograd(p, dtype);
    let shape = (p.stride == (1, 1) && p.kernel_h * p.kernel_w > 1) || strided_blocked_direct(p);
    blocked
        && p.in_channels >= FEW_INPUT_CHANNELS
        && shape
        && padded_copy_is_small(p)
        && (winograd::check(p).is_err() || beats_winograd)
}

/// Whether a strided layer goes to the blocked direct kernel: 3x3 ones
/// (ResNet's stride-2 layers), and with AVX-512, whose register tile (4
/// blocks of 8 output channels by 12 pixels, two blocks per zmm register)
/// is twice the AVX2 one's, every other kernel larger than 1x1 (ConvNeXt's
/// 2x2 downsampling). On AVX2 (Zen 4, 2 threads, batch 1, in the network)
/// resnet50's 3x3 stride-2 layers took 1.49, 1.56 and 1.77 ms against
/// 1.87, 1.85 and 2.12 on GEMM (which also needs them reordered to NCHW
/// and back). Strided 1x1 layers stay on GEMM, whose blocked 1x1 kernel
/// gathers the pixels they read and keeps the blocked layout: on AVX2
/// (the same run) resnet50's took 1.55, 1.46 and 1.81 ms there against
/// 1.74, 1.68 and 1.69 on the direct kernel; on an Intel Xeon with
/// AVX-512 (2 threads, the network profiled, weights in pairs, two runs
/// each) 0.87-0.91, 0.90-0.95 and 1.23-1.25 ms against 1.73-1.80,
/// 1.09-1.11 and 1.21 at batch 1, and 8.6-8.7, 9.1-9.5 and 9.3-9.5
/// against 17.1-17.8, 11.5-12.1 and 10.4-10.8 at batch 10. (On a Zen 5
/// with AVX-512, before the 1x1 kernel took strides on channel blocks,
/// the direct kernel had won there.) End to end on that Xeon (two builds
/// in their own processes, alternating): resnet50 0.95x the time at batch
/// 1, 0.88x at batch 10.
fn strided_blocked_direct(p: &Conv2dParams) -> bool {
    let k = (p.kernel_h, p.kernel_w);
    p.stride != (1, 1) && (k == (3, 3) || (ai3_kernels::isa::avx512() && k != (1, 1)))
}

/// Most output channels of a 3x3 layer that the blocked direct kernel runs
/// rather than Winograd (see [`blocked_direct_preferred`]).
const THIN_OUTPUTS: usize = 32;

/// Fewest 2x2 output tiles (over the batch) for Winograd: a 7x7 plane has
/// 16. Its transformed filters are 16/9 of the weights and each is read once
/// per block of tiles, so below this it streams more weights than GEMM per
/// output.
const MIN_WINOGRAD_TILES: usize = 16;

/// With few input channels per group im2col unrolls a short, wide matrix that
/// costs as much to build as to multiply; direct convolution's register tiles
/// read the input in place and measured 1.3-1.8x faster than im2col + GEMM on
/// the 3-channel input layers of resnet50, alexnet and squeezenet (batch 1 and
/// 10) and on stride-1 depthwise layers. Depthwise layers of any stride up
/// to 4 run on direct's dedicated depthwise path; grouped layers with a few
/// channels per group and a stride go to GEMM, which measured 2x faster. Direct also takes
/// the 3x3 stride-1 layers too thin for Winograd (see [`too_thin_for_winograd`]),
/// where it measured as fast as GEMM or faster.
///
/// Direct (like SMM and FFT) works on a zero-padded copy of the input, so a
/// padding far larger than the input (which PyTorch computes) goes to GEMM,
/// whose im2col only holds the output's windows.
///
/// Layers without groups that GEMM runs on f32 register tiles, each thread
/// unrolling its own columns (see [`tiles_preferred`]), go to GEMM instead.
fn direct_preferred(problem: &Problem) -> bool {
    matches!(problem, Problem::Conv2d(p, dtype)
        if blocked_direct_preferred(p, *dtype) || ((p.in_channels_per_group() < FEW_INPUT_CHANNELS
            && (p.groups == 1 || p.stride == (1, 1) || depthwise::applies(p)))
            || (winograd::check(p).is_ok() && too_thin_for_winograd(p, *dtype)))
            && padded_copy_is_small(p)
            && !tiles_preferred(p, *dtype))
}

/// Whether GEMM runs `p` on the f32 register tiles with enough blocks of
/// pixels for each thread to unroll its own columns (`tiled::applies`), in a
/// layer without groups. There it measured 10-35% faster than direct
/// convolution (2 threads, AVX2, batch 1): on the 3x3 RGB input layers of
/// squeezenet1_1 (1.03 -> 0.66 ms) and mobilenet_v2 (0.77 -> 0.58; again
/// 0.44 -> 0.26 after later changes), and on squeezenet1_1's thin 3x3 layers
/// (16 -> 64 at 55x55: 0.71 -> 0.61; 32 -> 128 at 27x27: 0.68 -> 0.55).
///
/// Not for RGB layers with large kernels ([`LARGE_KERNEL_TAPS`]), where
/// im2col gathers many scattered values per column: direct measured 1.64
/// against 1.84 ms on the 7x7 stride-2 layer of resnet50/densenet121/
/// googlenet and 1.35 against 1.48 on alexnet's 11x11 stride-4 one.
///
/// Nor, with AVX-512, for layers of fewer than 8 input channels, which
/// direct's blocked kernel reads NCHW and writes channel-blocked
/// (`direct::reads_nchw_into_blocked`), so the next layers need no reorder:
/// the 3x3 stride-2 RGB layers at batch 10 (Zen 5, 2 threads, profiled in
/// the network, the layer and the one after it) took 1.08 + 0.75 ms
/// against GEMM's 1.75 + 1.04 in mobilenet_v2, 1.34 + 1.04 against 2.04 +
/// 1.33 in efficientnet_b0, 1.66 + 1.07 (its pooling) + 0.29 against 2.55
/// + 0.85 + 0.42 in squeezenet1_1.
fn tiles_preferred(p: &Conv2dParams, dtype: DType) -> bool {
    let large_rgb_kernel = p.in_channels_per_group() < FEW_INPUT_CHANNELS
        && p.kernel_h * p.kernel_w >= LARGE_KERNEL_TAPS;
    let into_blocks = ai3_kernels::isa::avx512() && image_into_blocks(p, dtype);
    dtype == DType::F32
        && p.groups == 1
        && tiled::applies::<f32>(p)
        && !large_rgb_kernel
        && !into_blocks
}

/// Whether `'default'` runs `p` on direct's blocked kernel wherever the
/// layer's output is planned channel-blocked (see [`crate::layout`]): an
/// f32 layer without groups and with fewer input channels than a block (an
/// RGB input layer), which that kernel reads NCHW as it lies
/// (`direct::reads_nchw_into_blocked`) and writes in blocks, so that the
/// blocked run starts with no reorder. With AVX-512 [`resolve`] picks
/// direct for such layers in any layout (`tiles_preferred`); with AVX2,
/// where GEMM's tiles stay the NCHW choice (direct measured 1.7-6% slower
/// for swapped networks, whose layers write NCHW), the planned layout
/// decides: mobilenet_v2 converted 0.99x the time at batch 1 and 0.98x at
/// batch 10, squeezenet1_1 0.99x, efficientnet_b0 1.0x (Zen 4, 2 threads,
/// paired processes).
pub fn image_into_blocks(p: &Conv2dParams, dtype: DType) -> bool {
    dtype == DType::F32
        && p.groups == 1
        && p.in_channels < ai3_kernels::cpu::blocked::BLOCK
        && direct::reads_nchw_into_blocked(p)
        && padded_copy_is_small(p)
}

/// Kernel taps (`kernel_h * kernel_w`) from which a layer with few input
/// channels goes to direct convolution rather than GEMM's tiles: 5x5 on.
const LARGE_KERNEL_TAPS: usize = 25;

/// Whether a padded copy of the input costs at most 16 times the input (or 64 Ki
/// elements per plane).
fn padded_copy_is_small(p: &ai3_kernels::params::Conv2dParams) -> bool {
    let pad = &p.padding;
    let h = p.in_h.saturating_add(pad.top).saturating_add(pad.bottom);
    let w = p.in_w.saturating_add(pad.left).saturating_add(pad.right);
    h.saturating_mul(w) <= (p.in_h * p.in_w).saturating_mul(16).saturating_add(1 << 16)
}

fn gemm_preferred(problem: &Problem) -> bool {
    !direct_preferred(problem)
}

fn always() -> std::result::Result<(), String> {
    Ok(())
}

fn any_problem(_: &Problem) -> std::result::Result<(), String> {
    Ok(())
}

fn no_workspace(_: &Problem, _: DType) -> usize {
    0
}

/// The zero-padded copy of the input that direct convolution and SMM work on.
fn padded_copy_workspace(problem: &Problem, dtype: DType) -> usize {
    match problem {
        // Saturating: an estimate, for sizes that may not fit.
        Problem::Conv2d(p, _) => padded_copy_elements(p)
            .unwrap_or(usize::MAX)
            .saturating_mul(dtype.size()),
        _ => 0,
    }
}

fn winograd_supports(problem: &Problem) -> std::result::Result<(), String> {
    match problem {
        Problem::Conv2d(p, _) => winograd::check(p),
        _ => Err("winograd applies to conv2d only".into()),
    }
}

fn im2col_workspace(problem: &Problem, dtype: DType) -> usize {
    match problem {
        Problem::Conv2d(p, _) => [
            p.in_channels_per_group(),
            p.kernel_h,
            p.kernel_w,
            p.out_h(),
            p.out_w(),
            dtype.size(),
        ]
        .into_iter()
        .fold(1, usize::saturating_mul),
        _ => 0,
    }
}

/// Input spectra of a chunk of the batch plus per-thread accumulators, all complex.
fn fft_workspace(problem: &Problem, dtype: DType) -> usize {
    match problem {
        // Saturating: an estimate, for sizes that may not fit.
        Problem::Conv2d(p, _) => fft::workspace_complex_elements(p)
            .unwrap_or(usize::MAX)
            .saturating_mul(2 * dtype.size()),
        _ => 0,
    }
}

/// FFT convolution is never `'default'`'s choice: it pays only for large
/// kernels on large images, and every shape has a faster or equal row above it.
fn never(_: &Problem) -> bool {
    false
}

fn winograd_workspace(problem: &Problem, dtype: DType) -> usize {
    match problem {
        Problem::Conv2d(p, _) => {
            let tiles = p.out_h().div_ceil(2).saturating_mul(p.out_w().div_ceil(2));
            let channels = p.in_channels_per_group() + p.out_channels_per_group();
            [16, tiles, channels, dtype.size()]
                .into_iter()
                .fold(1, usize::saturating_mul)
        }
        _ => 0,
    }
}

/// How many attention heads run at once: each holds its own scratch.
fn concurrent_heads(p: &AttentionParams) -> usize {
    (p.batch * p.heads).clamp(1, crate::threads::num_threads().max(1))
}

/// Naive attention's score matrices, one per head running at once.
fn naive_attention_workspace(problem: &Problem, dtype: DType) -> usize {
    match problem {
        Problem::Attention(p) => [p.q_len, p.kv_len, concurrent_heads(p), dtype.size()]
            .into_iter()
            .fold(1, usize::saturating_mul),
        _ => 0,
    }
}

/// Flash attention's blocks, one per thread, independent of the sequence
/// length; in f32 with AVX-512 also each running head's packed keys, linear in it.
fn flash_attention_workspace(problem: &Problem, dtype: DType) -> usize {
    match problem {
        Problem::Attention(p) => {
            let blocks = [
                flash::scratch_len(p),
                crate::threads::num_threads().max(1),
                dtype.size(),
            ]
            .into_iter()
            .fold(1, usize::saturating_mul);
            let keys = match dtype {
                DType::F32 => flash::packed_keys_len(p)
                    .saturating_mul(concurrent_heads(p))
                    .saturating_mul(4),
                _ => 0,
            };
            blocks.saturating_add(keys)
        }
        _ => 0,
    }
}

/// `'default'` takes flash attention from this many keys on, where it
/// measured as fast as naive attention and needs far less memory.
const FLASH_FROM_KV_LEN: usize = 512;

fn flash_preferred(problem: &Problem) -> bool {
    matches!(problem, Problem::Attention(p) if p.kv_len >= FLASH_FROM_KV_LEN || p.causal)
}

/// The registry row of the user's C++ `op` (`cpp_custom/<op>.cpp`): available
/// once implemented, preferred by `'default'` when its header sets `DEFAULT_<OP>`.
macro_rules! custom_row {
    ($op:ident) => {
        AlgorithmInfo {
            op: OpKind::$op,
            algorithm: Algorithm::Custom,
            device: DeviceKind::Cpu,
            summary: "the user's C++ implementation (cpp_custom/)",
            available: || custom::implemented(CustomOp::$op),
            supports: any_problem,
            workspace_bytes: no_workspace,
            preferred: |_| custom::is_default(CustomOp::$op),
        }
    };
}

/// Why no CUDA row can run in this build: the GPU backend (cuDNN and cuBLAS
/// loaded at run time through cudarc) is not built yet. Its rows are listed so
/// that their names are known and selecting one says why it cannot run.
fn no_cuda_backend() -> std::result::Result<(), String> {
    Err(
        "this build of ai3 has no CUDA backend yet (cuDNN and cuBLAS are not built in); \
         models run on the CPU"
            .into(),
    )
}

/// A row of a cuDNN / cuBLAS algorithm on CUDA devices.
macro_rules! cuda_row {
    ($op:ident, $algo:ident, $summary:expr) => {
        AlgorithmInfo {
            op: OpKind::$op,
            algorithm: Algorithm::$algo,
            device: DeviceKind::Cuda,
            summary: $summary,
            available: no_cuda_backend,
            supports: any_problem,
            workspace_bytes: no_workspace,
            preferred: never,
        }
    };
}

macro_rules! row {
    ($op:ident, $algo:ident, $summary:expr) => {
        row!($op, $algo, $summary, always, any_problem, no_workspace)
    };
    ($op:ident, $algo:ident, $summary:expr, $avail:expr, $supports:expr, $ws:expr) => {
        row!($op, $algo, $summary, $avail, $supports, $ws, everywhere)
    };
    ($op:ident, $algo:ident, $summary:expr, $avail:expr, $supports:expr, $ws:expr, $pref:expr) => {
        AlgorithmInfo {
            op: OpKind::$op,
            algorithm: Algorithm::$algo,
            device: DeviceKind::Cpu,
            summary: $summary,
            available: $avail,
            supports: $supports,
            workspace_bytes: $ws,
            preferred: $pref,
        }
    };
}

/// Every algorithm ai3 knows, with the first available supporting entry per
/// operation being what `'default'` picks on the CPU.
pub static REGISTRY: &[AlgorithmInfo] = &[
    // The user's C++ comes first so that `DEFAULT_<OP> = true` wins; `'default'`
    // never falls back to it otherwise (see `resolve`).
    custom_row!(Conv2d),
    custom_row!(Linear),
    custom_row!(Relu),
    custom_row!(MaxPool2d),
    custom_row!(AvgPool2d),
    custom_row!(AdaptiveAvgPool2d),
    custom_row!(Flatten),
    // Winograd comes first: where it applies (3x3, stride 1, dilation 1) it
    // does 2.25x fewer multiplications than im2col + GEMM and measures faster
    // on every VGG/ResNet-like shape but those with few input channels, which
    // it leaves to direct convolution (see `direct_preferred`); GEMM takes
    // every other configuration.
    row!(
        Conv2d,
        Winograd,
        "Winograd F(2x2,3x3) or F(4x4,3x3): 3x3 kernels, stride 1, dilation 1",
        always,
        winograd_supports,
        winograd_workspace,
        winograd_preferred
    ),
    row!(
        Conv2d,
        Gemm,
        "im2col + blocked GEMM; f32 on register tiles (1x1, or enough pixels)",
        always,
        any_problem,
        im2col_workspace,
        gemm_preferred
    ),
    row!(
        Conv2d,
        Direct,
        "direct loop nest over output pixels",
        always,
        any_problem,
        padded_copy_workspace,
        direct_preferred
    ),
    row!(
        Conv2d,
        Smm,
        "scalar matrix multiplication with zero packing",
        always,
        any_problem,
        padded_copy_workspace
    ),
    row!(
        Conv2d,
        Fft,
        "FFT of padded planes, products summed over channels in frequency",
        always,
        any_problem,
        fft_workspace,
        never
    ),
    row!(
        Linear,
        Gemm,
        "f32, AVX-512: 12x32 tiles, weight packed once; else blocked GEMM"
    ),
    // cuDNN's forward algorithms and cuBLAS, by the names the reference ai3 uses.
    cuda_row!(Conv2d, ImplicitGemm, "cuDNN implicit GEMM"),
    cuda_row!(
        Conv2d,
        ImplicitPrecompGemm,
        "cuDNN implicit GEMM, precomputed indices"
    ),
    cuda_row!(Conv2d, Gemm, "cuDNN explicit GEMM"),
    cuda_row!(Conv2d, Winograd, "cuDNN Winograd"),
    cuda_row!(
        Conv2d,
        WinogradNonfused,
        "cuDNN Winograd, separate transforms"
    ),
    cuda_row!(Conv2d, Fft, "cuDNN FFT"),
    cuda_row!(Conv2d, FftTiling, "cuDNN tiled FFT"),
    cuda_row!(Conv2d, Guess, "cuDNN's heuristic pick"),
    cuda_row!(Conv2d, Find, "cuDNN's timed pick, cached per layer"),
    cuda_row!(Linear, Gemm, "cuBLAS GEMM"),
    row!(Relu, Direct, "elementwise max(x, 0)"),
    row!(MaxPool2d, Direct, "window maximum"),
    row!(AvgPool2d, Direct, "window mean"),
    row!(AdaptiveAvgPool2d, Direct, "adaptive window mean"),
    row!(Flatten, Direct, "copy under a new shape"),
    row!(Relu6, Direct, "elementwise min(max(x, 0), 6)"),
    row!(Hardtanh, Direct, "elementwise clamp"),
    row!(Hardswish, Direct, "elementwise x * relu6(x + 3) / 6"),
    row!(Hardsigmoid, Direct, "elementwise relu6(x + 3) / 6"),
    row!(Silu, Direct, "elementwise x * sigmoid(x)"),
    row!(Sigmoid, Direct, "elementwise 1 / (1 + exp(-x))"),
    row!(Gelu, Direct, "elementwise GELU (erf or tanh form)"),
    row!(Tanh, Direct, "elementwise tanh"),
    row!(Add, Direct, "broadcast loop over collapsed dimensions"),
    row!(Sub, Direct, "broadcast loop over collapsed dimensions"),
    row!(Mul, Direct, "broadcast loop over collapsed dimensions"),
    row!(Div, Direct, "broadcast loop over collapsed dimensions"),
    row!(Cat, Direct, "row-wise copies"),
    row!(Softmax, Direct, "max-subtracted exp and sum"),
    row!(
        BatchNorm2d,
        Direct,
        "per-channel scale and shift folded at build time"
    ),
    row!(LayerNorm, Direct, "two-pass row statistics"),
    row!(AdaptiveMaxPool2d, Direct, "adaptive window maximum"),
    row!(Mean, Direct, "f64 sums over collapsed dimensions"),
    row!(Permute, Direct, "strided copy over merged dimensions"),
    row!(Reshape, Direct, "copy under a new shape"),
    row!(Slice, Direct, "row-wise copy of one piece"),
    row!(
        Matmul,
        Gemm,
        "one blocked GEMM per batch, broadcast batches not copied"
    ),
    row!(
        Expand,
        Direct,
        "strided copy, repeated dimensions read with stride 0"
    ),
    row!(Index, Direct, "strided copy of the indexed view"),
    row!(Pad, Direct, "row copies into a filled output"),
    row!(Roll, Direct, "row copies in two rotated segments"),
    row!(Normalize, Direct, "sum of squares, then one scaling pass"),
    row!(Embedding, Direct, "row copies from the table"),
    row!(Sum, Direct, "f64 sums over collapsed dimensions"),
    row!(Squeeze, Direct, "copy under a new shape"),
    row!(
        Attention,
        Flash,
        "query and key blocks, online softmax; memory linear in length",
        always,
        any_problem,
        flash_attention_workspace,
        flash_preferred
    ),
    row!(
        Attention,
        Naive,
        "whole score matrix per head: GEMM, softmax, GEMM",
        always,
        any_problem,
        naive_attention_workspace
    ),
    row!(
        MultiheadAttention,
        Flash,
        "projections, then flash attention over the split heads",
        always,
        any_problem,
        flash_attention_workspace,
        flash_preferred
    ),
    row!(
        MultiheadAttention,
        Naive,
        "projections, then naive attention over the split heads",
        always,
        any_problem,
        naive_attention_workspace
    ),
];

/// The registry rows of one operation on one device kind.
pub fn entries(op: OpKind, device: DeviceKind) -> impl Iterator<Item = &'static AlgorithmInfo> {
    REGISTRY
        .iter()
        .filter(move |e| e.op == op && e.device == device)
}

/// The names a user may select for `op`: every registered algorithm (in
/// registry order, ai3's own first), then `'custom'` where it exists, then `'default'`.
pub fn selectable_names(op: OpKind) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = Vec::new();
    let rows = REGISTRY.iter().filter(|e| e.op == op);
    let (custom, own): (Vec<_>, Vec<_>) = rows.partition(|e| e.algorithm == Algorithm::Custom);
    for e in own.into_iter().chain(custom) {
        if !names.contains(&e.algorithm.name()) {
            names.push(e.algorithm.name());
        }
    }
    names.push("default");
    names
}

/// What the registry says about one algorithm for one problem: what
/// exploration chooses among.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// `Some(reason)` when it cannot run this problem here (unavailable in
    /// this build, or the configuration is unsupported).
    pub unusable: Option<String>,
    /// Scratch bytes it needs beyond input, output and prepared weights.
    pub workspace_bytes: usize,
}

/// Every algorithm of `op` on `device`, in registry order, with whether it
/// can run `problem` and the scratch memory it needs in `dtype`.
pub fn candidates(
    op: OpKind,
    device: DeviceKind,
    problem: &Problem,
    dtype: DType,
) -> Vec<Candidate> {
    entries(op, device)
        .map(|e| Candidate {
            algorithm: e.algorithm,
            unusable: (e.available)().and_then(|()| (e.supports)(problem)).err(),
            workspace_bytes: (e.workspace_bytes)(problem, dtype),
        })
        .collect()
}

/// What a user asked for: a named algorithm or ai3's choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// ai3 picks (the first available supporting registry entry).
    Default,
    /// This algorithm, or an error saying why it cannot run.
    Named(Algorithm),
}

impl Request {
    /// Parses a selector string for `op`; unknown names list the valid ones.
    pub fn parse(op: OpKind, name: &str) -> Result<Self> {
        if name == "default" {
            return Ok(Request::Default);
        }
        REGISTRY
            .iter()
            .find(|e| e.op == op && e.algorithm.name() == name)
            .map(|e| Request::Named(e.algorithm))
            .ok_or_else(|| {
                let hint = if name == "torch" {
                    " ('torch' keeps the PyTorch module and only applies to swap_operation)"
                } else {
                    ""
                };
                Error::algorithm(
                    op.name(),
                    format!(
                        "unknown algorithm '{name}'{hint}; choose one of {:?}",
                        selectable_names(op)
                    ),
                )
            })
    }
}

/// Whether `request` for `op` runs the user's C++: `'custom'`, or `'default'`
/// when the op's header sets `DEFAULT_<OP>` and the function is implemented.
pub fn runs_custom(op: OpKind, request: Request) -> bool {
    match request {
        Request::Named(a) => a == Algorithm::Custom,
        Request::Default => op
            .custom()
            .is_some_and(|c| custom::is_default(c) && custom::implemented(c).is_ok()),
    }
}

/// Resolves a request to the algorithm that will run on `device` for `problem`.
pub fn resolve(
    op: OpKind,
    request: Request,
    device: DeviceKind,
    problem: &Problem,
) -> Result<Algorithm> {
    match request {
        Request::Named(algo) => {
            let entry = entries(op, device)
                .find(|e| e.algorithm == algo)
                .ok_or_else(|| {
                    let elsewhere: Vec<&str> = REGISTRY
                        .iter()
                        .filter(|e| e.op == op && e.algorithm == algo)
                        .map(|e| e.device.name())
                        .collect();
                    Error::algorithm(
                        op.name(),
                        format!(
                            "algorithm '{algo}' runs on {} only and this model runs on the {}; \
                             choose one of {:?}",
                            elsewhere.join(", "),
                            device.name(),
                            entries(op, device)
                                .map(|e| e.algorithm.name())
                                .collect::<Vec<_>>()
                        ),
                    )
                })?;
            (entry.available)().map_err(|why| {
                Error::algorithm(
                    op.name(),
                    format!("algorithm '{algo}' is unavailable: {why}"),
                )
            })?;
            (entry.supports)(problem).map_err(|why| {
                Error::algorithm(
                    op.name(),
                    format!("algorithm '{algo}' does not support this configuration: {why}"),
                )
            })?;
            Ok(algo)
        }
        Request::Default => {
            let usable =
                |e: &&AlgorithmInfo| (e.available)().is_ok() && (e.supports)(problem).is_ok();
            // Preference is checked first: it is cheap, and the user's C++ is
            // probed only when its header asks to be the default.
            entries(op, device)
                .find(|e| (e.preferred)(problem) && usable(e))
                .or_else(|| {
                    entries(op, device)
                        .filter(|e| e.algorithm != Algorithm::Custom)
                        .find(usable)
                })
                .map(|e| e.algorithm)
                .ok_or_else(|| {
                    Error::algorithm(
                        op.name(),
                        format!(
                            "no algorithm on {} supports this configuration",
                            device.name()
                        ),
                    )
                })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ai3_kernels::params::Padding2d;

    /// A 3x3 layer, 4 -> 4 channels at 8x8, batch 1, padding 1.
    fn conv_params() -> Conv2dParams {
        Conv2dParams {
            batch: 1,
            in_channels: 4,
            in_h: 8,
            in_w: 8,
            out_channels: 4,
            kernel_h: 3,
            kernel_w: 3,
            stride: (1, 1),
            padding: Padding2d::symmetric(1, 1),
            dilation: (1, 1),
            groups: 1,
        }
    }

    fn conv(k: usize, stride: usize) -> Problem {
        Problem::Conv2d(
            Conv2dParams {
                kernel_h: k,
                kernel_w: k,
                stride: (stride, stride),
                ..conv_params()
            },
            DType::F64,
        )
    }

    #[test]
    fn default_prefers_winograd_only_where_it_pays() {
        let with_channels = |c: usize, k: usize, stride: usize| match conv(k, stride) {
            // 256 output pixels: enough for Winograd on 64 -> 64.
            Problem::Conv2d(p, d) => Problem::Conv2d(
                Conv2dParams {
                    in_channels: c,
                    out_channels: c,
                    in_h: 16,
                    in_w: 16,
                    ..p
                },
                d,
            ),
            other => other,
        };
        let pick = |p: Problem| resolve(OpKind::Conv2d, Request::Default, DeviceKind::Cpu, &p);
        assert_eq!(pick(with_channels(64, 3, 1)).unwrap(), Algorithm::Winograd);
        // On few pixels too, from 48 input channels on.
        let few_pixels = |c: usize| match with_channels(c, 3, 1) {
            Problem::Conv2d(p, d) => Problem::Conv2d(
                Conv2dParams {
                    in_h: 13,
                    in_w: 13,
                    ..p
                },
                d,
            ),
            other => other,
        };
        assert_eq!(pick(few_pixels(64)).unwrap(), Algorithm::Winograd);
        assert_eq!(pick(few_pixels(48)).unwrap(), Algorithm::Winograd);
        assert_eq!(pick(few_pixels(32)).unwrap(), Algorithm::Direct);
        // A thin layer stays off Winograd however wide its output.
        let thin = match with_channels(32, 3, 1) {
            Problem::Conv2d(p, d) => Problem::Conv2d(
                Conv2dParams {
                    out_channels: 512,
                    ..p
                },
                d,
            ),
            other => other,
        };
        assert_ne!(pick(thin).unwrap(), Algorithm::Winograd);
        // Planes under 7x7 (fewer than MIN_WINOGRAD_TILES tiles) go to GEMM
        // until the batch brings enough tiles.
        let plane = |c: usize, hw: usize, batch: usize| match with_channels(c, 3, 1) {
            Problem::Conv2d(p, d) => Problem::Conv2d(
                Conv2dParams {
                    batch,
                    in_h: hw,
                    in_w: hw,
                    ..p
                },
                d,
            ),
            other => other,
        };
        assert_eq!(pick(plane(512, 7, 1)).unwrap(), Algorithm::Winograd);
        assert_eq!(pick(plane(512, 5, 1)).unwrap(), Algorithm::Gemm);
        assert_eq!(pick(plane(512, 5, 2)).unwrap(), Algorithm::Winograd);
        assert_eq!(pick(plane(512, 7, 10)).unwrap(), Algorithm::Winograd);
        let plane_7x7 = |c: usize, batch: usize| plane(c, 7, batch);
        assert_eq!(pick(plane_7x7(32, 10)).unwrap(), Algorithm::Direct);
        assert_eq!(pick(with_channels(32, 3, 1)).unwrap(), Algorithm::Direct);
        assert_eq!(pick(with_channels(16, 3, 1)).unwrap(), Algorithm::Direct);
        assert_eq!(pick(with_channels(3, 3, 1)).unwrap(), Algorithm::Direct);
        assert_eq!(pick(with_channels(3, 7, 2)).unwrap(), Algorithm::Direct);
        assert_eq!(pick(with_channels(64, 3, 2)).unwrap(), Algorithm::Gemm);
        assert_eq!(pick(with_channels(64, 1, 1)).unwrap(), Algorithm::Gemm);
    }

    #[test]
    fn default_gives_thin_f32_layers_to_the_tiles_where_the_cpu_has_them() {
        let f32_conv = |c: usize, k: usize, stride: usize, groups: usize| match conv(k, stride) {
            Problem::Conv2d(p, _) => Problem::Conv2d(
                Conv2dParams {
                    in_channels: c,
                    out_channels: c,
                    in_h: 16,
                    in_w: 16,
                    groups,
                    ..p
                },
                DType::F32,
            ),
            other => other,
        };
        let pick = |p: Problem| resolve(OpKind::Conv2d, Request::Default, DeviceKind::Cpu, &p);
        let thin = match tiled::supports::<f32>() {
            true => Algorithm::Gemm,
            false => Algorithm::Direct,
        };
        // RGB layers: the tiles, but with AVX-512 direct's blocked kernel,
        // which reads them NCHW and writes channel blocks. Planned blocked,
        // that kernel wherever the CPU has it (`image_into_blocks`); not in
        // f64, nor for a whole block of input channels.
        let rgb = f32_conv(3, 3, 2, 1);
        let into_blocks = match &rgb {
            Problem::Conv2d(p, _) => {
                let blocks = direct::reads_nchw_into_blocked(p);
                assert_eq!(image_into_blocks(p, DType::F32), blocks);
                assert!(!image_into_blocks(p, DType::F64));
                let full = Conv2dParams {
                    in_channels: 8,
                    ..*p
                };
                assert!(!image_into_blocks(&full, DType::F32));
                blocks && ai3_kernels::isa::avx512()
            }
            _ => unreachable!(),
        };
        let rgb_pick = if into_blocks { Algorithm::Direct } else { thin };
        assert_eq!(pick(rgb).unwrap(), rgb_pick);
        // Stride-1 layers with 16 inputs or more go to direct's channel
        // blocks where the CPU has them.
        let blocked = direct::runs_blocked::<f32>(&conv_params());
        let thin_stride_1 = if blocked { Algorithm::Direct } else { thin };
        assert_eq!(pick(f32_conv(16, 3, 1, 1)).unwrap(), thin_stride_1);
        // Strided 3x3 layers with 16 inputs or more go to direct's channel
        // blocks where the CPU has them, 2x2 ones with AVX-512 only, 1x1
        // ones (ResNet's downsampling) never: GEMM's blocked 1x1 kernel.
        let blocked = direct::runs_blocked::<f32>(&conv_params());
        for (k, strided) in [
            (3, blocked),
            (2, blocked && ai3_kernels::isa::avx512()),
            (1, false),
        ] {
            let on_direct = pick(f32_conv(64, k, 2, 1)).unwrap() == Algorithm::Direct;
            assert_eq!(on_direct, strided, "{k}x{k} stride 2");
        }
        // RGB layers with large kernels go to direct.
        assert_eq!(pick(f32_conv(3, 7, 2, 1)).unwrap(), Algorithm::Direct);
        assert_eq!(pick(f32_conv(3, 5, 1, 1)).unwrap(), Algorithm::Direct);
        // Depthwise and grouped layers stay where they were, as does Winograd.
        assert_eq!(pick(f32_conv(32, 3, 1, 32)).unwrap(), Algorithm::Direct);
        assert_eq!(pick(f32_conv(32, 3, 1, 4)).unwrap(), Algorithm::Direct);
        assert_eq!(pick(f32_conv(64, 3, 1, 1)).unwrap(), Algorithm::Winograd);
    }

    #[test]
    fn default_gives_thin_outputs_and_large_kernels_to_direct_channel_blocks() {
        // DenseNet's 128 -> 32 3x3 layers, GoogLeNet's 5x5 ones.
        let layer = |ic: usize, oc: usize, k: usize, hw: usize, dtype: DType| {
            Problem::Conv2d(
                Conv2dParams {
                    in_channels: ic,
                    out_channels: oc,
                    kernel_h: k,
                    kernel_w: k,
                    in_h: hw,
                    in_w: hw,
                    padding: Padding2d::symmetric(k / 2, k / 2),
                    ..conv_params()
                },
                dtype,
            )
        };
        let pick = |p: Problem| resolve(OpKind::Conv2d, Request::Default, DeviceKind::Cpu, &p);
        let blocked = direct::runs_blocked::<f32>(&conv_params());
        let (thin, wide) = if blocked {
            (Algorithm::Direct, Algorithm::Direct)
        } else {
            (Algorithm::Winograd, Algorithm::Gemm)
        };
        // DenseNet's 128 -> 32 goes to Winograd's blocked kernel from 16
        // tiles (7x7) on; a 5x5 output (9 tiles) to direct's blocked
        // kernel, or without blocked kernels to GEMM (too few tiles for
        // Winograd).
        let batch =
            |n: usize, ic: usize, oc: usize, hw: usize| match layer(ic, oc, 3, hw, DType::F32) {
                Problem::Conv2d(p, d) => Problem::Conv2d(Conv2dParams { batch: n, ..p }, d),
                other => other,
            };
        let many = if blocked { Algorithm::Winograd } else { thin };
        for (n, hw, want) in [
            (1, 5, wide),
            (1, 7, many),
            (1, 14, many),
            (10, 14, many),
            (1, 28, many),
            (1, 56, many),
        ] {
            assert_eq!(
                pick(batch(n, 128, 32, hw)).unwrap(),
                want,
                "batch {n}, {hw}x{hw}"
            );
        }
        // Fewer inputs take Winograd from 128 tiles (14x14 at batch 3, 28x28
        // at batch 1) on; without the blocked kernel they stay with direct.
        let few = if blocked {
            Algorithm::Winograd
        } else {
            Algorithm::Direct
        };
        for (n, ic, oc, hw, want) in [
            (1, 32, 128, 14, Algorithm::Direct),
            (2, 32, 128, 14, Algorithm::Direct),
            (3, 32, 128, 14, few),
            (1, 16, 48, 14, Algorithm::Direct),
            (10, 16, 48, 14, few),
            (1, 16, 32, 28, few),
            (1, 24, 64, 56, few),
        ] {
            assert_eq!(
                pick(batch(n, ic, oc, hw)).unwrap(),
                want,
                "{ic} -> {oc}, batch {n}, {hw}x{hw}"
            );
        }
        // Fewer than 16 inputs never take Winograd.
        assert_ne!(
            pick(layer(8, 64, 3, 56, DType::F32)).unwrap(),
            Algorithm::Winograd
        );
        // More outputs and f64 stay with Winograd.
        assert_eq!(
            pick(layer(128, 64, 3, 14, DType::F32)).unwrap(),
            Algorithm::Winograd
        );
        assert_eq!(
            pick(layer(128, 32, 3, 14, DType::F64)).unwrap(),
            Algorithm::Winograd
        );
        assert_eq!(pick(layer(32, 64, 5, 14, DType::F32)).unwrap(), wide);
    }

    #[test]
    fn default_leaves_depthwise_to_direct_and_strided_groups_to_gemm() {
        let grouped = |stride: usize, groups: usize| match conv(3, stride) {
            Problem::Conv2d(p, d) => Problem::Conv2d(
                Conv2dParams {
                    in_channels: 32,
                    out_channels: 32,
                    groups,
                    ..p
                },
                d,
            ),
            other => other,
        };
        let pick = |p: Problem| resolve(OpKind::Conv2d, Request::Default, DeviceKind::Cpu, &p);
        assert_eq!(pick(grouped(1, 32)).unwrap(), Algorithm::Direct);
        assert_eq!(pick(grouped(2, 32)).unwrap(), Algorithm::Direct);
        // Two channels per group is not depthwise: strided, it goes to GEMM.
        assert_eq!(pick(grouped(2, 16)).unwrap(), Algorithm::Gemm);
    }

    #[test]
    fn fft_supports_everything_but_is_never_default() {
        for problem in [conv(3, 1), conv(3, 2), conv(1, 1)] {
            let named = resolve(
                OpKind::Conv2d,
                Request::Named(Algorithm::Fft),
                DeviceKind::Cpu,
                &problem,
            );
            assert_eq!(named.unwrap(), Algorithm::Fft);
            let picked = resolve(OpKind::Conv2d, Request::Default, DeviceKind::Cpu, &problem);
            assert_ne!(picked.unwrap(), Algorithm::Fft);
        }
        assert_eq!(
            Request::parse(OpKind::Conv2d, "fft").unwrap(),
            Request::Named(Algorithm::Fft)
        );
    }

    #[test]
    fn every_operation_has_a_cpu_row() {
        for &op in OpKind::ALL {
            assert!(entries(op, DeviceKind::Cpu).next().is_some(), "{op}");
        }
    }

    #[test]
    fn every_operation_has_a_default() {
        for &op in OpKind::ALL {
            let problem = if op == OpKind::Conv2d {
                conv(3, 1)
            } else {
                Problem::Elementwise { numel: 1 }
            };
            assert!(
                resolve(op, Request::Default, DeviceKind::Cpu, &problem).is_ok(),
                "{op}"
            );
        }
    }

    #[test]
    fn winograd_rejects_strided_with_reason() {
        let err = resolve(
            OpKind::Conv2d,
            Request::Named(Algorithm::Winograd),
            DeviceKind::Cpu,
            &conv(3, 2),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("stride"), "{err}");
        assert!(resolve(
            OpKind::Conv2d,
            Request::Named(Algorithm::Winograd),
            DeviceKind::Cpu,
            &conv(3, 1)
        )
        .is_ok());
    }

    #[test]
    fn candidates_say_why_not_and_count_scratch() {
        let strided = candidates(OpKind::Conv2d, DeviceKind::Cpu, &conv(3, 2), DType::F32);
        let get = |a: Algorithm| strided.iter().find(|c| c.algorithm == a).unwrap();
        assert!(get(Algorithm::Winograd)
            .unusable
            .as_deref()
            .unwrap()
            .contains("stride"));
        assert_eq!(get(Algorithm::Gemm).unusable, None);
        // im2col of a 3x3 stride-2 conv over 4 channels of 8x8 (padding 1): 4*9*4*4 floats.
        assert_eq!(get(Algorithm::Gemm).workspace_bytes, 4 * 9 * 16 * 4);
        // Direct's padded copy: 10 rows of 2 phases x 5 columns per channel, plus slack.
        assert_eq!(
            get(Algorithm::Direct).workspace_bytes,
            (4 * 10 * 10 + 64) * 4
        );
        let f64s = candidates(OpKind::Conv2d, DeviceKind::Cpu, &conv(3, 2), DType::F64);
        let f64_direct = f64s
            .iter()
            .find(|c| c.algorithm == Algorithm::Direct)
            .unwrap();
        assert_eq!(
            f64_direct.workspace_bytes,
            2 * get(Algorithm::Direct).workspace_bytes
        );
    }

    #[test]
    fn cudnn_names_parse_and_say_they_need_a_gpu() {
        let guess = Request::parse(OpKind::Conv2d, "implicit precomp gemm").unwrap();
        let err = resolve(OpKind::Conv2d, guess, DeviceKind::Cpu, &conv(3, 1))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("'implicit precomp gemm' runs on cuda only"),
            "{err}"
        );
        let on_gpu = resolve(
            OpKind::Conv2d,
            Request::Named(Algorithm::Gemm),
            DeviceKind::Cuda,
            &conv(3, 1),
        )
        .unwrap_err()
        .to_string();
        assert!(on_gpu.contains("no CUDA backend"), "{on_gpu}");
        // 'default' on the CPU never lands on a GPU row.
        let picked = resolve(
            OpKind::Linear,
            Request::Default,
            DeviceKind::Cpu,
            &conv(3, 1),
        );
        assert_eq!(picked.unwrap(), Algorithm::Gemm);
    }

    #[test]
    fn unknown_and_unavailable_names_explain_themselves() {
        let err = Request::parse(OpKind::Relu, "smm").unwrap_err().to_string();
        assert!(err.contains("'smm'") && err.contains("direct"), "{err}");
        let custom = Request::parse(OpKind::Conv2d, "custom").unwrap();
        let err = resolve(OpKind::Conv2d, custom, DeviceKind::Cpu, &conv(3, 1))
            .unwrap_err()
            .to_string();
        if custom::built_from_stock() {
            assert!(err.contains("custom conv2d is not implemented"), "{err}");
            assert!(err.contains("conv2d.cpp"), "{err}");
        }
    }
}
