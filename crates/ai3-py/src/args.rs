//! Conversions from Python arguments to `ai3-core` values, shared by the
//! [`Model`](crate::model::Model) methods.

use ai3_core::ops::{ActivationKind, PadMode, SizeExpr};
use ai3_core::params::Padding2d;
use ai3_core::{DType, Error, OpKind, Request, Tensor};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::dlpack;
use crate::errors::to_py;

pub(crate) fn parse_dtype(name: &str) -> PyResult<DType> {
    DType::from_name(name).ok_or_else(|| {
        to_py(Error::dtype(
            "model",
            format!("unsupported dtype {name}; ai3 computes in float32 and float64"),
        ))
    })
}

pub(crate) fn parse_request(op: OpKind, name: &str) -> PyResult<Request> {
    Request::parse(op, name).map_err(to_py)
}

pub(crate) fn parse_pad_mode(name: &str) -> PyResult<PadMode> {
    Ok(match name {
        "zeros" => PadMode::Zeros,
        "reflect" => PadMode::Reflect,
        "replicate" => PadMode::Replicate,
        "circular" => PadMode::Circular,
        other => {
            return Err(to_py(Error::invalid(
                OpKind::Conv2d.name(),
                format!(
                "padding_mode must be 'zeros', 'reflect', 'replicate' or 'circular', got '{other}'"
            ),
            )))
        }
    })
}

pub(crate) fn padding2d((top, bottom, left, right): (usize, usize, usize, usize)) -> Padding2d {
    Padding2d {
        top,
        bottom,
        left,
        right,
    }
}

/// An activation given as `(name, params)`, e.g. `("hardtanh", [0.0, 6.0])`.
pub(crate) fn parse_activation(
    spec: Option<(String, Vec<f64>)>,
) -> PyResult<Option<ActivationKind>> {
    spec.map(|(name, params)| ActivationKind::from_name(&name, &params).map_err(to_py))
        .transpose()
}

/// A weight as a tensor of `dtype`: copied once at build time, or borrowed
/// (no copy) when `copy` is false and it already has the right dtype and layout.
pub(crate) fn import_weight(
    obj: &Bound<'_, PyAny>,
    op: &str,
    dtype: DType,
    copy: bool,
) -> PyResult<Tensor> {
    let t = dlpack::import(obj, op)?;
    if !copy && t.dtype() == dtype && t.is_contiguous() {
        return Ok(t);
    }
    // A copy that cannot be made names the layer, not the tensor.
    t.to_dtype(dtype).map_err(|e| to_py(e.with_op(op)))
}

/// Parses one reshape size expression: `("const", v)`, `("dim", input, axis)`,
/// or `("add" | "sub" | "mul" | "floordiv", a, b)`; a bare int is a constant.
/// `num_inputs` bounds the input index of `"dim"`.
pub(crate) fn parse_size_expr(obj: &Bound<'_, PyAny>, num_inputs: usize) -> PyResult<SizeExpr> {
    if let Ok(v) = obj.extract::<i64>() {
        return Ok(SizeExpr::Const(v));
    }
    let repr = || obj.repr().map(|r| r.to_string()).unwrap_or_default();
    let items: Vec<Bound<'_, PyAny>> = if let Ok(t) = obj.cast::<PyTuple>() {
        t.iter().collect()
    } else if let Ok(l) = obj.cast::<PyList>() {
        l.iter().collect()
    } else {
        return Err(PyTypeError::new_err(format!(
            "reshape: a size expression must be an int or a tuple like ('const', v), ('dim', input, axis) or ('add', a, b), got {}",
            repr()
        )));
    };
    let tag: String = match items.first().map(|t| t.extract::<String>()) {
        Some(Ok(tag)) => tag,
        _ => {
            return Err(PyTypeError::new_err(format!(
                "reshape: a size expression tuple must start with a tag string, got {}",
                repr()
            )))
        }
    };
    let arity = |n: usize| -> PyResult<()> {
        if items.len() != n + 1 {
            return Err(PyValueError::new_err(format!(
                "reshape: '{tag}' takes {n} argument(s), got {}",
                repr()
            )));
        }
        Ok(())
    };
    let int = |o: &Bound<'_, PyAny>| -> PyResult<i64> {
        o.extract::<i64>()
            .map_err(|_| PyTypeError::new_err(format!("reshape: expected an int in {}", repr())))
    };
    let sub = |i: usize| parse_size_expr(&items[i], num_inputs).map(Box::new);
    Ok(match tag.as_str() {
        "const" => {
            arity(1)?;
            SizeExpr::Const(int(&items[1])?)
        }
        "dim" => {
            arity(2)?;
            let input = int(&items[1])?;
            if input < 0 || input as usize >= num_inputs {
                return Err(PyValueError::new_err(format!(
                    "reshape: {} reads input {input} but the node has {num_inputs} input(s)",
                    repr()
                )));
            }
            SizeExpr::Dim {
                input: input as usize,
                axis: int(&items[2])?,
            }
        }
        "add" | "sub" | "mul" | "floordiv" => {
            arity(2)?;
            let (a, b) = (sub(1)?, sub(2)?);
            match tag.as_str() {
                "add" => SizeExpr::Add(a, b),
                "sub" => SizeExpr::Sub(a, b),
                "mul" => SizeExpr::Mul(a, b),
                _ => SizeExpr::FloorDiv(a, b),
            }
        }
        other => {
            return Err(PyValueError::new_err(format!(
                "reshape: unknown size expression tag '{other}'; expected const, dim, add, sub, mul or floordiv"
            )))
        }
    })
}
