// adaptiveavgpool2d.hpp: the custom adaptiveavgpool2d (adaptive 2-D average pooling, as torch.nn.functional.adaptive_avg_pool2d).
//
// Implement `ai3::custom::adaptiveavgpool2d` in adaptiveavgpool2d.cpp, rebuild ai3 from source
// (`pip install .`, or `AI3_CUSTOM_DIR=/your/dir pip install .`), then select
// it with the algorithm name 'custom' (or with 'default' when DEFAULT_ADAPTIVEAVGPOOL2D is true).
// Check it against PyTorch with `python -m ai3 test --op adaptiveavgpool2d --algorithm custom`.
#pragma once

#include "ai3.hpp"

namespace ai3::custom {

/// When true, 'default' picks this implementation for every adaptiveavgpool2d
/// (once it is implemented; until then 'default' keeps ai3's own choice).
/// Edit the value here, or build with -DAI3_DEFAULT_ADAPTIVEAVGPOOL2D=true in AI3_CXXFLAGS.
#ifndef AI3_DEFAULT_ADAPTIVEAVGPOOL2D
#define AI3_DEFAULT_ADAPTIVEAVGPOOL2D false
#endif
inline constexpr bool DEFAULT_ADAPTIVEAVGPOOL2D = AI3_DEFAULT_ADAPTIVEAVGPOOL2D;

/// output[n, c, y, x] = the mean of input[n, c, h0:h1, w0:w1] with
///   h0 = floor(y * H / output_h), h1 = ceil((y + 1) * H / output_h)
/// (and likewise along the width).
///
/// input  [N, C, H, W]
/// output [N, C, output_h, output_w], already allocated.
void adaptiveavgpool2d(const Tensor &input, std::int64_t output_h, std::int64_t output_w,
                       Tensor &output);

} // namespace ai3::custom
