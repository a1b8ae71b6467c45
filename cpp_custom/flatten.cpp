// flatten.cpp: write your flatten here (the contract is in flatten.hpp).
//
// Until this body is replaced it throws ai3::NotImplemented, and selecting
// 'custom' for flatten raises an error naming this file.
#include "flatten.hpp"

namespace ai3::custom {

void flatten(const Tensor &, std::int64_t, std::int64_t, Tensor &) {
    throw NotImplemented("flatten");
}

} // namespace ai3::custom
