// maxpool2d.hpp: the custom maxpool2d (2-D max pooling, as torch.nn.functional.max_pool2d).
//
// Implement `ai3::custom::maxpool2d` in maxpool2d.cpp, rebuild ai3 from source
// (`pip install .`, or `AI3_CUSTOM_DIR=/your/dir pip install .`), then select
// it with the algorithm name 'custom' (or with 'default' when DEFAULT_MAXPOOL2D is true).
// Check it against PyTorch with `python -m ai3 test --op maxpool2d --algorithm custom`.
#pragma once

#include "ai3.hpp"

namespace ai3::custom {

/// When true, 'default' picks this implementation for every maxpool2d
/// (once it is implemented; until then 'default' keeps ai3's own choice).
/// Edit the value here, or build with -DAI3_DEFAULT_MAXPOOL2D=true in AI3_CXXFLAGS.
#ifndef AI3_DEFAULT_MAXPOOL2D
#define AI3_DEFAULT_MAXPOOL2D false
#endif
inline constexpr bool DEFAULT_MAXPOOL2D = AI3_DEFAULT_MAXPOOL2D;

/// output[n, c, y, x] = the maximum of input[n, c, y * stride_h - padding_h + ky * dilation_h,
///                                            x * stride_w - padding_w + kx * dilation_w]
/// over the taps 0 <= ky < kernel_h, 0 <= kx < kernel_w that fall inside the
/// input (padding never wins); a NaN in the window makes the output NaN.
///
/// input  [N, C, H, W]
/// output [N, C, OH, OW], already allocated; OH follows PyTorch's formula,
///        rounding up when ceil_mode is true (a window must start inside the
///        input or its left padding).
void maxpool2d(const Tensor &input, std::int64_t kernel_h, std::int64_t kernel_w,
               std::int64_t stride_h, std::int64_t stride_w, std::int64_t padding_h,
               std::int64_t padding_w, std::int64_t dilation_h, std::int64_t dilation_w,
               bool ceil_mode, Tensor &output);

} // namespace ai3::custom
