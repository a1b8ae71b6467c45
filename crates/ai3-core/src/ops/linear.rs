//! Fully connected layer over the last dimension.

use super::attrs::{optional, required, Arity, OpSpec, ParamKind as K};
use ai3_kernels::cpu::linear;
use ai3_kernels::cpu::linear::packed::PackedWeight;
use ai3_kernels::custom;
use ai3_kernels::params::LinearParams;

use super::{
    check_weight_dtype, custom_result, kernel_result, with_dtype, ActivationKind, Operation,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::registry::{self, Algorithm, DeviceKind, OpKind, Problem, Request};
use crate::tensor::{shape_str, Tensor};

const OP: OpKind = OpKind::Linear;

/// `y = x @ weight.T + bias` over the last dimension of `x`; leading dimensions are kept.
#[derive(Debug)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
    request: Request,
    /// Activation fused into the output, applied in place after the GEMM.
    activation: Option<ActivationKind>,
    /// Whether a second input, of the output's shape, is added to the
    /// output before the activation (a residual: `linear(x) + y`).
    residual: bool,
    /// The f32 weight packed for the register-tile kernel (AVX-512 or
    /// AVX2), which runs every f32 `gemm` call (None for f64 and on the
    /// portable ISA level). The weight is kept too, for `custom`, shapes
    /// and the other calls.
    packed: Option<PackedWeight>,
}

impl Linear {
    /// Builds the layer; `weight` is `[out_features, in_features]`.
    pub fn new(weight: Tensor, bias: Option<Tensor>, request: Request) -> Result<Self> {
        let &[out_f, _] = weight.shape() else {
            return Err(Error::shape(
                OP.name(),
                format!(
                    "weight must be 2-D [out_features, in_features], got {}",
                    shape_str(weight.shape())
                ),
            ));
        };
        if let Some(b) = &bias {
            check_weight_dtype(OP, "bias", b, weight.dtype())?;
            if b.shape() != [out_f] {
                return Err(Error::shape(
                    OP.name(),
                    format!(
                        "bias must have shape [{out_f}], got {}",
                        shape_str(b.shape())
                    ),
                ));
            }
        }
        let packed = match weight.dtype() {
            DType::F32 => {
                let b = match &bias {
                    Some(b) => Some(b.as_slice::<f32>()?),
                    None => None,
                };
                let &[out_f, in_f] = weight.shape() else {
                    unreachable!("checked above")
                };
                PackedWeight::new(weight.as_slice::<f32>()?, b, out_f, in_f)
                    .map_err(|e| Error::from_kernel(OP.name(), "packing the weight", e))?
            }
            _ => None,
        };
        let layer = Linear {
            weight,
            bias,
            request,
            activation: None,
            residual: false,
            packed,
        };
        layer.algorithm(&layer.params(1))?;
        Ok(layer)
    }

    /// Fuses `activation` (any kind) into the layer, applied in place to the output.
    pub fn with_activation(mut self, activation: Option<ActivationKind>) -> Self {
        self.activation = activation;
        self
    }

    /// Adds a second input, of the output's shape, to the output before the
    /// activation: `linear(x) + y` in one pass.
    pub fn with_residual(mut self, residual: bool) -> Self {
        self.residual = residual;
        self
    }

    /// The input and, with a fused residual, the residual.
    fn split<'a, T: ?Sized>(&self, inputs: &[&'a T]) -> Result<(&'a T, Option<&'a T>)> {
        super::with_residual(OP, self.residual, inputs)
    }

    /// Features of each input row.
    pub fn in_features(&self) -> usize {
        self.weight.shape()[1]
    }

    /// Features of each output row.
    pub fn out_features(&self) -> usize {
        self.weight.shape()[0]
    }

    /// The fused activation, if any.
    pub fn activation(&self) -> Option<ActivationKind> {
        self.activation
    }

    fn params(&self, rows: usize) -> LinearParams {
        LinearParams {
            rows,
            in_features: self.weight.shape()[1],
            out_features: self.weight.shape()[0],
        }
    }

    fn algorithm(&self, p: &LinearParams) -> Result<Algorithm> {
        registry::resolve(OP, self.request, DeviceKind::Cpu, &Problem::Linear(*p))
    }

    fn params_for(&self, shape: &[usize]) -> Result<LinearParams> {
        let in_f = self.weight.shape()[1];
        if shape.last() != Some(&in_f) {
            return Err(Error::shape(
                OP.name(),
                format!(
                    "input of shape {} does not end in in_features={in_f} (weight shape {})",
                    shape_str(shape),
                    shape_str(self.weight.shape())
                ),
            ));
        }
        Ok(self.params(shape[..shape.len() - 1].iter().product()))
    }
}

impl Operation for Linear {
    fn kind(&self) -> OpKind {
        OP
    }

    fn fused_activation(&self) -> Option<OpKind> {
        self.activation.map(|a| a.op_kind())
    }
    fn fused_residual(&self) -> bool {
        self.residual
    }
    fn algorithm_for(&self, input_shape: &[usize]) -> Result<String> {
        Ok(self
            .algorithm(&self.params_for(input_shape)?)?
            .name()
            .into())
    }
    fn problem(&self, inputs: &[&[usize]]) -> Result<Problem> {
        Ok(Problem::Linear(self.params_for(self.split(inputs)?.0)?))
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let (x, residual) = self.split(inputs)?;
        self.params_for(x)?;
        let mut out = x.to_vec();
        if let Some(last) = out.last_mut() {
            *last = self.weight.shape()[0];
        }
        if let Some(r) = residual.filter(|r| **r != *out) {
            return Err(Error::shape(
                OP.name(),
                format!(
                    "the residual added to the output has shape {}, the output {} (input shape {})",
                    shape_str(r),
                    shape_str(&out),
                    shape_str(x)
                ),
            ));
        }
        Ok(out)
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let (x, residual) = self.split(inputs)?;
        check_weight_dtype(OP, "input", x, self.weight.dtype())?;
        if let Some(r) = residual {
            check_weight_dtype(OP, "residual", r, self.weight.dtype())?;
            self.output_shape(&[x.shape(), r.shape()])?;
        }
        let p = self.params_for(x.shape())?;
        let algorithm = self.algorithm(&p)?;
        if let (Some(packed), Algorithm::Gemm) = (&self.packed, algorithm) {
            if p.in_features > 0 && x.dtype() == DType::F32 {
                let r = residual.map(|r| r.as_slice::<f32>()).transpose()?;
                let out = output.as_mut_slice::<f32>()?;
                // The residual and the activation run on each finished
                // block, still in cache.
                let fused = super::residual_epilogue(r, self.activation);
                let fused = (r.is_some() || self.activation.is_some())
                    .then_some(&fused as linear::packed::Epilogue);
                linear::packed::linear(&p, x.as_slice::<f32>()?, packed, out, fused);
                return Ok(());
            }
        }
        with_dtype!(x.dtype(), T, {
            let b = match &self.bias {
                Some(b) => Some(b.as_slice::<T>()?),
                None => None,
            };
            let (w, out) = (self.weight.as_slice::<T>()?, output.as_mut_slice::<T>()?);
            if p.in_features == 0 {
                // No products to sum: every row is the bias (zeros without one), as in PyTorch.
                if let (Some(b), false) = (b, out.is_empty()) {
                    out.chunks_exact_mut(p.out_features)
                        .for_each(|row| row.copy_from_slice(b));
                } else {
                    out.fill(T::default());
                }
            } else {
                match algorithm {
                    Algorithm::Gemm => {
                        let done = linear::gemm::<T>(&p, x.as_slice()?, w, b, out);
                        kernel_result(OP, done, || {
                            format!(
                                "input shape {}, weight shape {}",
                                shape_str(x.shape()),
                                shape_str(self.weight.shape())
                            )
                        })?
                    }
                    Algorithm::Custom => custom_result(
                        OP,
                        x.shape(),
                        custom::linear::<T>(&p, x.as_slice()?, w, b, out),
                    )?,
                    other => {
                        return Err(Error::algorithm(
                            OP.name(),
                            format!("algorithm '{other}' is not implemented"),
                        ))
                    }
                }
            }
            if let Some(r) = residual {
                super::residual_epilogue(Some(r.as_slice::<T>()?), None)(0, out);
            }
            if let Some(a) = self.activation {
                a.apply_inplace::<T>(out);
            }
        });
        Ok(())
    }
}

/// `linear`: `weight` `[out_features, in_features]`, optional `bias`, and a
/// fused `activation`. A second input, of the output's shape, is a residual
/// added before the activation.
pub const SPEC: OpSpec = OpSpec {
    inputs: Arity::between(1, 2),
    params: &[
        required("weight", K::Tensor),
        optional("bias", K::Tensor),
        optional("activation", K::Activation),
    ],
    build: |a| {
        let weight = a.required_tensor("weight")?;
        let bias = a.tensor("bias")?;
        let layer = Linear::new(weight, bias, a.request)?;
        Ok(Box::new(
            layer
                .with_activation(a.activation("activation")?)
                .with_residual(a.num_inputs == 2),
        ))
    },
};
