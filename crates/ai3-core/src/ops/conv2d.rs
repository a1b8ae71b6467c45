//! 2-D convolution with PyTorch's full semantics: stride, per-side padding,
//! dilation, groups, bias and the four padding modes.

use std::sync::OnceLock;

use ai3_kernels::cpu::conv2d::{direct, fft, gemm, smm, winograd};
use ai3_kernels::cpu::pad::pad2d;
pub use ai3_kernels::cpu::pad::PadMode;
use ai3_kernels::custom;
use ai3_kernels::params::{Conv2dParams, Padding2d};

use super::{
    check_positive, check_weight_dtype, custom_result, image_dims, image_shape, single, with_dtype,
    ActivationKind, Operation,
};
use crate::error::{Error, Result};
use crate::registry::{self, Algorithm, DeviceKind, OpKind, Problem, Request};
use crate::tensor::{shape_str, Tensor};

const OP: OpKind = OpKind::Conv2d;

/// A convolution layer with its weights and the algorithm the user asked for.
#[derive(Debug)]
pub struct Conv2d {
    weight: Tensor,
    bias: Option<Tensor>,
    stride: (usize, usize),
    padding: Padding2d,
    dilation: (usize, usize),
    groups: usize,
    padding_mode: PadMode,
    request: Request,
    /// Winograd-transformed weights, computed once on first use.
    winograd_filter: OnceLock<Tensor>,
    /// Weights and bias packed for direct convolution, once on first use.
    direct_packed: OnceLock<Tensor>,
    /// Activation fused into the output, applied in place after the kernel.
    activation: Option<ActivationKind>,
}

impl Conv2d {
    /// Builds a convolution; `weight` is `[out_channels, in_channels / groups, kh, kw]`.
    ///
    /// Everything that can be checked without the input is checked here, so a
    /// bad configuration fails when the model is built, not on its first call.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        weight: Tensor,
        bias: Option<Tensor>,
        stride: (usize, usize),
        padding: Padding2d,
        dilation: (usize, usize),
        groups: usize,
        padding_mode: PadMode,
        request: Request,
    ) -> Result<Self> {
        let dtype = weight.dtype();
        let &[oc, _, kh, kw] = weight.shape() else {
            return Err(Error::shape(
                OP.name(),
                format!(
                    "weight must be 4-D [out_channels, in_channels/groups, kh, kw], got {}",
                    shape_str(weight.shape())
                ),
            ));
        };
        check_positive(OP, "stride", &[stride.0, stride.1])?;
        check_positive(OP, "dilation", &[dilation.0, dilation.1])?;
        check_positive(OP, "groups", &[groups])?;
        if weight.numel() == 0 {
            return Err(Error::shape(
                OP.name(),
                format!(
                    "weight of shape {} has no elements",
                    shape_str(weight.shape())
                ),
            ));
        }
        if oc % groups != 0 {
            return Err(Error::invalid(
                OP.name(),
                format!("out_channels {oc} is not divisible by groups {groups}"),
            ));
        }
        if let Some(b) = &bias {
            check_weight_dtype(OP, "bias", b, dtype)?;
            if b.shape() != [oc] {
                return Err(Error::shape(
                    OP.name(),
                    format!("bias must have shape [{oc}], got {}", shape_str(b.shape())),
                ));
            }
        }
        let conv = Conv2d {
            weight,
            bias,
            stride,
            padding,
            dilation,
            groups,
            padding_mode,
            request,
            winograd_filter: OnceLock::new(),
            direct_packed: OnceLock::new(),
            activation: None,
        };
        if let Request::Named(algo) = request {
            // An input large enough for any kernel, so only shape-independent constraints can fail.
            let probe = conv.kernel_params(
                1,
                conv.in_channels(),
                kh * dilation.0 + 8,
                kw * dilation.1 + 8,
            );
            registry::resolve(
                OP,
                Request::Named(algo),
                DeviceKind::Cpu,
                &Problem::Conv2d(probe),
            )?;
        }
        Ok(conv)
    }

    /// Fuses `activation` (any kind) into the layer: it is applied in place
    /// to the output right after the convolution, saving a pass and a buffer.
    pub fn with_activation(mut self, activation: Option<ActivationKind>) -> Self {
        self.activation = activation;
        self
    }

    /// The fused activation, if any.
    pub fn activation(&self) -> Option<ActivationKind> {
        self.activation
    }

    fn in_channels(&self) -> usize {
        self.weight.shape()[1] * self.groups
    }

    /// Kernel-level parameters: zero padding stays implicit, other modes are
    /// materialised before the kernel runs, so the kernel sees no padding.
    fn kernel_params(&self, batch: usize, channels: usize, h: usize, w: usize) -> Conv2dParams {
        let ws = self.weight.shape();
        let (in_h, in_w, padding) = match self.padding_mode {
            PadMode::Zeros => (h, w, self.padding),
            _ => (
                h + self.padding.top + self.padding.bottom,
                w + self.padding.left + self.padding.right,
                Padding2d::default(),
            ),
        };
        let mut p = Conv2dParams {
            batch,
            in_channels: channels,
            in_h,
            in_w,
            out_channels: ws[0],
            kernel_h: ws[2],
            kernel_w: ws[3],
            stride: self.stride,
            padding,
            dilation: self.dilation,
            groups: self.groups,
        };
        // A stride past the last window start computes the same single window
        // as the smallest such stride; kernels size buffers by the stride
        // (a stride of 10^12 would ask for terabytes), so they get the small one.
        let fit = |stride: usize, padded: usize, span: usize| {
            stride.min(padded.saturating_sub(span) + 1).max(1)
        };
        p.stride = (
            fit(p.stride.0, p.padded_h(), p.effective_kernel_h()),
            fit(p.stride.1, p.padded_w(), p.effective_kernel_w()),
        );
        p
    }

    /// Validates an input shape against the layer; returns the kernel parameters and batching.
    fn params_for(&self, shape: &[usize]) -> Result<(Conv2dParams, bool)> {
        let (n, c, h, w, batched) = image_dims(OP, shape)?;
        let ic = self.in_channels();
        if c != ic {
            // A 3-D input is often a batched one that lost a dimension ([N, C, W]):
            // say how it was read.
            let read = if batched {
                String::new()
            } else {
                format!(
                    " (read as unbatched [C, H, W], it has {c} channel(s); give a 4-D [N, {ic}, H, W] (batched) or 3-D [{ic}, H, W] (unbatched) input)"
                )
            };
            return Err(Error::shape(
                OP.name(),
                format!(
                    "weight of shape {} with groups={} expects {ic} input channels, got input of shape {}{read}",
                    shape_str(self.weight.shape()),
                    self.groups,
                    shape_str(shape)
                ),
            ));
        }
        let pad = self.padding;
        match self.padding_mode {
            PadMode::Reflect if pad.top.max(pad.bottom) >= h || pad.left.max(pad.right) >= w => {
                return Err(Error::shape(
                    OP.name(),
                    format!("padding_mode='reflect' needs padding smaller than the input's spatial size; padding {pad:?}, input shape {}", shape_str(shape)),
                ))
            }
            PadMode::Circular if pad.top.max(pad.bottom) > h || pad.left.max(pad.right) > w => {
                return Err(Error::shape(
                    OP.name(),
                    format!("padding_mode='circular' needs padding at most the input's spatial size; padding {pad:?}, input shape {}", shape_str(shape)),
                ))
            }
            _ => {}
        }
        let p = self.kernel_params(n, c, h, w);
        if p.padded_h() < p.effective_kernel_h() || p.padded_w() < p.effective_kernel_w() {
            return Err(Error::shape(
                OP.name(),
                format!(
                    "kernel of size ({}, {}) (dilated: ({}, {})) is larger than the padded input ({}, {}); input shape {}, weight shape {}",
                    p.kernel_h,
                    p.kernel_w,
                    p.effective_kernel_h(),
                    p.effective_kernel_w(),
                    p.padded_h(),
                    p.padded_w(),
                    shape_str(shape),
                    shape_str(self.weight.shape())
                ),
            ));
        }
        Ok((p, batched))
    }

    fn algorithm(&self, p: &Conv2dParams) -> Result<Algorithm> {
        registry::resolve(OP, self.request, DeviceKind::Cpu, &Problem::Conv2d(*p))
    }

    fn run<T: crate::dtype::Element>(
        &self,
        p: &Conv2dParams,
        x: &[T],
        out: &mut [T],
    ) -> Result<()> {
        let w = self.weight.as_slice::<T>()?;
        let b = match &self.bias {
            Some(b) => Some(b.as_slice::<T>()?),
            None => None,
        };
        match self.algorithm(p)? {
            Algorithm::Direct => {
                let packed = prepared(&self.direct_packed, direct::packed_len(p), |d| {
                    direct::pack(p, w, b, d)
                })?;
                direct::conv2d_packed(p, x, packed, out)
            }
            Algorithm::Smm => smm::conv2d(p, x, w, b, out),
            Algorithm::Gemm => gemm::conv2d(p, x, w, b, out),
            Algorithm::Fft => fft::conv2d(p, x, w, b, out),
            Algorithm::Winograd => {
                let filter = prepared(
                    &self.winograd_filter,
                    winograd::transformed_filter_len(p),
                    |u| winograd::transform_filter_into(p, w, u),
                )?;
                winograd::conv2d(p, x, filter, b, out)
            }
            Algorithm::Custom => {
                let shape = [p.batch, p.in_channels, p.in_h, p.in_w];
                custom_result(OP, &shape, custom::conv2d(p, x, w, b, out))?
            }
        }
        Ok(())
    }
}

/// Weights an algorithm prepares once, on first use, and keeps in `cell`:
/// `len` elements written by `fill`. They depend only on the weight's
/// geometry, so every input size shares them.
fn prepared<T: crate::dtype::Element>(
    cell: &OnceLock<Tensor>,
    len: usize,
    fill: impl FnOnce(&mut [T]),
) -> Result<&[T]> {
    cell.get_or_init(|| {
        let mut t = Tensor::zeros(T::DTYPE, &[len]);
        if let Ok(data) = t.as_mut_slice::<T>() {
            fill(data);
        }
        t
    })
    .as_slice::<T>()
}

impl Operation for Conv2d {
    fn kind(&self) -> OpKind {
        OP
    }

    fn fused_activation(&self) -> Option<OpKind> {
        self.activation.map(|a| a.op_kind())
    }

    fn algorithm_for(&self, input_shape: &[usize]) -> Result<String> {
        let (p, _) = self.params_for(input_shape)?;
        Ok(self.algorithm(&p)?.name().into())
    }

    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let (p, batched) = self.params_for(single(OP, inputs)?)?;
        Ok(image_shape(
            batched,
            p.batch,
            p.out_channels,
            p.out_h(),
            p.out_w(),
        ))
    }

    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let x = single(OP, inputs)?;
        check_weight_dtype(OP, "input", x, self.weight.dtype())?;
        let (p, _) = self.params_for(x.shape())?;
        with_dtype!(x.dtype(), T, {
            if self.padding_mode == PadMode::Zeros {
                self.run::<T>(&p, x.as_slice()?, output.as_mut_slice()?)?;
            } else {
                let (_, c, h, w, _) = image_dims(OP, x.shape())?;
                let mut padded = Tensor::zeros(x.dtype(), &[p.batch, c, p.in_h, p.in_w]);
                pad2d::<T>(
                    self.padding_mode,
                    p.batch * c,
                    h,
                    w,
                    self.padding,
                    x.as_slice()?,
                    padded.as_mut_slice()?,
                );
                self.run::<T>(&p, padded.as_slice()?, output.as_mut_slice()?)?;
            }
            if let Some(a) = self.activation {
                a.apply_inplace::<T>(output.as_mut_slice()?);
            }
        });
        Ok(())
    }
}
