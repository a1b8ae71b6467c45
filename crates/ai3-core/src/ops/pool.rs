//! 2-D pooling: maximum, average and adaptive average.

use super::attrs::{optional, required, Args, Arity, OpSpec, ParamKind as K};
use ai3_kernels::cpu::{blocked, pool};
use ai3_kernels::custom::{self, CustomError};
use ai3_kernels::params::{AdaptivePool2dParams, AvgPoolOptions, Pool2dParams};
use ai3_kernels::KernelResult;

use super::{
    any_plane_dims, check_positive, custom_result, image_dims, image_shape, kernel_result,
    simple_algorithm, single, with_dtype, Operation,
};
use crate::error::{Error, Result};
use crate::layout::Blocked;
use crate::registry::{Algorithm, OpKind, Request};
use crate::tensor::{shape_str, Tensor};

/// Window geometry shared by max and average pooling.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Window `(h, w)`.
    pub kernel: (usize, usize),
    /// Stride `(h, w)`.
    pub stride: (usize, usize),
    /// Padding `(h, w)` on both sides.
    pub padding: (usize, usize),
    /// Dilation `(h, w)`.
    pub dilation: (usize, usize),
    /// PyTorch's `ceil_mode`.
    pub ceil_mode: bool,
}

impl Window {
    /// The dilated window `(h, w)`, or an error when it overflows (a huge
    /// dilation or kernel size).
    fn spans(&self, op: OpKind) -> Result<(usize, usize)> {
        let span = |k: usize, d: usize| k.checked_sub(1)?.checked_mul(d)?.checked_add(1);
        match (
            span(self.kernel.0, self.dilation.0),
            span(self.kernel.1, self.dilation.1),
        ) {
            (Some(h), Some(w)) => Ok((h, w)),
            _ => Err(Error::invalid(
                op.name(),
                format!(
                    "kernel_size {:?} with dilation {:?} spans more than a 64-bit size can count",
                    self.kernel, self.dilation
                ),
            )),
        }
    }

    fn check(&self, op: OpKind) -> Result<()> {
        check_positive(op, "kernel_size", &[self.kernel.0, self.kernel.1])?;
        check_positive(op, "stride", &[self.stride.0, self.stride.1])?;
        check_positive(op, "dilation", &[self.dilation.0, self.dilation.1])?;
        self.spans(op)?;
        // PyTorch's rule: padding at most half of the kernel size, dilation aside.
        if self.padding.0 > self.kernel.0 / 2 || self.padding.1 > self.kernel.1 / 2 {
            return Err(Error::invalid(
                op.name(),
                format!(
                    "padding {:?} must be at most half of kernel_size {:?}",
                    self.padding, self.kernel
                ),
            ));
        }
        Ok(())
    }

    fn params(&self, op: OpKind, shape: &[usize]) -> Result<(Pool2dParams, bool)> {
        let (n, c, h, w, batched) = image_dims(op, shape)?;
        let p = Pool2dParams {
            batch: n,
            channels: c,
            in_h: h,
            in_w: w,
            kernel: self.kernel,
            stride: self.stride,
            padding: self.padding,
            dilation: self.dilation,
            ceil_mode: self.ceil_mode,
        };
        let (span_h, span_w) = self.spans(op)?;
        // Padding is at most half the span (checked at construction), so
        // `2 * padding` fits; the sum with the input may not.
        let (Some(ph), Some(pw)) = (
            h.checked_add(2 * self.padding.0),
            w.checked_add(2 * self.padding.1),
        ) else {
            return Err(Error::shape(
                op.name(),
                format!(
                    "the padded input overflows a 64-bit size; input shape {}, padding {:?}",
                    shape_str(shape),
                    self.padding
                ),
            ));
        };
        // With ceil_mode, PyTorch still takes one (clipped) window when the
        // window sticks out of the padded input: only no window at all is an error.
        if (ph < span_h || pw < span_w) && (p.out_h() == 0 || p.out_w() == 0) {
            return Err(Error::shape(
                op.name(),
                format!(
                    "window of size ({span_h}, {span_w}) (kernel {:?}, dilation {:?}) is larger than the padded input; input shape {}, padding {:?}",
                    self.kernel,
                    self.dilation,
                    shape_str(shape),
                    self.padding
                ),
            ));
        }
        Ok((p, batched))
    }

    /// How a pooling over this window runs on blocked values: with its
    /// own kernel (saving nothing, but keeping a blocked run going) for a
    /// batched input with a non-empty output, by a built-in algorithm.
    fn blocked(&self, op: OpKind, algorithm: Algorithm, inputs: &[&[usize]]) -> Blocked {
        match inputs {
            [shape @ [_, _, _, _]] if algorithm != Algorithm::Custom => {
                match self.params(op, shape) {
                    Ok((p, _)) if p.out_h() * p.out_w() > 0 => Blocked::Kernel { gain: 0 },
                    _ => Blocked::No,
                }
            }
            _ => Blocked::No,
        }
    }

    /// Runs `kernel` (a blocked pooling over this window) on the blocked
    /// input and output of a node; `shapes` holds the logical input shape.
    fn forward_blocked(
        &self,
        op: OpKind,
        inputs: &[&Tensor],
        shapes: &[&[usize]],
        output: &mut Tensor,
        kernel: impl FnOnce(&Pool2dParams, &[f32], &mut [f32]) -> KernelResult<()>,
    ) -> Result<()> {
        let (x, shape) = (single(op, inputs)?, single(op, shapes)?);
        let (p, _) = self.params(op, shape)?;
        kernel_result(
            op,
            kernel(&p, x.as_slice()?, output.as_mut_slice()?),
            || format!("input shape {}, channel-blocked layout", shape_str(shape)),
        )
    }

    fn output_shape(&self, op: OpKind, shape: &[usize]) -> Result<Vec<usize>> {
        let (p, batched) = self.params(op, shape)?;
        Ok(image_shape(
            batched,
            p.batch,
            p.channels,
            p.out_h(),
            p.out_w(),
        ))
    }
}

/// Maximum over each window; padding never wins.
#[derive(Debug)]
pub struct MaxPool2d {
    window: Window,
    algorithm: Algorithm,
}

impl MaxPool2d {
    /// PyTorch's `nn.MaxPool2d`.
    pub fn new(window: Window) -> Result<Self> {
        window.check(OpKind::MaxPool2d)?;
        Ok(MaxPool2d {
            window,
            algorithm: Algorithm::Direct,
        })
    }

    /// Runs the algorithm `request` resolves to.
    pub fn with_request(mut self, request: Request) -> Result<Self> {
        self.algorithm = simple_algorithm(OpKind::MaxPool2d, request)?;
        Ok(self)
    }
}

impl Operation for MaxPool2d {
    fn per_image(&self, _inputs: &[&[usize]]) -> bool {
        true
    }
    fn kind(&self) -> OpKind {
        OpKind::MaxPool2d
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Ok(self.algorithm.name().into())
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        self.window
            .output_shape(OpKind::MaxPool2d, single(OpKind::MaxPool2d, inputs)?)
    }
    fn blocked(&self, inputs: &[&[usize]]) -> Blocked {
        self.window
            .blocked(OpKind::MaxPool2d, self.algorithm, inputs)
    }
    fn forward_blocked(
        &self,
        inputs: &[&Tensor],
        shapes: &[&[usize]],
        output: &mut Tensor,
    ) -> Result<()> {
        self.window
            .forward_blocked(OpKind::MaxPool2d, inputs, shapes, output, |p, x, out| {
                pool::maxpool2d_blocked::<f32>(p, x, out)
            })
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let x = single(OpKind::MaxPool2d, inputs)?;
        let (p, _) = self.window.params(OpKind::MaxPool2d, x.shape())?;
        with_dtype!(x.dtype(), T, {
            let (src, dst) = (x.as_slice::<T>()?, output.as_mut_slice::<T>()?);
            match self.algorithm {
                Algorithm::Custom => custom_result(
                    OpKind::MaxPool2d,
                    x.shape(),
                    custom::maxpool2d(&p, src, dst),
                )?,
                _ => kernel_result(
                    OpKind::MaxPool2d,
                    pool::maxpool2d::<T>(&p, src, dst),
                    || format!("input shape {}", shape_str(x.shape())),
                )?,
            }
        });
        Ok(())
    }
}

/// Mean over each window.
#[derive(Debug)]
pub struct AvgPool2d {
    window: Window,
    options: AvgPoolOptions,
    algorithm: Algorithm,
}

impl AvgPool2d {
    /// PyTorch's `nn.AvgPool2d` (the window's dilation must be 1).
    pub fn new(window: Window, options: AvgPoolOptions) -> Result<Self> {
        let op = OpKind::AvgPool2d;
        window.check(op)?;
        if window.dilation != (1, 1) {
            return Err(Error::invalid(op.name(), "average pooling has no dilation"));
        }
        if options.divisor_override == Some(0) {
            return Err(Error::invalid(
                op.name(),
                "divisor_override must be non-zero",
            ));
        }
        Ok(AvgPool2d {
            window,
            options,
            algorithm: Algorithm::Direct,
        })
    }

    /// Runs the algorithm `request` resolves to.
    pub fn with_request(mut self, request: Request) -> Result<Self> {
        self.algorithm = simple_algorithm(OpKind::AvgPool2d, request)?;
        Ok(self)
    }
}

impl Operation for AvgPool2d {
    fn per_image(&self, _inputs: &[&[usize]]) -> bool {
        true
    }
    fn kind(&self) -> OpKind {
        OpKind::AvgPool2d
    }
    fn algorithm_for(&self, _: &[usize]) -> Result<String> {
        Ok(self.algorithm.name().into())
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        self.window
            .output_shape(OpKind::AvgPool2d, single(OpKind::AvgPool2d, inputs)?)
    }
    fn blocked(&self, inputs: &[&[usize]]) -> Blocked {
        self.window
            .blocked(OpKind::AvgPool2d, self.algorithm, inputs)
    }
    fn forward_blocked(
        &self,
        inputs: &[&Tensor],
        shapes: &[&[usize]],
        output: &mut Tensor,
    ) -> Result<()> {
        self.window
            .forward_blocked(OpKind::AvgPool2d, inputs, shapes, output, |p, x, out| {
                pool::avgpool2d_blocked::<f32>(p, &self.options, x, out)
            })
    }
    fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
        let x = single(OpKind::AvgPool2d, inputs)?;
        let (p, _) = self.window.params(OpKind::AvgPool2d, x.shape())?;
        with_dtype!(x.dtype(), T, {
            let (src, dst) = (x.as_slice::<T>()?, output.as_mut_slice::<T>()?);
            match self.algorithm {
                Algorithm::Custom => custom_result(
                    OpKind::AvgPool2d,
                    x.shape(),
                    custom::avgpool2d(&p, &self.options, src, dst),
                )?,
                _ => kernel_result(
                    OpKind::AvgPool2d,
                    pool::avgpool2d::<T>(&p, &self.options, src, dst),
                    || format!("input shape {}", shape_str(x.shape())),
                )?,
            }
        });
        Ok(())
    }
}

type OutputSize = (Option<usize>, Option<usize>);

/// Whether an adaptive pooling runs on blocked values: an average to 1x1
/// (global average pooling) of a batched, non-empty plane, by a built-in
/// algorithm.
fn global_average_blocked(
    op: OpKind,
    output_size: OutputSize,
    algorithm: Algorithm,
    inputs: &[&[usize]],
) -> Blocked {
    let global = op == OpKind::AdaptiveAvgPool2d && output_size == (Some(1), Some(1));
    match inputs {
        [[_, _, h, w]] if global && algorithm != Algorithm::Custom && h * w > 0 => {
            Blocked::Kernel { gain: 0 }
        }
        _ => Blocked::No,
    }
}

fn adaptive_params(
    op: OpKind,
    output_size: OutputSize,
    shape: &[usize],
) -> Result<(AdaptivePool2dParams, bool)> {
    // PyTorch computes an average to 1x1 as a mean, NaN over an empty plane;
    // it refuses every other empty plane (and every one for the maximum).
    let (n, c, h, w, batched) = match (op, output_size) {
        (OpKind::AdaptiveAvgPool2d, (Some(1), Some(1))) => any_plane_dims(op, shape)?,
        _ => image_dims(op, shape)?,
    };
    Ok((
        AdaptivePool2dParams {
            batch: n,
            channels: c,
            in_h: h,
            in_w: w,
            out_h: output_size.0.unwrap_or(h),
            out_w: output_size.1.unwrap_or(w),
        },
        batched,
    ))
}

/// Defines an adaptive pooling operation over `$kernel`, with `$custom` the
/// user's C++ version where the registry has one.
macro_rules! adaptive_pool {
    ($(#[$doc:meta])* $name:ident, $op:expr, $kernel:path, $custom:path) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name {
            output_size: OutputSize,
            algorithm: Algorithm,
        }

        impl $name {
            /// The layer; `None` in `output_size` keeps that input dimension, and 0
            /// gives an empty output.
            pub fn new(output_size: OutputSize) -> Result<Self> {
                Ok($name { output_size, algorithm: Algorithm::Direct })
            }

            /// Runs the algorithm `request` resolves to.
            pub fn with_request(mut self, request: Request) -> Result<Self> {
                self.algorithm = simple_algorithm($op, request)?;
                Ok(self)
            }
        }

        impl Operation for $name {
            fn per_image(&self, _inputs: &[&[usize]]) -> bool {
                true
            }
            fn kind(&self) -> OpKind {
                $op
            }
            fn algorithm_for(&self, _: &[usize]) -> Result<String> {
                Ok(self.algorithm.name().into())
            }
            fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
                let (p, batched) = adaptive_params($op, self.output_size, single($op, inputs)?)?;
                Ok(image_shape(batched, p.batch, p.channels, p.out_h, p.out_w))
            }
            fn blocked(&self, inputs: &[&[usize]]) -> Blocked {
                global_average_blocked($op, self.output_size, self.algorithm, inputs)
            }
            fn forward_blocked(
                &self,
                inputs: &[&Tensor],
                shapes: &[&[usize]],
                output: &mut Tensor,
            ) -> Result<()> {
                let (x, shape) = (single($op, inputs)?, single($op, shapes)?);
                let (p, _) = adaptive_params($op, self.output_size, shape)?;
                kernel_result(
                    $op,
                    blocked::global_avg_pool::<f32>(
                        p.batch,
                        p.channels,
                        p.in_h * p.in_w,
                        x.as_slice()?,
                        output.as_mut_slice()?,
                    ),
                    || format!("input shape {}, channel-blocked layout", shape_str(shape)),
                )
            }
            fn forward(&self, inputs: &[&Tensor], output: &mut Tensor) -> Result<()> {
                let x = single($op, inputs)?;
                let (p, _) = adaptive_params($op, self.output_size, x.shape())?;
                with_dtype!(x.dtype(), T, {
                    let (src, dst) = (x.as_slice::<T>()?, output.as_mut_slice::<T>()?);
                    match self.algorithm {
                        _ if p.in_h == 0 || p.in_w == 0 => dst.fill(T::NAN),
                        Algorithm::Custom => custom_result($op, x.shape(), $custom(&p, src, dst))?,
                        _ => kernel_result($op, $kernel(&p, src, dst), || {
                            format!("input shape {}", shape_str(x.shape()))
                        })?,
                    }
                });
                Ok(())
            }
        }
    };
}

adaptive_pool!(
    /// Average pooling to a fixed output size (PyTorch's `nn.AdaptiveAvgPool2d`).
    AdaptiveAvgPool2d,
    OpKind::AdaptiveAvgPool2d,
    pool::adaptive_avgpool2d,
    custom::adaptiveavgpool2d
);

adaptive_pool!(
    /// Max pooling to a fixed output size (PyTorch's `nn.AdaptiveMaxPool2d`,
    /// values only); NaN propagates.
    AdaptiveMaxPool2d,
    OpKind::AdaptiveMaxPool2d,
    pool::adaptive_maxpool2d,
    no_custom
);

/// For operations without a `'custom'` registry row, which never resolve to it.
fn no_custom<T>(
    _: &AdaptivePool2dParams,
    _: &[T],
    _: &mut [T],
) -> std::result::Result<(), CustomError> {
    Err(CustomError::Failed(
        "this operation has no custom C++ implementation".into(),
    ))
}

fn window(a: &Args, dilation: bool) -> Result<Window> {
    let kernel = a.pair_or("kernel_size", (0, 0))?;
    Ok(Window {
        kernel,
        // PyTorch's default stride is the window.
        stride: a.pair_or("stride", kernel)?,
        padding: a.pair_or("padding", (0, 0))?,
        dilation: if dilation {
            a.pair_or("dilation", (1, 1))?
        } else {
            (1, 1)
        },
        ceil_mode: a.bool_or("ceil_mode", false)?,
    })
}

/// `maxpool2d`: `kernel_size`, `stride` (default: the window), `padding`,
/// `dilation`, `ceil_mode`, as in PyTorch.
pub const MAXPOOL2D: OpSpec = OpSpec {
    inputs: Arity::exactly(1),
    params: &[
        required("kernel_size", K::Ints),
        optional("stride", K::Ints),
        optional("padding", K::Ints),
        optional("dilation", K::Ints),
        optional("ceil_mode", K::Bool),
    ],
    build: |a| {
        Ok(Box::new(
            MaxPool2d::new(window(a, true)?)?.with_request(a.request)?,
        ))
    },
};

/// `avgpool2d`: `kernel_size`, `stride` (default: the window), `padding`,
/// `ceil_mode`, `count_include_pad` (default true), `divisor_override`, as in PyTorch.
pub const AVGPOOL2D: OpSpec = OpSpec {
    inputs: Arity::exactly(1),
    params: &[
        required("kernel_size", K::Ints),
        optional("stride", K::Ints),
        optional("padding", K::Ints),
        optional("ceil_mode", K::Bool),
        optional("count_include_pad", K::Bool),
        optional("divisor_override", K::Int),
    ],
    build: |a| {
        let options = AvgPoolOptions {
            count_include_pad: a.bool_or("count_include_pad", true)?,
            divisor_override: a.opt_usize("divisor_override")?,
        };
        let pool = AvgPool2d::new(window(a, false)?, options)?;
        Ok(Box::new(pool.with_request(a.request)?))
    },
};

/// `adaptiveavgpool2d`: `output_size`, two sizes (`None` keeps that input dimension).
pub const ADAPTIVEAVGPOOL2D: OpSpec = OpSpec {
    inputs: Arity::exactly(1),
    params: &[required("output_size", K::OptInts)],
    build: |a| {
        let [h, w] = a.opt_usizes_n("output_size")?;
        Ok(Box::new(
            AdaptiveAvgPool2d::new((h, w))?.with_request(a.request)?,
        ))
    },
};

/// `adaptivemaxpool2d`: `output_size`, two sizes (`None` keeps that input dimension).
pub const ADAPTIVEMAXPOOL2D: OpSpec = OpSpec {
    inputs: Arity::exactly(1),
    params: &[required("output_size", K::OptInts)],
    build: |a| {
        let [h, w] = a.opt_usizes_n("output_size")?;
        Ok(Box::new(
            AdaptiveMaxPool2d::new((h, w))?.with_request(a.request)?,
        ))
    },
};
