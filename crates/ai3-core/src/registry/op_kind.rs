//! The list of operations and their names.

use std::fmt;

use ai3_kernels::custom::CustomOp;

/// The operations ai3 implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// 2-D convolution.
    Conv2d,
    /// Fully connected layer.
    Linear,
    /// Rectified linear unit.
    Relu,
    /// 2-D max pooling.
    MaxPool2d,
    /// 2-D average pooling.
    AvgPool2d,
    /// 2-D adaptive average pooling.
    AdaptiveAvgPool2d,
    /// Flattening a range of dimensions.
    Flatten,
    /// `min(max(x, 0), 6)`.
    Relu6,
    /// `x` clamped to `[min_val, max_val]`.
    Hardtanh,
    /// `x * relu6(x + 3) / 6`.
    Hardswish,
    /// `relu6(x + 3) / 6`.
    Hardsigmoid,
    /// `x * sigmoid(x)`.
    Silu,
    /// Logistic sigmoid.
    Sigmoid,
    /// Gaussian error linear unit (exact or tanh approximation).
    Gelu,
    /// Hyperbolic tangent.
    Tanh,
    /// Broadcasting addition.
    Add,
    /// Broadcasting subtraction.
    Sub,
    /// Broadcasting multiplication.
    Mul,
    /// Broadcasting division.
    Div,
    /// Concatenation along a dimension.
    Cat,
    /// Softmax along a dimension.
    Softmax,
    /// Batch normalisation with running statistics (eval mode).
    BatchNorm2d,
    /// Layer normalisation over trailing dimensions.
    LayerNorm,
    /// 2-D adaptive max pooling.
    AdaptiveMaxPool2d,
    /// Mean over dimensions.
    Mean,
    /// Reordering dimensions (a contiguous copy).
    Permute,
    /// A contiguous copy under a shape computed at run time.
    Reshape,
    /// One piece of a `chunk` or `split` along a dimension.
    Slice,
}

impl OpKind {
    /// The user-written C++ operation behind this kind's `'custom'` algorithm, if it has one.
    pub fn custom(self) -> Option<CustomOp> {
        CustomOp::ALL.into_iter().find(|c| c.name() == self.name())
    }

    /// Every operation, in the order they are documented.
    pub const ALL: [OpKind; 28] = [
        OpKind::Conv2d,
        OpKind::Linear,
        OpKind::Relu,
        OpKind::MaxPool2d,
        OpKind::AvgPool2d,
        OpKind::AdaptiveAvgPool2d,
        OpKind::Flatten,
        OpKind::Relu6,
        OpKind::Hardtanh,
        OpKind::Hardswish,
        OpKind::Hardsigmoid,
        OpKind::Silu,
        OpKind::Sigmoid,
        OpKind::Gelu,
        OpKind::Tanh,
        OpKind::Add,
        OpKind::Sub,
        OpKind::Mul,
        OpKind::Div,
        OpKind::Cat,
        OpKind::Softmax,
        OpKind::BatchNorm2d,
        OpKind::LayerNorm,
        OpKind::AdaptiveMaxPool2d,
        OpKind::Mean,
        OpKind::Permute,
        OpKind::Reshape,
        OpKind::Slice,
    ];

    /// The name used in selectors and messages (`'conv2d'`, `'maxpool2d'`, ...).
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Conv2d => "conv2d",
            OpKind::Linear => "linear",
            OpKind::Relu => "relu",
            OpKind::MaxPool2d => "maxpool2d",
            OpKind::AvgPool2d => "avgpool2d",
            OpKind::AdaptiveAvgPool2d => "adaptiveavgpool2d",
            OpKind::Flatten => "flatten",
            OpKind::Relu6 => "relu6",
            OpKind::Hardtanh => "hardtanh",
            OpKind::Hardswish => "hardswish",
            OpKind::Hardsigmoid => "hardsigmoid",
            OpKind::Silu => "silu",
            OpKind::Sigmoid => "sigmoid",
            OpKind::Gelu => "gelu",
            OpKind::Tanh => "tanh",
            OpKind::Add => "add",
            OpKind::Sub => "sub",
            OpKind::Mul => "mul",
            OpKind::Div => "div",
            OpKind::Cat => "cat",
            OpKind::Softmax => "softmax",
            OpKind::BatchNorm2d => "batchnorm2d",
            OpKind::LayerNorm => "layernorm",
            OpKind::AdaptiveMaxPool2d => "adaptivemaxpool2d",
            OpKind::Mean => "mean",
            OpKind::Permute => "permute",
            OpKind::Reshape => "reshape",
            OpKind::Slice => "slice",
        }
    }

    /// Looks an operation up by its name.
    pub fn from_name(name: &str) -> Option<Self> {
        OpKind::ALL.into_iter().find(|op| op.name() == name)
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
