// linear.hpp: the custom linear (a fully connected layer, as torch.nn.functional.linear).
//
// Implement `ai3::custom::linear` in linear.cpp, rebuild ai3 from source
// (`pip install .`, or `AI3_CUSTOM_DIR=/your/dir pip install .`), then select
// it with the algorithm name 'custom' (or with 'default' when DEFAULT_LINEAR is true).
// Check it against PyTorch with `python -m ai3 test --op linear --algorithm custom`.
#pragma once

#include "ai3.hpp"

namespace ai3::custom {

/// When true, 'default' picks this implementation for every linear
/// (once it is implemented; until then 'default' keeps ai3's own choice).
/// Edit the value here, or build with -DAI3_DEFAULT_LINEAR=true in AI3_CXXFLAGS.
#ifndef AI3_DEFAULT_LINEAR
#define AI3_DEFAULT_LINEAR false
#endif
inline constexpr bool DEFAULT_LINEAR = AI3_DEFAULT_LINEAR;

/// output[m, o] = bias[o] + sum over i of input[m, i] * weight[o, i]
///
/// input  [M, IN] (leading dimensions of the PyTorch input flattened into M)
/// weight [OUT, IN]
/// bias   [OUT], or nullptr
/// output [M, OUT], already allocated. An activation fused into the layer is
/// applied by ai3 afterwards.
void linear(const Tensor &input, const Tensor &weight, const Tensor *bias, Tensor &output);

} // namespace ai3::custom
