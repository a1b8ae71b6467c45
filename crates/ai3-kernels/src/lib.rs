//! The kernels of ai3.
//!
//! CPU kernels are plain Rust, one module per operation family and one file
//! per algorithm (`cpu/conv2d/{direct,smm,gemm,winograd}.rs`). Kernels take
//! contiguous slices and a parameter struct from [`params`]; they know nothing
//! of graphs, tensors or Python, and they never allocate outputs: the caller
//! passes a buffer of the right length, which the kernel checks (in release
//! builds too) before writing. Scratch memory they do allocate goes through
//! [`alloc`]: a size that overflows or an allocation the system refuses is a
//! [`KernelError`], never an abort.
//!
//! [`custom`] reaches the user's C++ implementations (`cpp_custom/`) through
//! `cxx`, with the same slice-and-parameters interface.

pub mod alloc;
pub mod cpu;
pub mod custom;
pub mod float;
pub mod isa;
pub mod params;

pub use alloc::{KernelError, KernelResult};
pub use float::Float;
