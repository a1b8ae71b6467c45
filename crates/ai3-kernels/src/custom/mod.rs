//! The user's C++ algorithms (`'custom'`), reached through a `cxx` bridge.
//!
//! `build.rs` compiles one source per operation from `cpp_custom/` (or from
//! the directory named by `AI3_CUSTOM_DIR` at build time, falling back to
//! `cpp_custom/` for operations it does not provide) together with the glue
//! in `bridge.cc`. Out of the box every function throws `ai3::NotImplemented`;
//! [`implemented`] finds out, once per operation, by calling it on an empty
//! batch, so selecting `'custom'` can be refused up front with the file to edit.
//!
//! The wrappers here take slices and parameter structs like every other
//! kernel, check the buffers' lengths against the shapes they hand C++ (in
//! release builds too: C++ writes through the pointers), and turn C++
//! exceptions into [`CustomError`]; none ever unwinds into Rust.

use std::sync::OnceLock;

use crate::alloc::{check_len, checked_product, try_zeroed_vec, KernelError};
use crate::cpu::pad::{pad2d, PadMode};
use crate::params::{
    AdaptivePool2dParams, AvgPoolOptions, Conv2dParams, LinearParams, Padding2d, Pool2dParams,
};
use crate::Float;

#[cxx::bridge(namespace = "ai3::bridge")]
mod ffi {
    /// A contiguous tensor handed to C++: address, dtype (0 = f32, 1 = f64), shape.
    struct View {
        data: usize,
        dtype: u8,
        shape: Vec<i64>,
    }

    unsafe extern "C++" {
        include!("ai3-kernels/src/custom/bridge.h");

        #[allow(clippy::too_many_arguments)]
        fn conv2d(
            input: &View,
            weight: &View,
            bias: &View,
            has_bias: bool,
            padding_h: i64,
            padding_w: i64,
            stride_h: i64,
            stride_w: i64,
            dilation_h: i64,
            dilation_w: i64,
            groups: i64,
            output: &View,
        ) -> Result<bool>;
        fn linear(
            input: &View,
            weight: &View,
            bias: &View,
            has_bias: bool,
            output: &View,
        ) -> Result<bool>;
        fn relu(input: &View, output: &View) -> Result<bool>;
        #[allow(clippy::too_many_arguments)]
        fn maxpool2d(
            input: &View,
            kernel_h: i64,
            kernel_w: i64,
            stride_h: i64,
            stride_w: i64,
            padding_h: i64,
            padding_w: i64,
            dilation_h: i64,
            dilation_w: i64,
            ceil_mode: bool,
            output: &View,
        ) -> Result<bool>;
        #[allow(clippy::too_many_arguments)]
        fn avgpool2d(
            input: &View,
            kernel_h: i64,
            kernel_w: i64,
            stride_h: i64,
            stride_w: i64,
            padding_h: i64,
            padding_w: i64,
            ceil_mode: bool,
            count_include_pad: bool,
            divisor_override: i64,
            output: &View,
        ) -> Result<bool>;
        fn adaptiveavgpool2d(input: &View, output: &View) -> Result<bool>;
        fn flatten(input: &View, start_dim: i64, end_dim: i64, output: &View) -> Result<bool>;
        fn default_mask() -> u32;
    }
}

/// The operations a user can write in C++, in the order of `bridge.cc`'s `default_mask`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CustomOp {
    /// `conv2d.cpp`
    Conv2d,
    /// `linear.cpp`
    Linear,
    /// `relu.cpp`
    Relu,
    /// `maxpool2d.cpp`
    MaxPool2d,
    /// `avgpool2d.cpp`
    AvgPool2d,
    /// `adaptiveavgpool2d.cpp`
    AdaptiveAvgPool2d,
    /// `flatten.cpp`
    Flatten,
}

impl CustomOp {
    /// Every operation, in bridge order.
    pub const ALL: [CustomOp; 7] = [
        CustomOp::Conv2d,
        CustomOp::Linear,
        CustomOp::Relu,
        CustomOp::MaxPool2d,
        CustomOp::AvgPool2d,
        CustomOp::AdaptiveAvgPool2d,
        CustomOp::Flatten,
    ];

    /// The operation's name, which is also its file's stem (`conv2d.cpp`).
    pub fn name(self) -> &'static str {
        match self {
            CustomOp::Conv2d => "conv2d",
            CustomOp::Linear => "linear",
            CustomOp::Relu => "relu",
            CustomOp::MaxPool2d => "maxpool2d",
            CustomOp::AvgPool2d => "avgpool2d",
            CustomOp::AdaptiveAvgPool2d => "adaptiveavgpool2d",
            CustomOp::Flatten => "flatten",
        }
    }

    fn index(self) -> usize {
        CustomOp::ALL.iter().position(|&o| o == self).unwrap_or(0)
    }
}

/// Why a custom function did not produce its output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CustomError {
    /// The function still throws `ai3::NotImplemented`.
    NotImplemented,
    /// It threw; the exception's message.
    Failed(String),
    /// It was not called: a buffer had the wrong length, or a copy made for
    /// it (uneven padding) overflowed or could not be allocated.
    Kernel(KernelError),
}

impl From<KernelError> for CustomError {
    fn from(e: KernelError) -> Self {
        CustomError::Kernel(e)
    }
}

/// The directory `build.rs` compiled the user's sources from.
pub const SOURCE_DIR: &str = env!("AI3_CUSTOM_SOURCE_DIR");

/// Whether ai3 was built from the stock `cpp_custom/` (no `AI3_CUSTOM_DIR`).
pub fn built_from_stock() -> bool {
    env!("AI3_CUSTOM_STOCK") == "1"
}

/// Whether `'default'` should pick the user's `op` (its header's `DEFAULT_<OP>`).
pub fn is_default(op: CustomOp) -> bool {
    static MASK: OnceLock<u32> = OnceLock::new();
    let mask = *MASK.get_or_init(ffi::default_mask);
    mask & (1 << op.index()) != 0
}

/// `Ok` when the user has implemented `op`, else the reason (naming the file
/// to edit). Found by calling the function once on an empty batch, so a real
/// implementation does no work; the answer is cached.
pub fn implemented(op: CustomOp) -> Result<(), String> {
    static PROBES: [OnceLock<bool>; 7] = [const { OnceLock::new() }; 7];
    let ran = *PROBES[op.index()].get_or_init(|| probe(op) != Err(CustomError::NotImplemented));
    if ran {
        Ok(())
    } else {
        // The stock directory's absolute path is the build machine's, meaningless to a
        // user of a prebuilt wheel; a directory the user chose is worth naming.
        let from = if built_from_stock() {
            String::new()
        } else {
            format!(" (this build compiled AI3_CUSTOM_DIR={SOURCE_DIR})")
        };
        Err(format!(
            "custom {op} is not implemented{from}: write ai3::custom::{op} in {op}.cpp and build \
             ai3 from source with AI3_CUSTOM_DIR pointing at its directory (cpp_custom/README.md)",
            op = op.name()
        ))
    }
}

/// Calls `op` on an empty batch of f32 (valid shapes, no elements to compute).
fn probe(op: CustomOp) -> Result<(), CustomError> {
    let none: [f32; 0] = [];
    let mut out: [f32; 0] = [];
    let one = [0.0f32; 1];
    match op {
        CustomOp::Conv2d => {
            let p = Conv2dParams {
                batch: 0,
                in_channels: 1,
                in_h: 1,
                in_w: 1,
                out_channels: 1,
                kernel_h: 1,
                kernel_w: 1,
                stride: (1, 1),
                padding: Padding2d::default(),
                dilation: (1, 1),
                groups: 1,
            };
            conv2d(&p, &none, &one, None, &mut out)
        }
        CustomOp::Linear => {
            let p = LinearParams {
                rows: 0,
                in_features: 1,
                out_features: 1,
            };
            linear(&p, &none, &one, None, &mut out)
        }
        CustomOp::Relu => relu(&[0], &none, &mut out),
        CustomOp::MaxPool2d | CustomOp::AvgPool2d => {
            let p = Pool2dParams {
                batch: 0,
                channels: 1,
                in_h: 1,
                in_w: 1,
                kernel: (1, 1),
                stride: (1, 1),
                padding: (0, 0),
                dilation: (1, 1),
                ceil_mode: false,
            };
            if op == CustomOp::MaxPool2d {
                maxpool2d(&p, &none, &mut out)
            } else {
                let opts = AvgPoolOptions {
                    count_include_pad: true,
                    divisor_override: None,
                };
                avgpool2d(&p, &opts, &none, &mut out)
            }
        }
        CustomOp::AdaptiveAvgPool2d => {
            let p = AdaptivePool2dParams {
                batch: 0,
                channels: 1,
                in_h: 1,
                in_w: 1,
                out_h: 1,
                out_w: 1,
            };
            adaptiveavgpool2d(&p, &none, &mut out)
        }
        CustomOp::Flatten => flatten(&[0, 1], 1, 1, &none, &[0, 1], &mut out),
    }
}

fn dtype_code<T: Float>() -> u8 {
    if std::mem::size_of::<T>() == 4 {
        0
    } else {
        1
    }
}

/// A view of `data` (the buffer `what`) with `shape`, or an error when the
/// shape does not describe exactly `data`'s elements. The address of an
/// empty slice is still non-null and aligned, so C++ never sees a null pointer.
fn view<T: Float>(
    data: &[T],
    shape: &[usize],
    what: &'static str,
) -> Result<ffi::View, CustomError> {
    check_len(what, data.len(), checked_product(what, shape)?)?;
    Ok(ffi::View {
        data: data.as_ptr() as usize,
        dtype: dtype_code::<T>(),
        shape: shape.iter().map(|&d| dim(d)).collect(),
    })
}

/// A view C++ writes through. Taking `&mut` keeps Rust from reading the
/// buffer while C++ writes it.
fn view_mut<T: Float>(
    data: &mut [T],
    shape: &[usize],
    what: &'static str,
) -> Result<ffi::View, CustomError> {
    view(data, shape, what)
}

fn finish(result: Result<bool, cxx::Exception>) -> Result<(), CustomError> {
    match result {
        Ok(true) => Ok(()),
        Ok(false) => Err(CustomError::NotImplemented),
        Err(e) => Err(CustomError::Failed(e.what().to_string())),
    }
}

/// A size or hyperparameter as C++ receives it; one past `i64::MAX` (which
/// no tensor can have) saturates rather than turning negative.
fn dim(v: usize) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The user's conv2d. Uneven zero padding is applied here first, so C++
/// always sees one padding per axis.
pub fn conv2d<T: Float>(
    p: &Conv2dParams,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
) -> Result<(), CustomError> {
    p.check_buffers(input.len(), bias.map(<[T]>::len), output.len())?;
    let pad = p.padding;
    if pad.top != pad.bottom || pad.left != pad.right {
        const WHAT: &str = "evenly padded input copy";
        let (h, w) = (p.padded_h(), p.padded_w());
        let len = checked_product(WHAT, &[p.batch, p.in_channels, h, w])?;
        let mut padded = try_zeroed_vec(len, WHAT)?;
        pad2d(
            PadMode::Zeros,
            p.batch * p.in_channels,
            p.in_h,
            p.in_w,
            pad,
            input,
            &mut padded,
        )?;
        let q = Conv2dParams {
            in_h: h,
            in_w: w,
            padding: Padding2d::default(),
            ..*p
        };
        return conv2d(&q, &padded, weight, bias, output);
    }
    let x = view(
        input,
        &[p.batch, p.in_channels, p.in_h, p.in_w],
        "conv2d input",
    )?;
    let icg = p.in_channels_per_group();
    let w = view(
        weight,
        &[p.out_channels, icg, p.kernel_h, p.kernel_w],
        "conv2d weight",
    )?;
    let b = view(
        bias.unwrap_or(&[]),
        &[bias.map_or(0, |_| p.out_channels)],
        "conv2d bias",
    )?;
    let out_shape = [p.batch, p.out_channels, p.out_h(), p.out_w()];
    let o = view_mut(output, &out_shape, "conv2d output")?;
    finish(ffi::conv2d(
        &x,
        &w,
        &b,
        bias.is_some(),
        dim(pad.top),
        dim(pad.left),
        dim(p.stride.0),
        dim(p.stride.1),
        dim(p.dilation.0),
        dim(p.dilation.1),
        dim(p.groups),
        &o,
    ))
}

/// The user's linear layer on `[rows, in_features]`.
pub fn linear<T: Float>(
    p: &LinearParams,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
) -> Result<(), CustomError> {
    let x = view(input, &[p.rows, p.in_features], "linear input")?;
    let w = view(weight, &[p.out_features, p.in_features], "linear weight")?;
    let b = view(
        bias.unwrap_or(&[]),
        &[bias.map_or(0, |_| p.out_features)],
        "linear bias",
    )?;
    let o = view_mut(output, &[p.rows, p.out_features], "linear output")?;
    finish(ffi::linear(&x, &w, &b, bias.is_some(), &o))
}

/// The user's relu over a tensor of `shape`.
pub fn relu<T: Float>(shape: &[usize], input: &[T], output: &mut [T]) -> Result<(), CustomError> {
    let x = view(input, shape, "relu input")?;
    let o = view_mut(output, shape, "relu output")?;
    finish(ffi::relu(&x, &o))
}

fn pool_shapes(p: &Pool2dParams) -> ([usize; 4], [usize; 4]) {
    (
        [p.batch, p.channels, p.in_h, p.in_w],
        [p.batch, p.channels, p.out_h(), p.out_w()],
    )
}

/// The user's max pooling.
pub fn maxpool2d<T: Float>(
    p: &Pool2dParams,
    input: &[T],
    output: &mut [T],
) -> Result<(), CustomError> {
    p.check_buffers(input.len(), output.len())?;
    let (xs, os) = pool_shapes(p);
    let x = view(input, &xs, "maxpool2d input")?;
    let o = view_mut(output, &os, "maxpool2d output")?;
    finish(ffi::maxpool2d(
        &x,
        dim(p.kernel.0),
        dim(p.kernel.1),
        dim(p.stride.0),
        dim(p.stride.1),
        dim(p.padding.0),
        dim(p.padding.1),
        dim(p.dilation.0),
        dim(p.dilation.1),
        p.ceil_mode,
        &o,
    ))
}

/// The user's average pooling (`divisor_override` crosses as 0 when absent).
pub fn avgpool2d<T: Float>(
    p: &Pool2dParams,
    opts: &AvgPoolOptions,
    input: &[T],
    output: &mut [T],
) -> Result<(), CustomError> {
    p.check_buffers(input.len(), output.len())?;
    let (xs, os) = pool_shapes(p);
    let x = view(input, &xs, "avgpool2d input")?;
    let o = view_mut(output, &os, "avgpool2d output")?;
    finish(ffi::avgpool2d(
        &x,
        dim(p.kernel.0),
        dim(p.kernel.1),
        dim(p.stride.0),
        dim(p.stride.1),
        dim(p.padding.0),
        dim(p.padding.1),
        p.ceil_mode,
        opts.count_include_pad,
        dim(opts.divisor_override.unwrap_or(0)),
        &o,
    ))
}

/// The user's adaptive average pooling.
pub fn adaptiveavgpool2d<T: Float>(
    p: &AdaptivePool2dParams,
    input: &[T],
    output: &mut [T],
) -> Result<(), CustomError> {
    let x = view(
        input,
        &[p.batch, p.channels, p.in_h, p.in_w],
        "adaptiveavgpool2d input",
    )?;
    let o = view_mut(
        output,
        &[p.batch, p.channels, p.out_h, p.out_w],
        "adaptiveavgpool2d output",
    )?;
    finish(ffi::adaptiveavgpool2d(&x, &o))
}

/// The user's flatten of `in_shape` (dimensions `start..=end`, normalised) into `out_shape`.
pub fn flatten<T: Float>(
    in_shape: &[usize],
    start: usize,
    end: usize,
    input: &[T],
    out_shape: &[usize],
    output: &mut [T],
) -> Result<(), CustomError> {
    let x = view(input, in_shape, "flatten input")?;
    let o = view_mut(output, out_shape, "flatten output")?;
    finish(ffi::flatten(&x, dim(start), dim(end), &o))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stock cpp_custom/ throws NotImplemented everywhere; a build from
    /// another directory (AI3_CUSTOM_DIR) may implement some operations.
    #[test]
    fn stock_functions_report_not_implemented() {
        if built_from_stock() {
            for op in CustomOp::ALL {
                let why = implemented(op).unwrap_err();
                assert!(why.contains(&format!("{}.cpp", op.name())), "{why}");
                assert!(!is_default(op));
            }
        }
    }
}
