//! Shared inputs for ai3's criterion benchmarks (see `kernels.rs`).

use ai3_kernels::params::{Conv2dParams, Padding2d};

/// The ai3 paper's four convolution shapes `(in_channels, out_channels, size)`:
/// batch 10, 3x3 kernels, padding 1.
pub const PAPER_CONV_SHAPES: [(usize, usize, usize); 4] =
    [(3, 64, 224), (64, 128, 112), (256, 256, 28), (512, 512, 14)];

/// 3x3 layers `(in_channels, out_channels, size)` of GoogLeNet (28, 14, 7),
/// ResNet-50 (56) and SqueezeNet (13), for Winograd's two layouts.
pub const WINOGRAD_LAYOUT_SHAPES: [(usize, usize, usize); 6] = [
    (96, 128, 28),
    (160, 320, 14),
    (192, 384, 7),
    (64, 64, 56),
    (256, 256, 14),
    (64, 256, 13),
];

/// 1x1 layers (in channels, out channels, plane side) of the blocked 1x1
/// benchmark: EfficientNet-B0's 16 -> 96 expansion at 112x112 and 112 ->
/// 672 at 14x14, MobileNetV2's 144 -> 24 projection at 56x56, ResNet-50's
/// 256 -> 64 at 56x56 and 1024 -> 256 at 14x14, and MobileNetV2's
/// 24 -> 144 expansion at 56x56 and 32 -> 16 projection at 112x112.
pub const POINTWISE_SHAPES: [(usize, usize, usize); 7] = [
    (16, 96, 112),
    (24, 144, 56),
    (32, 16, 112),
    (112, 672, 14),
    (144, 24, 56),
    (256, 64, 56),
    (1024, 256, 14),
];

/// Parameters of a 3x3, padding-1, stride-1 convolution.
pub fn conv3x3(batch: usize, cin: usize, cout: usize, size: usize) -> Conv2dParams {
    Conv2dParams {
        batch,
        in_channels: cin,
        in_h: size,
        in_w: size,
        out_channels: cout,
        kernel_h: 3,
        kernel_w: 3,
        stride: (1, 1),
        padding: Padding2d::symmetric(1, 1),
        dilation: (1, 1),
        groups: 1,
    }
}

/// Deterministic pseudo-random values in [-1, 1).
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}
