// maxpool2d.cpp: write your maxpool2d here (the contract is in maxpool2d.hpp).
//
// Until this body is replaced it throws ai3::NotImplemented, and selecting
// 'custom' for maxpool2d raises an error naming this file.
#include "maxpool2d.hpp"

namespace ai3::custom {

void maxpool2d(const Tensor &, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool, Tensor &) {
    throw NotImplemented("maxpool2d");
}

} // namespace ai3::custom
