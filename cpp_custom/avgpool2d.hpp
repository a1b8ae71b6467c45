// avgpool2d.hpp: the custom avgpool2d (2-D average pooling, as torch.nn.functional.avg_pool2d).
//
// Implement `ai3::custom::avgpool2d` in avgpool2d.cpp, rebuild ai3 from source
// (`pip install .`, or `AI3_CUSTOM_DIR=/your/dir pip install .`), then select
// it with the algorithm name 'custom' (or with 'default' when DEFAULT_AVGPOOL2D is true).
// Check it against PyTorch with `python -m ai3 test --op avgpool2d --algorithm custom`.
#pragma once

#include "ai3.hpp"

#include <optional>

namespace ai3::custom {

/// When true, 'default' picks this implementation for every avgpool2d
/// (once it is implemented; until then 'default' keeps ai3's own choice).
/// Edit the value here, or build with -DAI3_DEFAULT_AVGPOOL2D=true in AI3_CXXFLAGS.
#ifndef AI3_DEFAULT_AVGPOOL2D
#define AI3_DEFAULT_AVGPOOL2D false
#endif
inline constexpr bool DEFAULT_AVGPOOL2D = AI3_DEFAULT_AVGPOOL2D;

/// output[n, c, y, x] = the sum of the window's input values divided by
///   divisor_override, when given; otherwise
///   the window's size clipped to the padded input when count_include_pad, or
///   the number of taps inside the input when not.
/// The window starts at (y * stride_h - padding_h, x * stride_w - padding_w)
/// and spans kernel_h x kernel_w.
///
/// input  [N, C, H, W]
/// output [N, C, OH, OW], already allocated (ceil_mode as in maxpool2d).
void avgpool2d(const Tensor &input, std::int64_t kernel_h, std::int64_t kernel_w,
               std::int64_t stride_h, std::int64_t stride_w, std::int64_t padding_h,
               std::int64_t padding_w, bool ceil_mode, bool count_include_pad,
               std::optional<std::int64_t> divisor_override, Tensor &output);

} // namespace ai3::custom
