// ai3.hpp: what a custom C++ algorithm sees of ai3.
//
// Every operation in this directory has a header declaring the function you
// implement (conv2d.hpp, linear.hpp, ...) and a source file holding its body
// (conv2d.cpp, ...). ai3 calls your function with `ai3::Tensor` views of its
// own memory: the inputs are read-only, the output is already allocated with
// the right shape and you write every element of it. Nothing is copied.
//
// Tensors are row-major and contiguous, in float32 or float64; one function
// serves both, so dispatch on `input.dtype()` (see `ai3::dispatch`).
//
// Errors: throw any exception (std::invalid_argument, std::runtime_error, ...)
// and ai3 raises `ai3.CustomError` in Python with its message. Throwing
// `ai3::NotImplemented` means "no implementation here": ai3 then refuses to
// select 'custom' for the operation, naming the file to edit.
//
// Your function may be called from several threads at once (one model run by
// several threads, or several models); keep it free of unsynchronised shared
// state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ai3 {

/// The element types ai3 computes in.
enum class DType : std::uint8_t { Float32 = 0, Float64 = 1 };

/// The C++ type of a `DType`, for `dispatch`.
template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::Float32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::Float64; };

/// Name of a dtype, for messages.
inline const char *dtype_name(DType d) { return d == DType::Float32 ? "float32" : "float64"; }

/// Thrown by the functions of this directory that nobody has written yet.
struct NotImplemented : std::logic_error {
    explicit NotImplemented(const std::string &op)
        : std::logic_error("custom " + op + " is not implemented") {}
};

/// A view of a row-major, contiguous tensor: data pointer, dtype, shape and
/// strides (in elements). Views do not own their memory unless made by
/// `Tensor::empty`; copying a view copies the pointer, not the data.
class Tensor {
  public:
    /// A view of `data`, which must hold `shape`'s product of `dtype` elements.
    Tensor(void *data, DType dtype, std::vector<std::int64_t> shape)
        : data_(data), dtype_(dtype), shape_(std::move(shape)) {
        strides_.assign(shape_.size(), 1);
        for (std::size_t i = shape_.size(); i-- > 1;) {
            strides_[i - 1] = strides_[i] * shape_[i];
        }
    }

    /// A new zero-filled tensor that owns its memory (for scratch buffers).
    static Tensor empty(std::vector<std::int64_t> shape, DType dtype) {
        std::int64_t n = std::accumulate(shape.begin(), shape.end(), std::int64_t{1},
                                         std::multiplies<std::int64_t>());
        std::size_t bytes = static_cast<std::size_t>(n) * (dtype == DType::Float32 ? 4 : 8);
        std::shared_ptr<unsigned char[]> owner(new unsigned char[bytes > 0 ? bytes : 1]());
        Tensor t(owner.get(), dtype, std::move(shape));
        t.owner_ = std::move(owner);
        return t;
    }

    DType dtype() const { return dtype_; }
    /// Number of dimensions.
    std::int64_t dim() const { return static_cast<std::int64_t>(shape_.size()); }
    const std::vector<std::int64_t> &shape() const { return shape_; }
    /// Size of dimension `i`; negative `i` counts from the end, as in PyTorch.
    std::int64_t size(std::int64_t i) const { return shape_.at(axis(i)); }
    const std::vector<std::int64_t> &strides() const { return strides_; }
    /// Stride (in elements) of dimension `i`; negative `i` counts from the end.
    std::int64_t stride(std::int64_t i) const { return strides_.at(axis(i)); }
    /// Number of elements.
    std::int64_t numel() const {
        return std::accumulate(shape_.begin(), shape_.end(), std::int64_t{1},
                               std::multiplies<std::int64_t>());
    }

    /// The elements as `T`; throws std::invalid_argument if `T` is not the dtype.
    template <class T> T *data() const {
        if (dtype_of<T>::value != dtype_) {
            throw std::invalid_argument(std::string("tensor holds ") + dtype_name(dtype_) +
                                        ", not " + dtype_name(dtype_of<T>::value));
        }
        return static_cast<T *>(data_);
    }

    /// The element at `index` (one entry per dimension), bounds-checked.
    template <class T> T &at(std::initializer_list<std::int64_t> index) const {
        if (static_cast<std::int64_t>(index.size()) != dim()) {
            throw std::out_of_range("index has " + std::to_string(index.size()) +
                                    " entries for a tensor of " + std::to_string(dim()) +
                                    " dimensions");
        }
        std::int64_t offset = 0, i = 0;
        for (std::int64_t v : index) {
            if (v < 0 || v >= shape_[i]) {
                throw std::out_of_range("index " + std::to_string(v) + " out of range for size " +
                                        std::to_string(shape_[i]) + " of dimension " +
                                        std::to_string(i));
            }
            offset += v * strides_[i++];
        }
        return data<T>()[offset];
    }

  private:
    std::size_t axis(std::int64_t i) const {
        std::int64_t d = dim();
        if (i < -d || i >= d) {
            throw std::out_of_range("dimension " + std::to_string(i) + " out of range for a " +
                                    std::to_string(d) + "-D tensor");
        }
        return static_cast<std::size_t>(i < 0 ? i + d : i);
    }

    void *data_;
    DType dtype_;
    std::vector<std::int64_t> shape_;
    std::vector<std::int64_t> strides_;
    std::shared_ptr<unsigned char[]> owner_;
};

/// Calls `f(T{})` with `T` = float or double according to `dtype`, so one
/// template serves both: `ai3::dispatch(x.dtype(), [&](auto zero) { using T = decltype(zero); ... });`
template <class F> decltype(auto) dispatch(DType dtype, F &&f) {
    if (dtype == DType::Float32) {
        return f(float{});
    }
    return f(double{});
}

} // namespace ai3
