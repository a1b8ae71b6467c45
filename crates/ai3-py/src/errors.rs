//! The one mapping from ai3's Rust errors to Python exceptions.
//!
//! The exception classes live in `ai3/errors.py` so that they can inherit
//! from both `ai3.Error` and the matching builtin (`ValueError`, `TypeError`,
//! `MemoryError`).

use ai3_core::Error;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// Converts an ai3 error into the matching `ai3.errors` exception.
pub fn to_py(err: Error) -> PyErr {
    let class = match &err {
        Error::Shape { .. } => "ShapeError",
        Error::Dtype { .. } => "DtypeError",
        Error::InvalidArgument { .. } => "InvalidArgumentError",
        Error::Algorithm { .. } => "AlgorithmError",
        Error::Device { .. } => "DeviceError",
        Error::Custom { .. } => "CustomError",
        Error::Internal { .. } => "InternalError",
        Error::OutOfMemory { .. } => "OutOfMemoryError",
    };
    let msg = err.to_string();
    Python::attach(|py| {
        let made = py
            .import("ai3.errors")
            .and_then(|m| m.getattr(class))
            .and_then(|cls| cls.call1((msg.clone(),)));
        match made {
            Ok(exc) => PyErr::from_value(exc),
            Err(_) => PyRuntimeError::new_err(msg),
        }
    })
}

/// Runs `f`, turning a panic into `ai3.InternalError` so none reaches Python.
pub fn no_panic<T>(op: &str, f: impl FnOnce() -> ai3_core::Result<T>) -> ai3_core::Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(Error::internal(op, format!("panicked: {what}")))
        }
    }
}
