//! The kernels of ai3.
//!
//! CPU kernels are plain Rust, one module per operation family and one file
//! per algorithm (`cpu/conv2d/{direct,smm,gemm,winograd}.rs`). Kernels take
//! contiguous slices and a parameter struct from [`params`]; they know nothing
//! of graphs, tensors or Python, and they never allocate outputs: the caller
//! passes a buffer of the right length.

pub mod cpu;
pub mod float;
pub mod params;

pub use float::Float;
