//! Binary elementwise arithmetic with broadcasting: add, sub, mul, div.

use super::attrs::{optional, Args, Arity, OpSpec, ParamKind as K};
use ai3_kernels::cpu::{binary, blocked};
use ai3_kernels::params::broadcast_shape;

use super::activation::with_scalar_fn;
use super::{elements, elements_mut, kernel_result, with_dtype, ActivationKind, Operation};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::layout::Blocked;
use crate::registry::{Algorithm, OpKind};
use crate::tensor::{shape_str, Tensor};

/// The arithmetic operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryKind {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b` (IEEE: division by zero gives ±inf or NaN, as in PyTorch).
    Div,
}

impl BinaryKind {
    /// The operation (`add`, `sub`, `mul`, `div`).
    pub fn op_kind(self) -> OpKind {
        match self {
            BinaryKind::Add => OpKind::Add,
            BinaryKind::Sub => OpKind::Sub,
            BinaryKind::Mul => OpKind::Mul,
            BinaryKind::Div => OpKind::Div,
        }
    }
}

/// Calls `$f(.., g)` with `g` the closure `post(a op b)` of `$kind`, matching
/// once per call.
macro_rules! with_binary_fn {
    ($kind:expr, $post:ident, $f:path, ($($arg:expr),*)) => {
        match $kind {
            BinaryKind::Add => $f($($arg,)* |a, b| $post(a + b)),
            BinaryKind::Sub => $f($($arg,)* |a, b| $post(a - b)),
            BinaryKind::Mul => $f($($arg,)* |a, b| $post(a * b)),
            BinaryKind::Div => $f($($arg,)* |a, b| $post(a / b)),
        }
    };
}

/// `a op b` for two tensors (broadcast), or `x op scalar` / `scalar op x`,
/// optionally followed by an activation in the same pass.
#[derive(Debug, Clone, Copy)]
pub struct Binary {
    kind: BinaryKind,
    scalar: Option<f64>,
    scalar_first: bool,
    activation: Option<ActivationKind>,
}

impl Binary {
    /// Two tensor inputs when `scalar` is `None`; otherwise one tensor input
    /// and the scalar on the right (`x - 2`) or, with `scalar_first`, on the
    /// left (`2 - x`).
    pub fn new(kind: BinaryKind, scalar: Option<f64>, scalar_first: bool) -> Self {
        Binary {
            kind,
            scalar,
            scalar_first,
            activation: None,
        }
    }

    /// Fuses `activation` (any kind) into the node: applied to each result
    /// as it is written (ResNet's `relu(out + identity)`).
    pub fn with_activation(mut self, activation: Option<ActivationKind>) -> Self {
        self.activation = activation;
        self
    }

    /// How many tensor inputs the node reads.
    pub fn num_inputs(&self) -> usize {
        if self.scalar.is_some() {
            1
        } else {
            2
        }
    }

    fn run<T: Element>(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        match self.activation {
            Some(a) => with_scalar_fn!(a, T, run_then(self, inputs, output)),
            None => run_then(self, inputs, output, |v: T| v),
        }
    }

    fn arity_error(&self, got: usize) -> Error {
        Error::invalid(
            self.kind.op_kind().name(),
            format!(
                "expected {} tensor input(s){}, got {got}",
                self.num_inputs(),
                if self.scalar.is_some() {
                    " and a scalar"
                } else {
                    ""
                }
            ),
        )
    }
}

/// Runs `op` with `post` applied to each result.
fn run_then<T: Element, G: Fn(T) -> T + Sync + Copy>(
    op: &Binary,
    inputs: &[&Tensor],
    output: &mut Tensor,
    post: G,
) -> Result<()> {
    let out = elements_mut::<T>(output)?;
    let done = match (inputs, op.scalar) {
        ([x], Some(s)) => {
            let s = T::from_f64(s).unwrap_or_else(T::nan);
            let first = op.scalar_first;
            with_binary_fn!(
                op.kind,
                post,
                binary::scalar,
                (elements::<T>(x)?, s, first, out)
            )
        }
        ([a, b], None) if a.shape() == b.shape() => {
            with_binary_fn!(
                op.kind,
                post,
                binary::same_shape,
                (elements::<T>(a)?, elements::<T>(b)?, out)
            )
        }
        ([a, b], None) => with_binary_fn!(
            op.kind,
            post,
            binary::broadcast,
            (
                elements::<T>(a)?,
                a.shape(),
                elements::<T>(b)?,
                b.shape(),
                out
            )
        ),
        _ => return Err(op.arity_error(inputs.len())),
    };
    kernel_result(op.kind.op_kind(), done, || {
        let shapes: Vec<String> = inputs.iter().map(|t| shape_str(t.shape())).collect();
        format!("input shapes {}", shapes.join(", "))
    })
}

/// For a per-channel broadcast (one input `[n or 1, c, 1, 1]`, the other
/// the whole output `[n, c, h, w]` with more than one pixel), whether the
/// per-channel input is the first; `None` for any other pair of shapes.
fn per_channel_operand(a: &[usize], b: &[usize], out: &[usize]) -> Option<bool> {
    let channel =
        |s: &[usize]| s.len() == 4 && s[2] == 1 && s[3] == 1 && (s[0] == 1 || s[0] == out[0]);
    let plane = out
        .get(2..)
        .is_some_and(|p| p.iter().product::<usize>() > 1);
    match (a == out, b == out) {
        (true, false) if plane && channel(b) => Some(false),
        (false, true) if plane && channel(a) => Some(true),
        _ => None,
    }
}

impl Operation for Binary {
    // Operands of the output's rank and batch (the executor checks) are
    // broadcast within an image only.
    fn per_image(&self, _inputs: &[&[usize]]) -> bool {
        true
    }
    fn kind(&self) -> OpKind {
        self.kind.op_kind()
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Ok(Algorithm::Direct.name().into())
    }
    fn fused_activation(&self) -> Option<OpKind> {
        self.activation.map(|a| a.op_kind())
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        match (inputs, self.scalar) {
            ([x], Some(_)) => Ok(x.to_vec()),
            ([a, b], None) => broadcast_shape(a, b).ok_or_else(|| {
                Error::shape(
                    self.kind().name(),
                    format!(
                        "shapes {} and {} cannot be broadcast together",
                        shape_str(a),
                        shape_str(b)
                    ),
                )
            }),
            _ => Err(self.arity_error(inputs.len())),
        }
    }
    fn blocked(&self, inputs: &[&[usize]]) -> Blocked {
        // A division could turn the padding lanes' zeros into NaN; the
        // others keep them finite. Every tensor input needs the output's
        // channels, so that its blocks line up with the output's.
        if self.kind == BinaryKind::Div {
            return Blocked::No;
        }
        let Ok(out) = self.output_shape(inputs) else {
            return Blocked::No;
        };
        let aligned = inputs.iter().all(|s| s.len() == 4 && s[1] == out[1]);
        if out.len() != 4 || !aligned {
            return Blocked::No;
        }
        match inputs {
            [a, b] if a != b => match per_channel_operand(a, b, &out) {
                Some(_) => Blocked::Kernel { gain: 0 },
                None => Blocked::No,
            },
            _ => Blocked::Elementwise,
        }
    }

    fn forward_blocked(
        &self,
        inputs: &[&Tensor],
        shapes: &[&[usize]],
        output: &mut Tensor,
    ) -> Result<()> {
        let op = self.kind.op_kind();
        let (&[x, y], &[a, b]) = (inputs, shapes) else {
            return Err(self.arity_error(inputs.len()));
        };
        if a.len() != 4 || b.len() != 4 {
            return Err(Error::internal(op.name(), "a blocked input is not 4-D"));
        }
        let [n, c, h, w]: [usize; 4] = std::array::from_fn(|i| a[i].max(b[i]));
        let Some(first) = per_channel_operand(a, b, &[n, c, h, w]) else {
            return Err(Error::internal(
                op.name(),
                format!(
                    "no channel-blocked kernel for shapes {} and {}",
                    shape_str(a),
                    shape_str(b)
                ),
            ));
        };
        // `big` is the full image, `small` the per-channel values.
        let (big, small, s_batch) = if first { (y, x, a[0]) } else { (x, y, b[0]) };
        let activation = self.activation;
        let post = |block: &mut [f32]| {
            if let Some(act) = activation {
                act.apply_serial(block)
            }
        };
        let (src, s, out) = (
            big.as_slice::<f32>()?,
            small.as_slice::<f32>()?,
            output.as_mut_slice::<f32>()?,
        );
        let plane = h * w;
        // `f(image value, channel value)`, the operands in their order.
        let done = match (self.kind, first) {
            (BinaryKind::Add, _) => {
                blocked::per_channel(n, c, plane, src, s, s_batch, out, |p, q| p + q, post)
            }
            (BinaryKind::Mul, _) => {
                blocked::per_channel(n, c, plane, src, s, s_batch, out, |p, q| p * q, post)
            }
            (BinaryKind::Sub, false) => {
                blocked::per_channel(n, c, plane, src, s, s_batch, out, |p, q| p - q, post)
            }
            (BinaryKind::Sub, true) => {
                blocked::per_channel(n, c, plane, src, s, s_batch, out, |p, q| q - p, post)
            }
            (BinaryKind::Div, _) => {
                return Err(Error::internal(
                    op.name(),
                    "division has no channel-blocked kernel",
                ))
            }
        };
        kernel_result(op, done, || {
            format!(
                "input shapes {}, {}, channel-blocked layout",
                shape_str(a),
                shape_str(b)
            )
        })
    }

    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        with_dtype!(output.dtype(), T, self.run::<T>(inputs, output))
    }
}

fn build_binary(a: &mut Args) -> Result<Box<dyn Operation>> {
    let kind = match a.op() {
        OpKind::Add => BinaryKind::Add,
        OpKind::Sub => BinaryKind::Sub,
        OpKind::Mul => BinaryKind::Mul,
        OpKind::Div => BinaryKind::Div,
        other => return Err(Error::internal(other.name(), "not a binary operation")),
    };
    let op = Binary::new(
        kind,
        a.opt_float("scalar")?,
        a.bool_or("scalar_first", false)?,
    )
    .with_activation(a.activation("activation")?);
    if a.num_inputs != op.num_inputs() {
        return Err(Error::invalid(
            kind.op_kind().name(),
            format!(
                "expected {} input(s) with scalar={:?}, got {}",
                op.num_inputs(),
                op.scalar,
                a.num_inputs
            ),
        ));
    }
    Ok(Box::new(op))
}

/// A binary operation: two inputs (broadcast), or one and a `scalar` (on the
/// left with `scalar_first`), and a fused `activation`.
const BINARY: OpSpec = OpSpec {
    inputs: Arity::between(1, 2),
    params: &[
        optional("scalar", K::Float),
        optional("scalar_first", K::Bool),
        optional("activation", K::Activation),
    ],
    build: build_binary,
};

/// `add`.
pub const ADD: OpSpec = BINARY;
/// `sub`.
pub const SUB: OpSpec = BINARY;
/// `mul`.
pub const MUL: OpSpec = BINARY;
/// `div`.
pub const DIV: OpSpec = BINARY;

#[cfg(test)]
mod tests {
    use super::*;

    fn run(op: &Binary, inputs: &[&Tensor]) -> Result<Tensor> {
        let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
        let mut out = Tensor::zeros(inputs[0].dtype(), &op.output_shape(&shapes)?).unwrap();
        op.forward(inputs, &mut out)?;
        Ok(out)
    }

    #[test]
    fn tensor_and_scalar_forms() {
        let x = Tensor::from_slice(&[1.0f32, 2.0, 4.0, 8.0], &[2, 2]).unwrap();
        let y = Tensor::from_slice(&[10.0f32, 20.0], &[2, 1]).unwrap();
        let sub = Binary::new(BinaryKind::Sub, None, false);
        let out = run(&sub, &[&x, &y]).unwrap();
        assert_eq!(out.as_slice::<f32>().unwrap(), &[-9.0, -8.0, -16.0, -12.0]);
        let div = Binary::new(BinaryKind::Div, Some(2.0), true);
        let out = run(&div, &[&x]).unwrap();
        assert_eq!(out.as_slice::<f32>().unwrap(), &[2.0, 1.0, 0.5, 0.25]);
        let mul = Binary::new(BinaryKind::Mul, None, false);
        assert_eq!(
            run(&mul, &[&x, &x]).unwrap().as_slice::<f32>().unwrap(),
            &[1.0, 4.0, 16.0, 64.0]
        );
    }

    #[test]
    fn incompatible_shapes_name_both() {
        let add = Binary::new(BinaryKind::Add, None, false);
        let err = add.output_shape(&[&[2, 3], &[4]]).unwrap_err().to_string();
        assert!(
            err.contains("add") && err.contains("[2, 3]") && err.contains("[4]"),
            "{err}"
        );
        assert!(add.output_shape(&[&[2, 3]]).is_err());
    }
}
