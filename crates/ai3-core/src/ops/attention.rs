//! Scaled dot-product attention, as PyTorch's
//! `F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=, scale=, enable_gqa=)`
//! computes it in eval mode (no dropout), with a choice of algorithm per node.

use ai3_kernels::cpu::attention::{flash, naive, Mask};
use ai3_kernels::params::AttentionParams;

use super::attrs::{optional, Arity, OpSpec, ParamKind as K};
use super::{kernel_result, with_dtype, Operation};
use crate::error::{Error, Result};
use crate::registry::{self, Algorithm, DeviceKind, OpKind, Problem, Request};
use crate::tensor::{shape_str, Tensor};

const OP: OpKind = OpKind::Attention;

/// `softmax(q @ kᵀ * scale + mask) @ v` over the last two dimensions of
/// query `[..., q_len, head_dim]`, key `[..., kv_len, head_dim]` and value
/// `[..., kv_len, v_dim]`, with an optional additive mask (a fourth input)
/// that broadcasts to `[..., q_len, kv_len]`.
#[derive(Debug)]
pub struct Attention {
    /// A mask the node holds (a constant of the network), instead of a fourth input.
    mask: Option<Tensor>,
    scale: Option<f64>,
    causal: bool,
    gqa: bool,
    request: Request,
}

/// Where the mask's elements are for each flat head, and its row and column steps.
struct MaskLayout {
    offsets: Vec<usize>,
    row_stride: usize,
    col_stride: usize,
}

impl Attention {
    /// Attention scaling the scores by `scale` (default `1 / sqrt(head_dim)`),
    /// causal or not; with `gqa`, key and value may have fewer heads
    /// (dimension -3) than the query, a divisor of its count.
    pub fn new(scale: Option<f64>, causal: bool, gqa: bool, request: Request) -> Result<Self> {
        Self::with_mask(None, scale, causal, gqa, request)
    }

    /// [`Attention::new`] with an additive mask the node holds.
    pub fn with_mask(
        mask: Option<Tensor>,
        scale: Option<f64>,
        causal: bool,
        gqa: bool,
        request: Request,
    ) -> Result<Self> {
        if causal && mask.is_some() {
            return Err(both_masks());
        }
        if scale.is_some_and(|s| !s.is_finite()) {
            return Err(Error::invalid(
                OP.name(),
                format!("scale must be finite, got {scale:?}"),
            ));
        }
        Ok(Attention {
            mask,
            scale,
            causal,
            gqa,
            request,
        })
    }

    fn shape_error(&self, inputs: &[&[usize]], why: &str) -> Error {
        let shapes: Vec<String> = inputs.iter().map(|s| shape_str(s)).collect();
        Error::shape(
            OP.name(),
            format!(
                "{why} (query, key, value, mask shapes: {})",
                shapes.join(", ")
            ),
        )
    }

    /// The shapes of query, key, value and the mask (held or read), if any.
    fn with_mask_shape<'a>(&'a self, inputs: &[&'a [usize]]) -> Result<Vec<&'a [usize]>> {
        let mut shapes = inputs.to_vec();
        if let Some(m) = &self.mask {
            if shapes.len() != 3 {
                return Err(Error::internal(OP.name(), "a held mask and a mask input"));
            }
            shapes.push(m.shape());
        }
        Ok(shapes)
    }

    /// The kernel's problem for inputs of these shapes, or an error naming them.
    fn params_for(&self, inputs: &[&[usize]]) -> Result<AttentionParams> {
        let (q, k, v) = match inputs {
            [q, k, v] | [q, k, v, _] => (*q, *k, *v),
            _ => {
                return Err(Error::internal(
                    OP.name(),
                    format!("expected 3 or 4 inputs, got {}", inputs.len()),
                ))
            }
        };
        let r = q.len();
        if r < 2 || k.len() != r || v.len() != r {
            return Err(self.shape_error(
                inputs,
                "query, key and value must have the same rank, at least 2",
            ));
        }
        let (lead, kv_lead) = (&q[..r - 2], &k[..r - 2]);
        let (heads, kv_heads) = if r >= 3 { (q[r - 3], k[r - 3]) } else { (1, 1) };
        let same_batch =
            lead[..lead.len().saturating_sub(1)] == kv_lead[..lead.len().saturating_sub(1)];
        let heads_ok = heads == kv_heads || (self.gqa && kv_heads > 0 && heads % kv_heads == 0);
        if !same_batch || !heads_ok || v[..r - 2] != *kv_lead {
            let why = if self.gqa {
                "leading dimensions must match, and key/value heads must divide the query's"
            } else {
                "leading dimensions of query, key and value must match (enable_gqa=True lets \
                 key and value have fewer heads)"
            };
            return Err(self.shape_error(inputs, why));
        }
        if q[r - 1] != k[r - 1] || k[r - 2] != v[r - 2] {
            return Err(self.shape_error(
                inputs,
                "query and key must share the last dimension, key and value the length",
            ));
        }
        let head_dim = q[r - 1];
        let batch: usize = lead[..lead.len().saturating_sub(1)].iter().product();
        Ok(AttentionParams {
            batch,
            heads,
            kv_heads,
            q_len: q[r - 2],
            kv_len: k[r - 2],
            head_dim,
            v_dim: v[r - 1],
            scale: self
                .scale
                .unwrap_or_else(|| 1.0 / (head_dim.max(1) as f64).sqrt()),
            causal: self.causal,
        })
    }

    /// How the mask of shape `mask` is read for each flat head of query shape `q`.
    fn mask_layout(&self, inputs: &[&[usize]], p: &AttentionParams) -> Result<MaskLayout> {
        let (q, m) = (inputs[0], inputs[3]);
        let r = q.len();
        let mut target = q[..r - 2].to_vec();
        target.extend([p.q_len, p.kv_len]);
        if m.len() > r {
            return Err(self.shape_error(inputs, "the mask has more dimensions than the query"));
        }
        // Contiguous strides of the mask, 0 where it broadcasts, right-aligned on the target.
        let mut strides = vec![0usize; r];
        let mut step = 1usize;
        for (i, &size) in m.iter().enumerate().rev() {
            let t = target[r - m.len() + i];
            if size != t && size != 1 {
                return Err(self.shape_error(
                    inputs,
                    &format!("the mask does not broadcast to {}", shape_str(&target)),
                ));
            }
            strides[r - m.len() + i] = if size == 1 { 0 } else { step };
            step *= size;
        }
        let lead = &target[..r - 2];
        let count: usize = lead.iter().product();
        let mut offsets = Vec::with_capacity(count);
        let mut index = vec![0usize; lead.len()];
        for _ in 0..count {
            offsets.push(index.iter().zip(&strides).map(|(i, s)| i * s).sum());
            for d in (0..lead.len()).rev() {
                index[d] += 1;
                if index[d] < lead[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        Ok(MaskLayout {
            offsets,
            row_stride: strides[r - 2],
            col_stride: strides[r - 1],
        })
    }

    fn algorithm(&self, p: &AttentionParams) -> Result<Algorithm> {
        registry::resolve(OP, self.request, DeviceKind::Cpu, &Problem::Attention(*p))
    }
}

impl Operation for Attention {
    fn kind(&self) -> OpKind {
        OP
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Err(Error::internal(OP.name(), "needs every input's shape"))
    }
    fn algorithm_for_inputs(&self, inputs: &[&[usize]]) -> Result<String> {
        Ok(self.algorithm(&self.params_for(inputs)?)?.name().into())
    }
    fn problem(&self, inputs: &[&[usize]]) -> Result<Problem> {
        Ok(Problem::Attention(self.params_for(inputs)?))
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let inputs = &self.with_mask_shape(inputs)?;
        let p = self.params_for(inputs)?;
        if inputs.len() == 4 {
            self.mask_layout(inputs, &p)?;
        }
        let mut out = inputs[0].to_vec();
        if let Some(last) = out.last_mut() {
            *last = p.v_dim;
        }
        Ok(out)
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let mut inputs = inputs.to_vec();
        if let Some(m) = &self.mask {
            inputs.push(m);
        }
        let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
        let p = self.params_for(&shapes)?;
        let layout = match inputs.len() {
            4 => Some(self.mask_layout(&shapes, &p)?),
            _ => None,
        };
        let algorithm = self.algorithm(&p)?;
        let context = || {
            let s: Vec<String> = shapes.iter().map(|s| shape_str(s)).collect();
            format!("inputs of shapes {}", s.join(", "))
        };
        with_dtype!(output.dtype(), T, {
            let (q, k, v) = (
                inputs[0].as_slice::<T>()?,
                inputs[1].as_slice::<T>()?,
                inputs[2].as_slice::<T>()?,
            );
            let mask_data = match inputs.get(3) {
                Some(m) => m.as_slice::<T>()?,
                None => &[],
            };
            let mask = layout.as_ref().map(|l| Mask {
                data: mask_data,
                offsets: &l.offsets,
                row_stride: l.row_stride,
                col_stride: l.col_stride,
            });
            let out = output.as_mut_slice::<T>()?;
            let done = match algorithm {
                Algorithm::Naive => naive::attention(&p, q, k, v, mask.as_ref(), out),
                Algorithm::Flash => flash::attention(&p, q, k, v, mask.as_ref(), out),
                other => {
                    return Err(Error::algorithm(
                        OP.name(),
                        format!("algorithm '{other}' is not implemented"),
                    ))
                }
            };
            kernel_result(OP, done, context)?;
        });
        Ok(())
    }
}

/// `attention`: query, key, value and an optional additive mask (a fourth
/// input, or `attn_mask` held by the node); `scale` (default `1 / sqrt(head_dim)`), `is_causal`, `enable_gqa`,
/// as in `F.scaled_dot_product_attention`.
pub const SPEC: OpSpec = OpSpec {
    inputs: Arity::between(3, 4),
    params: &[
        optional("attn_mask", K::Tensor),
        optional("scale", K::Float),
        optional("is_causal", K::Bool),
        optional("enable_gqa", K::Bool),
    ],
    build: |a| {
        let causal = a.bool_or("is_causal", false)?;
        let mask = a.tensor("attn_mask")?;
        if causal && a.num_inputs == 4 {
            return Err(both_masks());
        }
        if mask.is_some() && a.num_inputs == 4 {
            return Err(mask_twice(OP));
        }
        let op = Attention::with_mask(
            mask,
            a.opt_float("scale")?,
            causal,
            a.bool_or("enable_gqa", false)?,
            a.request,
        )?;
        Ok(Box::new(op))
    },
};

/// The error for a mask given both as `attn_mask` and as an input, naming `op`.
pub(super) fn mask_twice(op: OpKind) -> Error {
    Error::invalid(
        op.name(),
        "give the mask as attn_mask or as a fourth input, not both",
    )
}

fn both_masks() -> Error {
    Error::invalid(
        OP.name(),
        "give a mask or is_causal=True, not both (as in PyTorch)",
    )
}
