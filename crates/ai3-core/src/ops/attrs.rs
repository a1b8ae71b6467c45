//! Operations described as data.
//!
//! Each operation has one [`OpSpec`]: its parameters by name and kind, how
//! many inputs it reads, and the function that builds it from [`Args`]. A
//! front end gives parameter values by name ([`Attrs`]); [`OpSpec::check`]
//! rejects unknown, missing and mistyped ones with a message that names the
//! operation, and the builder reads them through typed getters. This is the
//! one way nodes are built ([`crate::Graph::add`]).

use std::collections::BTreeMap;

use super::{ActivationKind, Operation, RuntimeWeights, SizeExpr};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::ValueId;
use crate::registry::{OpKind, Request};
use crate::tensor::Tensor;

/// What a parameter holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// `true` / `false`.
    Bool,
    /// An integer.
    Int,
    /// A float (an integer is accepted).
    Float,
    /// A string.
    Str,
    /// A list of integers.
    Ints,
    /// A list of floats.
    Floats,
    /// A list of integers or `None`s (adaptive pooling's output size).
    OptInts,
    /// A tensor the node holds, or a graph value it reads on every call.
    Tensor,
    /// Size expressions computed at run time (see [`SizeExpr`]).
    Sizes,
    /// An activation applied to the output (`(name, params)`).
    Activation,
}

impl ParamKind {
    /// The kind as the Python stub spells it.
    pub fn name(self) -> &'static str {
        match self {
            ParamKind::Bool => "bool",
            ParamKind::Int => "int",
            ParamKind::Float => "float",
            ParamKind::Str => "str",
            ParamKind::Ints => "list[int]",
            ParamKind::Floats => "list[float]",
            ParamKind::OptInts => "list[int | None]",
            ParamKind::Tensor => "tensor | value id",
            ParamKind::Sizes => "list[size expression]",
            ParamKind::Activation => "(activation, params)",
        }
    }
}

/// One parameter of an operation.
#[derive(Debug)]
pub struct ParamSpec {
    /// Its name, as PyTorch spells it where PyTorch has one.
    pub name: &'static str,
    /// What it holds.
    pub kind: ParamKind,
    /// Whether it must be given (an optional one has a default, or is absent
    /// in PyTorch's sense: no bias).
    pub required: bool,
}

/// A required parameter.
pub const fn required(name: &'static str, kind: ParamKind) -> ParamSpec {
    ParamSpec {
        name,
        kind,
        required: true,
    }
}

/// An optional parameter.
pub const fn optional(name: &'static str, kind: ParamKind) -> ParamSpec {
    ParamSpec {
        name,
        kind,
        required: false,
    }
}

/// How many inputs (graph values besides weights) an operation reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arity {
    /// At least this many.
    pub min: usize,
    /// At most this many (`None`: any number).
    pub max: Option<usize>,
}

impl Arity {
    /// Exactly `n` inputs.
    pub const fn exactly(n: usize) -> Self {
        Arity {
            min: n,
            max: Some(n),
        }
    }

    /// `n` inputs or more.
    pub const fn at_least(n: usize) -> Self {
        Arity { min: n, max: None }
    }

    /// Between `min` and `max` inputs.
    pub const fn between(min: usize, max: usize) -> Self {
        Arity {
            min,
            max: Some(max),
        }
    }

    fn accepts(&self, n: usize) -> bool {
        n >= self.min && self.max.is_none_or(|m| n <= m)
    }
}

/// An operation described as data: what [`crate::Graph::add`] builds nodes from.
pub struct OpSpec {
    /// The inputs it reads.
    pub inputs: Arity,
    /// Its parameters.
    pub params: &'static [ParamSpec],
    /// Builds the operation from checked parameters.
    pub build: fn(&mut Args) -> Result<Box<dyn Operation>>,
}

impl OpSpec {
    /// The parameter called `name`, if the operation has one.
    pub fn param(&self, name: &str) -> Option<&'static ParamSpec> {
        self.params.iter().find(|p| p.name == name)
    }

    /// The error for a parameter `op` does not have, listing those it has.
    pub fn unknown(&self, op: OpKind, name: &str) -> Error {
        Error::invalid(
            op.name(),
            format!(
                "unknown parameter '{name}'; its parameters are {:?}",
                self.params.iter().map(|p| p.name).collect::<Vec<_>>()
            ),
        )
    }

    /// Rejects unknown, missing and mistyped parameters of `op`, and a wrong
    /// number of inputs.
    pub fn check(&self, op: OpKind, attrs: &Attrs, num_inputs: usize) -> Result<()> {
        if !self.inputs.accepts(num_inputs) {
            let want = match self.inputs.max {
                Some(m) if m == self.inputs.min => format!("{m}"),
                Some(m) => format!("{} to {m}", self.inputs.min),
                None => format!("at least {}", self.inputs.min),
            };
            return Err(Error::invalid(
                op.name(),
                format!("takes {want} input(s), got {num_inputs}"),
            ));
        }
        for (name, value) in &attrs.0 {
            let Some(p) = self.param(name) else {
                return Err(self.unknown(op, name));
            };
            if !value.fits(p.kind) {
                return Err(Error::invalid(
                    op.name(),
                    format!(
                        "parameter '{name}' must be {}, got {}",
                        p.kind.name(),
                        value.kind_name()
                    ),
                ));
            }
        }
        if let Some(p) = self
            .params
            .iter()
            .find(|p| p.required && !attrs.0.contains_key(p.name))
        {
            return Err(Error::invalid(
                op.name(),
                format!("missing parameter '{}'", p.name),
            ));
        }
        Ok(())
    }
}

/// A parameter's value.
#[derive(Debug)]
pub enum Attr {
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// A list of integers.
    Ints(Vec<i64>),
    /// A list of floats.
    Floats(Vec<f64>),
    /// A list of integers or `None`s.
    OptInts(Vec<Option<i64>>),
    /// A tensor the node holds.
    Tensor(Tensor),
    /// A graph value the node reads on every call in place of a held tensor.
    Value(ValueId),
    /// Size expressions.
    Sizes(Vec<SizeExpr>),
    /// An activation.
    Activation(ActivationKind),
}

impl Attr {
    fn fits(&self, kind: ParamKind) -> bool {
        matches!(
            (self, kind),
            (Attr::Bool(_), ParamKind::Bool)
                | (Attr::Int(_), ParamKind::Int)
                | (Attr::Float(_) | Attr::Int(_), ParamKind::Float)
                | (Attr::Str(_), ParamKind::Str)
                | (
                    Attr::Ints(_) | Attr::Int(_),
                    ParamKind::Ints | ParamKind::OptInts
                )
                | (Attr::Floats(_), ParamKind::Floats)
                | (Attr::OptInts(_), ParamKind::OptInts)
                | (Attr::Tensor(_) | Attr::Value(_), ParamKind::Tensor)
                | (Attr::Sizes(_), ParamKind::Sizes)
                | (Attr::Activation(_), ParamKind::Activation)
        )
    }

    fn kind_name(&self) -> &'static str {
        match self {
            Attr::Bool(_) => "a bool",
            Attr::Int(_) => "an int",
            Attr::Float(_) => "a float",
            Attr::Str(_) => "a str",
            Attr::Ints(_) => "a list of ints",
            Attr::Floats(_) => "a list of floats",
            Attr::OptInts(_) => "a list of ints and Nones",
            Attr::Tensor(_) => "a tensor",
            Attr::Value(_) => "a value id",
            Attr::Sizes(_) => "size expressions",
            Attr::Activation(_) => "an activation",
        }
    }

    /// A copy of a value that is not a held tensor (those are moved, never copied).
    pub(crate) fn try_clone(&self) -> Option<Attr> {
        Some(match self {
            Attr::Bool(v) => Attr::Bool(*v),
            Attr::Int(v) => Attr::Int(*v),
            Attr::Float(v) => Attr::Float(*v),
            Attr::Str(v) => Attr::Str(v.clone()),
            Attr::Ints(v) => Attr::Ints(v.clone()),
            Attr::Floats(v) => Attr::Floats(v.clone()),
            Attr::OptInts(v) => Attr::OptInts(v.clone()),
            Attr::Tensor(_) => return None,
            Attr::Value(v) => Attr::Value(*v),
            Attr::Sizes(v) => Attr::Sizes(v.clone()),
            Attr::Activation(v) => Attr::Activation(*v),
        })
    }
}

/// Parameter values by name.
#[derive(Debug, Default)]
pub struct Attrs(pub BTreeMap<String, Attr>);

impl Attrs {
    /// No parameters.
    pub fn new() -> Self {
        Attrs::default()
    }

    /// These parameters plus `name = value`.
    pub fn with(mut self, name: &str, value: Attr) -> Self {
        self.0.insert(name.to_string(), value);
        self
    }
}

/// The checked parameters of one node, read by its operation's builder.
pub struct Args {
    op: OpKind,
    attrs: Attrs,
    /// The algorithm asked for.
    pub request: Request,
    /// How many inputs the node reads.
    pub num_inputs: usize,
}

impl Args {
    /// Parameters `attrs` of `op` (already checked against its spec).
    pub fn new(op: OpKind, attrs: Attrs, request: Request, num_inputs: usize) -> Self {
        Args {
            op,
            attrs,
            request,
            num_inputs,
        }
    }

    /// The operation being built.
    pub fn op(&self) -> OpKind {
        self.op
    }

    fn wrong(&self, name: &str, want: &str) -> Error {
        Error::invalid(self.op.name(), format!("parameter '{name}' must be {want}"))
    }

    fn missing(&self, name: &str) -> Error {
        Error::invalid(self.op.name(), format!("missing parameter '{name}'"))
    }

    fn get(&self, name: &str) -> Option<&Attr> {
        self.attrs.0.get(name)
    }

    /// A boolean, `default` when absent.
    pub fn bool_or(&self, name: &str, default: bool) -> Result<bool> {
        match self.get(name) {
            None => Ok(default),
            Some(Attr::Bool(v)) => Ok(*v),
            Some(_) => Err(self.wrong(name, "a bool")),
        }
    }

    /// An integer, if given.
    pub fn opt_int(&self, name: &str) -> Result<Option<i64>> {
        match self.get(name) {
            None => Ok(None),
            Some(Attr::Int(v)) => Ok(Some(*v)),
            Some(_) => Err(self.wrong(name, "an int")),
        }
    }

    /// An integer that must be given.
    pub fn int(&self, name: &str) -> Result<i64> {
        self.opt_int(name)?.ok_or_else(|| self.missing(name))
    }

    /// An integer, `default` when absent.
    pub fn int_or(&self, name: &str, default: i64) -> Result<i64> {
        Ok(self.opt_int(name)?.unwrap_or(default))
    }

    fn to_usize(&self, name: &str, v: i64) -> Result<usize> {
        usize::try_from(v).map_err(|_| {
            Error::invalid(
                self.op.name(),
                format!("parameter '{name}' must not be negative, got {v}"),
            )
        })
    }

    /// A non-negative integer, if given.
    pub fn opt_usize(&self, name: &str) -> Result<Option<usize>> {
        self.opt_int(name)?
            .map(|v| self.to_usize(name, v))
            .transpose()
    }

    /// A non-negative integer that must be given.
    pub fn usize(&self, name: &str) -> Result<usize> {
        self.opt_usize(name)?.ok_or_else(|| self.missing(name))
    }

    /// A non-negative integer, `default` when absent.
    pub fn usize_or(&self, name: &str, default: usize) -> Result<usize> {
        Ok(self.opt_usize(name)?.unwrap_or(default))
    }

    /// A float (an integer is accepted), if given.
    pub fn opt_float(&self, name: &str) -> Result<Option<f64>> {
        match self.get(name) {
            None => Ok(None),
            Some(Attr::Float(v)) => Ok(Some(*v)),
            Some(Attr::Int(v)) => Ok(Some(*v as f64)),
            Some(_) => Err(self.wrong(name, "a float")),
        }
    }

    /// A float, `default` when absent.
    pub fn float_or(&self, name: &str, default: f64) -> Result<f64> {
        Ok(self.opt_float(name)?.unwrap_or(default))
    }

    /// A string, `default` when absent.
    pub fn str_or<'a>(&'a self, name: &str, default: &'a str) -> Result<&'a str> {
        match self.get(name) {
            None => Ok(default),
            Some(Attr::Str(v)) => Ok(v),
            Some(_) => Err(self.wrong(name, "a str")),
        }
    }

    /// A list of integers, if given.
    pub fn opt_ints(&self, name: &str) -> Result<Option<Vec<i64>>> {
        match self.get(name) {
            None => Ok(None),
            Some(Attr::Ints(v)) => Ok(Some(v.clone())),
            Some(Attr::Int(v)) => Ok(Some(vec![*v])),
            Some(_) => Err(self.wrong(name, "a list of ints")),
        }
    }

    /// A list of integers that must be given.
    pub fn ints(&self, name: &str) -> Result<Vec<i64>> {
        self.opt_ints(name)?.ok_or_else(|| self.missing(name))
    }

    /// A list of non-negative integers, if given.
    pub fn opt_usizes(&self, name: &str) -> Result<Option<Vec<usize>>> {
        self.opt_ints(name)?
            .map(|v| v.into_iter().map(|x| self.to_usize(name, x)).collect())
            .transpose()
    }

    /// `N` non-negative integers (an int is all `N` of them), `default` when absent.
    pub fn usizes_n<const N: usize>(&self, name: &str, default: [usize; N]) -> Result<[usize; N]> {
        let v = match self.get(name) {
            None => return Ok(default),
            Some(Attr::Int(v)) => vec![*v; N],
            Some(Attr::Ints(v)) => v.clone(),
            Some(_) => return Err(self.wrong(name, &format!("{N} ints"))),
        };
        let v: Vec<usize> = v
            .into_iter()
            .map(|x| self.to_usize(name, x))
            .collect::<Result<_>>()?;
        let got = v.len();
        v.try_into().map_err(|_| {
            Error::invalid(
                self.op.name(),
                format!("parameter '{name}' must have {N} values, got {got}"),
            )
        })
    }

    /// A pair of non-negative integers (an int is both), `default` when absent.
    pub fn pair_or(&self, name: &str, default: (usize, usize)) -> Result<(usize, usize)> {
        let [a, b] = self.usizes_n(name, [default.0, default.1])?;
        Ok((a, b))
    }

    /// A list of non-negative integers or `None`s of length `N` (an int or
    /// `None` alone is all of them).
    pub fn opt_usizes_n<const N: usize>(&self, name: &str) -> Result<[Option<usize>; N]> {
        let v: Vec<Option<i64>> = match self.get(name) {
            None => return Err(self.missing(name)),
            Some(Attr::Int(v)) => vec![Some(*v); N],
            Some(Attr::Ints(v)) => v.iter().map(|x| Some(*x)).collect(),
            Some(Attr::OptInts(v)) => v.clone(),
            Some(_) => return Err(self.wrong(name, &format!("{N} ints or Nones"))),
        };
        let v: Vec<Option<usize>> = v
            .into_iter()
            .map(|x| x.map(|x| self.to_usize(name, x)).transpose())
            .collect::<Result<_>>()?;
        let got = v.len();
        v.try_into().map_err(|_| {
            Error::invalid(
                self.op.name(),
                format!("parameter '{name}' must have {N} values, got {got}"),
            )
        })
    }

    /// A list of integers and `None`s that must be given.
    pub fn opt_ints_list(&self, name: &str) -> Result<Vec<Option<i64>>> {
        match self.get(name) {
            None => Err(self.missing(name)),
            Some(Attr::OptInts(v)) => Ok(v.clone()),
            Some(Attr::Ints(v)) => Ok(v.iter().map(|&x| Some(x)).collect()),
            Some(_) => Err(self.wrong(name, "a list of ints and Nones")),
        }
    }

    /// A tensor, if given (taken: a builder reads each tensor once).
    pub fn tensor(&mut self, name: &str) -> Result<Option<Tensor>> {
        match self.attrs.0.remove(name) {
            None => Ok(None),
            Some(Attr::Tensor(t)) => Ok(Some(t)),
            Some(Attr::Value(v)) => Err(Error::internal(
                self.op.name(),
                format!("parameter '{name}' is graph value {v}, not yet a tensor"),
            )),
            Some(_) => Err(self.wrong(name, "a tensor")),
        }
    }

    /// A tensor that must be given.
    pub fn required_tensor(&mut self, name: &str) -> Result<Tensor> {
        self.tensor(name)?.ok_or_else(|| self.missing(name))
    }

    /// Size expressions that must be given.
    pub fn sizes(&self, name: &str) -> Result<Vec<SizeExpr>> {
        match self.get(name) {
            None => Err(self.missing(name)),
            Some(Attr::Sizes(v)) => Ok(v.clone()),
            Some(_) => Err(self.wrong(name, "size expressions")),
        }
    }

    /// The activation, if given.
    pub fn activation(&self, name: &str) -> Result<Option<ActivationKind>> {
        match self.get(name) {
            None => Ok(None),
            Some(Attr::Activation(k)) => Ok(Some(*k)),
            Some(_) => Err(self.wrong(name, "an activation")),
        }
    }
}

/// Builds node `op` reading `inputs` with parameters `attrs` and running
/// `algorithm` (a selector name) in `dtype`: the operation, and the values the
/// node reads (`inputs`, then the weights given as graph values).
///
/// Weights given as graph values ([`Attr::Value`]) are read on every call
/// and the layer is built from them each time ([`RuntimeWeights`]); a layer's
/// weights are then all graph values (add held ones with `Graph::constant`).
pub fn build_node(
    op: OpKind,
    inputs: Vec<ValueId>,
    attrs: Attrs,
    algorithm: &str,
    dtype: DType,
) -> Result<(Box<dyn Operation>, Vec<ValueId>)> {
    let spec = op.spec();
    spec.check(op, &attrs, inputs.len())?;
    let request = Request::parse(op, algorithm)?;
    // In the order of the spec (weight before bias), as summaries list inputs.
    let values: Vec<(String, ValueId)> = spec
        .params
        .iter()
        .filter_map(|p| match attrs.0.get(p.name) {
            Some(Attr::Value(id)) => Some((p.name.to_string(), *id)),
            _ => None,
        })
        .collect();
    let num_inputs = inputs.len();
    if values.is_empty() {
        let mut args = Args::new(op, attrs, request, num_inputs);
        return Ok(((spec.build)(&mut args)?, inputs));
    }
    if num_inputs != 1 {
        return Err(Error::invalid(
            op.name(),
            "weights read as graph values need a node with one input",
        ));
    }
    if attrs.0.values().any(|v| matches!(v, Attr::Tensor(_))) {
        return Err(Error::invalid(
            op.name(),
            "weights must all be tensors or all be value ids (add constants with `constant`)",
        ));
    }
    let fused = match attrs.0.get("activation") {
        Some(Attr::Activation(k)) => Some(k.op_kind()),
        _ => None,
    };
    let names: Vec<String> = values.iter().map(|(k, _)| k.clone()).collect();
    let layer = move |given: Vec<Tensor>| -> Result<Box<dyn Operation>> {
        let mut filled = Attrs::new();
        for (k, v) in &attrs.0 {
            let v = v.try_clone().ok_or_else(|| {
                Error::internal(op.name(), format!("parameter '{k}' cannot be copied"))
            })?;
            filled.0.insert(k.clone(), v);
        }
        for (k, t) in names.iter().zip(given) {
            filled.0.insert(k.clone(), Attr::Tensor(t));
        }
        (spec.build)(&mut Args::new(op, filled, request, num_inputs))
    };
    let mut reads = inputs;
    reads.extend(values.iter().map(|(_, id)| *id));
    let node = RuntimeWeights::new(op, dtype, fused, Box::new(layer));
    Ok((Box::new(node), reads))
}
