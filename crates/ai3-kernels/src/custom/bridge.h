// Glue between the cxx bridge (mod.rs) and the user's functions in
// cpp_custom/ (or AI3_CUSTOM_DIR). Each function converts ai3's views into
// ai3::Tensor, calls the user's code, and reports "not implemented" as a
// false return; every other exception propagates to Rust as an Err through
// cxx, non-std ones converted to std::runtime_error first.
#pragma once

#include <cstdint>

namespace ai3::bridge {

struct View;

bool conv2d(const View &input, const View &weight, const View &bias, bool has_bias,
            std::int64_t padding_h, std::int64_t padding_w, std::int64_t stride_h,
            std::int64_t stride_w, std::int64_t dilation_h, std::int64_t dilation_w,
            std::int64_t groups, const View &output);
bool linear(const View &input, const View &weight, const View &bias, bool has_bias,
            const View &output);
bool relu(const View &input, const View &output);
bool maxpool2d(const View &input, std::int64_t kernel_h, std::int64_t kernel_w,
               std::int64_t stride_h, std::int64_t stride_w, std::int64_t padding_h,
               std::int64_t padding_w, std::int64_t dilation_h, std::int64_t dilation_w,
               bool ceil_mode, const View &output);
bool avgpool2d(const View &input, std::int64_t kernel_h, std::int64_t kernel_w,
               std::int64_t stride_h, std::int64_t stride_w, std::int64_t padding_h,
               std::int64_t padding_w, bool ceil_mode, bool count_include_pad,
               std::int64_t divisor_override, const View &output);
bool adaptiveavgpool2d(const View &input, const View &output);
bool flatten(const View &input, std::int64_t start_dim, std::int64_t end_dim,
             const View &output);

/// The DEFAULT_<OP> constants of the user's headers, as a bitmask in the
/// order of `CustomOp` (bit 0: conv2d, bit 1: linear, ...).
std::uint32_t default_mask();

} // namespace ai3::bridge
