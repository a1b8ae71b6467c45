//! Elementwise activations: one operation type for every activation, and the
//! [`ActivationKind`] that convolution and linear layers fuse as an epilogue.

use ai3_kernels::cpu::activation::{self, map, map_inplace, map_inplace_serial};
use ai3_kernels::custom;
use ai3_kernels::Float;

use super::attrs::{optional, Args, Arity, Attrs, OpSpec, ParamKind as K};
use super::{custom_result, kernel_result, simple_algorithm, single, with_dtype, Operation};
use crate::error::{Error, Result};
use crate::layout::Blocked;
use crate::registry::{Algorithm, OpKind, Request};
use crate::tensor::Tensor;

/// Which activation, with its parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ActivationKind {
    /// `max(x, 0)`.
    Relu,
    /// `min(max(x, 0), 6)`.
    Relu6,
    /// `x` clamped to `[min, max]`.
    Hardtanh {
        /// PyTorch's `min_val`.
        min: f64,
        /// PyTorch's `max_val`.
        max: f64,
    },
    /// `x * relu6(x + 3) / 6`.
    Hardswish,
    /// `relu6(x + 3) / 6`.
    Hardsigmoid,
    /// `x * sigmoid(x)`.
    Silu,
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
    /// GELU: exact (erf) or, with `tanh`, PyTorch's `approximate='tanh'`.
    Gelu {
        /// Use the tanh approximation.
        tanh: bool,
    },
    /// Hyperbolic tangent.
    Tanh,
}

pub(super) fn lit<T: Float>(v: f64) -> T {
    T::from_f64(v).unwrap_or_else(T::nan)
}

/// Calls `$f(.., g)` with `g` the scalar function of `$kind` at element type
/// `$t`, so the match happens once per call, not once per element.
macro_rules! with_scalar_fn {
    ($kind:expr, $t:ty, $f:ident($($arg:expr),*)) => {{
        use $crate::ops::activation::lit;
        use $crate::ops::ActivationKind;
        use ::ai3_kernels::cpu::activation::scalar;
        match $kind {
            ActivationKind::Relu => $f($($arg,)* scalar::relu::<$t>),
            ActivationKind::Relu6 => $f($($arg,)* scalar::relu6::<$t>),
            ActivationKind::Hardtanh { min, max } => {
                let (lo, hi) = (lit::<$t>(min), lit::<$t>(max));
                $f($($arg,)* move |x: $t| scalar::hardtanh(x, lo, hi))
            }
            ActivationKind::Hardswish => $f($($arg,)* scalar::hardswish::<$t>),
            ActivationKind::Hardsigmoid => $f($($arg,)* scalar::hardsigmoid::<$t>),
            ActivationKind::Silu => $f($($arg,)* scalar::silu::<$t>),
            ActivationKind::Sigmoid => $f($($arg,)* scalar::sigmoid::<$t>),
            ActivationKind::Gelu { tanh: false } => $f($($arg,)* scalar::gelu::<$t>),
            ActivationKind::Gelu { tanh: true } => $f($($arg,)* scalar::gelu_tanh::<$t>),
            ActivationKind::Tanh => $f($($arg,)* scalar::tanh::<$t>),
        }
    }};
}
pub(super) use with_scalar_fn;

impl ActivationKind {
    /// The operation this activation is on its own (`relu6`, `gelu`, ...).
    pub fn op_kind(&self) -> OpKind {
        match self {
            ActivationKind::Relu => OpKind::Relu,
            ActivationKind::Relu6 => OpKind::Relu6,
            ActivationKind::Hardtanh { .. } => OpKind::Hardtanh,
            ActivationKind::Hardswish => OpKind::Hardswish,
            ActivationKind::Hardsigmoid => OpKind::Hardsigmoid,
            ActivationKind::Silu => OpKind::Silu,
            ActivationKind::Sigmoid => OpKind::Sigmoid,
            ActivationKind::Gelu { .. } => OpKind::Gelu,
            ActivationKind::Tanh => OpKind::Tanh,
        }
    }

    /// The activation a node of operation `a.op()` computes, from its
    /// parameters: `hardtanh`'s `min_val` and `max_val` (default -1 and 1),
    /// `gelu`'s `approximate` (`'none'` or `'tanh'`).
    pub fn from_args(a: &Args) -> Result<Self> {
        let kind = match a.op() {
            OpKind::Relu => ActivationKind::Relu,
            OpKind::Relu6 => ActivationKind::Relu6,
            OpKind::Hardswish => ActivationKind::Hardswish,
            OpKind::Hardsigmoid => ActivationKind::Hardsigmoid,
            OpKind::Silu => ActivationKind::Silu,
            OpKind::Sigmoid => ActivationKind::Sigmoid,
            OpKind::Tanh => ActivationKind::Tanh,
            OpKind::Hardtanh => ActivationKind::Hardtanh {
                min: a.float_or("min_val", -1.0)?,
                max: a.float_or("max_val", 1.0)?,
            },
            OpKind::Gelu => match a.str_or("approximate", "none")? {
                "none" => ActivationKind::Gelu { tanh: false },
                "tanh" => ActivationKind::Gelu { tanh: true },
                other => {
                    return Err(Error::invalid(
                        "gelu",
                        format!("approximate must be 'none' or 'tanh', got '{other}'"),
                    ))
                }
            },
            other => return Err(not_an_activation(other)),
        };
        kind.check()?;
        Ok(kind)
    }

    /// The activation `op` with parameters `attrs`, as fused into another node.
    ///
    /// ```
    /// use ai3_core::ops::{ActivationKind, Attr, Attrs};
    /// use ai3_core::OpKind;
    /// let attrs = Attrs::new().with("min_val", Attr::Float(0.0)).with("max_val", Attr::Float(6.0));
    /// let k = ActivationKind::from_attrs(OpKind::Hardtanh, attrs).unwrap();
    /// assert_eq!(k, ActivationKind::Hardtanh { min: 0.0, max: 6.0 });
    /// assert!(ActivationKind::from_attrs(OpKind::Conv2d, Attrs::new()).is_err());
    /// ```
    pub fn from_attrs(op: OpKind, attrs: Attrs) -> Result<Self> {
        if !ACTIVATIONS.contains(&op) {
            return Err(not_an_activation(op));
        }
        op.spec().check(op, &attrs, 1)?;
        ActivationKind::from_args(&Args::new(op, attrs, Request::Default, 1))
    }

    fn check(&self) -> Result<()> {
        if let ActivationKind::Hardtanh { min, max } = *self {
            if min.is_nan() || max.is_nan() || min > max {
                return Err(Error::invalid(
                    OpKind::Hardtanh.name(),
                    format!("min_val {min} must not exceed max_val {max}"),
                ));
            }
        }
        Ok(())
    }

    /// The activation of one element.
    pub fn apply<T: Float>(&self, x: T) -> T {
        fn call<T, F: Fn(T) -> T>(x: T, f: F) -> T {
            f(x)
        }
        with_scalar_fn!(*self, T, call(x))
    }

    /// `output[i] = activation(input[i])`, every element written; slices of
    /// different lengths are an [`Error::Internal`].
    pub fn apply_to<T: Float>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        if let (Some(act), Some(out)) = (self.f32_vectorised(), f32_slice(output)) {
            if out.len() == input.len() {
                out.copy_from_slice(f32_slice_ref(input).expect("T is f32"));
                activation::vectorised_f32_inplace(out, act);
                return Ok(());
            }
        }
        let done = with_scalar_fn!(*self, T, map(input, output));
        kernel_result(self.op_kind(), done, || {
            format!("{} input and {} output elements", input.len(), output.len())
        })
    }

    /// The activation applied in place, e.g. to a convolution's output.
    pub fn apply_inplace<T: Float>(&self, data: &mut [T]) {
        if let (Some(act), Some(d)) = (self.f32_vectorised(), f32_slice(data)) {
            return activation::vectorised_f32_inplace(d, act);
        }
        with_scalar_fn!(*self, T, map_inplace(data))
    }

    /// This activation's f32 vector kernel, if it has one (those that need `exp`).
    fn f32_vectorised(&self) -> Option<activation::Vectorised> {
        match self {
            ActivationKind::Gelu { tanh } => Some(activation::Vectorised::Gelu { tanh: *tanh }),
            ActivationKind::Silu => Some(activation::Vectorised::Silu),
            ActivationKind::Sigmoid => Some(activation::Vectorised::Sigmoid),
            _ => None,
        }
    }

    /// The bounds this activation clamps to, when it is a clamp (ReLU,
    /// ReLU6, Hardtanh with `min <= max`), which the blocked convolution
    /// kernels apply in registers.
    pub fn clamp(&self) -> Option<(f32, f32)> {
        match *self {
            ActivationKind::Relu => Some((0.0, f32::INFINITY)),
            ActivationKind::Relu6 => Some((0.0, 6.0)),
            // Bounds as f32 (`lit`), as the scalar function has them.
            ActivationKind::Hardtanh { min, max } => {
                let (lo, hi) = (lit::<f32>(min), lit::<f32>(max));
                (lo <= hi).then_some((lo, hi))
            }
            _ => None,
        }
    }

    /// [`apply_inplace`](Self::apply_inplace) on the calling thread, for a
    /// kernel's epilogue on a block one of its tasks just wrote.
    pub fn apply_serial<T: Float>(&self, data: &mut [T]) {
        if let (Some(act), Some(d)) = (self.f32_vectorised(), f32_slice(data)) {
            return activation::vectorised_f32_serial(d, act);
        }
        with_scalar_fn!(*self, T, map_inplace_serial(data))
    }
}

/// `data` as f32, when `T` is f32.
fn f32_slice<T: Float>(data: &mut [T]) -> Option<&mut [f32]> {
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>())
        // SAFETY: T is f32.
        .then(|| unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr().cast(), data.len()) })
}

/// [`f32_slice`] for a shared slice.
fn f32_slice_ref<T: Float>(data: &[T]) -> Option<&[f32]> {
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>())
        // SAFETY: T is f32.
        .then(|| unsafe { std::slice::from_raw_parts(data.as_ptr().cast(), data.len()) })
}

/// An elementwise activation as a graph operation.
#[derive(Debug, Clone, Copy)]
pub struct Activation {
    kind: ActivationKind,
    algorithm: Algorithm,
}

impl Activation {
    /// Wraps an activation (rejects `hardtanh` with `min_val > max_val`).
    pub fn new(kind: ActivationKind) -> Result<Self> {
        kind.check()?;
        Ok(Activation {
            kind,
            algorithm: Algorithm::Direct,
        })
    }

    /// Runs the algorithm `request` resolves to (`'custom'` exists for relu only).
    pub fn with_request(mut self, request: Request) -> Result<Self> {
        self.algorithm = simple_algorithm(self.kind.op_kind(), request)?;
        Ok(self)
    }

    /// The activation computed.
    pub fn activation(&self) -> ActivationKind {
        self.kind
    }
}

impl Operation for Activation {
    fn per_image(&self, _inputs: &[&[usize]]) -> bool {
        true
    }
    fn kind(&self) -> OpKind {
        self.kind.op_kind()
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Ok(self.algorithm.name().into())
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let x = single(self.kind(), inputs)?;
        Ok(x.to_vec())
    }
    fn blocked(&self, _inputs: &[&[usize]]) -> Blocked {
        // Every kind maps finite values to finite ones, channel by channel
        // alike; the user's C++ sees the shape, so it stays NCHW.
        match self.algorithm {
            Algorithm::Custom => Blocked::No,
            _ => Blocked::Elementwise,
        }
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let x = single(self.kind(), inputs)?;
        with_dtype!(x.dtype(), T, {
            let (src, dst) = (x.as_slice::<T>()?, output.as_mut_slice::<T>()?);
            match (self.algorithm, self.kind) {
                (Algorithm::Custom, ActivationKind::Relu) => {
                    custom_result(self.kind(), x.shape(), custom::relu(x.shape(), src, dst))?
                }
                _ => self.kind.apply_to::<T>(src, dst)?,
            }
        });
        Ok(())
    }
}

/// The operations that are activations (and can be fused into another node).
const ACTIVATIONS: [OpKind; 9] = [
    OpKind::Relu,
    OpKind::Relu6,
    OpKind::Hardtanh,
    OpKind::Hardswish,
    OpKind::Hardsigmoid,
    OpKind::Silu,
    OpKind::Sigmoid,
    OpKind::Gelu,
    OpKind::Tanh,
];

fn not_an_activation(op: OpKind) -> Error {
    Error::invalid(
        op.name(),
        "is not an activation; choose one of relu, relu6, hardtanh, hardswish, hardsigmoid, \
         silu, sigmoid, gelu, tanh",
    )
}

/// An activation without parameters.
const PLAIN: OpSpec = OpSpec {
    inputs: Arity::exactly(1),
    params: &[],
    build: build_activation,
};

fn build_activation(a: &mut Args) -> Result<Box<dyn Operation>> {
    let kind = ActivationKind::from_args(a)?;
    Ok(Box::new(Activation::new(kind)?.with_request(a.request)?))
}

/// `relu`.
pub const RELU: OpSpec = PLAIN;
/// `relu6`.
pub const RELU6: OpSpec = PLAIN;
/// `hardswish`.
pub const HARDSWISH: OpSpec = PLAIN;
/// `hardsigmoid`.
pub const HARDSIGMOID: OpSpec = PLAIN;
/// `silu`.
pub const SILU: OpSpec = PLAIN;
/// `sigmoid`.
pub const SIGMOID: OpSpec = PLAIN;
/// `tanh`.
pub const TANH: OpSpec = PLAIN;
/// `hardtanh`: `min_val` (default -1) and `max_val` (default 1).
pub const HARDTANH: OpSpec = OpSpec {
    inputs: Arity::exactly(1),
    params: &[optional("min_val", K::Float), optional("max_val", K::Float)],
    build: build_activation,
};
/// `gelu`: `approximate`, `'none'` (the default) or `'tanh'`.
pub const GELU: OpSpec = OpSpec {
    inputs: Arity::exactly(1),
    params: &[optional("approximate", K::Str)],
    build: build_activation,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::ops::Attr;

    #[test]
    fn parses_every_activation_and_rejects_bad_params() {
        let mut activations = 0;
        for &op in OpKind::ALL {
            if let Ok(k) = ActivationKind::from_attrs(op, Attrs::new()) {
                assert_eq!(k.op_kind(), op);
                activations += 1;
            }
        }
        assert_eq!(activations, 9);
        let one = |name: &str, v: Attr| Attrs::new().with(name, v);
        let relu6 = ActivationKind::from_attrs(OpKind::Relu6, one("min_val", Attr::Float(1.0)));
        assert!(relu6
            .unwrap_err()
            .to_string()
            .contains("unknown parameter 'min_val'"));
        let bad = one("min_val", Attr::Float(2.0)).with("max_val", Attr::Float(1.0));
        assert!(ActivationKind::from_attrs(OpKind::Hardtanh, bad).is_err());
        let gelu = one("approximate", Attr::Str("fast".into()));
        assert!(ActivationKind::from_attrs(OpKind::Gelu, gelu).is_err());
        let typed = one("approximate", Attr::Float(1.0));
        let err = ActivationKind::from_attrs(OpKind::Gelu, typed).unwrap_err();
        assert!(
            err.to_string().contains("'approximate' must be str"),
            "{err}"
        );
        let err = ActivationKind::from_attrs(OpKind::Linear, Attrs::new()).unwrap_err();
        assert!(err.to_string().contains("not an activation"), "{err}");
    }

    #[test]
    fn forward_matches_apply() {
        let x = Tensor::from_slice(&[-4.0f64, -1.0, 0.0, 0.5, 3.0, 7.0], &[2, 3]).unwrap();
        for kind in [
            ActivationKind::Relu6,
            ActivationKind::Hardtanh {
                min: -0.5,
                max: 2.0,
            },
            ActivationKind::Gelu { tanh: true },
            ActivationKind::Silu,
        ] {
            let op = Activation::new(kind).unwrap();
            let mut out = Tensor::zeros(DType::F64, &[2, 3]).unwrap();
            op.forward(&[&x], &mut out).unwrap();
            let want: Vec<f64> = x
                .as_slice::<f64>()
                .unwrap()
                .iter()
                .map(|&v| kind.apply(v))
                .collect();
            assert_eq!(out.as_slice::<f64>().unwrap(), &want[..]);
            let mut inplace = x.as_slice::<f64>().unwrap().to_vec();
            kind.apply_inplace(&mut inplace);
            assert_eq!(inplace, want);
        }
        assert_eq!(ActivationKind::Relu6.apply(7.0f32), 6.0);
        assert_eq!(ActivationKind::Hardswish.apply(1.0f64), 1.0 * 4.0 / 6.0);
    }

    #[test]
    fn conv_and_linear_fuse_the_activation() {
        use crate::ops::{Conv2d, Linear, PadMode};
        use crate::params::Padding2d;
        use crate::registry::{Algorithm, Request};
        let w: Vec<f32> = (0..18).map(|i| (i as f32 - 8.0) / 4.0).collect();
        let x: Vec<f32> = (0..16).map(|i| (i as f32 - 7.0) / 2.0).collect();
        let x = Tensor::from_slice(&x, &[1, 1, 4, 4]).unwrap();
        let kind = ActivationKind::Hardtanh {
            min: -1.0,
            max: 2.0,
        };
        for algo in [Algorithm::Direct, Algorithm::Gemm, Algorithm::Winograd] {
            let conv = |act| {
                let w = Tensor::from_slice(&w, &[2, 1, 3, 3]).unwrap();
                let c = Conv2d::new(
                    w,
                    None,
                    (1, 1),
                    Padding2d::symmetric(1, 1),
                    (1, 1),
                    1,
                    PadMode::Zeros,
                    Request::Named(algo),
                )
                .unwrap();
                let mut out = Tensor::zeros(DType::F32, &[1, 2, 4, 4]).unwrap();
                c.with_activation(act).forward(&[&x], &mut out).unwrap();
                out.as_slice::<f32>().unwrap().to_vec()
            };
            let plain = conv(None);
            assert!(plain.iter().any(|&v| !(-1.0..=2.0).contains(&v)));
            let want: Vec<f32> = plain.iter().map(|&v| kind.apply(v)).collect();
            assert_eq!(conv(Some(kind)), want, "{algo}");
        }
        let w = Tensor::from_slice(&[1.0f64, -1.0, 2.0, 0.5], &[2, 2]).unwrap();
        let lin = Linear::new(w, None, Request::Default)
            .unwrap()
            .with_activation(Some(ActivationKind::Relu));
        let x = Tensor::from_slice(&[1.0f64, 3.0], &[1, 2]).unwrap();
        let mut out = Tensor::zeros(DType::F64, &[1, 2]).unwrap();
        lin.forward(&[&x], &mut out).unwrap();
        assert_eq!(out.as_slice::<f64>().unwrap(), &[0.0, 3.5]);
    }
}
