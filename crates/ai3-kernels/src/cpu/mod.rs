//! CPU kernels: one module per operation family, one file per algorithm.
//!
//! Every kernel works on contiguous NCHW slices whose lengths the caller has
//! already checked against the parameter struct, and writes into a buffer the
//! caller owns. Parallelism comes from rayon over independent output blocks.

pub mod activation;
pub mod attention;
pub mod binary;
pub mod blocked;
pub mod bmm;
pub mod conv2d;
pub mod linear;
mod matmul;
pub mod norm;
pub mod pad;
pub mod par;
pub mod pool;
pub mod reduce;
pub(crate) mod scratch;
pub mod shape;
pub mod shift;
#[cfg(target_arch = "x86_64")]
pub(crate) mod tile;

#[cfg(test)]
pub(crate) mod test_util;
