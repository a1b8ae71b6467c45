// flatten.hpp: the custom flatten (torch.flatten: dimensions start_dim..end_dim merged into one).
//
// Implement `ai3::custom::flatten` in flatten.cpp, rebuild ai3 from source
// (`pip install .`, or `AI3_CUSTOM_DIR=/your/dir pip install .`), then select
// it with the algorithm name 'custom' (or with 'default' when DEFAULT_FLATTEN is true).
// Check it against PyTorch with `python -m ai3 test --op flatten --algorithm custom`.
#pragma once

#include "ai3.hpp"

namespace ai3::custom {

/// When true, 'default' picks this implementation for every flatten
/// (once it is implemented; until then 'default' keeps ai3's own choice).
/// Edit the value here, or build with -DAI3_DEFAULT_FLATTEN=true in AI3_CXXFLAGS.
#ifndef AI3_DEFAULT_FLATTEN
#define AI3_DEFAULT_FLATTEN false
#endif
inline constexpr bool DEFAULT_FLATTEN = AI3_DEFAULT_FLATTEN;

/// The elements of `input` in order, under output's shape: dimensions
/// start_dim..=end_dim (non-negative, already normalised) merged into one.
///
/// input  any shape
/// output the flattened shape, already allocated.
void flatten(const Tensor &input, std::int64_t start_dim, std::int64_t end_dim, Tensor &output);

} // namespace ai3::custom
