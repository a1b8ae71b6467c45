// A complete custom conv2d: the textbook loop nest, with groups, stride,
// padding and dilation, in float32 and float64. It is written for clarity,
// not speed: it shows the contract of cpp_custom/conv2d.hpp end to end.
//
// Its header is the stock cpp_custom/conv2d.hpp (a directory only needs the
// files it changes).
//
// Build ai3 with it:   AI3_CUSTOM_DIR=examples/custom_conv2d pip install .
// Make it 'default':   AI3_CXXFLAGS=-DAI3_DEFAULT_CONV2D=true AI3_CUSTOM_DIR=... pip install .
// Check it:            python -m ai3 test --op conv2d --algorithm custom
// Use it:              ai3.swap_conv2d(model, "custom")
#include "conv2d.hpp"

#include <stdexcept>
#include <string>

namespace {

template <class T>
void conv2d_loops(const ai3::Tensor &input, const ai3::Tensor &weight, const ai3::Tensor *bias,
                  std::int64_t padding_h, std::int64_t padding_w, std::int64_t stride_h,
                  std::int64_t stride_w, std::int64_t dilation_h, std::int64_t dilation_w,
                  std::int64_t groups, ai3::Tensor &output) {
    const std::int64_t batch = input.size(0), in_h = input.size(2), in_w = input.size(3);
    const std::int64_t out_c = output.size(1), out_h = output.size(2), out_w = output.size(3);
    const std::int64_t group_in = weight.size(1), kernel_h = weight.size(2),
                       kernel_w = weight.size(3);
    const std::int64_t group_out = out_c / groups;
    const T *x = input.data<T>();
    const T *w = weight.data<T>();
    const T *b = bias ? bias->data<T>() : nullptr;
    T *y = output.data<T>();

    for (std::int64_t n = 0; n < batch; ++n) {
        for (std::int64_t o = 0; o < out_c; ++o) {
            const std::int64_t first_in = (o / group_out) * group_in;
            for (std::int64_t oy = 0; oy < out_h; ++oy) {
                for (std::int64_t ox = 0; ox < out_w; ++ox) {
                    T sum = b ? b[o] : T(0);
                    for (std::int64_t c = 0; c < group_in; ++c) {
                        for (std::int64_t ky = 0; ky < kernel_h; ++ky) {
                            const std::int64_t iy = oy * stride_h - padding_h + ky * dilation_h;
                            if (iy < 0 || iy >= in_h) {
                                continue;
                            }
                            for (std::int64_t kx = 0; kx < kernel_w; ++kx) {
                                const std::int64_t ix = ox * stride_w - padding_w + kx * dilation_w;
                                if (ix < 0 || ix >= in_w) {
                                    continue;
                                }
                                sum += x[((n * input.size(1) + first_in + c) * in_h + iy) * in_w + ix] *
                                       w[((o * group_in + c) * kernel_h + ky) * kernel_w + kx];
                            }
                        }
                    }
                    y[((n * out_c + o) * out_h + oy) * out_w + ox] = sum;
                }
            }
        }
    }
}

} // namespace

namespace ai3::custom {

void conv2d(const Tensor &input, const Tensor &weight, const Tensor *bias, std::int64_t padding_h,
            std::int64_t padding_w, std::int64_t stride_h, std::int64_t stride_w,
            std::int64_t dilation_h, std::int64_t dilation_w, std::int64_t groups,
            Tensor &output) {
    // ai3 has checked the shapes already; a check of your own assumptions
    // turns into a Python exception carrying this message.
    if (input.size(1) != weight.size(1) * groups) {
        throw std::invalid_argument("input has " + std::to_string(input.size(1)) +
                                    " channels, weight expects " +
                                    std::to_string(weight.size(1) * groups));
    }
    ai3::dispatch(input.dtype(), [&](auto zero) {
        using T = decltype(zero);
        conv2d_loops<T>(input, weight, bias, padding_h, padding_w, stride_h, stride_w, dilation_h,
                        dilation_w, groups, output);
    });
}

} // namespace ai3::custom
