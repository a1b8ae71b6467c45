#include "ai3-kernels/src/custom/bridge.h"

#include <exception>
#include <stdexcept>
#include <vector>

#include "ai3-kernels/src/custom/mod.rs.h"
#include "adaptiveavgpool2d.hpp"
#include "ai3.hpp"
#include "avgpool2d.hpp"
#include "conv2d.hpp"
#include "flatten.hpp"
#include "linear.hpp"
#include "maxpool2d.hpp"
#include "relu.hpp"

namespace ai3::bridge {
namespace {

Tensor tensor(const View &v) {
    std::vector<std::int64_t> shape(v.shape.begin(), v.shape.end());
    return Tensor(reinterpret_cast<void *>(v.data), static_cast<DType>(v.dtype), std::move(shape));
}

/// Runs the user's code: true if it ran, false if it threw NotImplemented.
template <class F> bool guarded(F &&f) {
    try {
        f();
        return true;
    } catch (const NotImplemented &) {
        return false;
    } catch (const std::exception &) {
        throw;
    } catch (...) {
        throw std::runtime_error("threw something that is not a std::exception");
    }
}

} // namespace

bool conv2d(const View &input, const View &weight, const View &bias, bool has_bias,
            std::int64_t padding_h, std::int64_t padding_w, std::int64_t stride_h,
            std::int64_t stride_w, std::int64_t dilation_h, std::int64_t dilation_w,
            std::int64_t groups, const View &output) {
    return guarded([&] {
        Tensor out = tensor(output);
        Tensor b = tensor(bias);
        custom::conv2d(tensor(input), tensor(weight), has_bias ? &b : nullptr, padding_h,
                       padding_w, stride_h, stride_w, dilation_h, dilation_w, groups, out);
    });
}

bool linear(const View &input, const View &weight, const View &bias, bool has_bias,
            const View &output) {
    return guarded([&] {
        Tensor out = tensor(output);
        Tensor b = tensor(bias);
        custom::linear(tensor(input), tensor(weight), has_bias ? &b : nullptr, out);
    });
}

bool relu(const View &input, const View &output) {
    return guarded([&] {
        Tensor out = tensor(output);
        custom::relu(tensor(input), out);
    });
}

bool maxpool2d(const View &input, std::int64_t kernel_h, std::int64_t kernel_w,
               std::int64_t stride_h, std::int64_t stride_w, std::int64_t padding_h,
               std::int64_t padding_w, std::int64_t dilation_h, std::int64_t dilation_w,
               bool ceil_mode, const View &output) {
    return guarded([&] {
        Tensor out = tensor(output);
        custom::maxpool2d(tensor(input), kernel_h, kernel_w, stride_h, stride_w, padding_h,
                          padding_w, dilation_h, dilation_w, ceil_mode, out);
    });
}

bool avgpool2d(const View &input, std::int64_t kernel_h, std::int64_t kernel_w,
               std::int64_t stride_h, std::int64_t stride_w, std::int64_t padding_h,
               std::int64_t padding_w, bool ceil_mode, bool count_include_pad,
               std::int64_t divisor_override, const View &output) {
    return guarded([&] {
        Tensor out = tensor(output);
        std::optional<std::int64_t> divisor;
        if (divisor_override > 0) {
            divisor = divisor_override;
        }
        custom::avgpool2d(tensor(input), kernel_h, kernel_w, stride_h, stride_w, padding_h,
                          padding_w, ceil_mode, count_include_pad, divisor, out);
    });
}

bool adaptiveavgpool2d(const View &input, const View &output) {
    return guarded([&] {
        Tensor out = tensor(output);
        custom::adaptiveavgpool2d(tensor(input), out.size(-2), out.size(-1), out);
    });
}

bool flatten(const View &input, std::int64_t start_dim, std::int64_t end_dim,
             const View &output) {
    return guarded([&] {
        Tensor out = tensor(output);
        custom::flatten(tensor(input), start_dim, end_dim, out);
    });
}

std::uint32_t default_mask() {
    const bool flags[] = {custom::DEFAULT_CONV2D,    custom::DEFAULT_LINEAR,
                          custom::DEFAULT_RELU,      custom::DEFAULT_MAXPOOL2D,
                          custom::DEFAULT_AVGPOOL2D, custom::DEFAULT_ADAPTIVEAVGPOOL2D,
                          custom::DEFAULT_FLATTEN};
    std::uint32_t mask = 0;
    for (std::uint32_t i = 0; i < sizeof(flags) / sizeof(flags[0]); ++i) {
        mask |= static_cast<std::uint32_t>(flags[i]) << i;
    }
    return mask;
}

} // namespace ai3::bridge
