//! Parameter structs shared by the kernels and by `ai3-core`.
//!
//! They live in the lowest layer so that kernels and the core agree on one
//! description of each operation; `ai3-core` re-exports them and adds
//! validation against user input. Every struct describes a batched NCHW
//! problem on contiguous buffers: unbatched input is passed with `batch = 1`.

use crate::alloc::{check_len, checked_product, checked_sum, KernelError, KernelResult};

/// Zero padding on each side of a 2-D image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct Padding2d {
    /// Rows of zeros above the image.
    pub top: usize,
    /// Rows of zeros below the image.
    pub bottom: usize,
    /// Columns of zeros left of the image.
    pub left: usize,
    /// Columns of zeros right of the image.
    pub right: usize,
}

impl Padding2d {
    /// The same padding `(h, w)` on both sides of each dimension, as PyTorch's `padding=(h, w)`.
    pub fn symmetric(h: usize, w: usize) -> Self {
        Self {
            top: h,
            bottom: h,
            left: w,
            right: w,
        }
    }
}

/// A 2-D convolution: input `[batch, in_channels, in_h, in_w]`, weight
/// `[out_channels, in_channels / groups, kernel_h, kernel_w]`, optional bias
/// `[out_channels]`, output `[batch, out_channels, out_h(), out_w()]`.
///
/// Padding here is always zero padding; other padding modes are materialised
/// by the caller before the kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dParams {
    /// Number of images.
    pub batch: usize,
    /// Input channels (all groups together).
    pub in_channels: usize,
    /// Input height.
    pub in_h: usize,
    /// Input width.
    pub in_w: usize,
    /// Output channels (all groups together).
    pub out_channels: usize,
    /// Kernel height.
    pub kernel_h: usize,
    /// Kernel width.
    pub kernel_w: usize,
    /// Stride `(h, w)`.
    pub stride: (usize, usize),
    /// Zero padding on each side.
    pub padding: Padding2d,
    /// Dilation `(h, w)`.
    pub dilation: (usize, usize),
    /// Number of groups; `in_channels` and `out_channels` are multiples of it.
    pub groups: usize,
}

impl Conv2dParams {
    /// Effective (dilated) kernel height.
    pub fn effective_kernel_h(&self) -> usize {
        self.dilation.0 * (self.kernel_h - 1) + 1
    }
    /// Effective (dilated) kernel width.
    pub fn effective_kernel_w(&self) -> usize {
        self.dilation.1 * (self.kernel_w - 1) + 1
    }
    /// Padded input height.
    pub fn padded_h(&self) -> usize {
        self.in_h + self.padding.top + self.padding.bottom
    }
    /// Padded input width.
    pub fn padded_w(&self) -> usize {
        self.in_w + self.padding.left + self.padding.right
    }
    /// Output height (the caller guarantees the kernel fits in the padded input).
    pub fn out_h(&self) -> usize {
        (self.padded_h() - self.effective_kernel_h()) / self.stride.0 + 1
    }
    /// Output width (the caller guarantees the kernel fits in the padded input).
    pub fn out_w(&self) -> usize {
        (self.padded_w() - self.effective_kernel_w()) / self.stride.1 + 1
    }
    /// Input channels seen by one group.
    pub fn in_channels_per_group(&self) -> usize {
        self.in_channels / self.groups
    }
    /// Output channels produced by one group.
    pub fn out_channels_per_group(&self) -> usize {
        self.out_channels / self.groups
    }
    /// Number of input elements.
    pub fn input_len(&self) -> usize {
        self.batch * self.in_channels * self.in_h * self.in_w
    }
    /// Number of weight elements.
    pub fn weight_len(&self) -> usize {
        self.out_channels * self.in_channels_per_group() * self.kernel_h * self.kernel_w
    }
    /// Number of output elements.
    pub fn output_len(&self) -> usize {
        self.batch * self.out_channels * self.out_h() * self.out_w()
    }
    /// Multiply-accumulates of the direct definition (what the layer costs),
    /// saturating at `usize::MAX`: it only guides threading decisions.
    pub fn macs(&self) -> usize {
        self.output_len()
            .saturating_mul(self.in_channels_per_group())
            .saturating_mul(self.kernel_h)
            .saturating_mul(self.kernel_w)
    }

    /// Checks that every size derived from these parameters fits in `usize`
    /// (dilated kernel, padded input, input, weight and output lengths), so
    /// the unchecked accessors above cannot overflow, and that the output is
    /// defined (positive strides, the dilated kernel within the padded input),
    /// which the caller has validated with a message for the user.
    ///
    /// ```
    /// use ai3_kernels::params::{Conv2dParams, Padding2d};
    /// let mut p = Conv2dParams {
    ///     batch: 1, in_channels: 3, in_h: 8, in_w: 8, out_channels: 4,
    ///     kernel_h: 3, kernel_w: 3, stride: (1, 1), padding: Padding2d::symmetric(1, 1),
    ///     dilation: (1, 1), groups: 1,
    /// };
    /// assert!(p.check_sizes().is_ok());
    /// p.padding = Padding2d::symmetric(usize::MAX / 2, 1);
    /// assert!(p.check_sizes().is_err());
    /// ```
    pub fn check_sizes(&self) -> KernelResult<()> {
        let span = |k: usize, d: usize, what| {
            k.checked_sub(1)
                .and_then(|k| k.checked_mul(d))
                .and_then(|s| s.checked_add(1))
                .ok_or(KernelError::Overflow { what })
        };
        let eh = span(
            self.kernel_h,
            self.dilation.0,
            "conv2d dilated kernel height",
        )?;
        let ew = span(
            self.kernel_w,
            self.dilation.1,
            "conv2d dilated kernel width",
        )?;
        let ph = checked_sum(
            "conv2d padded input height",
            &[self.in_h, self.padding.top, self.padding.bottom],
        )?;
        let pw = checked_sum(
            "conv2d padded input width",
            &[self.in_w, self.padding.left, self.padding.right],
        )?;
        if ph < eh || pw < ew || self.stride.0 == 0 || self.stride.1 == 0 || self.groups == 0 {
            return Err(KernelError::Precondition {
                what: "conv2d needs positive strides and groups and a dilated kernel within the padded input",
            });
        }
        checked_product(
            "conv2d input size",
            &[self.batch, self.in_channels, self.in_h, self.in_w],
        )?;
        checked_product(
            "conv2d weight size",
            &[
                self.out_channels,
                self.in_channels_per_group(),
                self.kernel_h,
                self.kernel_w,
            ],
        )?;
        checked_product(
            "conv2d output size",
            &[
                self.batch,
                self.out_channels,
                (ph - eh) / self.stride.0 + 1,
                (pw - ew) / self.stride.1 + 1,
            ],
        )?;
        Ok(())
    }

    /// Checks, in release builds too, that a kernel's input, bias and output
    /// have this layer's lengths (each kernel checks its own weight form):
    /// a few comparisons, made before anything is written.
    pub fn check_buffers(
        &self,
        input_len: usize,
        bias_len: Option<usize>,
        output_len: usize,
    ) -> KernelResult<()> {
        self.check_sizes()?;
        check_len("conv2d input", input_len, self.input_len())?;
        check_len("conv2d output", output_len, self.output_len())?;
        if let Some(b) = bias_len {
            check_len("conv2d bias", b, self.out_channels)?;
        }
        Ok(())
    }

    /// Checks that a weight in PyTorch's layout (`[out_channels,
    /// in_channels / groups, kh, kw]`) and a bias have this layer's
    /// lengths: what every packer of prepared weights checks first.
    pub fn check_weights(&self, weight_len: usize, bias_len: Option<usize>) -> KernelResult<()> {
        check_len("conv2d weight", weight_len, self.weight_len())?;
        if let Some(b) = bias_len {
            check_len("conv2d bias", b, self.out_channels)?;
        }
        Ok(())
    }
}

/// Output length of a pooling window along one axis, PyTorch's rule: with
/// `ceil_mode`, a last window that starts inside the input (or its left
/// padding) counts even if it sticks out, so one window larger than the padded
/// input still gives one output; 0 when no window fits. Computed in `i128`,
/// so no sum of user sizes overflows.
pub fn pooled_len(
    input: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
    ceil_mode: bool,
) -> usize {
    let (input, padding, s) = (input as i128, padding as i128, stride as i128);
    let span = dilation as i128 * (kernel as i128 - 1) + 1;
    let room = input + 2 * padding - span + if ceil_mode { s - 1 } else { 0 };
    let mut out = room.div_euclid(s) + 1;
    if ceil_mode && out > 0 && (out - 1).saturating_mul(s) >= input + padding {
        out -= 1;
    }
    usize::try_from(out.max(0)).unwrap_or(usize::MAX)
}

/// A 2-D pooling window over `[batch, channels, in_h, in_w]`, output
/// `[batch, channels, out_h, out_w]` (maximum and average pooling).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pool2dParams {
    /// Number of images.
    pub batch: usize,
    /// Channels.
    pub channels: usize,
    /// Input height.
    pub in_h: usize,
    /// Input width.
    pub in_w: usize,
    /// Window `(h, w)`.
    pub kernel: (usize, usize),
    /// Stride `(h, w)`.
    pub stride: (usize, usize),
    /// Implicit padding `(h, w)` on both sides (never counted as a maximum).
    pub padding: (usize, usize),
    /// Dilation `(h, w)`; average pooling requires `(1, 1)`.
    pub dilation: (usize, usize),
    /// PyTorch's `ceil_mode`.
    pub ceil_mode: bool,
}

impl Pool2dParams {
    /// Output height.
    pub fn out_h(&self) -> usize {
        pooled_len(
            self.in_h,
            self.kernel.0,
            self.stride.0,
            self.padding.0,
            self.dilation.0,
            self.ceil_mode,
        )
    }
    /// Output width.
    pub fn out_w(&self) -> usize {
        pooled_len(
            self.in_w,
            self.kernel.1,
            self.stride.1,
            self.padding.1,
            self.dilation.1,
            self.ceil_mode,
        )
    }
    /// Number of input elements.
    pub fn input_len(&self) -> usize {
        self.batch * self.channels * self.in_h * self.in_w
    }
    /// Number of output elements.
    pub fn output_len(&self) -> usize {
        self.batch * self.channels * self.out_h() * self.out_w()
    }
    /// Checks, in release builds too, that a kernel's input and output have
    /// these lengths, computing them without overflow.
    pub fn check_buffers(&self, input_len: usize, output_len: usize) -> KernelResult<()> {
        let (b, c) = (self.batch, self.channels);
        let want_in = checked_product("pool input size", &[b, c, self.in_h, self.in_w])?;
        let want_out = checked_product("pool output size", &[b, c, self.out_h(), self.out_w()])?;
        check_len("pool input", input_len, want_in)?;
        check_len("pool output", output_len, want_out)
    }
}

/// What average pooling divides each window's sum by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AvgPoolOptions {
    /// Count padded positions in the divisor (PyTorch's `count_include_pad`).
    pub count_include_pad: bool,
    /// Divide by this instead (PyTorch's `divisor_override`).
    pub divisor_override: Option<usize>,
}

/// Adaptive pooling of `[batch, channels, in_h, in_w]` to `[batch, channels, out_h, out_w]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AdaptivePool2dParams {
    /// Number of images.
    pub batch: usize,
    /// Channels.
    pub channels: usize,
    /// Input height.
    pub in_h: usize,
    /// Input width.
    pub in_w: usize,
    /// Output height.
    pub out_h: usize,
    /// Output width.
    pub out_w: usize,
}

impl AdaptivePool2dParams {
    /// Number of input elements.
    pub fn input_len(&self) -> usize {
        self.batch * self.channels * self.in_h * self.in_w
    }
    /// Number of output elements.
    pub fn output_len(&self) -> usize {
        self.batch * self.channels * self.out_h * self.out_w
    }
    /// Checks, in release builds too, that a kernel's input and output have
    /// these lengths, computing them without overflow.
    pub fn check_buffers(&self, input_len: usize, output_len: usize) -> KernelResult<()> {
        let (b, c) = (self.batch, self.channels);
        let want_in = checked_product("pool input size", &[b, c, self.in_h, self.in_w])?;
        let want_out = checked_product("pool output size", &[b, c, self.out_h, self.out_w])?;
        check_len("pool input", input_len, want_in)?;
        check_len("pool output", output_len, want_out)
    }
}

/// A fully connected layer: input `[rows, in_features]`, weight
/// `[out_features, in_features]`, optional bias `[out_features]`, output
/// `[rows, out_features]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LinearParams {
    /// Rows of the input (the product of all leading dimensions).
    pub rows: usize,
    /// Input features.
    pub in_features: usize,
    /// Output features.
    pub out_features: usize,
}

impl LinearParams {
    /// Checks, in release builds too, that a kernel's input, weight, bias and
    /// output have these lengths, computing them without overflow.
    pub fn check_buffers(
        &self,
        input_len: usize,
        weight_len: usize,
        bias_len: Option<usize>,
        output_len: usize,
    ) -> KernelResult<()> {
        let (r, i, o) = (self.rows, self.in_features, self.out_features);
        check_len(
            "linear input",
            input_len,
            checked_product("linear input size", &[r, i])?,
        )?;
        check_len(
            "linear weight",
            weight_len,
            checked_product("linear weight size", &[o, i])?,
        )?;
        check_len(
            "linear output",
            output_len,
            checked_product("linear output size", &[r, o])?,
        )?;
        if let Some(b) = bias_len {
            check_len("linear bias", b, o)?;
        }
        Ok(())
    }
}

/// The NumPy/PyTorch broadcast of two shapes (aligned at the trailing
/// dimension; a size of 1 stretches), or `None` when they are incompatible.
///
/// ```
/// use ai3_kernels::params::broadcast_shape;
/// assert_eq!(broadcast_shape(&[8, 3, 5, 5], &[3, 1, 1]), Some(vec![8, 3, 5, 5]));
/// assert_eq!(broadcast_shape(&[2, 3], &[4]), None);
/// ```
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let dim = |s: &[usize], k: usize| {
        if k + s.len() >= rank {
            s[k + s.len() - rank]
        } else {
            1
        }
    };
    (0..rank)
        .map(|k| match (dim(a, k), dim(b, k)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// Scaled dot-product attention: query `[batch, heads, q_len, head_dim]`,
/// key `[batch, kv_heads, kv_len, head_dim]`, value `[batch, kv_heads,
/// kv_len, v_dim]`, output `[batch, heads, q_len, v_dim]`. Query head `h`
/// reads key/value head `h / (heads / kv_heads)` (grouped-query attention
/// when `kv_heads < heads`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    /// Product of the leading dimensions.
    pub batch: usize,
    /// Query heads.
    pub heads: usize,
    /// Key and value heads; divides `heads`.
    pub kv_heads: usize,
    /// Query length.
    pub q_len: usize,
    /// Key and value length.
    pub kv_len: usize,
    /// Query and key feature size.
    pub head_dim: usize,
    /// Value feature size.
    pub v_dim: usize,
    /// Factor of the scores (PyTorch's default: `1 / sqrt(head_dim)`).
    pub scale: f64,
    /// Query `i` attends to keys `j <= i` only (PyTorch's `is_causal`, aligned top-left).
    pub causal: bool,
}

impl AttentionParams {
    /// `(query, key, value, output)` element counts, or an error if one overflows.
    pub fn lens(&self) -> KernelResult<(usize, usize, usize, usize)> {
        let (b, h, kh) = (self.batch, self.heads, self.kv_heads);
        Ok((
            checked_product("attention query", &[b, h, self.q_len, self.head_dim])?,
            checked_product("attention key", &[b, kh, self.kv_len, self.head_dim])?,
            checked_product("attention value", &[b, kh, self.kv_len, self.v_dim])?,
            checked_product("attention output", &[b, h, self.q_len, self.v_dim])?,
        ))
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads.max(1)
    }

    /// Checks the head counts and the four buffers' lengths.
    pub fn check_buffers(&self, q: usize, k: usize, v: usize, out: usize) -> KernelResult<()> {
        if (self.kv_heads == 0 && self.heads != 0)
            || !self.heads.is_multiple_of(self.kv_heads.max(1))
        {
            return Err(KernelError::Precondition {
                what: "query heads must be a multiple of key/value heads",
            });
        }
        let (lq, lk, lv, lo) = self.lens()?;
        check_len("attention query", q, lq)?;
        check_len("attention key", k, lk)?;
        check_len("attention value", v, lv)?;
        check_len("attention output", out, lo)
    }
}

/// Sizes around one dimension of a contiguous tensor: `outer` blocks of
/// `dim` slices of `inner` elements (softmax, concatenation, slicing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AxisParams {
    /// Product of the dimensions before the axis.
    pub outer: usize,
    /// Size of the axis.
    pub dim: usize,
    /// Product of the dimensions after the axis.
    pub inner: usize,
}

impl AxisParams {
    /// Splits `shape` around dimension `axis` (which must be in range).
    pub fn new(shape: &[usize], axis: usize) -> Self {
        AxisParams {
            outer: shape[..axis].iter().product(),
            dim: shape[axis],
            inner: shape[axis + 1..].iter().product(),
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.outer * self.dim * self.inner
    }
    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooled_len_matches_pytorch_rules() {
        // 5 -> kernel 2 stride 2: floor gives 2, ceil gives 3.
        assert_eq!(pooled_len(5, 2, 2, 0, 1, false), 2);
        assert_eq!(pooled_len(5, 2, 2, 0, 1, true), 3);
        // With padding the last ceil window would start in the right padding: dropped.
        assert_eq!(pooled_len(4, 2, 2, 1, 1, true), 3);
        // Dilation widens the window.
        assert_eq!(pooled_len(7, 3, 1, 0, 2, false), 3);
    }

    #[test]
    fn conv_output_shape() {
        let p = Conv2dParams {
            batch: 2,
            in_channels: 4,
            in_h: 9,
            in_w: 7,
            out_channels: 6,
            kernel_h: 3,
            kernel_w: 2,
            stride: (2, 1),
            padding: Padding2d::symmetric(1, 0),
            dilation: (1, 2),
            groups: 2,
        };
        assert_eq!(p.out_h(), (9 + 2 - 3) / 2 + 1);
        assert_eq!(p.out_w(), 7 - 2 - 1 + 1);
        assert_eq!(p.weight_len(), 6 * 2 * 3 * 2);
    }
}
