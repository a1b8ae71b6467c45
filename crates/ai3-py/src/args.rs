//! Conversions from Python arguments to `ai3-core` values, shared by the
//! [`Model`](crate::model::Model) methods.

use ai3_core::ops::{ActivationKind, Attr, Attrs, ParamKind, SizeExpr};
use ai3_core::{DType, Error, OpKind, Request, Tensor};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyTuple};

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
pub(crate) fn parse_size_expr(obj: &Bound<'_, PyAny>) -> PyResult<SizeExpr> {
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
    let sub = |i: usize| parse_size_expr(&items[i]).map(Box::new);
    Ok(match tag.as_str() {
        "const" => {
            arity(1)?;
            SizeExpr::Const(int(&items[1])?)
        }
        "dim" => {
            arity(2)?;
            let input = int(&items[1])?;
            if input < 0 {
                return Err(PyValueError::new_err(format!(
                    "reshape: {} reads a negative input index",
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

/// The parameters of a node of `op`, converted by the kinds its spec gives
/// them: a tensor parameter is a tensor the node holds (copied in `dtype`, or
/// borrowed when `copy` is false) or an int naming a graph value; `None`
/// leaves a parameter out.
pub(crate) fn parse_attrs(
    op: OpKind,
    params: Option<&Bound<'_, PyDict>>,
    dtype: DType,
    copy: bool,
) -> PyResult<Attrs> {
    let mut attrs = Attrs::new();
    let Some(params) = params else {
        return Ok(attrs);
    };
    let spec = op.spec();
    for (key, value) in params.iter() {
        let name: String = key
            .extract()
            .map_err(|_| PyTypeError::new_err(format!("{op}: parameter names must be str")))?;
        if value.is_none() {
            continue;
        }
        let Some(p) = spec.param(&name) else {
            return Err(to_py(spec.unknown(op, &name)));
        };
        let attr = parse_attr(op, p.kind, &name, &value, dtype, copy)?;
        attrs.0.insert(name, attr);
    }
    Ok(attrs)
}

fn parse_attr(
    op: OpKind,
    kind: ParamKind,
    name: &str,
    value: &Bound<'_, PyAny>,
    dtype: DType,
    copy: bool,
) -> PyResult<Attr> {
    let wrong = || {
        let got = value
            .get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default();
        to_py(Error::invalid(
            op.name(),
            format!("parameter '{name}' must be {}, got {got}", kind.name()),
        ))
    };
    let is_int = value.is_instance_of::<PyInt>() && !value.is_instance_of::<PyBool>();
    Ok(match kind {
        ParamKind::Bool => Attr::Bool(value.cast::<PyBool>().map_err(|_| wrong())?.is_true()),
        ParamKind::Int if is_int => Attr::Int(value.extract().map_err(|_| wrong())?),
        ParamKind::Int => return Err(wrong()),
        ParamKind::Float if is_int || value.is_instance_of::<PyFloat>() => {
            Attr::Float(value.extract().map_err(|_| wrong())?)
        }
        ParamKind::Float => return Err(wrong()),
        ParamKind::Str => Attr::Str(value.extract().map_err(|_| wrong())?),
        ParamKind::Ints if is_int => Attr::Int(value.extract().map_err(|_| wrong())?),
        _ if matches!(
            kind,
            ParamKind::Ints | ParamKind::Floats | ParamKind::OptInts
        ) && !is_sequence(value) =>
        {
            return Err(wrong())
        }
        ParamKind::Ints => Attr::Ints(value.extract().map_err(|_| wrong())?),
        ParamKind::Floats => Attr::Floats(value.extract().map_err(|_| wrong())?),
        ParamKind::OptInts => Attr::OptInts(value.extract().map_err(|_| wrong())?),
        ParamKind::Tensor if is_int => Attr::Value(value.extract().map_err(|_| wrong())?),
        ParamKind::Tensor if value.hasattr("__dlpack__")? => {
            Attr::Tensor(import_weight(value, op.name(), dtype, copy)?)
        }
        ParamKind::Tensor => return Err(wrong()),
        ParamKind::Sizes => Attr::Sizes(
            value
                .try_iter()
                .map_err(|_| wrong())?
                .map(|e| parse_size_expr(&e?))
                .collect::<PyResult<_>>()?,
        ),
        ParamKind::Activation => {
            let (act, params): (String, Option<Bound<'_, PyDict>>) =
                value.extract().map_err(|_| wrong())?;
            let act_op = OpKind::from_name(&act).ok_or_else(|| {
                to_py(Error::invalid(
                    op.name(),
                    format!("parameter '{name}': unknown activation '{act}'"),
                ))
            })?;
            let attrs = parse_attrs(act_op, params.as_ref(), dtype, copy)?;
            Attr::Activation(ActivationKind::from_attrs(act_op, attrs).map_err(to_py)?)
        }
    })
}

/// Whether `value` is a list or tuple (not a string, which is iterable too).
fn is_sequence(value: &Bound<'_, PyAny>) -> bool {
    value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>()
}
