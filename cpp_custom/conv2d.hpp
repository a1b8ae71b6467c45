// conv2d.hpp: the custom conv2d (a 2-D convolution, as torch.nn.functional.conv2d with zero padding).
//
// Implement `ai3::custom::conv2d` in conv2d.cpp, rebuild ai3 from source
// (`pip install .`, or `AI3_CUSTOM_DIR=/your/dir pip install .`), then select
// it with the algorithm name 'custom' (or with 'default' when DEFAULT_CONV2D is true).
// Check it against PyTorch with `python -m ai3 test --op conv2d --algorithm custom`.
#pragma once

#include "ai3.hpp"

namespace ai3::custom {

/// When true, 'default' picks this implementation for every conv2d
/// (once it is implemented; until then 'default' keeps ai3's own choice).
/// Edit the value here, or build with -DAI3_DEFAULT_CONV2D=true in AI3_CXXFLAGS.
#ifndef AI3_DEFAULT_CONV2D
#define AI3_DEFAULT_CONV2D false
#endif
inline constexpr bool DEFAULT_CONV2D = AI3_DEFAULT_CONV2D;

/// output[n, o, y, x] = bias[o] + the sum, over the input channels c of o's
/// group and the taps (ky, kx), of
///     input[n, c, y * stride_h - padding_h + ky * dilation_h,
///                 x * stride_w - padding_w + kx * dilation_w] * weight[o, c', ky, kx]
/// where positions outside the input count as zero and c' = c modulo C / groups.
///
/// input  [N, C, H, W]
/// weight [O, C / groups, KH, KW]
/// bias   [O], or nullptr when the layer has none
/// output [N, O, OH, OW] with OH = (H + 2 * padding_h - dilation_h * (KH - 1) - 1) / stride_h + 1
///        (and likewise OW); already allocated, write every element.
///
/// Other padding modes (reflect, replicate, circular) and uneven padding
/// ('same' with an even kernel) reach you already applied to `input`, with
/// padding 0. An activation fused into the layer is applied by ai3 afterwards.
void conv2d(const Tensor &input, const Tensor &weight, const Tensor *bias,
            std::int64_t padding_h, std::int64_t padding_w, std::int64_t stride_h,
            std::int64_t stride_w, std::int64_t dilation_h, std::int64_t dilation_w,
            std::int64_t groups, Tensor &output);

} // namespace ai3::custom
