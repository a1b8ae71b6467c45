//! Data movement between shapes: concatenation, permutation, and the pieces
//! of `chunk` / `split`. Each produces a contiguous copy.

use super::attrs::{optional, required, Arity, OpSpec, ParamKind as K};
use ai3_kernels::cpu::shape as kernel;
use ai3_kernels::params::AxisParams;

use super::{elements, elements_mut, kernel_result, normalize_dim, single, with_dtype, Operation};
use crate::error::{Error, Result};
use crate::layout::{Blocked, BLOCK};
use crate::registry::{Algorithm, OpKind};
use crate::tensor::{shape_str, Tensor};

fn shapes_str(shapes: &[&[usize]]) -> String {
    let parts: Vec<String> = shapes.iter().map(|s| shape_str(s)).collect();
    parts.join(", ")
}

/// `torch.cat(inputs, dim)`: every input has the same rank and the same
/// sizes except along `dim`.
#[derive(Debug, Clone, Copy)]
pub struct Concat {
    dim: i64,
}

impl Concat {
    /// Concatenation along `dim` (negative counts from the end).
    pub fn new(dim: i64) -> Self {
        Concat { dim }
    }

    fn axis(&self, inputs: &[&[usize]]) -> Result<usize> {
        let op = OpKind::Cat;
        let Some(first) = inputs.first() else {
            return Err(Error::invalid(op.name(), "needs at least one input"));
        };
        if first.is_empty() {
            return Err(Error::shape(
                op.name(),
                format!(
                    "zero-dimensional inputs cannot be concatenated; input shapes {}",
                    shapes_str(inputs)
                ),
            ));
        }
        let axis = normalize_dim(op, self.dim, first.len(), first)?;
        let fits = |s: &&[usize]| {
            s.len() == first.len()
                && s.iter()
                    .zip(first.iter())
                    .enumerate()
                    .all(|(k, (a, b))| k == axis || a == b)
        };
        if !inputs.iter().all(fits) {
            return Err(Error::shape(
                op.name(),
                format!(
                    "inputs must have the same rank and the same sizes except in dimension {}; got shapes {}",
                    self.dim,
                    shapes_str(inputs)
                ),
            ));
        }
        Ok(axis)
    }
}

/// PyTorch's legacy rule: inputs of shape `[0]` are skipped, whatever the
/// rank of the others, unless every input is one.
fn legacy_skip<'a, T>(inputs: &[&'a T], shape: impl Fn(&T) -> &[usize]) -> Vec<&'a T>
where
    T: ?Sized,
{
    let kept: Vec<&T> = inputs.iter().copied().filter(|t| shape(t) != [0]).collect();
    if kept.is_empty() {
        inputs.to_vec()
    } else {
        kept
    }
}

impl Operation for Concat {
    fn kind(&self) -> OpKind {
        OpKind::Cat
    }
    fn per_image(&self, inputs: &[&[usize]]) -> bool {
        // Along channels or further, with no skipped `[0]` input.
        inputs.iter().all(|s| *s != [0]) && self.axis(inputs).is_ok_and(|a| a >= 1)
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Ok(Algorithm::Direct.name().into())
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let inputs = &legacy_skip(inputs, |s| s)[..];
        let axis = self.axis(inputs)?;
        let mut out = inputs[0].to_vec();
        out[axis] = inputs.iter().map(|s| s[axis]).sum();
        Ok(out)
    }
    fn in_place_parts(&self, inputs: &[&[usize]]) -> Option<Vec<usize>> {
        // PyTorch's skipped `[0]` inputs have no place: no planning for them.
        if inputs.iter().any(|s| *s == [0]) {
            return None;
        }
        let axis = self.axis(inputs).ok()?;
        if inputs[0][..axis].iter().any(|&d| d != 1) {
            return None;
        }
        let mut at = 0usize;
        let mut starts = Vec::with_capacity(inputs.len());
        for s in inputs {
            starts.push(at);
            at = at.checked_add(s.iter().product())?;
        }
        Some(starts)
    }
    fn blocked(&self, inputs: &[&[usize]]) -> Blocked {
        // Along the channels, each input whole blocks: the blocked output
        // is the inputs' blocks end to end per image, as NCHW would have
        // them, so the same copies (or in-place places) serve.
        let whole = inputs
            .iter()
            .all(|s| s.len() == 4 && s[1] % BLOCK == 0 && s[1] > 0);
        match self.axis(inputs) {
            Ok(1) if whole => Blocked::Kernel { gain: 0 },
            _ => Blocked::No,
        }
    }
    fn forward_blocked(
        &self,
        inputs: &[&Tensor],
        shapes: &[&[usize]],
        output: &mut Tensor,
    ) -> Result<()> {
        if self.blocked(shapes) == Blocked::No {
            return Err(Error::internal(
                OpKind::Cat.name(),
                format!(
                    "no channel-blocked kernel for input shapes {}",
                    shapes_str(shapes)
                ),
            ));
        }
        // Physical [n, c / 8, h, w, 8]: the block axis is still axis 1.
        self.run(inputs, 1, output)
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let inputs = &legacy_skip(inputs, Tensor::shape)[..];
        let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
        let axis = self.axis(&shapes)?;
        self.run(inputs, axis, output)
    }
}

impl Concat {
    /// Copies `inputs` (already past the legacy skip) along `axis` into
    /// `output`.
    fn run(&self, inputs: &[&Tensor], axis: usize, output: &mut Tensor) -> Result<()> {
        let outer = AxisParams::new(output.shape(), axis).outer;
        if outer == 1 {
            return concat_runs(inputs, output);
        }
        with_dtype!(output.dtype(), T, {
            let parts = inputs
                .iter()
                .map(|t| {
                    let p = AxisParams::new(t.shape(), axis);
                    Ok((elements::<T>(t)?, p.dim * p.inner))
                })
                .collect::<Result<Vec<_>>>()?;
            let done = kernel::concat::<T>(outer, &parts, elements_mut(output)?);
            kernel_result(OpKind::Cat, done, || {
                let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
                format!("input shapes {}", shapes_str(&shapes))
            })?
        });
        Ok(())
    }
}

/// A concatenation with one run per input (nothing before the axis): each
/// input is copied to its place in `output`, unless the memory planner
/// already put it there (see [`Operation::in_place_parts`]).
fn concat_runs(inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
    // Checked before anything is written.
    if let Some(t) = inputs.iter().find(|t| t.dtype() != output.dtype()) {
        return Err(Error::invalid(
            OpKind::Cat.name(),
            format!(
                "an input of dtype {} for an output of {}",
                t.dtype().name(),
                output.dtype().name()
            ),
        ));
    }
    let total: usize = inputs.iter().map(|t| t.numel()).sum();
    if total != output.numel() {
        return Err(Error::internal(
            OpKind::Cat.name(),
            format!(
                "inputs of {total} elements for an output of {}",
                output.numel()
            ),
        ));
    }
    let size = output.dtype().size();
    let dst = output.data_ptr_mut();
    let mut at = 0usize;
    for t in inputs {
        let bytes = t.numel() * size;
        // SAFETY: `at + bytes` is within the output (the sizes sum to its
        // own, checked above); the input holds `bytes` bytes. Raw copies, not
        // slices: an input placed inside the output overlaps it.
        unsafe {
            let to = dst.add(at);
            let from = t.data_ptr();
            if !std::ptr::eq(from, to) {
                std::ptr::copy(from, to, bytes);
            }
        }
        at += bytes;
    }
    Ok(())
}

/// `x.permute(dims).contiguous()`.
#[derive(Debug, Clone)]
pub struct Permute {
    dims: Vec<i64>,
    /// `transpose(d0, d1)`: the permutation is only known once the input's rank is.
    swap: Option<(i64, i64)>,
}

impl Permute {
    /// A permutation of the input's dimensions (negative entries count from the end).
    pub fn new(dims: Vec<i64>) -> Self {
        Permute { dims, swap: None }
    }

    /// `x.transpose(d0, d1)`: the identity permutation with two dimensions exchanged.
    pub fn transpose(d0: i64, d1: i64) -> Self {
        Permute {
            dims: Vec::new(),
            swap: Some((d0, d1)),
        }
    }

    fn perm(&self, shape: &[usize]) -> Result<Vec<usize>> {
        let op = OpKind::Permute;
        if let Some((d0, d1)) = self.swap {
            let mut perm: Vec<usize> = (0..shape.len()).collect();
            let a = normalize_dim(op, d0, shape.len(), shape)?;
            let b = normalize_dim(op, d1, shape.len(), shape)?;
            perm.swap(a, b);
            return Ok(perm);
        }
        let bad = || {
            Error::invalid(
                op.name(),
                format!(
                    "dims {:?} are not a permutation of the {} dimensions of input of shape {}",
                    self.dims,
                    shape.len(),
                    shape_str(shape)
                ),
            )
        };
        if self.dims.len() != shape.len() {
            return Err(bad());
        }
        let mut seen = vec![false; shape.len()];
        let mut perm = Vec::with_capacity(shape.len());
        for &d in &self.dims {
            let k = normalize_dim(op, d, shape.len(), shape)?;
            if std::mem::replace(&mut seen[k], true) {
                return Err(bad());
            }
            perm.push(k);
        }
        Ok(perm)
    }
}

impl Operation for Permute {
    fn kind(&self) -> OpKind {
        OpKind::Permute
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Ok(Algorithm::Direct.name().into())
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let x = single(OpKind::Permute, inputs)?;
        Ok(self.perm(x)?.iter().map(|&k| x[k]).collect())
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let x = single(OpKind::Permute, inputs)?;
        let perm = self.perm(x.shape())?;
        with_dtype!(x.dtype(), T, {
            let done = kernel::permute::<T>(x.shape(), &perm, elements(x)?, elements_mut(output)?);
            kernel_result(OpKind::Permute, done, || {
                format!("input shape {}, dims {perm:?}", shape_str(x.shape()))
            })?
        });
        Ok(())
    }
}

/// How a dimension is cut into pieces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SliceMode {
    /// `torch.chunk(n)`: pieces of `ceil(size / n)`; the last may be smaller,
    /// and there may be fewer than `n`.
    Chunks(usize),
    /// `torch.split(k)`: pieces of `k`, the last one smaller.
    SplitSize(usize),
    /// `torch.split([a, b, ...])`: pieces of these sizes, which must sum to the size.
    Sections(Vec<usize>),
}

/// Piece `index` of `torch.chunk` / `torch.split` along `dim`, as a contiguous copy.
#[derive(Debug, Clone)]
pub struct Slice {
    dim: i64,
    index: usize,
    mode: SliceMode,
}

impl Slice {
    /// Piece `index` of cutting dimension `dim` according to `mode`.
    pub fn new(dim: i64, index: usize, mode: SliceMode) -> Result<Self> {
        let op = OpKind::Slice.name();
        match &mode {
            SliceMode::Chunks(0) => return Err(Error::invalid(op, "chunks must be positive")),
            SliceMode::SplitSize(0) => {
                return Err(Error::invalid(op, "split_size must be positive"))
            }
            SliceMode::Sections(s) if index >= s.len() => {
                return Err(Error::invalid(
                    op,
                    format!(
                        "index {index} is out of range for {} sections {s:?}",
                        s.len()
                    ),
                ))
            }
            _ => {}
        }
        Ok(Slice { dim, index, mode })
    }

    /// `(axis, start, len)` of the piece in an input of `shape`.
    fn piece(&self, shape: &[usize]) -> Result<(usize, usize, usize)> {
        let op = OpKind::Slice;
        let axis = normalize_dim(op, self.dim, shape.len(), shape)?;
        let size = shape[axis];
        let (start, len, pieces) = match &self.mode {
            SliceMode::Chunks(n) => {
                let step = size.div_ceil(*n);
                let pieces = if size == 0 { *n } else { size.div_ceil(step) };
                let start = (self.index * step).min(size);
                (start, step.min(size - start), pieces)
            }
            SliceMode::SplitSize(k) => {
                let start = (self.index * k).min(size);
                (start, (*k).min(size - start), size.div_ceil(*k).max(1))
            }
            SliceMode::Sections(s) => {
                if s.iter().sum::<usize>() != size {
                    return Err(Error::shape(
                        op.name(),
                        format!(
                            "sections {s:?} do not sum to the size {size} of dimension {} of input of shape {}",
                            self.dim,
                            shape_str(shape)
                        ),
                    ));
                }
                (s[..self.index].iter().sum(), s[self.index], s.len())
            }
        };
        if self.index >= pieces {
            return Err(Error::shape(
                op.name(),
                format!(
                    "piece {} does not exist: {:?} cuts dimension {} of input of shape {} into {pieces} piece(s)",
                    self.index,
                    self.mode,
                    self.dim,
                    shape_str(shape)
                ),
            ));
        }
        Ok((axis, start, len))
    }
}

impl Operation for Slice {
    fn kind(&self) -> OpKind {
        OpKind::Slice
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Ok(Algorithm::Direct.name().into())
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let x = single(OpKind::Slice, inputs)?;
        let (axis, _, len) = self.piece(x)?;
        let mut out = x.to_vec();
        out[axis] = len;
        Ok(out)
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let x = single(OpKind::Slice, inputs)?;
        let (axis, start, len) = self.piece(x.shape())?;
        let p = AxisParams::new(x.shape(), axis);
        with_dtype!(x.dtype(), T, {
            let done = kernel::narrow::<T>(
                p.outer,
                p.dim * p.inner,
                start * p.inner,
                len * p.inner,
                elements(x)?,
                elements_mut(output)?,
            );
            kernel_result(OpKind::Slice, done, || {
                format!("input shape {}", shape_str(x.shape()))
            })?
        });
        Ok(())
    }
}

/// `cat`: its inputs joined along `dim`.
pub const CAT: OpSpec = OpSpec {
    inputs: Arity::at_least(1),
    params: &[required("dim", K::Int)],
    build: |a| Ok(Box::new(Concat::new(a.int("dim")?))),
};

/// `permute`: `dims` reordered, or (`dim0`, `dim1`) swapped as `transpose` does.
pub const PERMUTE: OpSpec = OpSpec {
    inputs: Arity::exactly(1),
    params: &[
        optional("dims", K::Ints),
        optional("dim0", K::Int),
        optional("dim1", K::Int),
    ],
    build: |a| match (a.opt_ints("dims")?, a.opt_int("dim0")?, a.opt_int("dim1")?) {
        (Some(dims), None, None) => Ok(Box::new(Permute::new(dims))),
        (None, Some(d0), Some(d1)) => Ok(Box::new(Permute::transpose(d0, d1))),
        _ => Err(Error::invalid(
            OpKind::Permute.name(),
            "give either dims, or dim0 and dim1",
        )),
    },
};

/// `slice`: piece `index` along `dim` of `torch.chunk` (`chunks`),
/// `torch.split` by size (`split_size`) or by `sections`; exactly one of the three.
pub const SLICE: OpSpec = OpSpec {
    inputs: Arity::exactly(1),
    params: &[
        required("dim", K::Int),
        required("index", K::Int),
        optional("chunks", K::Int),
        optional("split_size", K::Int),
        optional("sections", K::Ints),
    ],
    build: |a| {
        let mode = match (
            a.opt_usize("chunks")?,
            a.opt_usize("split_size")?,
            a.opt_usizes("sections")?,
        ) {
            (Some(n), None, None) => SliceMode::Chunks(n),
            (None, Some(k), None) => SliceMode::SplitSize(k),
            (None, None, Some(s)) => SliceMode::Sections(s),
            _ => {
                return Err(Error::invalid(
                    OpKind::Slice.name(),
                    "give exactly one of chunks, split_size and sections",
                ))
            }
        };
        Ok(Box::new(Slice::new(
            a.int("dim")?,
            a.usize("index")?,
            mode,
        )?))
    },
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    fn run(op: &dyn Operation, inputs: &[&Tensor]) -> Result<Vec<f64>> {
        let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
        let mut out = Tensor::zeros(DType::F64, &op.output_shape(&shapes)?).unwrap();
        op.forward(inputs, &mut out)?;
        Ok(elements::<f64>(&out)?.to_vec())
    }

    fn ramp(shape: &[usize]) -> Tensor {
        let v: Vec<f64> = (0..shape.iter().product::<usize>())
            .map(|i| i as f64)
            .collect();
        Tensor::from_slice(&v, shape).unwrap()
    }

    #[test]
    fn chunk_and_split_pieces_follow_torch() {
        let x = ramp(&[2, 5]);
        // torch.chunk(x, 3, 1): sizes 2, 2, 1.
        let sizes = |mode: SliceMode, n: usize| -> Vec<Vec<usize>> {
            (0..n)
                .map(|i| {
                    Slice::new(-1, i, mode.clone())
                        .and_then(|s| s.output_shape(&[&[2, 5]]))
                        .unwrap_or_default()
                })
                .collect()
        };
        assert_eq!(
            sizes(SliceMode::Chunks(3), 3),
            vec![vec![2, 2], vec![2, 2], vec![2, 1]]
        );
        // torch.chunk(x, 4, 1) on 5 gives only 3 pieces of 2, 2, 1.
        assert_eq!(sizes(SliceMode::Chunks(4), 4)[3], Vec::<usize>::new());
        assert_eq!(sizes(SliceMode::SplitSize(2), 3)[2], vec![2, 1]);
        let s = Slice::new(1, 1, SliceMode::Sections(vec![1, 3, 1])).unwrap();
        assert_eq!(run(&s, &[&x]).unwrap(), vec![1.0, 2.0, 3.0, 6.0, 7.0, 8.0]);
        let empty = Slice::new(1, 1, SliceMode::Sections(vec![2, 0, 3])).unwrap();
        assert_eq!(empty.output_shape(&[&[2, 5]]).unwrap(), vec![2, 0]);
        assert_eq!(run(&empty, &[&x]).unwrap(), Vec::<f64>::new());
        let bad = Slice::new(1, 0, SliceMode::Sections(vec![1, 1])).unwrap();
        let err = bad.output_shape(&[&[2, 5]]).unwrap_err().to_string();
        assert!(err.contains("[2, 5]") && err.contains("[1, 1]"), "{err}");
    }

    #[test]
    fn cat_and_permute() {
        let (a, b) = (ramp(&[2, 1, 2]), ramp(&[2, 2, 2]));
        let cat = Concat::new(-2);
        assert_eq!(
            run(&cat, &[&a, &b]).unwrap(),
            vec![0.0, 1.0, 0.0, 1.0, 2.0, 3.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
        );
        let err = cat
            .output_shape(&[&[2, 1, 2], &[3, 1, 2]])
            .unwrap_err()
            .to_string();
        assert!(err.contains("[2, 1, 2], [3, 1, 2]"), "{err}");
        let p = Permute::new(vec![1, 0]);
        assert_eq!(
            run(&p, &[&ramp(&[2, 3])]).unwrap(),
            vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
        );
        assert!(Permute::new(vec![0, 0]).output_shape(&[&[2, 2]]).is_err());
        assert!(Permute::new(vec![0]).output_shape(&[&[2, 2]]).is_err());
    }
}
