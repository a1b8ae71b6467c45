//! Normalisation layers: eval-mode batch norm and layer norm.

use super::attrs::{optional, required, Arity, OpSpec, ParamKind as K};
use ai3_kernels::cpu::norm::{self, scale_shift};

use super::activation::with_scalar_fn;
use super::{check_weight_dtype, kernel_result, single, with_dtype, ActivationKind, Operation};
use std::sync::OnceLock;

use ai3_kernels::cpu::blocked;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::{Blocked, BLOCK};
use crate::registry::{Algorithm, OpKind};
use crate::tensor::{shape_str, Tensor};

/// The values of a 1-D or any tensor in f64, whatever its dtype.
fn values(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.to_dtype(DType::F64)?.as_slice::<f64>()?.to_vec())
}

/// `nn.BatchNorm2d` in eval mode: `(x - mean) / sqrt(var + eps) * weight +
/// bias` per channel, folded once into `x * scale + shift`, optionally
/// followed by an activation in the same pass.
#[derive(Debug)]
pub struct BatchNorm2d {
    scale: Tensor,
    shift: Tensor,
    activation: Option<ActivationKind>,
    /// `scale` and `shift` (f32) padded to whole channel blocks with zeros,
    /// for the blocked layout; made on first use.
    blocked: OnceLock<(Vec<f32>, Vec<f32>)>,
}

impl BatchNorm2d {
    /// Folds the statistics and affine parameters (all `[C]`, in the graph's
    /// dtype, which is `running_mean`'s) into a per-channel scale and shift.
    pub fn new(
        weight: Option<Tensor>,
        bias: Option<Tensor>,
        running_mean: Tensor,
        running_var: Tensor,
        eps: f64,
    ) -> Result<Self> {
        let op = OpKind::BatchNorm2d;
        let dtype = running_mean.dtype();
        let &[c] = running_mean.shape() else {
            return Err(Error::shape(
                op.name(),
                format!(
                    "running_mean must be 1-D [channels], got {}",
                    shape_str(running_mean.shape())
                ),
            ));
        };
        let named = [
            ("running_var", Some(&running_var)),
            ("weight", weight.as_ref()),
            ("bias", bias.as_ref()),
        ];
        for (what, t) in named {
            let Some(t) = t else { continue };
            check_weight_dtype(op, what, t, dtype)?;
            if t.shape() != [c] {
                return Err(Error::shape(
                    op.name(),
                    format!(
                        "{what} must have shape [{c}] like running_mean, got {}",
                        shape_str(t.shape())
                    ),
                ));
            }
        }
        if eps.is_nan() || eps < 0.0 {
            return Err(Error::invalid(
                op.name(),
                format!("eps must be non-negative, got {eps}"),
            ));
        }
        let (mean, var) = (values(&running_mean)?, values(&running_var)?);
        let w = weight.as_ref().map(values).transpose()?;
        let b = bias.as_ref().map(values).transpose()?;
        let mut scale = vec![0.0; c];
        let mut shift = vec![0.0; c];
        for i in 0..c {
            let s = w.as_ref().map_or(1.0, |w| w[i]) / (var[i] + eps).sqrt();
            scale[i] = s;
            shift[i] = b.as_ref().map_or(0.0, |b| b[i]) - mean[i] * s;
        }
        Ok(BatchNorm2d {
            scale: Tensor::from_slice(&scale, &[c])?.to_dtype(dtype)?,
            shift: Tensor::from_slice(&shift, &[c])?.to_dtype(dtype)?,
            activation: None,
            blocked: OnceLock::new(),
        })
    }

    /// Fuses `activation` (any kind) into the layer: it is applied to each
    /// element as it is written, saving a pass over the output.
    pub fn with_activation(mut self, activation: Option<ActivationKind>) -> Self {
        self.activation = activation;
        self
    }

    /// `(channels, elements per channel plane)` of an input shape.
    fn layout(&self, shape: &[usize]) -> Result<(usize, usize)> {
        let op = OpKind::BatchNorm2d;
        let c = self.scale.numel();
        let (got, inner) = match *shape {
            [_, ch] => (ch, 1),
            [ch, h, w] => (ch, h * w),
            [_, ch, h, w] => (ch, h * w),
            _ => {
                return Err(Error::shape(
                    op.name(),
                    format!(
                    "expected a 2-D [N, C], 3-D [C, H, W] or 4-D [N, C, H, W] input, got shape {}",
                    shape_str(shape)
                ),
                ))
            }
        };
        if got != c {
            return Err(Error::shape(
                op.name(),
                format!(
                    "input of shape {} has {got} channels but the layer has {c} (running_mean shape [{c}])",
                    shape_str(shape)
                ),
            ));
        }
        Ok((c, inner))
    }
}

impl Operation for BatchNorm2d {
    fn per_image(&self, _inputs: &[&[usize]]) -> bool {
        true
    }
    fn kind(&self) -> OpKind {
        OpKind::BatchNorm2d
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Ok(Algorithm::Direct.name().into())
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let x = single(OpKind::BatchNorm2d, inputs)?;
        self.layout(x)?;
        Ok(x.to_vec())
    }
    fn fused_activation(&self) -> Option<OpKind> {
        self.activation.map(|a| a.op_kind())
    }
    fn blocked(&self, inputs: &[&[usize]]) -> Blocked {
        // Per channel: a kernel of its own that saves nothing, but keeps a
        // blocked run going through the layer (DenseNet's pre-activations).
        match inputs {
            [[_, _, _, _]]
                if self.scale.dtype() == DType::F32 && self.layout(inputs[0]).is_ok() =>
            {
                Blocked::Kernel { gain: 0 }
            }
            _ => Blocked::No,
        }
    }
    fn forward_blocked(
        &self,
        inputs: &[&Tensor],
        shapes: &[&[usize]],
        output: &mut Tensor,
    ) -> Result<()> {
        let op = OpKind::BatchNorm2d;
        let (x, shape) = (single(op, inputs)?, single(op, shapes)?);
        let &[n, c, h, w] = shape else {
            return Err(Error::internal(op.name(), "a blocked input is not 4-D"));
        };
        let (scale, shift) = (self.scale.as_slice::<f32>()?, self.shift.as_slice::<f32>()?);
        let (scale, shift) = self.blocked.get_or_init(|| {
            let lanes = c.div_ceil(BLOCK) * BLOCK;
            let pad = |v: &[f32]| {
                let mut v = v.to_vec();
                v.resize(lanes, 0.0);
                v
            };
            (pad(scale), pad(shift))
        });
        let activation = self.activation;
        let post = |block: &mut [f32]| {
            if let Some(act) = activation {
                act.apply_serial(block)
            }
        };
        let (x, out) = (x.as_slice::<f32>()?, output.as_mut_slice::<f32>()?);
        let done = blocked::scale_shift(n, c, h * w, x, scale, shift, out, post);
        kernel_result(op, done, || {
            format!("input shape {}, channel-blocked layout", shape_str(shape))
        })
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let x = single(OpKind::BatchNorm2d, inputs)?;
        check_weight_dtype(OpKind::BatchNorm2d, "input", x, self.scale.dtype())?;
        let (c, inner) = self.layout(x.shape())?;
        with_dtype!(x.dtype(), T, {
            let (scale, shift) = (self.scale.as_slice::<T>()?, self.shift.as_slice::<T>()?);
            let (x, out) = (x.as_slice::<T>()?, output.as_mut_slice::<T>()?);
            let done = match self.activation {
                Some(a) => with_scalar_fn!(a, T, scale_shift(c, inner, scale, shift, x, out)),
                None => scale_shift(c, inner, scale, shift, x, out, |v| v),
            };
            kernel_result(OpKind::BatchNorm2d, done, || {
                format!("input of {} elements, {c} channels", x.len())
            })?
        });
        Ok(())
    }
}

/// `nn.LayerNorm`: normalises over the trailing `normalized_shape` dimensions.
#[derive(Debug)]
pub struct LayerNorm {
    normalized_shape: Vec<usize>,
    weight: Option<Tensor>,
    bias: Option<Tensor>,
    eps: f64,
}

impl LayerNorm {
    /// Layer norm with optional elementwise affine parameters of `normalized_shape`.
    pub fn new(
        normalized_shape: Vec<usize>,
        weight: Option<Tensor>,
        bias: Option<Tensor>,
        eps: f64,
    ) -> Result<Self> {
        let op = OpKind::LayerNorm;
        if normalized_shape.is_empty() || normalized_shape.contains(&0) {
            return Err(Error::invalid(
                op.name(),
                format!(
                    "normalized_shape must be non-empty and positive, got {normalized_shape:?}"
                ),
            ));
        }
        if eps.is_nan() || eps < 0.0 {
            return Err(Error::invalid(
                op.name(),
                format!("eps must be non-negative, got {eps}"),
            ));
        }
        if let (Some(w), Some(b)) = (&weight, &bias) {
            check_weight_dtype(op, "bias", b, w.dtype())?;
        }
        for (what, t) in [("weight", &weight), ("bias", &bias)] {
            if let Some(t) = t {
                if t.shape() != normalized_shape.as_slice() {
                    return Err(Error::shape(
                        op.name(),
                        format!(
                            "{what} must have shape {} (normalized_shape), got {}",
                            shape_str(&normalized_shape),
                            shape_str(t.shape())
                        ),
                    ));
                }
            }
        }
        Ok(LayerNorm {
            normalized_shape,
            weight,
            bias,
            eps,
        })
    }

    fn cols(&self, shape: &[usize]) -> Result<usize> {
        let op = OpKind::LayerNorm;
        let n = self.normalized_shape.len();
        if shape.len() < n || shape[shape.len() - n..] != self.normalized_shape[..] {
            return Err(Error::shape(
                op.name(),
                format!(
                    "input of shape {} does not end in normalized_shape {}",
                    shape_str(shape),
                    shape_str(&self.normalized_shape)
                ),
            ));
        }
        Ok(self.normalized_shape.iter().product())
    }
}

impl Operation for LayerNorm {
    fn kind(&self) -> OpKind {
        OpKind::LayerNorm
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Ok(Algorithm::Direct.name().into())
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let x = single(OpKind::LayerNorm, inputs)?;
        self.cols(x)?;
        Ok(x.to_vec())
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let op = OpKind::LayerNorm;
        let x = single(op, inputs)?;
        let cols = self.cols(x.shape())?;
        for (what, t) in [("weight", &self.weight), ("bias", &self.bias)] {
            if let Some(t) = t {
                check_weight_dtype(op, what, t, x.dtype())?;
            }
        }
        with_dtype!(x.dtype(), T, {
            let w = self
                .weight
                .as_ref()
                .map(|t| t.as_slice::<T>())
                .transpose()?;
            let b = self.bias.as_ref().map(|t| t.as_slice::<T>()).transpose()?;
            let done =
                norm::layernorm::<T>(cols, self.eps, w, b, x.as_slice()?, output.as_mut_slice()?);
            kernel_result(OpKind::LayerNorm, done, || {
                format!("input shape {}", shape_str(x.shape()))
            })?
        });
        Ok(())
    }
}

/// `batchnorm2d` in eval mode: `running_mean`, `running_var`, optional affine
/// `weight` and `bias`, `eps` (default 1e-5), and a fused `activation`.
pub const BATCHNORM2D: OpSpec = OpSpec {
    inputs: Arity::exactly(1),
    params: &[
        optional("weight", K::Tensor),
        optional("bias", K::Tensor),
        required("running_mean", K::Tensor),
        required("running_var", K::Tensor),
        optional("eps", K::Float),
        optional("activation", K::Activation),
    ],
    build: |a| {
        let (weight, bias) = (a.tensor("weight")?, a.tensor("bias")?);
        let mean = a.required_tensor("running_mean")?;
        let var = a.required_tensor("running_var")?;
        let bn = BatchNorm2d::new(weight, bias, mean, var, a.float_or("eps", 1e-5)?)?;
        Ok(Box::new(bn.with_activation(a.activation("activation")?)))
    },
};

/// `layernorm` over the trailing `normalized_shape` dimensions, with optional
/// affine `weight` and `bias` and `eps` (default 1e-5).
pub const LAYERNORM: OpSpec = OpSpec {
    inputs: Arity::exactly(1),
    params: &[
        required("normalized_shape", K::Ints),
        optional("weight", K::Tensor),
        optional("bias", K::Tensor),
        optional("eps", K::Float),
    ],
    build: |a| {
        let shape = a.opt_usizes("normalized_shape")?.unwrap_or_default();
        let (weight, bias) = (a.tensor("weight")?, a.tensor("bias")?);
        let eps = a.float_or("eps", 1e-5)?;
        Ok(Box::new(LayerNorm::new(shape, weight, bias, eps)?))
    },
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batchnorm_folds_and_checks_channels() {
        let t = |v: &[f32]| Tensor::from_slice(v, &[v.len()]).unwrap();
        let bn = BatchNorm2d::new(
            Some(t(&[2.0, 1.0])),
            Some(t(&[0.5, 0.0])),
            t(&[1.0, -1.0]),
            t(&[4.0, 1.0]),
            0.0,
        )
        .unwrap();
        let x = Tensor::from_slice(&[3.0f32, 5.0, 0.0, 1.0], &[1, 2, 2, 1]).unwrap();
        let mut out = Tensor::zeros(DType::F32, &[1, 2, 2, 1]).unwrap();
        bn.forward(&[&x], &mut out).unwrap();
        assert_eq!(out.as_slice::<f32>().unwrap(), &[2.5, 4.5, 1.0, 2.0]);
        let err = bn.output_shape(&[&[1, 3, 2, 2]]).unwrap_err().to_string();
        assert!(
            err.contains("[1, 3, 2, 2]") && err.contains("3 channels"),
            "{err}"
        );
        assert!(BatchNorm2d::new(None, None, t(&[0.0]), t(&[1.0, 1.0]), 1e-5).is_err());
    }

    #[test]
    fn layernorm_checks_trailing_shape() {
        let ln = LayerNorm::new(vec![3], None, None, 1e-5).unwrap();
        assert_eq!(ln.output_shape(&[&[2, 3]]).unwrap(), vec![2, 3]);
        let err = ln.output_shape(&[&[3, 2]]).unwrap_err().to_string();
        assert!(err.contains("[3, 2]"), "{err}");
        let w = Tensor::zeros(DType::F32, &[4]).unwrap();
        assert!(LayerNorm::new(vec![3], Some(w), None, 1e-5).is_err());
    }
}
