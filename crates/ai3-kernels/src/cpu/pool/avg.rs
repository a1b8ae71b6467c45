//! Average pooling.

use super::separable::{pool, Reduce};
use super::try_table;
use crate::alloc::{KernelError, KernelResult};
use crate::params::{AvgPoolOptions, Pool2dParams};
use crate::Float;

/// The window `[start, end)` of output index `o` in one dimension, before and
/// after clipping to the input, as PyTorch's `avg_pool2d` computes it: the
/// unclipped window stops at the end of the right padding, which is what
/// `count_include_pad` counts.
#[inline]
fn window(
    o: usize,
    stride: usize,
    pad: usize,
    kernel: usize,
    len: usize,
) -> (isize, isize, usize, usize) {
    let start = (o * stride) as isize - pad as isize;
    let end = (start + kernel as isize).min((len + pad) as isize);
    let clipped_start = start.max(0) as usize;
    let clipped_end = (end.min(len as isize)).max(clipped_start as isize) as usize;
    (start, end, clipped_start, clipped_end)
}

/// 2-D average pooling with exactly PyTorch's `avg_pool2d` divisor rule:
/// `divisor_override` if given, else the window size including padding (but
/// not the part past the right padding that `ceil_mode` can add) when
/// `count_include_pad`, else the number of input elements in the window.
///
/// `p.dilation` must be `(1, 1)`. A buffer of the wrong length is an error
/// before anything is written.
pub fn avgpool2d<T: Float>(
    p: &Pool2dParams,
    opts: &AvgPoolOptions,
    input: &[T],
    output: &mut [T],
) -> KernelResult<()> {
    p.check_buffers(input.len(), output.len())?;
    if p.dilation != (1, 1) {
        return Err(KernelError::Precondition {
            what: "average pooling has no dilation",
        });
    }
    let (rows, cols) = divisors::<T>(p, opts)?;
    pool(p, Reduce::Sum, input, output, |y, out| {
        let r = rows[y];
        for (o, &c) in out.iter_mut().zip(&cols) {
            *o = *o / (r * c);
        }
    })
}

/// The divisor of output `(y, x)` as a row factor times a column factor
/// (`divisor_override` folded into the rows): `(rows, cols)`.
pub(super) fn divisors<T: Float>(
    p: &Pool2dParams,
    opts: &AvgPoolOptions,
) -> KernelResult<(Vec<T>, Vec<T>)> {
    let factor = |o: usize, stride: usize, pad: usize, kernel: usize, len: usize| {
        let (start, end, clipped_start, clipped_end) = window(o, stride, pad, kernel, len);
        let count = match opts.divisor_override {
            Some(_) => 1,
            None if opts.count_include_pad => (end - start) as usize,
            None => clipped_end - clipped_start,
        };
        T::from_usize(count).unwrap_or_else(T::nan)
    };
    let override_t = opts
        .divisor_override
        .map_or_else(T::one, |d| T::from_usize(d).unwrap_or_else(T::nan));
    let rows = try_table(p.out_h(), |y| {
        override_t * factor(y, p.stride.0, p.padding.0, p.kernel.0, p.in_h)
    })?;
    let cols = try_table(p.out_w(), |x| {
        factor(x, p.stride.1, p.padding.1, p.kernel.1, p.in_w)
    })?;
    Ok((rows, cols))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::test_util::{assert_close, Rng};

    fn params(
        h: usize,
        w: usize,
        k: (usize, usize),
        s: (usize, usize),
        pad: (usize, usize),
        ceil: bool,
    ) -> Pool2dParams {
        Pool2dParams {
            batch: 1,
            channels: 1,
            in_h: h,
            in_w: w,
            kernel: k,
            stride: s,
            padding: pad,
            dilation: (1, 1),
            ceil_mode: ceil,
        }
    }

    const INCLUDE: AvgPoolOptions = AvgPoolOptions {
        count_include_pad: true,
        divisor_override: None,
    };
    const EXCLUDE: AvgPoolOptions = AvgPoolOptions {
        count_include_pad: false,
        divisor_override: None,
    };

    /// Enumerates the padded grid position by position, as the PyTorch
    /// documentation describes average pooling.
    fn naive(p: &Pool2dParams, o: &AvgPoolOptions, x: &[f64]) -> Vec<f64> {
        let (oh, ow) = (p.out_h(), p.out_w());
        let (ph, pw) = (p.padding.0 as isize, p.padding.1 as isize);
        let mut out = Vec::new();
        for plane in x.chunks(p.in_h * p.in_w) {
            for y in 0..oh {
                for xo in 0..ow {
                    let (mut sum, mut inside, mut padded) = (0.0, 0usize, 0usize);
                    for ky in 0..p.kernel.0 {
                        for kx in 0..p.kernel.1 {
                            let iy = (y * p.stride.0 + ky) as isize - ph;
                            let ix = (xo * p.stride.1 + kx) as isize - pw;
                            // Positions past the right/bottom padding do not exist.
                            if iy >= p.in_h as isize + ph || ix >= p.in_w as isize + pw {
                                continue;
                            }
                            padded += 1;
                            if iy >= 0 && ix >= 0 && iy < p.in_h as isize && ix < p.in_w as isize {
                                sum += plane[iy as usize * p.in_w + ix as usize];
                                inside += 1;
                            }
                        }
                    }
                    let d = o.divisor_override.unwrap_or(if o.count_include_pad {
                        padded
                    } else {
                        inside
                    });
                    out.push(sum / d as f64);
                }
            }
        }
        out
    }

    #[test]
    fn hand_computed() {
        // [[1 2 3] [4 5 6] [7 8 9]], kernel 2, stride 2, padding 1.
        let x: Vec<f64> = (1..=9).map(f64::from).collect();
        let p = params(3, 3, (2, 2), (2, 2), (1, 1), false);
        assert_eq!((p.out_h(), p.out_w()), (2, 2));
        let mut out = [f64::NAN; 4];
        avgpool2d(&p, &INCLUDE, &x, &mut out).unwrap();
        assert_eq!(out, [1.0 / 4.0, 5.0 / 4.0, 11.0 / 4.0, 28.0 / 4.0]);
        avgpool2d(&p, &EXCLUDE, &x, &mut out).unwrap();
        assert_eq!(out, [1.0, 2.5, 5.5, 7.0]);
        let o = AvgPoolOptions {
            count_include_pad: true,
            divisor_override: Some(3),
        };
        avgpool2d(&p, &o, &x, &mut out).unwrap();
        assert_eq!(out, [1.0 / 3.0, 5.0 / 3.0, 11.0 / 3.0, 28.0 / 3.0]);

        // Ceil mode on a 1x3 row, kernel 2 stride 2 without padding: the last
        // window hangs past the input and past the (zero) padding, so even
        // count_include_pad divides by 1 there.
        let x = [1.0f32, 2.0, 3.0];
        let p = params(1, 3, (1, 2), (1, 2), (0, 0), true);
        let mut out = [f32::NAN; 2];
        avgpool2d(&p, &INCLUDE, &x, &mut out).unwrap();
        assert_eq!(out, [1.5, 3.0]);

        // Ceil mode with padding: the last window reaches the right padding,
        // which count_include_pad counts.
        let x = [1.0f64, 2.0, 3.0, 4.0];
        let p = params(1, 4, (1, 3), (1, 2), (0, 1), true);
        assert_eq!(p.out_w(), 3);
        let mut out = [f64::NAN; 3];
        avgpool2d(&p, &INCLUDE, &x, &mut out).unwrap();
        // Windows: [-1,2) -> 3/3, [1,4) -> 9/3, [3,5)∩[.,5) -> 4/2.
        assert_eq!(out, [1.0, 3.0, 2.0]);
    }

    #[test]
    fn matches_naive() {
        let mut rng = Rng::new(4);
        let options = [
            INCLUDE,
            EXCLUDE,
            AvgPoolOptions {
                count_include_pad: false,
                divisor_override: Some(5),
            },
        ];
        for &(h, w) in &[(7, 9), (6, 5)] {
            for kh in 1..4 {
                for kw in 1..4 {
                    for s in 1..4 {
                        for ceil in [false, true] {
                            for opts in &options {
                                let mut p =
                                    params(h, w, (kh, kw), (s, 1 + s % 3), (kh / 2, kw / 2), ceil);
                                p.batch = 2;
                                p.channels = 2;
                                let x = rng.vec(p.input_len());
                                let mut out = vec![f64::NAN; p.output_len()];
                                avgpool2d(&p, opts, &x, &mut out).unwrap();
                                assert_close(
                                    &out,
                                    &naive(&p, opts, &x),
                                    1e-12,
                                    &format!("{p:?} {opts:?}"),
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
