// relu.cpp: write your relu here (the contract is in relu.hpp).
//
// Until this body is replaced it throws ai3::NotImplemented, and selecting
// 'custom' for relu raises an error naming this file.
#include "relu.hpp"

namespace ai3::custom {

void relu(const Tensor &, Tensor &) {
    throw NotImplemented("relu");
}

} // namespace ai3::custom
