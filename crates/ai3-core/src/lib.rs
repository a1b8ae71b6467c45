//! The core of ai3: tensors, operations and their validation, the algorithm
//! registry, and the graph executor. Kernels live in `ai3-kernels`; Python
//! bindings in `ai3-py`.

mod buffers;
pub mod dtype;
pub mod error;
pub mod graph;
pub mod layout;
pub mod ops;
pub mod plan;
pub mod registry;
pub mod tensor;
pub mod threads;

pub use ai3_kernels::{isa, params};
pub use dtype::{DType, Device, Element};
pub use error::{Error, Result};
pub use graph::{Graph, MemoryPlan, NodeReport, ValueId};
pub use layout::Layout;
pub use registry::{Algorithm, Candidate, OpKind, Request};
pub use tensor::Tensor;
