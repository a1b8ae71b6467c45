//! Reshape to a shape computed at run time from the sizes of the node's inputs.

use super::attrs::{required, Arity, OpSpec, ParamKind as K};
use super::{elements, elements_mut, normalize_dim, with_dtype, Operation};
use crate::error::{Error, Result};
use crate::registry::{Algorithm, OpKind};
use crate::tensor::{shape_str, Tensor};

const OP: OpKind = OpKind::Reshape;

/// One entry of a target shape: an integer expression over input sizes, so a
/// traced `x.view(x.size(0), -1)` keeps working for any batch size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SizeExpr {
    /// A constant; `-1` as a whole entry means "infer from the element count".
    Const(i64),
    /// Size `axis` (negative counts from the end) of node input `input`
    /// (`0` is the data being reshaped).
    Dim {
        /// Which node input.
        input: usize,
        /// Which of its dimensions.
        axis: i64,
    },
    /// Sum.
    Add(Box<SizeExpr>, Box<SizeExpr>),
    /// Difference.
    Sub(Box<SizeExpr>, Box<SizeExpr>),
    /// Product.
    Mul(Box<SizeExpr>, Box<SizeExpr>),
    /// Python's `//` (rounds toward negative infinity).
    FloorDiv(Box<SizeExpr>, Box<SizeExpr>),
}

impl SizeExpr {
    /// Rejects a size read from an input the node does not have.
    pub fn check_inputs(&self, num_inputs: usize) -> Result<()> {
        match self {
            SizeExpr::Const(_) => Ok(()),
            SizeExpr::Dim { input, .. } if *input >= num_inputs => Err(Error::invalid(
                OP.name(),
                format!("a size reads input {input} but the node has {num_inputs} input(s)"),
            )),
            SizeExpr::Dim { .. } => Ok(()),
            SizeExpr::Add(a, b)
            | SizeExpr::Sub(a, b)
            | SizeExpr::Mul(a, b)
            | SizeExpr::FloorDiv(a, b) => {
                a.check_inputs(num_inputs)?;
                b.check_inputs(num_inputs)
            }
        }
    }

    /// The value for these input shapes.
    pub fn eval(&self, inputs: &[&[usize]]) -> Result<i64> {
        let overflow = || Error::invalid(OP.name(), format!("{self:?} overflows"));
        Ok(match self {
            SizeExpr::Const(v) => *v,
            SizeExpr::Dim { input, axis } => {
                let shape = inputs.get(*input).ok_or_else(|| {
                    Error::invalid(
                        OP.name(),
                        format!(
                            "size expression reads input {input} but the node has {} input(s)",
                            inputs.len()
                        ),
                    )
                })?;
                shape[normalize_dim(OP, *axis, shape.len(), shape)?] as i64
            }
            SizeExpr::Add(a, b) => a
                .eval(inputs)?
                .checked_add(b.eval(inputs)?)
                .ok_or_else(overflow)?,
            SizeExpr::Sub(a, b) => a
                .eval(inputs)?
                .checked_sub(b.eval(inputs)?)
                .ok_or_else(overflow)?,
            SizeExpr::Mul(a, b) => a
                .eval(inputs)?
                .checked_mul(b.eval(inputs)?)
                .ok_or_else(overflow)?,
            SizeExpr::FloorDiv(a, b) => {
                let (n, d) = (a.eval(inputs)?, b.eval(inputs)?);
                if d == 0 {
                    return Err(Error::invalid(
                        OP.name(),
                        format!(
                            "division by zero in {self:?} for input shapes {}",
                            shapes_str(inputs)
                        ),
                    ));
                }
                let q = n.checked_div(d).ok_or_else(overflow)?;
                if n % d != 0 && ((n < 0) != (d < 0)) {
                    q - 1
                } else {
                    q
                }
            }
        })
    }
}

fn shapes_str(shapes: &[&[usize]]) -> String {
    let parts: Vec<String> = shapes.iter().map(|s| shape_str(s)).collect();
    parts.join(", ")
}

/// `x.reshape(spec)` as a contiguous copy; the node's inputs are the data
/// followed by any tensors whose sizes the spec reads.
#[derive(Debug, Clone)]
pub struct Reshape {
    spec: Vec<SizeExpr>,
}

impl Reshape {
    /// A reshape to `spec` (at most one entry may be `Const(-1)`).
    pub fn new(spec: Vec<SizeExpr>) -> Result<Self> {
        let inferred = spec.iter().filter(|e| **e == SizeExpr::Const(-1)).count();
        if inferred > 1 {
            return Err(Error::invalid(
                OP.name(),
                format!("only one dimension can be inferred (-1), got spec {spec:?}"),
            ));
        }
        Ok(Reshape { spec })
    }
}

impl Operation for Reshape {
    fn kind(&self) -> OpKind {
        OP
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Ok(Algorithm::Direct.name().into())
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let Some(data) = inputs.first() else {
            return Err(Error::internal(
                OP.name(),
                "expected at least 1 input, got 0",
            ));
        };
        // The data's shape exists, so its count fits; the target's may not.
        let numel: usize = data.iter().product();
        let mut out = Vec::with_capacity(self.spec.len());
        let mut infer = None;
        for (k, e) in self.spec.iter().enumerate() {
            let v = e.eval(inputs)?;
            if *e == SizeExpr::Const(-1) {
                infer = Some(k);
                out.push(1);
            } else if v < 0 {
                return Err(Error::invalid(
                    OP.name(),
                    format!(
                        "entry {k} of the target shape ({e:?}) is {v} for input shapes {}",
                        shapes_str(inputs)
                    ),
                ));
            } else {
                out.push(v as usize);
            }
        }
        let known = crate::tensor::checked_numel(&out);
        let mismatch = || {
            let shown: Vec<i64> = (0..out.len())
                .map(|k| if Some(k) == infer { -1 } else { out[k] as i64 })
                .collect();
            Error::shape(
                OP.name(),
                format!(
                    "shape {shown:?} is invalid for input of shape {} ({numel} elements)",
                    shape_str(data)
                ),
            )
        };
        match (infer, known) {
            (Some(k), Some(known)) => {
                if known == 0 || !numel.is_multiple_of(known) {
                    return Err(mismatch());
                }
                out[k] = numel / known;
            }
            (None, Some(known)) if known == numel => {}
            _ => return Err(mismatch()),
        }
        Ok(out)
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let Some(x) = inputs.first() else {
            return Err(Error::internal(
                OP.name(),
                "expected at least 1 input, got 0",
            ));
        };
        if x.numel() != output.numel() {
            return Err(Error::internal(OP.name(), "element counts differ"));
        }
        with_dtype!(x.dtype(), T, {
            elements_mut::<T>(output)?.copy_from_slice(elements::<T>(x)?)
        });
        Ok(())
    }
}

/// `reshape` of input 0 to `shape`, one size expression per output dimension
/// (inputs after the first are read for their sizes only).
pub const SPEC: OpSpec = OpSpec {
    inputs: Arity::at_least(1),
    params: &[required("shape", K::Sizes)],
    build: |a| {
        let spec = a.sizes("shape")?;
        for e in &spec {
            e.check_inputs(a.num_inputs)?;
        }
        Ok(Box::new(Reshape::new(spec)?))
    },
};

#[cfg(test)]
mod tests {
    use super::*;
    use SizeExpr::*;

    fn dim(input: usize, axis: i64) -> Box<SizeExpr> {
        Box::new(Dim { input, axis })
    }

    #[test]
    fn evaluates_run_time_sizes() {
        // x.view(x.size(0), -1) and x.view(b, c // 2, 2, h * w) with sizes read from input 1.
        let r = Reshape::new(vec![*dim(0, 0), Const(-1)]).unwrap();
        assert_eq!(r.output_shape(&[&[4, 3, 2]]).unwrap(), vec![4, 6]);
        let spec = vec![
            *dim(1, 0),
            FloorDiv(dim(1, 1), Box::new(Const(2))),
            Const(2),
            Mul(dim(1, -2), dim(1, -1)),
        ];
        let r = Reshape::new(spec).unwrap();
        assert_eq!(
            r.output_shape(&[&[2, 6, 3, 5], &[2, 6, 3, 5]]).unwrap(),
            vec![2, 3, 2, 15]
        );
        let e = Sub(Box::new(Const(-7)), Box::new(Const(0)));
        assert_eq!(
            FloorDiv(Box::new(e), Box::new(Const(2))).eval(&[]).unwrap(),
            -4
        );
    }

    #[test]
    fn errors_name_shapes() {
        assert!(Reshape::new(vec![Const(-1), Const(-1)]).is_err());
        let r = Reshape::new(vec![Const(5), Const(-1)]).unwrap();
        let err = r.output_shape(&[&[4, 3]]).unwrap_err().to_string();
        assert!(
            err.contains("[4, 3]") && err.contains("12 elements"),
            "{err}"
        );
        let r = Reshape::new(vec![FloorDiv(dim(0, 0), Box::new(Const(0)))]).unwrap();
        assert!(r
            .output_shape(&[&[4]])
            .unwrap_err()
            .to_string()
            .contains("division by zero"));
        let r = Reshape::new(vec![*dim(2, 0)]).unwrap();
        assert!(r.output_shape(&[&[4]]).is_err());
        // (2^62 + 1) * 2 * 2 wraps around to 4: a target that overflows is a mismatch.
        let r = Reshape::new(vec![Const((1 << 62) + 1), Const(2), Const(2)]).unwrap();
        assert!(r.output_shape(&[&[4]]).is_err());
        let r = Reshape::new(vec![Const(1 << 62), Const(4), Const(-1)]).unwrap();
        assert!(r.output_shape(&[&[4]]).is_err());
    }
}
