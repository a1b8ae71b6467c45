//! 2-D convolution with PyTorch's full semantics: stride, per-side padding,
//! dilation, groups, bias and the four padding modes.

use super::attrs::{optional, required, Arity, OpSpec, ParamKind as K};
use std::sync::OnceLock;

use ai3_kernels::alloc::checked_sum;
use ai3_kernels::cpu::binary;
use ai3_kernels::cpu::blocked::pointwise::{self, Pointwise, Subsample};
use ai3_kernels::cpu::blocked::{self, scaled, Fused};
use ai3_kernels::cpu::conv2d::{depthwise, direct, fft, gemm, smm, tiled, winograd, Epilogue};
use ai3_kernels::cpu::linear::{self, packed::PackedWeight};
use ai3_kernels::cpu::pad::pad2d;
pub use ai3_kernels::cpu::pad::PadMode;
use ai3_kernels::custom;
use ai3_kernels::params::{Conv2dParams, Padding2d};
use ai3_kernels::{KernelError, KernelResult};

use super::{
    any_plane_dims, check_positive, check_weight_dtype, custom_result, elements, elements_mut,
    image_dims, image_shape, kernel_result, single, with_dtype, ActivationKind, Operation,
};
use crate::error::{Error, Result};
use crate::layout::Blocked;
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
    /// Winograd-transformed weights (packed with the bias where the blocked
    /// kernel runs them), computed once on first use: one per form
    /// ([`winograd::form`]), as input sizes may call for either.
    winograd_filter: [OnceLock<Tensor>; winograd::FORMS],
    /// Weights and bias packed for direct convolution, once on first use.
    direct_packed: OnceLock<Tensor>,
    /// Weights and bias packed for the blocked (and channels-last) depthwise
    /// kernel, once on first use.
    depthwise_packed: OnceLock<Tensor>,
    /// Weights and bias packed for the blocked 1x1 kernel, once on first use.
    pointwise_packed: OnceLock<Tensor>,
    /// Weights in the order of channels-last patches, once on first use.
    nhwc_weight: OnceLock<Tensor>,
    /// Those weights and the bias packed for the f32 register-tile linear
    /// kernel, once on first use.
    nhwc_packed: OnceLock<PackedWeight>,
    /// Activation fused into the output, applied in place after the kernel
    /// (and after the residual).
    activation: Option<ActivationKind>,
    /// Whether the node reads a second input of the output's shape, added to
    /// the output before the activation (ResNet's skip connection).
    residual: bool,
    /// Whether the node reads a last input, `[n or 1, in_channels, 1, 1]`,
    /// that multiplies the input's channels before the convolution
    /// (squeeze-and-excitation's `conv(x * s)`).
    input_scale: bool,
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
        let (Some(eh), Some(ew)) = (dilated(kh, dilation.0), dilated(kw, dilation.1)) else {
            return Err(Error::invalid(
                OP.name(),
                format!(
                    "dilation {dilation:?} with a kernel of size ({kh}, {kw}) spans more than a 64-bit size can count"
                ),
            ));
        };
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
            winograd_filter: Default::default(),
            direct_packed: OnceLock::new(),
            depthwise_packed: OnceLock::new(),
            pointwise_packed: OnceLock::new(),
            nhwc_weight: OnceLock::new(),
            nhwc_packed: OnceLock::new(),
            activation: None,
            residual: false,
            input_scale: false,
        };
        if let Request::Named(algo) = request {
            // An input large enough for any kernel, so only shape-independent
            // constraints can fail. With a padding whose sum with it overflows
            // no input fits, which the first call reports with its shapes.
            let probe = conv.kernel_params(
                1,
                conv.in_channels(),
                eh.saturating_add(8),
                ew.saturating_add(8),
            );
            if let Ok(probe) = probe {
                registry::resolve(
                    OP,
                    Request::Named(algo),
                    DeviceKind::Cpu,
                    &Problem::Conv2d(probe, conv.weight.dtype()),
                )?;
            }
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

    /// Makes the layer read a second input, of its output's shape, added to
    /// the output before the fused activation: `act(conv(x) + residual)`.
    pub fn with_residual(mut self, residual: bool) -> Self {
        self.residual = residual;
        self
    }

    /// Makes the layer read a last input, `[n, in_channels, 1, 1]` (or a
    /// batch of 1; `[in_channels, 1, 1]` for an unbatched input), that
    /// multiplies each image's input channels before the convolution:
    /// `conv(x * scale)`, squeeze-and-excitation's scaling folded into the
    /// layer that reads it. The blocked 1x1 kernel scales its weights per
    /// image rather than the input where that is less work.
    pub fn with_input_scale(mut self, input_scale: bool) -> Self {
        self.input_scale = input_scale;
        self
    }

    /// The input, the residual (with a fused one) and the input scale (with
    /// a fused one), in that order.
    #[allow(clippy::type_complexity)]
    fn split<'a, T: ?Sized>(
        &self,
        inputs: &[&'a T],
    ) -> Result<(&'a T, Option<&'a T>, Option<&'a T>)> {
        let want = 1 + usize::from(self.residual) + usize::from(self.input_scale);
        if inputs.len() != want {
            return Err(Error::internal(
                OP.name(),
                format!("expected {want} input(s), got {}", inputs.len()),
            ));
        }
        Ok((
            inputs[0],
            self.residual.then(|| inputs[1]),
            self.input_scale.then(|| inputs[want - 1]),
        ))
    }

    /// The output shape for input shape `x`, checked against the residual's
    /// and the input scale's.
    fn checked_output_shape(
        &self,
        x: &[usize],
        residual: Option<&[usize]>,
        scale: Option<&[usize]>,
    ) -> Result<Vec<usize>> {
        let (p, batched) = self.params_for(x)?;
        let out = image_shape(batched, p.batch, p.out_channels, p.out_h(), p.out_w());
        if let Some(s) = scale {
            let one = image_shape(batched, 1, p.in_channels, 1, 1);
            let each = image_shape(batched, p.batch, p.in_channels, 1, 1);
            if s != one.as_slice() && s != each.as_slice() {
                return Err(Error::shape(
                    OP.name(),
                    format!(
                        "the scale of the input's channels must have shape {}{}, got {} ({})",
                        shape_str(&each),
                        if one != each {
                            format!(" or {}", shape_str(&one))
                        } else {
                            String::new()
                        },
                        shape_str(s),
                        self.context(x)
                    ),
                ));
            }
        }
        if let Some(r) = residual {
            if r != out.as_slice() {
                return Err(Error::shape(
                    OP.name(),
                    format!(
                        "the residual added to the output must have the output's shape {}, got {} ({})",
                        shape_str(&out),
                        shape_str(r),
                        self.context(x)
                    ),
                ));
            }
        }
        Ok(out)
    }

    fn in_channels(&self) -> usize {
        self.weight.shape()[1] * self.groups
    }

    /// Kernel-level parameters: zero padding stays implicit, other modes are
    /// materialised before the kernel runs, so the kernel sees no padding.
    /// A padded size that overflows is an error.
    fn kernel_params(
        &self,
        batch: usize,
        channels: usize,
        h: usize,
        w: usize,
    ) -> KernelResult<Conv2dParams> {
        let ws = self.weight.shape();
        let pad = self.padding;
        const PADDED_H: &str = "conv2d padded input height";
        const PADDED_W: &str = "conv2d padded input width";
        let (in_h, in_w, padding) = match self.padding_mode {
            PadMode::Zeros => (h, w, pad),
            _ => (
                checked_sum(PADDED_H, &[h, pad.top, pad.bottom])?,
                checked_sum(PADDED_W, &[w, pad.left, pad.right])?,
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
        // Checked here, so the unchecked accessors of `p` cannot overflow.
        let overflow = |what| KernelError::Overflow { what };
        let eh =
            dilated(p.kernel_h, p.dilation.0).ok_or(overflow("conv2d dilated kernel height"))?;
        let ew =
            dilated(p.kernel_w, p.dilation.1).ok_or(overflow("conv2d dilated kernel width"))?;
        let ph = checked_sum(PADDED_H, &[in_h, padding.top, padding.bottom])?;
        let pw = checked_sum(PADDED_W, &[in_w, padding.left, padding.right])?;
        // A stride past the last window start computes the same single window
        // as the smallest such stride; kernels size buffers by the stride
        // (a stride of 10^12 would ask for terabytes), so they get the small one.
        let fit = |stride: usize, padded: usize, span: usize| {
            stride.min(padded.saturating_sub(span) + 1).max(1)
        };
        p.stride = (fit(p.stride.0, ph, eh), fit(p.stride.1, pw, ew));
        Ok(p)
    }

    /// `x` with its channels multiplied by `scale` (NCHW, shapes checked):
    /// a fused input scale for the kernels that have none of their own.
    fn scaled_input(&self, x: &Tensor, scale: &Tensor) -> Result<Tensor> {
        let mut t = Tensor::unfilled(x.dtype(), x.shape()).map_err(|e| {
            e.with_op(OP.name())
                .map_msg(|m| format!("{m} (the scaled input; {})", self.context(x.shape())))
        })?;
        with_dtype!(x.dtype(), T, {
            let done = binary::broadcast(
                x.as_slice::<T>()?,
                x.shape(),
                scale.as_slice::<T>()?,
                scale.shape(),
                t.as_mut_slice::<T>()?,
                |v, c| v * c,
            );
            kernel_result(OP, done, || self.context(x.shape()))?;
        });
        Ok(t)
    }

    /// The shapes and hyperparameters behind a problem, for messages.
    fn context(&self, shape: &[usize]) -> String {
        let p = self.padding;
        let padding = if p.top == p.bottom && p.left == p.right {
            format!("({}, {})", p.top, p.left)
        } else {
            format!(
                "(top {}, bottom {}, left {}, right {})",
                p.top, p.bottom, p.left, p.right
            )
        };
        format!(
            "input shape {}, weight shape {}, padding {padding}, stride {:?}, dilation {:?}",
            shape_str(shape),
            shape_str(self.weight.shape()),
            self.stride,
            self.dilation
        )
    }

    /// Validates an input shape against the layer; returns the kernel parameters and batching.
    fn params_for(&self, shape: &[usize]) -> Result<(Conv2dParams, bool)> {
        // PyTorch gives an empty batch an empty output whatever its plane
        // (with zero padding; its other padding modes refuse an empty plane).
        let (n, c, h, w, batched) = match (shape, self.padding_mode) {
            ([0, _, _, _], PadMode::Zeros) => any_plane_dims(OP, shape)?,
            _ => image_dims(OP, shape)?,
        };
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
        let p = kernel_result(OP, self.kernel_params(n, c, h, w), || self.context(shape))?;
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
        // The input, weight and output sizes fit too.
        kernel_result(OP, p.check_sizes(), || self.context(shape))?;
        Ok((p, batched))
    }

    fn algorithm(&self, p: &Conv2dParams) -> Result<Algorithm> {
        registry::resolve(
            OP,
            self.request,
            DeviceKind::Cpu,
            &Problem::Conv2d(*p, self.weight.dtype()),
        )
    }

    /// What the kernels apply to output elements `at..at + s.len()` once
    /// finished, while they are in cache: the residual (in the output's
    /// layout), then the activation.
    fn epilogue<'a, T: crate::dtype::Element>(
        &self,
        residual: Option<&'a [T]>,
    ) -> impl Fn(usize, &mut [T]) + Sync + 'a {
        super::residual_epilogue(residual, self.activation)
    }

    /// Runs the kernel of the algorithm `p` resolves to; `shape` is the
    /// layer's input shape, for messages. Returns whether the kernel applied
    /// the fused activation itself (else the caller applies it).
    fn run<T: crate::dtype::Element>(
        &self,
        p: &Conv2dParams,
        shape: &[usize],
        x: &[T],
        residual: Option<&[T]>,
        out: &mut [T],
    ) -> Result<bool> {
        let w = self.weight.as_slice::<T>()?;
        let b = match &self.bias {
            Some(b) => Some(b.as_slice::<T>()?),
            None => None,
        };
        let algorithm = self.algorithm(p)?;
        let context = || format!("{}, algorithm '{algorithm}'", self.context(shape));
        let epilogue = self.epilogue(residual);
        let mut fused = false;
        let done = match algorithm {
            Algorithm::Direct if depthwise::applies(p) => {
                fused = true;
                // f32 on channel blocks: the weights packed once per layer.
                let packed =
                    if self.weight.dtype() == crate::DType::F32 && depthwise::reads_packed(p) {
                        Some(self.depthwise_packed(p, context)?)
                    } else {
                        None
                    };
                depthwise::conv2d(p, x, w, b, packed, out, Some(&epilogue))
            }
            Algorithm::Direct => {
                let len = kernel_result(OP, direct::packed_len::<T>(p), context)?;
                let packed = prepared(&self.direct_packed, len, context, |d| {
                    direct::pack(p, w, b, d)
                })?;
                direct::conv2d_packed(p, x, packed, out)
            }
            Algorithm::Smm => smm::conv2d(p, x, w, b, out),
            Algorithm::Gemm if tiled::applies::<T>(p) => {
                fused = true;
                tiled::conv2d(p, x, w, b, out, Some(&epilogue))
            }
            Algorithm::Gemm => gemm::conv2d(p, x, w, b, out),
            Algorithm::Fft => fft::conv2d(p, x, w, b, out),
            Algorithm::Winograd => {
                let len = kernel_result(OP, winograd::prepared_len::<T>(p), context)?;
                let cell = &self.winograd_filter[winograd::form::<T>(p)];
                let filter = prepared(cell, len, context, |u| winograd::prepare(p, w, b, u))?;
                let done = winograd::conv2d_prepared(p, x, filter, b, out, Some(&epilogue));
                fused = matches!(done, Ok(true));
                done.map(drop)
            }
            Algorithm::Custom => {
                let shape = [p.batch, p.in_channels, p.in_h, p.in_w];
                return custom_result(OP, &shape, custom::conv2d(p, x, w, b, out)).map(|_| false);
            }
            // `algorithm()` resolved for the CPU, which has no row for these.
            gpu_only @ (Algorithm::ImplicitGemm
            | Algorithm::ImplicitPrecompGemm
            | Algorithm::WinogradNonfused
            | Algorithm::FftTiling
            | Algorithm::Guess
            | Algorithm::Find) => {
                return Err(Error::internal(
                    OP.name(),
                    format!("the GPU algorithm '{gpu_only}' reached the CPU kernels"),
                ))
            }
            other @ (Algorithm::Naive | Algorithm::Flash) => {
                return Err(Error::internal(
                    OP.name(),
                    format!("the attention algorithm '{other}' reached conv2d"),
                ))
            }
        };
        kernel_result(OP, done, context)?;
        Ok(fused)
    }
}

/// The blocked 1x1 kernel's shape when it computes `p`: a 1x1 convolution
/// with no padding and one group, of any stride.
fn pointwise_shape(p: &Conv2dParams) -> Option<Pointwise> {
    let one = p.kernel_h == 1 && p.kernel_w == 1 && p.groups == 1;
    let subsample = (p.stride != (1, 1)).then_some(Subsample {
        in_h: p.in_h,
        in_w: p.in_w,
        stride: p.stride,
    });
    (one && p.padding == Padding2d::default()).then_some(Pointwise {
        batch: p.batch,
        in_channels: p.in_channels,
        out_channels: p.out_channels,
        plane: p.out_h() * p.out_w(),
        subsample,
    })
}

/// Whether a layer whose blocked kernel is `kernel` (`blocked_kernel`) and
/// whose 1x1 shape is `pointwise` (`pointwise_shape`) runs on the blocked
/// 1x1 kernel, the one that adds a residual in the output's place.
fn on_pointwise(kernel: &Option<(Algorithm, usize)>, pointwise: &Option<Pointwise>) -> bool {
    matches!(kernel, Some((Algorithm::Gemm, _))) && pointwise.is_some()
}

/// Planes up to which the blocked 1x1 kernel is counted as beating the NCHW
/// GEMM, whose vectors run over a plane's pixels (49 of 56 lanes useful at
/// 7x7). Measured up to 56x56 in ResNet-50 at batch 1, each layer with its
/// share of the reorders (AVX2, 2 threads): four 128 -> 512 at 28x28 with
/// the residual 3.15 -> 2.64 ms, three 512 -> 128 2.10 -> 1.69, 64 -> 256 at
/// 56x56 3.29 -> 2.92; the network 0.96x, at batch 10 1.0x. Larger planes
/// (112x112) are not measured.
const POINTWISE_GAIN_PLANE: usize = 3136;

/// Output planes up to which, on AVX-512, the blocked 1x1 kernel is
/// counted as saving more than the reorders into and out of its blocks
/// cost, so that a 1x1 layer alone among NCHW operations (a swapped layer,
/// a graph's only convolution) runs blocked too. On an Intel Xeon with
/// AVX-512 (ResNet-50's 1x1 layers at batch 1, each swapped alone with
/// the reorders, alternating with `nn.Conv2d` in one process, 2 threads):
/// at 7x7 and 14x14 0.78-1.10x PyTorch's time blocked against 1.04-1.26x
/// in NCHW (512 -> 2048 at 7x7 0.86x against 1.19x, 1024 -> 512 at 14x14
/// 1.06x against 1.26x; 1024 -> 256 1.09x either way); at 28x28 mixed
/// (1.07-1.11x against 0.96-1.17x), at 56x56 slower (0.81-1.22x against
/// 0.71-1.03x). Narrower layers lost (see [`POINTWISE_ALONE_CHANNELS`]).
const POINTWISE_ALONE_PLANE: usize = 196;

/// Channels, in and out, below which a 1x1 layer alone stays NCHW whatever
/// its plane ([`POINTWISE_ALONE_PLANE`]): with every 1x1 layer of 7x7 and
/// 14x14 planes blocked, swapped mobilenet_v2 and efficientnet_b0 at batch
/// 1 (their projections and expansions of 96-192 channels to 576-1152)
/// took 1.09x and 1.16x the time end to end (8 paired rounds), while
/// resnet50's (256 to 2048 channels) took 0.98x at batch 1 and 0.96x at
/// batch 10.
const POINTWISE_ALONE_CHANNELS: usize = 256;

impl Conv2d {
    /// The blocked kernel that computes `p` for this layer, if any: the
    /// depthwise or channel-block path of `'direct'`, the blocked kernel of
    /// `'winograd'`, or the 1x1 GEMM of `'gemm'`, with the elements it
    /// saves against the NCHW kernel (see [`crate::layout`]). `'default'`
    /// takes direct's for the layers [`registry::image_into_blocks`] names,
    /// whatever it runs them on in NCHW.
    fn blocked_kernel(&self, p: &Conv2dParams) -> Option<(Algorithm, usize)> {
        let dtype = self.weight.dtype();
        if self.padding_mode != PadMode::Zeros || dtype != crate::DType::F32 {
            return None;
        }
        let (numel_in, numel_out) = (p.input_len(), p.output_len());
        let algorithm = match self.request {
            Request::Default if registry::image_into_blocks(p, dtype) => Algorithm::Direct,
            _ => self.algorithm(p).ok()?,
        };
        match algorithm {
            // The transposes into and out of its channel blocks (depthwise,
            // or the blocked direct kernel's padded copy and scattered stores).
            Algorithm::Direct
                if depthwise::applies_blocked(p) || direct::runs_blocked::<f32>(p) =>
            {
                Some((Algorithm::Direct, numel_in.saturating_add(numel_out)))
            }
            // The NCHW run of the same kernel transposes each tile row's
            // input into channel blocks and scatters each tile's output.
            Algorithm::Winograd if winograd::runs_blocked::<f32>(p) => {
                Some((Algorithm::Winograd, numel_in.saturating_add(numel_out)))
            }
            Algorithm::Gemm
                if pointwise_shape(p).is_some() && ai3_kernels::cpu::blocked::available() =>
            {
                let plane = p.out_h() * p.out_w();
                Some((
                    Algorithm::Gemm,
                    if plane <= POINTWISE_ALONE_PLANE
                        && p.in_channels.min(p.out_channels) >= POINTWISE_ALONE_CHANNELS
                        && ai3_kernels::isa::avx512()
                    {
                        numel_in.saturating_add(numel_out).saturating_mul(2)
                    } else if plane <= POINTWISE_GAIN_PLANE {
                        numel_out
                    } else {
                        0
                    },
                ))
            }
            _ => None,
        }
    }

    /// Whether this layer's blocked kernel also reads NCHW input
    /// ([`Blocked::EitherInput`]): the blocked direct kernel with fewer
    /// input channels than a block (an RGB input layer) and no residual,
    /// which copies an NCHW image into its padded buffer as it lies, so
    /// that no reorder into blocks (8 lanes for 3 channels) runs before it.
    fn reads_nchw(&self, p: &Conv2dParams) -> bool {
        !self.residual
            && !self.input_scale
            && p.in_channels < ai3_kernels::cpu::blocked::BLOCK
            && !depthwise::applies_blocked(p)
            && direct::reads_nchw_into_blocked(p)
            && matches!(self.blocked_kernel(p), Some((Algorithm::Direct, _)))
    }

    /// The algorithm whose kernel reads and writes `p` channels last, if
    /// any: the depthwise path of `'direct'` (f32), or the patches of
    /// `'gemm'` when the windows do not overlap, which `'default'` takes
    /// too: its NCHW kernel would need the input copied to NCHW and its
    /// output back (ConvNeXt's downsampling layers, swapped, batch 10:
    /// 12.1 ms against PyTorch's 3.0, of which the patches' GEMM takes 3.4).
    fn channels_last_kernel(&self, p: &Conv2dParams) -> Option<Algorithm> {
        match self.algorithm(p).ok()? {
            Algorithm::Direct
                if self.weight.dtype() == crate::DType::F32 && depthwise::applies_nhwc(p) =>
            {
                Some(Algorithm::Direct)
            }
            Algorithm::Gemm if gemm::applies_nhwc(p) => Some(Algorithm::Gemm),
            _ if self.request == Request::Default && gemm::applies_nhwc(p) => Some(Algorithm::Gemm),
            _ => None,
        }
    }

    /// The f32 weights and bias packed for the blocked and channels-last
    /// depthwise kernels, on first use.
    fn depthwise_packed(&self, p: &Conv2dParams, context: impl Fn() -> String) -> Result<&[f32]> {
        let len = kernel_result(OP, depthwise::blocked_packed_len(p), &context)?;
        let w = self.weight.as_slice::<f32>()?;
        let b = match &self.bias {
            Some(b) => Some(b.as_slice::<f32>()?),
            None => None,
        };
        prepared(&self.depthwise_packed, len, context, |d| {
            depthwise::pack_blocked(p, w, b, d)
        })
    }

    /// The f32 weights in channels-last patch order, with the bias, packed
    /// for the register-tile linear kernel, on first use (see [`prepared`]
    /// for what a failure leaves).
    fn nhwc_packed(&self, p: &Conv2dParams, context: impl Fn() -> String) -> Result<&PackedWeight> {
        once(&self.nhwc_packed, || {
            let w = self.weight.as_slice::<f32>()?;
            let b = match &self.bias {
                Some(b) => Some(b.as_slice::<f32>()?),
                None => None,
            };
            let features = p.kernel_h * p.kernel_w * p.in_channels;
            // In patch order only until packed: not kept beside the packed copy.
            let pack = || -> KernelResult<Option<PackedWeight>> {
                let mut d =
                    ai3_kernels::alloc::try_zeroed_vec(w.len(), "channels-last conv2d weight")?;
                gemm::nhwc_weight(p, w, &mut d)?;
                PackedWeight::new(&d, b, p.out_channels, features)
            };
            pack()
                .map_err(|e| Error::from_kernel(OP.name(), &context(), e))?
                .ok_or_else(|| {
                    Error::internal(OP.name(), "the packed linear kernel does not run here")
                })
        })
    }
}

/// Weights an algorithm prepares once, on first use, and keeps in `cell`:
/// `len` elements written by `fill`. They depend only on the weight's
/// geometry, so every input size shares them.
///
/// A failure (memory refused, a kernel error) is returned and nothing is
/// cached, so the next call tries again: weights that were never written are
/// never used. Two threads may both prepare them on a first call; the
/// first to finish is kept, the other's work is dropped.
fn prepared<T: crate::dtype::Element>(
    cell: &OnceLock<Tensor>,
    len: usize,
    context: impl Fn() -> String,
    fill: impl FnOnce(&mut [T]) -> KernelResult<()>,
) -> Result<&[T]> {
    once(cell, || {
        let mut t = Tensor::zeros(T::DTYPE, &[len]).map_err(|e| {
            let ctx = context();
            e.with_op(OP.name())
                .map_msg(|m| format!("{m} (the prepared weights; {ctx})"))
        })?;
        fill(t.as_mut_slice::<T>()?).map_err(|e| Error::from_kernel(OP.name(), &context(), e))?;
        Ok(t)
    })?
    .as_slice::<T>()
}

/// The value in `cell`, made by `make` on first use. A failure is returned
/// and nothing is cached, so the next call tries again. Two threads may
/// both make it on a first call; the first to finish is kept (the values
/// are the same), the other's dropped.
fn once<V>(cell: &OnceLock<V>, make: impl FnOnce() -> Result<V>) -> Result<&V> {
    if let Some(v) = cell.get() {
        return Ok(v);
    }
    // Set fails only when another thread set it first.
    let _ = cell.set(make()?);
    cell.get()
        .ok_or_else(|| Error::internal(OP.name(), "prepared weights vanished"))
}

/// `(k - 1) * d + 1`, the extent of a kernel of size `k` with dilation `d`,
/// or `None` when it overflows.
fn dilated(k: usize, d: usize) -> Option<usize> {
    k.checked_sub(1)?.checked_mul(d)?.checked_add(1)
}

impl Operation for Conv2d {
    fn kind(&self) -> OpKind {
        OP
    }

    fn per_image(&self, _inputs: &[&[usize]]) -> bool {
        true
    }

    fn fused_activation(&self) -> Option<OpKind> {
        self.activation.map(|a| a.op_kind())
    }

    fn fused_residual(&self) -> bool {
        self.residual
    }

    fn fused_input_scale(&self) -> bool {
        self.input_scale
    }

    fn algorithm_for(&self, input_shape: &[usize]) -> Result<String> {
        let (p, _) = self.params_for(input_shape)?;
        Ok(self.algorithm(&p)?.name().into())
    }

    fn problem(&self, inputs: &[&[usize]]) -> Result<Problem> {
        Ok(Problem::Conv2d(
            self.params_for(self.split(inputs)?.0)?.0,
            self.weight.dtype(),
        ))
    }

    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let (x, residual, scale) = self.split(inputs)?;
        self.checked_output_shape(x, residual, scale)
    }

    fn blocked(&self, inputs: &[&[usize]]) -> Blocked {
        let Ok((x, _, _)) = self.split(inputs) else {
            return Blocked::No;
        };
        match self.params_for(x) {
            Ok((p, true)) => match self.blocked_kernel(&p) {
                // Reads an NCHW image where it lies (see `reads_nchw`).
                Some((_, _)) if self.reads_nchw(&p) => Blocked::EitherInput {
                    gain: p.output_len(),
                },
                Some((_, gain)) => Blocked::Kernel { gain },
                None => Blocked::No,
            },
            _ => Blocked::No,
        }
    }

    /// The residual, for a 1x1 layer on the blocked 1x1 kernel: it is
    /// written over the residual it adds (`pointwise::conv2d_onto_residual`).
    fn output_over_input(&self, inputs: &[&[usize]], blocked: bool) -> Option<usize> {
        let (x, Some(_), None) = self.split(inputs).ok()? else {
            return None;
        };
        let (p, _) = self.params_for(x).ok()?;
        (blocked && on_pointwise(&self.blocked_kernel(&p), &pointwise_shape(&p))).then_some(1)
    }

    fn blocked_algorithm_for(&self, inputs: &[&[usize]]) -> Result<String> {
        let (x, _, _) = self.split(inputs)?;
        let (p, _) = self.params_for(x)?;
        match self.blocked_kernel(&p) {
            Some((algorithm, _)) => Ok(algorithm.name().into()),
            None => Ok(self.algorithm(&p)?.name().into()),
        }
    }

    fn forward_blocked(
        &self,
        inputs: &[&Tensor],
        shapes: &[&[usize]],
        output: &mut Tensor,
    ) -> Result<()> {
        let (x, residual, scale) = self.split(inputs)?;
        let (shape, _, scale_shape) = self.split(shapes)?;
        let (p, _) = self.params_for(shape)?;
        let context = || format!("{}, channel-blocked layout", self.context(shape));
        let w = self.weight.as_slice::<f32>()?;
        let b = match &self.bias {
            Some(b) => Some(b.as_slice::<f32>()?),
            None => None,
        };
        let kernel = (self.blocked_kernel(&p), pointwise_shape(&p));
        // The memory planner may have put the output over the residual
        // (`output_over_input`): the output holds it on entry, and its
        // tensor points there too, so it is never read through that tensor.
        // Only the 1x1 kernel adds it so; another kernel (the algorithm
        // changed since the plan) reads a copy.
        let over = residual.is_some_and(|r| r.data_ptr() == output.data_ptr());
        let onto_residual = over && scale.is_none() && on_pointwise(&kernel.0, &kernel.1);
        let copied = if over && !onto_residual {
            Some(output.to_contiguous().map_err(|e| e.with_op(OP.name()))?)
        } else {
            None
        };
        let r = match copied.as_ref().or(residual) {
            Some(r) if !onto_residual => Some(r.as_slice::<f32>()?),
            _ => None,
        };
        let epilogue = self.epilogue(r);
        let e = (r.is_some() || self.activation.is_some()).then_some(&epilogue as Epilogue<f32>);
        // The 1x1, direct and depthwise kernels add the residual and clamp
        // in registers; another activation runs after, on finished strips.
        let clamp = self.activation.and_then(|a| a.clamp());
        let fused = Fused { residual: r, clamp };
        let rest = self.activation.filter(|_| clamp.is_none());
        let after = move |_: usize, s: &mut [f32]| {
            if let Some(a) = rest {
                a.apply_serial(s)
            }
        };
        let after = rest.is_some().then_some(&after as Epilogue<f32>);
        let nchw_in = crate::layout::is_nchw(x, shape);
        if nchw_in && !self.reads_nchw(&p) {
            return Err(Error::internal(
                OP.name(),
                format!(
                    "an NCHW input to a blocked kernel that reads blocks ({})",
                    context()
                ),
            ));
        }
        // The input scale: the 1x1 kernel's own (scaled weights, or a
        // scaled copy it reads while in cache); for the other kernels a
        // scaled copy of the input, in blocks.
        let scale = match (scale, scale_shape) {
            (Some(t), Some(&[sn, ..])) => Some((t.as_slice::<f32>()?, sn)),
            (None, _) => None,
            _ => {
                return Err(Error::internal(
                    OP.name(),
                    "a blocked input scale is not 4-D",
                ))
            }
        };
        let copy = match (scale, kernel) {
            (Some(_), (Some((Algorithm::Gemm, _)), Some(_))) | (None, _) | (_, (None, _)) => None,
            (Some((sv, sn)), _) => {
                let mut t =
                    Tensor::unfilled(x.dtype(), x.shape()).map_err(|e| e.with_op(OP.name()))?;
                let done = blocked::per_channel(
                    p.batch,
                    p.in_channels,
                    p.in_h * p.in_w,
                    x.as_slice::<f32>()?,
                    sv,
                    sn,
                    t.as_mut_slice::<f32>()?,
                    |v, c| v * c,
                    |_| {},
                );
                kernel_result(OP, done, context)?;
                Some(t)
            }
        };
        let x = copy.as_ref().unwrap_or(x);
        let (x, out) = (x.as_slice::<f32>()?, output.as_mut_slice::<f32>()?);
        let done = match kernel {
            (Some((Algorithm::Direct, _)), _) if depthwise::applies_blocked(&p) => {
                let packed = self.depthwise_packed(&p, context)?;
                depthwise::conv2d_blocked(&p, x, packed, out, fused, after)
            }
            (Some((Algorithm::Direct, _)), _) => {
                let len = kernel_result(OP, direct::packed_len::<f32>(&p), context)?;
                let packed = prepared(&self.direct_packed, len, context, |d| {
                    direct::pack(&p, w, b, d)
                })?;
                direct::conv2d_blocked(&p, nchw_in, x, packed, out, fused, after)
            }
            (Some((Algorithm::Winograd, _)), _) => {
                let len = kernel_result(OP, winograd::prepared_len::<f32>(&p), context)?;
                let cell = &self.winograd_filter[winograd::form::<f32>(&p)];
                let packed = prepared(cell, len, context, |d| winograd::prepare(&p, w, b, d))?;
                winograd::blocked::conv2d(&p, true, x, packed, out, e)
            }
            (Some((Algorithm::Gemm, _)), Some(s)) => {
                let len = kernel_result(OP, s.packed_len(), context)?;
                let packed = prepared(&self.pointwise_packed, len, context, |d| {
                    pointwise::pack(&s, w, b, d)
                })?;
                match scale {
                    Some((sv, sn)) => scaled::conv2d(&s, x, sv, sn, packed, out, fused, after),
                    None if onto_residual => {
                        pointwise::conv2d_onto_residual(&s, x, packed, out, clamp, after)
                    }
                    None => pointwise::conv2d(&s, x, packed, out, fused, after),
                }
            }
            // Planned blocked with an algorithm that has changed since
            // (`'default'` follows the thread count).
            _ => {
                let out_shape = self.output_shape(shapes)?;
                return crate::layout::via_nchw(self, inputs, shapes, &out_shape, output);
            }
        };
        kernel_result(OP, done, context)
    }

    fn channels_last(&self, inputs: &[&[usize]]) -> bool {
        let Ok((x, None, None)) = self.split(inputs) else {
            return false;
        };
        if self.activation.is_some() || self.padding_mode != PadMode::Zeros {
            return false;
        }
        match self.params_for(x) {
            Ok((p, true)) => self.channels_last_kernel(&p).is_some(),
            _ => false,
        }
    }

    fn forward_channels_last(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let (x, _, _) = self.split(inputs)?;
        let &[n, h, w, c] = x.shape() else {
            return Err(Error::internal(
                OP.name(),
                format!("channels-last input of shape {}", shape_str(x.shape())),
            ));
        };
        let shape = [n, c, h, w];
        check_weight_dtype(OP, "input", x, self.weight.dtype())?;
        let (p, _) = self.params_for(&shape)?;
        let context = || format!("{}, channels last", self.context(&shape));
        let done = match self.channels_last_kernel(&p) {
            Some(Algorithm::Direct) => {
                let packed = self.depthwise_packed(&p, context)?;
                depthwise::conv2d_nhwc(&p, x.as_slice()?, packed, output.as_mut_slice()?)
            }
            Some(Algorithm::Gemm)
                if x.dtype() == crate::DType::F32 && linear::packed::available() =>
            {
                let packed = self.nhwc_packed(&p, context)?;
                gemm::conv2d_nhwc_packed(&p, x.as_slice()?, packed, output.as_mut_slice()?)
            }
            Some(Algorithm::Gemm) => with_dtype!(x.dtype(), T, {
                let w = self.weight.as_slice::<T>()?;
                let w = prepared(&self.nhwc_weight, w.len(), context, |d| {
                    gemm::nhwc_weight(&p, w, d)
                })?;
                gemm::conv2d_nhwc::<T>(
                    &p,
                    x.as_slice()?,
                    w,
                    self.bias.as_ref().map(|b| b.as_slice()).transpose()?,
                    output.as_mut_slice()?,
                )
            }),
            _ => {
                return Err(Error::internal(
                    OP.name(),
                    format!("no channels-last kernel for {}", context()),
                ))
            }
        };
        kernel_result(OP, done, context)
    }

    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let (x, residual, scale) = self.split(inputs)?;
        check_weight_dtype(OP, "input", x, self.weight.dtype())?;
        if let Some(r) = residual {
            check_weight_dtype(OP, "residual", r, self.weight.dtype())?;
        }
        if let Some(s) = scale {
            check_weight_dtype(OP, "input scale", s, self.weight.dtype())?;
        }
        if residual.is_some() || scale.is_some() {
            self.checked_output_shape(
                x.shape(),
                residual.map(Tensor::shape),
                scale.map(Tensor::shape),
            )?;
        }
        // The input scaled first: the kernels read it as any input.
        let scaled = scale.map(|s| self.scaled_input(x, s)).transpose()?;
        let x = scaled.as_ref().unwrap_or(x);
        let (p, _) = self.params_for(x.shape())?;
        let shape = x.shape();
        with_dtype!(x.dtype(), T, {
            let r = match residual {
                Some(r) => Some(r.as_slice::<T>()?),
                None => None,
            };
            let fused = if self.padding_mode == PadMode::Zeros {
                self.run::<T>(&p, shape, x.as_slice()?, r, output.as_mut_slice()?)?
            } else {
                let (_, c, h, w, _) = image_dims(OP, shape)?;
                let mut padded =
                    Tensor::zeros(x.dtype(), &[p.batch, c, p.in_h, p.in_w]).map_err(|e| {
                        e.with_op(OP.name()).map_msg(|m| {
                            format!(
                                "{m} (the input padded with padding_mode='{}'; {})",
                                self.padding_mode.name(),
                                self.context(shape)
                            )
                        })
                    })?;
                let filled = pad2d::<T>(
                    self.padding_mode,
                    p.batch * c,
                    h,
                    w,
                    self.padding,
                    x.as_slice()?,
                    padded.as_mut_slice()?,
                );
                kernel_result(OP, filled, || self.context(shape))?;
                self.run::<T>(&p, shape, padded.as_slice()?, r, output.as_mut_slice()?)?
            };
            if !fused {
                let out = output.as_mut_slice::<T>()?;
                if let Some(r) = r {
                    out.iter_mut().zip(r).for_each(|(o, &r)| *o += r);
                }
                if let Some(a) = self.activation {
                    a.apply_inplace::<T>(out);
                }
            }
        });
        Ok(())
    }
}

/// `padding_mode` by PyTorch's name.
fn pad_mode(name: &str) -> Result<PadMode> {
    Ok(match name {
        "zeros" => PadMode::Zeros,
        "reflect" => PadMode::Reflect,
        "replicate" => PadMode::Replicate,
        "circular" => PadMode::Circular,
        other => {
            return Err(Error::invalid(
                OP.name(),
                format!(
                "padding_mode must be 'zeros', 'reflect', 'replicate' or 'circular', got '{other}'"
            ),
            ))
        }
    })
}

/// `conv2d`: `weight` `[out_channels, in_channels / groups, kh, kw]`, optional
/// `bias`, `stride`, `padding` `[top, bottom, left, right]`, `dilation`,
/// `groups`, `padding_mode` (PyTorch's), and a fused `activation`. A second
/// input, of the output's shape, is a residual added before the activation.
/// `input_scale`: the last input, `[n or 1, in_channels, 1, 1]`, multiplies
/// the input's channels first (see [`Conv2d::with_input_scale`]).
/// `channels_last`: input and output are `[n, h, w, c]` ([`ChannelsLast`]).
pub const SPEC: OpSpec = OpSpec {
    inputs: Arity::between(1, 3),
    params: &[
        required("weight", K::Tensor),
        optional("bias", K::Tensor),
        optional("stride", K::Ints),
        optional("padding", K::Ints),
        optional("dilation", K::Ints),
        optional("groups", K::Int),
        optional("padding_mode", K::Str),
        optional("activation", K::Activation),
        optional("channels_last", K::Bool),
        optional("input_scale", K::Bool),
    ],
    build: |a| {
        let weight = a.required_tensor("weight")?;
        let bias = a.tensor("bias")?;
        let [top, bottom, left, right] = a.usizes_n("padding", [0; 4])?;
        let padding = Padding2d {
            top,
            bottom,
            left,
            right,
        };
        let conv = Conv2d::new(
            weight,
            bias,
            a.pair_or("stride", (1, 1))?,
            padding,
            a.pair_or("dilation", (1, 1))?,
            a.usize_or("groups", 1)?,
            pad_mode(a.str_or("padding_mode", "zeros")?)?,
            a.request,
        )?;
        let input_scale = a.bool_or("input_scale", false)?;
        // The input, then a residual, then (with input_scale) the scale.
        let residual = match a.num_inputs.checked_sub(1 + usize::from(input_scale)) {
            Some(0) => false,
            Some(1) => true,
            _ => {
                return Err(Error::invalid(
                    OP.name(),
                    format!(
                        "takes the input, an optional residual{}: got {} input(s)",
                        if input_scale {
                            " and the input scale"
                        } else {
                            ""
                        },
                        a.num_inputs
                    ),
                ))
            }
        };
        let conv = conv
            .with_activation(a.activation("activation")?)
            .with_residual(residual)
            .with_input_scale(input_scale);
        if !a.bool_or("channels_last", false)? {
            return Ok(Box::new(conv));
        }
        if residual || input_scale {
            return Err(Error::invalid(
                OP.name(),
                "a channels-last convolution takes no residual input or input scale",
            ));
        }
        Ok(Box::new(ChannelsLast { conv }))
    },
};

/// `[n, h, w, c]` read as `[n, c, h, w]`, or back: `to_nchw` picks the
/// direction. Other ranks are an error naming the shape.
fn nhwc_dims(shape: &[usize], to_nchw: bool) -> Result<[usize; 4]> {
    match *shape {
        [n, h, w, c] if to_nchw => Ok([n, c, h, w]),
        [n, c, h, w] => Ok([n, h, w, c]),
        _ => Err(Error::shape(
            OP.name(),
            format!(
                "a channels-last convolution needs a 4-D input, got shape {}",
                shape_str(shape)
            ),
        )),
    }
}

/// A convolution whose input and output are channels last: it reads
/// `[n, h, w, c]` and writes `[n, out_h, out_w, out_channels]`, the
/// NCHW convolution's output permuted by `(0, 2, 3, 1)`. Conversion makes
/// one where a network permutes channels-last values into NCHW for a
/// convolution and back after it (ConvNeXt's blocks and downsampling),
/// and drops those permutes. It runs the convolution's channels-last kernel
/// where one applies (the depthwise and the disjoint-window patch kernels,
/// f32), else the NCHW kernel between two transposes.
#[derive(Debug)]
pub struct ChannelsLast {
    conv: Conv2d,
}

impl ChannelsLast {
    /// The NCHW shape of the input `inputs` holds, channels last.
    fn nchw(inputs: &[&[usize]]) -> Result<[usize; 4]> {
        nhwc_dims(single(OP, inputs)?, true)
    }
}

impl Operation for ChannelsLast {
    fn kind(&self) -> OpKind {
        OP
    }

    fn per_image(&self, _inputs: &[&[usize]]) -> bool {
        true
    }

    fn fused_activation(&self) -> Option<OpKind> {
        self.conv.fused_activation()
    }

    fn own_layout(&self) -> Option<&'static str> {
        Some("NHWC")
    }

    fn algorithm_for(&self, input_shape: &[usize]) -> Result<String> {
        self.conv.algorithm_for(&nhwc_dims(input_shape, true)?)
    }

    fn problem(&self, inputs: &[&[usize]]) -> Result<Problem> {
        self.conv.problem(&[&Self::nchw(inputs)?])
    }

    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let out = self.conv.output_shape(&[&Self::nchw(inputs)?])?;
        Ok(nhwc_dims(&out, false)?.to_vec())
    }

    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let x = single(OP, inputs)?;
        let shape = nhwc_dims(x.shape(), true)?;
        if self.conv.channels_last(&[&shape]) {
            return self.conv.forward_channels_last(inputs, output);
        }
        // No channels-last kernel for these parameters (f64, a fused
        // activation, overlapping windows but depthwise, no AVX2): the NCHW
        // kernel between transposes.
        let out_shape = self.conv.output_shape(&[&shape])?;
        let mut xn = Tensor::zeros(x.dtype(), &shape)?;
        let mut yn = Tensor::zeros(x.dtype(), &out_shape)?;
        with_dtype!(x.dtype(), T, {
            let done = ai3_kernels::cpu::shape::permute::<T>(
                x.shape(),
                &[0, 3, 1, 2],
                elements(x)?,
                elements_mut(&mut xn)?,
            );
            kernel_result(OP, done, || self.conv.context(&shape))?;
            self.conv.forward(&[&xn], &mut yn)?;
            let done = ai3_kernels::cpu::shape::permute::<T>(
                &out_shape,
                &[0, 2, 3, 1],
                elements(&yn)?,
                elements_mut(output)?,
            );
            kernel_result(OP, done, || self.conv.context(&shape))?
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> String {
        "input shape [1, 3, 8, 8]".into()
    }

    #[test]
    fn prepared_weights_that_fail_are_an_error_and_never_cached() {
        let cell = OnceLock::new();
        // The fill fails: an error, nothing kept, no zero weights handed out.
        let failed = prepared::<f32>(&cell, 4, ctx, |_| {
            Err(KernelError::Precondition { what: "test" })
        });
        assert!(matches!(failed, Err(Error::Internal { .. })), "{failed:?}");
        assert!(cell.get().is_none());
        // The memory is refused (2^62 bytes): an out-of-memory error naming conv2d.
        let refused = prepared::<f32>(&cell, 1 << 60, ctx, |_| Ok(()));
        match refused {
            Err(e @ Error::OutOfMemory { .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.starts_with("conv2d: ") && msg.contains("bytes"),
                    "{msg}"
                );
                assert!(msg.contains("input shape [1, 3, 8, 8]"), "{msg}");
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        assert!(cell.get().is_none());
        // The next call succeeds and is kept; later calls reuse it.
        let ok = prepared::<f32>(&cell, 3, ctx, |d| {
            d.fill(2.0);
            Ok(())
        })
        .unwrap();
        assert_eq!(ok, &[2.0; 3]);
        let again = prepared::<f32>(&cell, 3, ctx, |_| panic!("prepared twice")).unwrap();
        assert_eq!(again, &[2.0; 3]);
    }

    /// A residual the memory planner put in the output's place (its tensor
    /// pointing at the output's memory, see `output_over_input`) is added as
    /// a separate one is: by the 1x1 kernel in place, and by the others
    /// (here a 3x3 layer, whose algorithm may have changed since the plan)
    /// from a copy.
    #[test]
    fn a_residual_in_the_output_s_place_is_added_as_a_separate_one() {
        if !blocked::available() {
            return;
        }
        let (n, c, h, w) = (2, 16, 5, 6);
        let plane = h * w;
        let vals = |seed: usize, len: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((i * 7 + seed) % 11) as f32 / 11.0 - 0.5)
                .collect()
        };
        let to_blocked = |v: &[f32]| {
            let mut b = vec![0f32; blocked::blocked_len(n, c, plane).unwrap()];
            blocked::to_blocked(n, c, plane, v, &mut b).unwrap();
            b
        };
        let shape = [n, c, h, w];
        let phys = crate::layout::blocked_shape(&shape);
        let x = Tensor::from_slice(&to_blocked(&vals(1, n * c * plane)), &phys).unwrap();
        let r = to_blocked(&vals(2, n * c * plane));
        for k in [1usize, 3] {
            let pad = k / 2;
            let conv = Conv2d::new(
                Tensor::from_slice(&vals(3, c * c * k * k), &[c, c, k, k]).unwrap(),
                Some(Tensor::from_slice(&vals(4, c), &[c]).unwrap()),
                (1, 1),
                Padding2d {
                    top: pad,
                    bottom: pad,
                    left: pad,
                    right: pad,
                },
                (1, 1),
                1,
                PadMode::Zeros,
                Request::Named(if k == 1 {
                    Algorithm::Gemm
                } else {
                    Algorithm::Direct
                }),
            )
            .unwrap()
            .with_residual(true);
            let shapes: [&[usize]; 2] = [&shape, &shape];
            assert_eq!(conv.output_over_input(&shapes, true), (k == 1).then_some(1));
            let separate = Tensor::from_slice(&r, &phys).unwrap();
            let mut want = Tensor::from_slice(&vec![f32::NAN; r.len()], &phys).unwrap();
            conv.forward_blocked(&[&x, &separate], &shapes, &mut want)
                .unwrap();
            let mut out = Tensor::from_slice(&r, &phys).unwrap();
            // SAFETY: `out`'s memory, alive for the call, which reads the
            // residual through `out` alone.
            let over = unsafe {
                Tensor::from_raw_parts(
                    out.data_ptr_mut(),
                    crate::DType::F32,
                    phys.clone(),
                    crate::tensor::contiguous_strides(&phys),
                    crate::Device::Cpu,
                    Box::new(()),
                )
            }
            .unwrap();
            conv.forward_blocked(&[&x, &over], &shapes, &mut out)
                .unwrap();
            let (got, want) = (
                out.as_slice::<f32>().unwrap(),
                want.as_slice::<f32>().unwrap(),
            );
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                    "{k}x{k} at {i}: {g} vs {w}"
                );
            }
        }
    }

    fn layer(padding: usize, dilation: usize) -> Result<Conv2d> {
        Conv2d::new(
            Tensor::from_slice(&[1.0f32; 4 * 3 * 3 * 3], &[4, 3, 3, 3])?,
            None,
            (1, 1),
            Padding2d::symmetric(padding, padding),
            (dilation, dilation),
            1,
            PadMode::Zeros,
            Request::Default,
        )
    }

    #[test]
    fn channels_last_is_the_nchw_convolution_permuted() {
        let cl = ChannelsLast {
            conv: layer(1, 1).unwrap(),
        };
        // Not 4-D: a shape error naming the shape.
        let err = cl.output_shape(&[&[1, 8, 3]]).unwrap_err();
        assert!(matches!(err, Error::Shape { .. }), "{err}");
        assert!(err.to_string().contains("[1, 8, 3]"), "{err}");
        // [n, h, w, c] in, [n, h, w, out_channels] out.
        assert_eq!(cl.output_shape(&[&[2, 5, 4, 3]]).unwrap(), vec![2, 5, 4, 4]);
        // A dense 3x3 layer has no channels-last kernel: the NCHW one between
        // transposes, checked against the NCHW layer on the permuted input.
        let nhwc: Vec<f32> = (0..2 * 5 * 4 * 3)
            .map(|i| ((i * 7) % 11) as f32 - 5.0)
            .collect();
        let x = Tensor::from_slice(&nhwc, &[2, 5, 4, 3]).unwrap();
        let mut got = Tensor::zeros(crate::DType::F32, &[2, 5, 4, 4]).unwrap();
        cl.forward(&[&x], &mut got).unwrap();
        let mut nchw = vec![0.0f32; nhwc.len()];
        ai3_kernels::cpu::shape::permute(&[2, 5, 4, 3], &[0, 3, 1, 2], &nhwc, &mut nchw).unwrap();
        let xn = Tensor::from_slice(&nchw, &[2, 3, 5, 4]).unwrap();
        let mut want = Tensor::zeros(crate::DType::F32, &[2, 4, 5, 4]).unwrap();
        cl.conv.forward(&[&xn], &mut want).unwrap();
        let want = want.as_slice::<f32>().unwrap();
        let got = got.as_slice::<f32>().unwrap();
        for n in 0..2 {
            for c in 0..4 {
                for hw in 0..20 {
                    assert_eq!(got[(n * 20 + hw) * 4 + c], want[(n * 4 + c) * 20 + hw]);
                }
            }
        }
    }

    #[test]
    fn sizes_that_overflow_are_shape_errors() {
        // The padded height overflows usize.
        let conv = layer(usize::MAX / 2, 1).unwrap();
        let err = conv.output_shape(&[&[1, 3, 8, 8]]).unwrap_err();
        assert!(matches!(err, Error::Shape { .. }), "{err}");
        assert!(err.to_string().contains("[1, 3, 8, 8]"), "{err}");
        // The padded plane fits, the output does not: (2^33)^2 * 4 channels.
        let conv = layer(1 << 32, 1).unwrap();
        let err = conv.output_shape(&[&[1, 3, 8, 8]]).unwrap_err();
        assert!(matches!(err, Error::Shape { .. }), "{err}");
        // A dilated kernel wider than a 64-bit size is refused when built.
        let err = layer(0, usize::MAX / 2 + 1).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
        // A huge dilation that fits is PyTorch's "kernel larger than input".
        let conv = layer(0, 1 << 40).unwrap();
        let err = conv.output_shape(&[&[1, 3, 8, 8]]).unwrap_err();
        assert!(
            err.to_string().contains("larger than the padded input"),
            "{err}"
        );
    }
}
