// relu.hpp: the custom relu (max(x, 0) elementwise, as torch.relu).
//
// Implement `ai3::custom::relu` in relu.cpp, rebuild ai3 from source
// (`pip install .`, or `AI3_CUSTOM_DIR=/your/dir pip install .`), then select
// it with the algorithm name 'custom' (or with 'default' when DEFAULT_RELU is true).
// Check it against PyTorch with `python -m ai3 test --op relu --algorithm custom`.
#pragma once

#include "ai3.hpp"

namespace ai3::custom {

/// When true, 'default' picks this implementation for every relu
/// (once it is implemented; until then 'default' keeps ai3's own choice).
/// Edit the value here, or build with -DAI3_DEFAULT_RELU=true in AI3_CXXFLAGS.
#ifndef AI3_DEFAULT_RELU
#define AI3_DEFAULT_RELU false
#endif
inline constexpr bool DEFAULT_RELU = AI3_DEFAULT_RELU;

/// output[i] = max(input[i], 0), with NaN kept as NaN.
///
/// input and output have the same shape (any rank); output is already allocated.
void relu(const Tensor &input, Tensor &output);

} // namespace ai3::custom
