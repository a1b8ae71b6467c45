//! Operations that read a strided view of their input and write it
//! contiguous: `expand` (broadcasting, stride 0) and indexing (`x[:, 0]`,
//! `x[..., 1:5:2]`, `x[None]`), which run the one gather kernel; and
//! `squeeze`, whose view is the input's data under a shorter shape.

use ai3_kernels::cpu::shape::gather;

use super::attrs::{required, Arity, OpSpec, ParamKind as K};
use super::{elements, elements_mut, kernel_result, with_dtype, Operation, SizeExpr};
use crate::error::{Error, Result};
use crate::registry::{Algorithm, OpKind};
use crate::tensor::{shape_str, Tensor};

/// Contiguous strides of `shape`.
fn strides_of(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * shape[k + 1];
    }
    strides
}

/// A view: where it starts in the input, its shape and its strides.
struct View {
    offset: usize,
    dims: Vec<usize>,
    strides: Vec<usize>,
}

fn copy_view(op: OpKind, view: &View, x: &Tensor, output: &mut Tensor) -> Result<()> {
    with_dtype!(x.dtype(), T, {
        let done = gather::<T>(
            view.offset,
            &view.dims,
            &view.strides,
            elements(x)?,
            elements_mut(output)?,
        );
        kernel_result(op, done, || {
            format!(
                "input of shape {}, view of shape {}",
                shape_str(x.shape()),
                shape_str(&view.dims)
            )
        })
    })
}

/// `x.expand(*size)` as a contiguous copy: `-1` keeps a dimension, a
/// dimension of size 1 repeats, new leading dimensions may be added. The
/// node's inputs are the data and any tensors whose sizes `size` reads.
#[derive(Debug, Clone)]
pub struct Expand {
    size: Vec<SizeExpr>,
}

impl Expand {
    fn view(&self, inputs: &[&[usize]]) -> Result<View> {
        let op = OpKind::Expand;
        let x = inputs.first().copied().unwrap_or(&[]);
        let (r_in, r_out) = (x.len(), self.size.len());
        let bad = |why: String| {
            let sizes: Vec<String> = inputs.iter().map(|s| shape_str(s)).collect();
            Error::shape(
                op.name(),
                format!("{why} (input shapes {})", sizes.join(", ")),
            )
        };
        if r_out < r_in {
            return Err(bad(format!(
                "{r_out} sizes for an input of {r_in} dimensions"
            )));
        }
        let in_strides = strides_of(x);
        let (mut dims, mut strides) = (Vec::with_capacity(r_out), Vec::with_capacity(r_out));
        for (k, e) in self.size.iter().enumerate() {
            let v = e.eval(inputs)?;
            let own = k.checked_sub(r_out - r_in).map(|i| (x[i], in_strides[i]));
            let (d, s) = match (own, v) {
                (Some((d, s)), -1) => (d, s),
                (Some((d, s)), v) if v >= 0 && d == v as usize => (d, s),
                (Some((1, _)), v) if v >= 0 => (v as usize, 0),
                (None, v) if v >= 0 => (v as usize, 0),
                _ => {
                    return Err(bad(format!(
                        "size {v} at dimension {k} cannot expand {}",
                        own.map_or("a new dimension".into(), |(d, _)| format!("size {d}"))
                    )))
                }
            };
            dims.push(d);
            strides.push(s);
        }
        Ok(View {
            offset: 0,
            dims,
            strides,
        })
    }
}

impl Operation for Expand {
    fn kind(&self) -> OpKind {
        OpKind::Expand
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Ok(Algorithm::Direct.name().into())
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        Ok(self.view(inputs)?.dims)
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
        copy_view(OpKind::Expand, &self.view(&shapes)?, inputs[0], output)
    }
}

/// `expand` of input 0 to `size`, one size expression per output dimension.
pub const EXPAND: OpSpec = OpSpec {
    inputs: Arity::at_least(1),
    params: &[required("size", K::Sizes)],
    build: |a| {
        let size = a.sizes("size")?;
        for e in &size {
            e.check_inputs(a.num_inputs)?;
        }
        Ok(Box::new(Expand { size }))
    },
};

/// One entry of an index: what `x[...]` holds for one position.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum IndexItem {
    /// `start:stop:step` (`None`: from the start, to the end), `step > 0`.
    Slice(Option<i64>, Option<i64>, i64),
    /// An integer: that position, the dimension removed.
    Int(i64),
    /// `None`: a new dimension of size 1.
    NewAxis,
    /// `...`: as many full slices as the other entries leave.
    Ellipsis,
}

/// `x[items]` with basic indexing (slices with positive steps, integers,
/// `None`, `...`), as a contiguous copy.
#[derive(Debug, Clone)]
pub struct Index {
    items: Vec<IndexItem>,
}

impl Index {
    /// An index; a slice step of 0 or less, or two ellipses, is an error.
    pub fn new(items: Vec<IndexItem>) -> Result<Self> {
        let op = OpKind::Index;
        for item in &items {
            if let IndexItem::Slice(_, _, step) = item {
                if *step <= 0 {
                    return Err(Error::invalid(
                        op.name(),
                        format!(
                            "slice step {step}: steps must be positive (PyTorch rejects \
                             negative steps too; use torch.flip)"
                        ),
                    ));
                }
            }
        }
        if items.iter().filter(|i| **i == IndexItem::Ellipsis).count() > 1 {
            return Err(Error::invalid(
                op.name(),
                "an index can have only one '...'",
            ));
        }
        Ok(Index { items })
    }

    fn view(&self, x: &[usize]) -> Result<View> {
        let op = OpKind::Index;
        let consumed = self
            .items
            .iter()
            .filter(|i| matches!(i, IndexItem::Slice(..) | IndexItem::Int(_)))
            .count();
        if consumed > x.len() {
            return Err(Error::shape(
                op.name(),
                format!("{consumed} indices for an input of shape {}", shape_str(x)),
            ));
        }
        let full = IndexItem::Slice(None, None, 1);
        let mut items: Vec<IndexItem> = Vec::with_capacity(x.len() + self.items.len());
        for &item in &self.items {
            if item == IndexItem::Ellipsis {
                items.extend(std::iter::repeat_n(full, x.len() - consumed));
            } else {
                items.push(item);
            }
        }
        if !self.items.contains(&IndexItem::Ellipsis) {
            items.extend(std::iter::repeat_n(full, x.len() - consumed));
        }
        let in_strides = strides_of(x);
        let mut view = View {
            offset: 0,
            dims: Vec::new(),
            strides: Vec::new(),
        };
        let mut dim = 0;
        for item in items {
            match item {
                IndexItem::NewAxis => {
                    view.dims.push(1);
                    view.strides.push(0);
                }
                IndexItem::Int(i) => {
                    let size = x[dim] as i64;
                    let at = if i < 0 { i + size } else { i };
                    if !(0..size).contains(&at) {
                        return Err(Error::shape(
                            op.name(),
                            format!(
                                "index {i} is out of bounds for dimension {dim} with size {size} \
                                 (input of shape {})",
                                shape_str(x)
                            ),
                        ));
                    }
                    view.offset += at as usize * in_strides[dim];
                    dim += 1;
                }
                IndexItem::Slice(start, stop, step) => {
                    let size = x[dim] as i64;
                    let clamp = |v: i64| (if v < 0 { v + size } else { v }).clamp(0, size);
                    let (a, b) = (start.map_or(0, clamp), stop.map_or(size, clamp));
                    let len = if b > a { (b - a + step - 1) / step } else { 0 };
                    if len > 0 {
                        view.offset += a as usize * in_strides[dim];
                    }
                    view.dims.push(len as usize);
                    view.strides.push(in_strides[dim] * step as usize);
                    dim += 1;
                }
                IndexItem::Ellipsis => unreachable!("expanded above"),
            }
        }
        Ok(view)
    }
}

impl Operation for Index {
    fn kind(&self) -> OpKind {
        OpKind::Index
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Ok(Algorithm::Direct.name().into())
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        Ok(self.view(super::single(OpKind::Index, inputs)?)?.dims)
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let x = super::single(OpKind::Index, inputs)?;
        copy_view(OpKind::Index, &self.view(x.shape())?, x, output)
    }
}

/// `index`: one entry per position of `x[...]`, as four parallel lists:
/// `kinds` (0 slice, 1 integer, 2 `None`, 3 `...`), `starts` (a slice's
/// start or the integer; `None` for from the start), `stops` (`None` for to
/// the end) and `steps`.
pub const INDEX: OpSpec = OpSpec {
    inputs: Arity::exactly(1),
    params: &[
        required("kinds", K::Ints),
        required("starts", K::OptInts),
        required("stops", K::OptInts),
        required("steps", K::Ints),
    ],
    build: |a| {
        let kinds = a.ints("kinds")?;
        let starts = a.opt_ints_list("starts")?;
        let stops = a.opt_ints_list("stops")?;
        let steps = a.ints("steps")?;
        let n = kinds.len();
        if starts.len() != n || stops.len() != n || steps.len() != n {
            return Err(Error::invalid(
                OpKind::Index.name(),
                "kinds, starts, stops and steps must have one entry per position",
            ));
        }
        let items = (0..n)
            .map(|i| match kinds[i] {
                0 => Ok(IndexItem::Slice(starts[i], stops[i], steps[i])),
                1 => starts[i].map(IndexItem::Int).ok_or_else(|| {
                    Error::invalid(OpKind::Index.name(), "an integer entry needs its start")
                }),
                2 => Ok(IndexItem::NewAxis),
                3 => Ok(IndexItem::Ellipsis),
                k => Err(Error::invalid(
                    OpKind::Index.name(),
                    format!("unknown entry kind {k}"),
                )),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Box::new(Index::new(items)?))
    },
};

/// `x.squeeze(dims)`: the listed dimensions that have size 1 removed (a
/// listed dimension of another size stays, as in PyTorch); no dims: every
/// dimension of size 1.
#[derive(Debug, Clone)]
pub struct Squeeze {
    dims: Option<Vec<i64>>,
}

impl Squeeze {
    /// Removes the size-1 dimensions among `dims` (all of them for `None`).
    pub fn new(dims: Option<Vec<i64>>) -> Self {
        Squeeze { dims }
    }
}

impl Operation for Squeeze {
    fn kind(&self) -> OpKind {
        OpKind::Squeeze
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Ok(Algorithm::Direct.name().into())
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let op = OpKind::Squeeze;
        let x = super::single(op, inputs)?;
        let mut drop = vec![self.dims.is_none(); x.len()];
        for &d in self.dims.iter().flatten() {
            // A 0-D tensor accepts dim 0 or -1 and stays 0-D, as in PyTorch.
            let k = super::normalize_dim(op, d, x.len().max(1), x)?;
            if let Some(flag) = drop.get_mut(k) {
                *flag = true;
            }
        }
        Ok(x.iter()
            .zip(drop)
            .filter(|&(&size, drop)| !(drop && size == 1))
            .map(|(&size, _)| size)
            .collect())
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let x = super::single(OpKind::Squeeze, inputs)?;
        with_dtype!(x.dtype(), T, {
            elements_mut::<T>(output)?.copy_from_slice(elements::<T>(x)?);
        });
        Ok(())
    }
}

/// `squeeze` of `dims` (absent: every dimension of size 1).
pub const SQUEEZE: OpSpec = OpSpec {
    inputs: Arity::exactly(1),
    params: &[super::attrs::optional("dims", K::Ints)],
    build: |a| Ok(Box::new(Squeeze::new(a.opt_ints("dims")?))),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squeeze_drops_only_dimensions_of_size_one() {
        let all = Squeeze::new(None);
        assert_eq!(all.output_shape(&[&[1, 3, 1, 2]]).unwrap(), vec![3, 2]);
        let some = Squeeze::new(Some(vec![0, -2, 1]));
        // Dimension 1 (size 3) is listed but stays, as in PyTorch.
        assert_eq!(some.output_shape(&[&[1, 3, 1, 2]]).unwrap(), vec![3, 2]);
        assert_eq!(
            Squeeze::new(Some(vec![-1])).output_shape(&[&[]]).unwrap(),
            Vec::<usize>::new()
        );
        let err = Squeeze::new(Some(vec![4]))
            .output_shape(&[&[1, 3]])
            .unwrap_err();
        assert!(err.to_string().contains("squeeze"), "{err}");
        let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[1, 3]).unwrap();
        let mut out = Tensor::zeros(x.dtype(), &[3]).unwrap();
        all.forward(&[&x], &mut out).unwrap();
        assert_eq!(out.as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0]);
    }
}
