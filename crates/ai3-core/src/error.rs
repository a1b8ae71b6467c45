//! The one error type of ai3. Every variant names the operation it came from
//! and carries a message that states the shapes or values involved.

use ai3_kernels::alloc::format_bytes;
use ai3_kernels::KernelError;

/// Result alias used throughout ai3.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in ai3, grouped by how a user should react.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Shapes do not fit the operation (rank, channels, kernel larger than input, empty tensor).
    #[error("{op}: {msg}")]
    Shape {
        /// Operation name, e.g. `conv2d`.
        op: String,
        /// What is wrong, with the shapes.
        msg: String,
    },
    /// An element type the operation cannot compute in.
    #[error("{op}: {msg}")]
    Dtype {
        /// Operation name.
        op: String,
        /// What is wrong, with the dtypes.
        msg: String,
    },
    /// A hyperparameter out of range (stride 0, negative padding, groups not dividing channels).
    #[error("{op}: {msg}")]
    InvalidArgument {
        /// Operation name.
        op: String,
        /// What is wrong, with the values.
        msg: String,
    },
    /// The algorithm is unknown, unavailable in this build, or does not support the configuration.
    #[error("{op}: {msg}")]
    Algorithm {
        /// Operation name.
        op: String,
        /// Which algorithm and why it cannot run.
        msg: String,
    },
    /// The device is not usable (not compiled in, or the tensor lives elsewhere).
    #[error("{op}: {msg}")]
    Device {
        /// Operation name.
        op: String,
        /// What is wrong.
        msg: String,
    },
    /// The user's C++ implementation (`'custom'`) threw; the exception's message.
    #[error("{op}: the custom C++ implementation failed: {msg}")]
    Custom {
        /// Operation name.
        op: String,
        /// The C++ exception's `what()`.
        msg: String,
    },
    /// A bug in ai3: an invariant did not hold. Reported instead of panicking.
    #[error("{op}: internal error: {msg}")]
    Internal {
        /// Operation name.
        op: String,
        /// What did not hold.
        msg: String,
    },
    /// The system refused memory ai3 asked for (an output, the arena, a
    /// padded copy, scratch). On Linux a request beyond the memory and swap
    /// there are is refused at once; a smaller one may be granted and fail
    /// only when touched, as for every program.
    #[error("{op}: {msg}")]
    OutOfMemory {
        /// Operation name.
        op: String,
        /// What was asked for, in bytes, with the shapes.
        msg: String,
    },
}

impl Error {
    /// A [`Error::Shape`] error.
    pub fn shape(op: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Shape {
            op: op.into(),
            msg: msg.into(),
        }
    }
    /// A [`Error::Custom`] error.
    pub fn custom(op: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Custom {
            op: op.into(),
            msg: msg.into(),
        }
    }
    /// A [`Error::Dtype`] error.
    pub fn dtype(op: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Dtype {
            op: op.into(),
            msg: msg.into(),
        }
    }
    /// A [`Error::InvalidArgument`] error.
    pub fn invalid(op: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::InvalidArgument {
            op: op.into(),
            msg: msg.into(),
        }
    }
    /// A [`Error::Algorithm`] error.
    pub fn algorithm(op: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Algorithm {
            op: op.into(),
            msg: msg.into(),
        }
    }
    /// A [`Error::Device`] error.
    pub fn device(op: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Device {
            op: op.into(),
            msg: msg.into(),
        }
    }
    /// A [`Error::Internal`] error.
    pub fn internal(op: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Internal {
            op: op.into(),
            msg: msg.into(),
        }
    }

    /// An [`Error::OutOfMemory`] error: `bytes` for `what` were refused;
    /// `context` states the shapes.
    ///
    /// ```
    /// use ai3_core::Error;
    /// let e = Error::out_of_memory("conv2d", "the output", 64_000_000_000_000, "input shape [1, 3, 8, 8]");
    /// assert_eq!(
    ///     e.to_string(),
    ///     "conv2d: cannot allocate 64.0 TB (64000000000000 bytes) for the output; input shape [1, 3, 8, 8]"
    /// );
    /// ```
    pub fn out_of_memory(op: impl Into<String>, what: &str, bytes: usize, context: &str) -> Self {
        let sep = if context.is_empty() { "" } else { "; " };
        Error::OutOfMemory {
            op: op.into(),
            msg: format!(
                "cannot allocate {} for {what}{sep}{context}",
                format_bytes(bytes)
            ),
        }
    }

    /// The one mapping from a kernel's error to ai3's: an allocation the
    /// system refused is [`Error::OutOfMemory`], a size that overflows
    /// [`Error::Shape`], a wrong buffer length or broken precondition (a bug
    /// in ai3) [`Error::Internal`]. `context` states the shapes, e.g.
    /// `"input shape [1, 3, 8, 8], weight shape [4, 3, 3, 3]"`.
    pub fn from_kernel(op: impl Into<String>, context: &str, e: KernelError) -> Self {
        match e {
            KernelError::Alloc { what, bytes } => {
                Error::out_of_memory(op, &format!("the {what}"), bytes, context)
            }
            KernelError::Overflow { what } => Error::shape(
                op,
                format!(
                    "the {what} overflows a 64-bit size (more than memory can hold); {context}"
                ),
            ),
            KernelError::Length { .. } | KernelError::Precondition { .. } => {
                Error::internal(op, format!("{e}; {context}"))
            }
        }
    }

    /// The same error with `f` applied to its message (to add where it happened).
    pub fn map_msg(self, f: impl FnOnce(String) -> String) -> Self {
        match self {
            Error::Shape { op, msg } => Error::Shape { op, msg: f(msg) },
            Error::Dtype { op, msg } => Error::Dtype { op, msg: f(msg) },
            Error::InvalidArgument { op, msg } => Error::InvalidArgument { op, msg: f(msg) },
            Error::Algorithm { op, msg } => Error::Algorithm { op, msg: f(msg) },
            Error::Device { op, msg } => Error::Device { op, msg: f(msg) },
            Error::Custom { op, msg } => Error::Custom { op, msg: f(msg) },
            Error::Internal { op, msg } => Error::Internal { op, msg: f(msg) },
            Error::OutOfMemory { op, msg } => Error::OutOfMemory { op, msg: f(msg) },
        }
    }

    /// The same error attributed to operation `op`.
    pub fn with_op(self, op: impl Into<String>) -> Self {
        let op = op.into();
        match self {
            Error::Shape { msg, .. } => Error::Shape { op, msg },
            Error::Dtype { msg, .. } => Error::Dtype { op, msg },
            Error::InvalidArgument { msg, .. } => Error::InvalidArgument { op, msg },
            Error::Algorithm { msg, .. } => Error::Algorithm { op, msg },
            Error::Device { msg, .. } => Error::Device { op, msg },
            Error::Custom { msg, .. } => Error::Custom { op, msg },
            Error::Internal { msg, .. } => Error::Internal { op, msg },
            Error::OutOfMemory { msg, .. } => Error::OutOfMemory { op, msg },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_errors_map_to_the_matching_variant() {
        let ctx = "input shape [1, 3, 8, 8]";
        let oom = Error::from_kernel(
            "conv2d",
            ctx,
            KernelError::Alloc {
                what: "padded input copy",
                bytes: 48_000_000_000_000,
            },
        );
        assert!(matches!(oom, Error::OutOfMemory { .. }));
        assert_eq!(
            oom.to_string(),
            "conv2d: cannot allocate 48.0 TB (48000000000000 bytes) for the padded input copy; input shape [1, 3, 8, 8]"
        );
        let big = Error::from_kernel("conv2d", ctx, KernelError::Overflow { what: "FFT height" });
        assert!(matches!(big, Error::Shape { .. }));
        assert!(big.to_string().contains("FFT height") && big.to_string().contains(ctx));
        let bug = KernelError::Length {
            what: "conv2d output",
            expected: 4,
            got: 3,
        };
        assert!(matches!(
            Error::from_kernel("conv2d", ctx, bug),
            Error::Internal { .. }
        ));
    }

    #[test]
    fn messages_and_ops_can_be_rewritten() {
        let e = Error::out_of_memory("tensor", "a buffer", 2000, "shape [500]");
        let e = e.with_op("add").map_msg(|m| format!("{m} (at node 'x')"));
        assert_eq!(
            e.to_string(),
            "add: cannot allocate 2.0 kB (2000 bytes) for a buffer; shape [500] (at node 'x')"
        );
        assert!(matches!(e, Error::OutOfMemory { .. }));
    }
}
