//! `nn.MultiheadAttention` as one node: the query, key and value
//! projections (each a [`Linear`], its weight packed once), the heads split
//! out, one [`Attention`] whose algorithm the node's request chooses, the
//! heads merged back and the output projection.

use rayon::prelude::*;

use super::attrs::{optional, required, Arity, OpSpec, ParamKind as K};
use super::{with_dtype, Attention, Linear, Operation};
use crate::error::{Error, Result};
use crate::registry::{OpKind, Problem, Request};
use crate::tensor::{shape_str, Tensor};

const OP: OpKind = OpKind::MultiheadAttention;

/// Multi-head attention over query `[batch, q_len, embed]`, key and value
/// `[batch, kv_len, kdim | vdim]` (`[len, batch, ...]` unless `batch_first`;
/// `[len, ...]` unbatched), as `nn.MultiheadAttention` computes it in eval
/// mode, without the attention weights.
#[derive(Debug)]
pub struct MultiheadAttention {
    heads: usize,
    batch_first: bool,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    out_proj: Linear,
    attention: Attention,
}

/// Sizes of one call: batch, query and key lengths, whether batched.
#[derive(Clone, Copy)]
struct Dims {
    batch: usize,
    q_len: usize,
    kv_len: usize,
    batched: bool,
}

impl MultiheadAttention {
    fn error(&self, inputs: &[&[usize]], why: &str) -> Error {
        let shapes: Vec<String> = inputs.iter().map(|s| shape_str(s)).collect();
        Error::shape(
            OP.name(),
            format!("{why} (query, key, value shapes: {})", shapes.join(", ")),
        )
    }

    fn dims(&self, inputs: &[&[usize]]) -> Result<Dims> {
        let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
        if !(2..=3).contains(&q.len()) || k.len() != q.len() || v.len() != q.len() {
            return Err(self.error(
                inputs,
                "query, key and value must all be 2-D (unbatched) or all 3-D",
            ));
        }
        let (batch, q_len, kv_len) = match (q.len(), self.batch_first) {
            (2, _) => (1, q[0], k[0]),
            (_, true) => (q[0], q[1], k[1]),
            (_, false) => (q[1], q[0], k[0]),
        };
        let batch_of = |s: &[usize]| match (s.len(), self.batch_first) {
            (2, _) => 1,
            (_, true) => s[0],
            (_, false) => s[1],
        };
        let len_of = |s: &[usize]| {
            if self.batch_first && s.len() == 3 {
                s[1]
            } else {
                s[0]
            }
        };
        if batch_of(k) != batch || batch_of(v) != batch || len_of(v) != kv_len {
            return Err(self.error(
                inputs,
                "key and value must have the query's batch and one length",
            ));
        }
        Ok(Dims {
            batch,
            q_len,
            kv_len,
            batched: q.len() == 3,
        })
    }

    /// The projected shape of an input: its last dimension replaced.
    fn projected(&self, x: &[usize], proj: &Linear, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        proj.output_shape(&[x])
            .map_err(|e| self.error(inputs, &e.to_string()))
    }

    /// A mask input's shape as the attention reads it: a 3-D one of
    /// `batch * heads` rows split into `[batch, heads, ...]`, as
    /// `nn.MultiheadAttention` reads it; others broadcast as they are.
    fn mask_shape(&self, d: Dims, m: &[usize]) -> Vec<usize> {
        match *m {
            [bh, l, s] if d.batched && bh == d.batch * self.heads => {
                vec![d.batch, self.heads, l, s]
            }
            _ => m.to_vec(),
        }
    }

    fn head_shapes(&self, d: Dims, q_dim: usize, v_dim: usize) -> [Vec<usize>; 3] {
        let h = self.heads;
        [
            vec![d.batch, h, d.q_len, q_dim / h],
            vec![d.batch, h, d.kv_len, q_dim / h],
            vec![d.batch, h, d.kv_len, v_dim / h],
        ]
    }
}

/// Copies projected rows `[len, batch, e]` or `[batch, len, e]` into heads
/// `[batch, heads, len, e / heads]`, or back when `merge`.
#[allow(clippy::too_many_arguments)]
fn move_heads<T: Copy + Send + Sync>(
    rows: &mut [T],
    heads_buf: &mut [T],
    batch: usize,
    len: usize,
    heads: usize,
    e: usize,
    batch_first: bool,
    merge: bool,
) {
    let dh = e / heads;
    let row_of = |b: usize, t: usize| {
        if batch_first {
            b * len + t
        } else {
            t * batch + b
        }
    };
    if merge {
        // Each output row is one (batch entry, position): its heads side by side.
        let src: &[T] = heads_buf;
        rows.par_chunks_mut(e.max(1))
            .enumerate()
            .take(batch * len)
            .for_each(|(i, row)| {
                let (b, t) = if batch_first {
                    (i / len, i % len)
                } else {
                    (i % batch, i / batch)
                };
                for (h, to) in row.chunks_exact_mut(dh.max(1)).enumerate().take(heads) {
                    to.copy_from_slice(&src[((b * heads + h) * len + t) * dh..][..dh]);
                }
            });
    } else {
        let src: &[T] = rows;
        heads_buf
            .par_chunks_mut(len * dh)
            .enumerate()
            .for_each(|(bh, out)| {
                let (b, h) = (bh / heads, bh % heads);
                for (t, o) in out.chunks_exact_mut(dh.max(1)).enumerate().take(len) {
                    o.copy_from_slice(&src[row_of(b, t) * e + h * dh..][..dh]);
                }
            });
    }
}

impl Operation for MultiheadAttention {
    fn kind(&self) -> OpKind {
        OP
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Err(Error::internal(OP.name(), "needs every input's shape"))
    }
    fn algorithm_for_inputs(&self, inputs: &[&[usize]]) -> Result<String> {
        let shapes = self.attention_shapes(inputs)?;
        let refs: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
        self.attention.algorithm_for_inputs(&refs)
    }
    fn problem(&self, inputs: &[&[usize]]) -> Result<Problem> {
        let shapes = self.attention_shapes(inputs)?;
        let refs: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
        self.attention.problem(&refs)
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        self.attention_shapes(inputs)?;
        let q = self.projected(inputs[0], &self.q_proj, inputs)?;
        let mut out = inputs[0].to_vec();
        if let Some(last) = out.last_mut() {
            *last = self.projected(&q, &self.out_proj, inputs)?[q.len() - 1];
        }
        Ok(out)
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
        let d = self.dims(&shapes)?;
        let dtype = inputs[0].dtype();
        let project = |x: &Tensor, proj: &Linear| -> Result<Tensor> {
            let mut y = Tensor::zeros(dtype, &self.projected(x.shape(), proj, &shapes)?)?;
            proj.forward(&[x], &mut y)?;
            Ok(y)
        };
        let mut q = project(inputs[0], &self.q_proj)?;
        let mut k = project(inputs[1], &self.k_proj)?;
        let mut v = project(inputs[2], &self.v_proj)?;
        let (qe, ve) = (
            q.shape()[q.shape().len() - 1],
            v.shape()[v.shape().len() - 1],
        );
        let [qs, ks, vs] = self.head_shapes(d, qe, ve);
        let mut qh = Tensor::zeros(dtype, &qs)?;
        let mut kh = Tensor::zeros(dtype, &ks)?;
        let mut vh = Tensor::zeros(dtype, &vs)?;
        let mut oh = Tensor::zeros(dtype, &[d.batch, self.heads, d.q_len, ve / self.heads])?;
        let bf = self.batch_first || !d.batched;
        with_dtype!(dtype, T, {
            let h = self.heads;
            let split = |rows: &mut Tensor, heads: &mut Tensor, len, e| -> Result<()> {
                let (r, hb) = (rows.as_mut_slice::<T>()?, heads.as_mut_slice::<T>()?);
                move_heads(r, hb, d.batch, len, h, e, bf, false);
                Ok(())
            };
            split(&mut q, &mut qh, d.q_len, qe)?;
            split(&mut k, &mut kh, d.kv_len, qe)?;
            split(&mut v, &mut vh, d.kv_len, ve)?;
            // A 3-D mask is per batch entry and head: [batch * heads, q_len, kv_len].
            let split_mask = match inputs.get(3) {
                Some(m) if self.mask_shape(d, m.shape()) != m.shape() => {
                    Some(m.to_contiguous()?.reshape(&self.mask_shape(d, m.shape()))?)
                }
                _ => None,
            };
            let mut att: Vec<&Tensor> = vec![&qh, &kh, &vh];
            att.extend(split_mask.as_ref().or(inputs.get(3).copied()));
            self.attention.forward(&att, &mut oh)?;
            let mut merged_shape = inputs[0].shape().to_vec();
            if let Some(last) = merged_shape.last_mut() {
                *last = ve;
            }
            let mut merged = Tensor::zeros(dtype, &merged_shape)?;
            let (m, o) = (merged.as_mut_slice::<T>()?, oh.as_mut_slice::<T>()?);
            move_heads(m, o, d.batch, d.q_len, h, ve, bf, true);
            self.out_proj.forward(&[&merged], output)?;
        });
        Ok(())
    }
}

impl MultiheadAttention {
    /// The shapes the inner attention sees: heads split out, plus the mask's.
    fn attention_shapes(&self, inputs: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        if !(3..=4).contains(&inputs.len()) {
            return Err(Error::internal(OP.name(), "expected 3 or 4 inputs"));
        }
        let d = self.dims(inputs)?;
        let qe = *self
            .projected(inputs[0], &self.q_proj, inputs)?
            .last()
            .unwrap_or(&0);
        self.projected(inputs[1], &self.k_proj, inputs)?;
        let ve = *self
            .projected(inputs[2], &self.v_proj, inputs)?
            .last()
            .unwrap_or(&0);
        let mut shapes = self.head_shapes(d, qe, ve).to_vec();
        shapes.extend(inputs.get(3).map(|m| self.mask_shape(d, m)));
        let refs: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
        self.attention.output_shape(&refs)?;
        Ok(shapes)
    }
}

/// `multihead_attention`: inputs query, key, value and an optional additive
/// mask (broadcasting to `[batch, heads, q_len, kv_len]`, or `attn_mask`
/// held); the projections' weights and biases, `num_heads`, `batch_first`.
pub const SPEC: OpSpec = OpSpec {
    inputs: Arity::between(3, 4),
    params: &[
        required("q_weight", K::Tensor),
        required("k_weight", K::Tensor),
        required("v_weight", K::Tensor),
        optional("q_bias", K::Tensor),
        optional("k_bias", K::Tensor),
        optional("v_bias", K::Tensor),
        required("out_weight", K::Tensor),
        optional("out_bias", K::Tensor),
        required("num_heads", K::Int),
        optional("batch_first", K::Bool),
        optional("attn_mask", K::Tensor),
    ],
    build: |a| {
        let heads = a.int("num_heads")?;
        let request: Request = a.request;
        let mut linear = |w: &str, b: &str| -> Result<Linear> {
            let weight = a.required_tensor(w)?;
            let bias = a.tensor(b)?;
            Linear::new(weight, bias, Request::Default)
                .map_err(|e| Error::invalid(OP.name(), format!("{w}: {e}")))
        };
        let q_proj = linear("q_weight", "q_bias")?;
        let k_proj = linear("k_weight", "k_bias")?;
        let v_proj = linear("v_weight", "v_bias")?;
        let out_proj = linear("out_weight", "out_bias")?;
        let (qe, ke, ve) = (
            q_proj.out_features(),
            k_proj.out_features(),
            v_proj.out_features(),
        );
        if heads <= 0 || qe % heads as usize != 0 || ve % heads as usize != 0 || ke != qe {
            return Err(Error::invalid(
                OP.name(),
                format!(
                    "num_heads={heads} must divide the projections' sizes (query {qe}, key {ke}, \
                     value {ve}; query and key equal)"
                ),
            ));
        }
        if out_proj.in_features() != ve {
            return Err(Error::invalid(
                OP.name(),
                format!(
                    "out_weight takes {} features, the heads give {ve}",
                    out_proj.in_features()
                ),
            ));
        }
        let mask = a.tensor("attn_mask")?;
        if mask.is_some() && a.num_inputs == 4 {
            return Err(super::attention::mask_twice(OP));
        }
        let attention = Attention::with_mask(mask, None, false, false, request)?;
        Ok(Box::new(MultiheadAttention {
            heads: heads as usize,
            batch_first: a.bool_or("batch_first", true)?,
            q_proj,
            k_proj,
            v_proj,
            out_proj,
            attention,
        }))
    },
};
