//! The one error type of ai3. Every variant names the operation it came from
//! and carries a message that states the shapes or values involved.

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
}
