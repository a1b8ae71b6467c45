//! The list of operations: one line each, giving the name users select it
//! by and the [`OpSpec`] its nodes are built from.

use std::fmt;

use ai3_kernels::custom::CustomOp;

use crate::ops::{self, OpSpec};

macro_rules! op_kinds {
    ($($(#[$doc:meta])* $variant:ident = $name:literal => $spec:path,)*) => {
        /// The operations ai3 implements.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum OpKind {
            $($(#[$doc])* $variant,)*
        }

        impl OpKind {
            /// Every operation, in the order they are documented.
            pub const ALL: &'static [OpKind] = &[$(OpKind::$variant,)*];

            /// The name used in selectors and messages (`'conv2d'`, `'maxpool2d'`, ...).
            pub fn name(self) -> &'static str {
                match self {
                    $(OpKind::$variant => $name,)*
                }
            }

            /// The operation's parameters, inputs and builder.
            pub fn spec(self) -> &'static OpSpec {
                match self {
                    $(OpKind::$variant => &$spec,)*
                }
            }
        }
    };
}

op_kinds! {
    /// 2-D convolution.
    Conv2d = "conv2d" => ops::conv2d::SPEC,
    /// Fully connected layer.
    Linear = "linear" => ops::linear::SPEC,
    /// Rectified linear unit.
    Relu = "relu" => ops::activation::RELU,
    /// 2-D max pooling.
    MaxPool2d = "maxpool2d" => ops::pool::MAXPOOL2D,
    /// 2-D average pooling.
    AvgPool2d = "avgpool2d" => ops::pool::AVGPOOL2D,
    /// 2-D adaptive average pooling.
    AdaptiveAvgPool2d = "adaptiveavgpool2d" => ops::pool::ADAPTIVEAVGPOOL2D,
    /// Flattening a range of dimensions.
    Flatten = "flatten" => ops::flatten::SPEC,
    /// `min(max(x, 0), 6)`.
    Relu6 = "relu6" => ops::activation::RELU6,
    /// `x` clamped to `[min_val, max_val]`.
    Hardtanh = "hardtanh" => ops::activation::HARDTANH,
    /// `x * relu6(x + 3) / 6`.
    Hardswish = "hardswish" => ops::activation::HARDSWISH,
    /// `relu6(x + 3) / 6`.
    Hardsigmoid = "hardsigmoid" => ops::activation::HARDSIGMOID,
    /// `x * sigmoid(x)`.
    Silu = "silu" => ops::activation::SILU,
    /// Logistic sigmoid.
    Sigmoid = "sigmoid" => ops::activation::SIGMOID,
    /// Gaussian error linear unit (exact or tanh approximation).
    Gelu = "gelu" => ops::activation::GELU,
    /// Hyperbolic tangent.
    Tanh = "tanh" => ops::activation::TANH,
    /// Broadcasting addition.
    Add = "add" => ops::binary::ADD,
    /// Broadcasting subtraction.
    Sub = "sub" => ops::binary::SUB,
    /// Broadcasting multiplication.
    Mul = "mul" => ops::binary::MUL,
    /// Broadcasting division.
    Div = "div" => ops::binary::DIV,
    /// Concatenation along a dimension.
    Cat = "cat" => ops::shape::CAT,
    /// Softmax along a dimension.
    Softmax = "softmax" => ops::reduce::SOFTMAX,
    /// Batch normalisation with running statistics (eval mode).
    BatchNorm2d = "batchnorm2d" => ops::norm::BATCHNORM2D,
    /// Layer normalisation over trailing dimensions.
    LayerNorm = "layernorm" => ops::norm::LAYERNORM,
    /// 2-D adaptive max pooling.
    AdaptiveMaxPool2d = "adaptivemaxpool2d" => ops::pool::ADAPTIVEMAXPOOL2D,
    /// Mean over dimensions.
    Mean = "mean" => ops::reduce::MEAN,
    /// Reordering dimensions (a contiguous copy).
    Permute = "permute" => ops::shape::PERMUTE,
    /// A contiguous copy under a shape computed at run time.
    Reshape = "reshape" => ops::reshape::SPEC,
    /// One piece of a `chunk` or `split` along a dimension.
    Slice = "slice" => ops::shape::SLICE,
    /// Scaled dot-product attention.
    Attention = "attention" => ops::attention::SPEC,
    /// Matrix product over broadcast batch dimensions (`torch.matmul`).
    Matmul = "matmul" => ops::matmul::SPEC,
    /// Broadcasting to a larger shape (a contiguous copy).
    Expand = "expand" => ops::view::EXPAND,
    /// Basic indexing: slices, integers, `None`, `...` (a contiguous copy).
    Index = "index" => ops::view::INDEX,
    /// Constant padding of trailing dimensions.
    Pad = "pad" => ops::shift::PAD,
    /// Cyclic shift along dimensions.
    Roll = "roll" => ops::shift::ROLL,
    /// L2 normalisation along a dimension (`F.normalize`).
    Normalize = "normalize" => ops::reduce::NORMALIZE,
    /// Rows of a table picked by indices (`nn.Embedding`).
    Embedding = "embedding" => ops::embedding::SPEC,
    /// Sum over dimensions.
    Sum = "sum" => ops::reduce::SUM,
    /// Removing dimensions of size 1.
    Squeeze = "squeeze" => ops::view::SQUEEZE,
    /// `nn.MultiheadAttention`: projections, attention, output projection.
    MultiheadAttention = "multihead_attention" => ops::mha::SPEC,
}

impl OpKind {
    /// The user-written C++ operation behind this kind's `'custom'` algorithm, if it has one.
    pub fn custom(self) -> Option<CustomOp> {
        CustomOp::ALL.into_iter().find(|c| c.name() == self.name())
    }

    /// Looks an operation up by its name.
    pub fn from_name(name: &str) -> Option<Self> {
        OpKind::ALL.iter().copied().find(|op| op.name() == name)
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
