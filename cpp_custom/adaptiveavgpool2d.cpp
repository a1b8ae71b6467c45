// adaptiveavgpool2d.cpp: write your adaptiveavgpool2d here (the contract is in adaptiveavgpool2d.hpp).
//
// Until this body is replaced it throws ai3::NotImplemented, and selecting
// 'custom' for adaptiveavgpool2d raises an error naming this file.
#include "adaptiveavgpool2d.hpp"

namespace ai3::custom {

void adaptiveavgpool2d(const Tensor &, std::int64_t, std::int64_t, Tensor &) {
    throw NotImplemented("adaptiveavgpool2d");
}

} // namespace ai3::custom
