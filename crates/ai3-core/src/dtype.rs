//! Element types and devices.

use std::fmt;

/// The element types ai3 computes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit IEEE float (`torch.float32`).
    F32,
    /// 64-bit IEEE float (`torch.float64`).
    F64,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F64 => 8,
        }
    }
    /// The name PyTorch uses, e.g. `float32`.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
        }
    }
    /// Parses a PyTorch dtype name (`float32`, `torch.float64`, `float`, `double`).
    pub fn from_name(name: &str) -> Option<Self> {
        match name.trim_start_matches("torch.") {
            "float32" | "float" => Some(DType::F32),
            "float64" | "double" => Some(DType::F64),
            _ => None,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a tensor's memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// Host memory.
    Cpu,
    /// A CUDA device by ordinal.
    Cuda(i32),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// Rust element types that correspond to a [`DType`].
pub trait Element: ai3_kernels::Float {
    /// The matching dtype.
    const DTYPE: DType;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
}

impl Element for f64 {
    const DTYPE: DType = DType::F64;
}
