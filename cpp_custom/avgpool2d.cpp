// avgpool2d.cpp: write your avgpool2d here (the contract is in avgpool2d.hpp).
//
// Until this body is replaced it throws ai3::NotImplemented, and selecting
// 'custom' for avgpool2d raises an error naming this file.
#include "avgpool2d.hpp"

namespace ai3::custom {

void avgpool2d(const Tensor &, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool, bool, std::optional<std::int64_t>, Tensor &) {
    throw NotImplemented("avgpool2d");
}

} // namespace ai3::custom
