//! Max pooling.

use super::for_each_plane;
use crate::alloc::KernelResult;
use crate::cpu::scratch::with_scratch;
use crate::isa::multiversion;
use crate::params::Pool2dParams;
use crate::Float;

/// The larger of `acc` and `v`, where a NaN on either side wins and then sticks.
#[inline(always)]
fn nan_max<T: Float>(acc: T, v: T) -> T {
    // `|`, not `||`: both sides are cheap, and a select vectorises.
    if (v > acc) | v.is_nan() {
        v
    } else {
        acc
    }
}

/// The output positions `lo..hi` along one axis whose windows lie entirely
/// inside the input (every other position touches padding or the clipped
/// `ceil_mode` edge).
fn interior(out: usize, n: usize, k: usize, s: usize, pad: usize, d: usize) -> (usize, usize) {
    let span = (k - 1) * d;
    let lo = pad.div_ceil(s).min(out);
    // Largest o with o*s - pad + span <= n - 1.
    let hi = if n + pad > span {
        ((n + pad - 1 - span) / s + 1).min(out)
    } else {
        0
    };
    (lo, hi.max(lo))
}

/// The taps `k` of a window starting at `start` (`k * dilation` from it, `k <
/// kernel`) that land inside `0..n`: the loops visit those only, so a window
/// far larger than the input costs no more than the input.
fn taps_inside(start: isize, kernel: usize, dilation: usize, n: usize) -> std::ops::Range<usize> {
    let d = dilation as u128;
    let first = if start < 0 {
        (start.unsigned_abs() as u128).div_ceil(d)
    } else {
        0
    };
    let last = n as i128 - 1 - start as i128; // the tap offset k * d may reach this
    let end = if last < 0 { 0 } else { last as u128 / d + 1 };
    let end = end.min(kernel as u128);
    let first = first.min(end);
    first as usize..end as usize
}

multiversion! {
    /// `acc[i] = nan_max(acc[i], row[i])`: one more row of a window, across
    /// a whole input row at once.
    unsafe fn fold_row<T>(acc: &mut [T], row: &[T]) => fold_row_impl
}

#[inline(always)]
unsafe fn fold_row_impl<T: Float>(acc: &mut [T], row: &[T]) {
    for (a, &v) in acc.iter_mut().zip(row) {
        *a = nan_max(*a, v);
    }
}

multiversion! {
    /// `out[x] = max(v[x * sw + k * dw], k < kw)` for every `x`, where every
    /// such index lies inside `v`: the windows of a row's interior.
    unsafe fn window_max<T>(v: &[T], out: &mut [T], kw: usize, sw: usize, dw: usize) => window_max_impl
}

#[inline(always)]
unsafe fn window_max_impl<T: Float>(v: &[T], out: &mut [T], kw: usize, sw: usize, dw: usize) {
    // The shapes CNNs use, with the window fixed so the loop vectorises.
    #[inline(always)]
    fn fixed<T: Float, const K: usize, const S: usize>(v: &[T], out: &mut [T]) {
        for (x, o) in out.iter_mut().enumerate() {
            let w = &v[x * S..][..K];
            *o = w[1..].iter().fold(w[0], |acc, &e| nan_max(acc, e));
        }
    }
    match (kw, sw, dw) {
        (3, 2, 1) => fixed::<T, 3, 2>(v, out),
        (2, 2, 1) => fixed::<T, 2, 2>(v, out),
        (3, 1, 1) => fixed::<T, 3, 1>(v, out),
        _ => {
            for (x, o) in out.iter_mut().enumerate() {
                let x0 = x * sw;
                *o = (1..kw).fold(v[x0], |acc, k| nan_max(acc, v[x0 + k * dw]));
            }
        }
    }
}

/// 2-D max pooling as PyTorch's `max_pool2d`: padding counts as `-inf`,
/// dilation spreads the window, `ceil_mode` windows are clipped to the input,
/// and a NaN anywhere in a window makes that output NaN.
///
/// The window max is separable: for each output row the input rows of its
/// window are first folded into one row (a contiguous pass that vectorises),
/// whose windows along the width then give the output row. Only border
/// columns check bounds.
///
/// A buffer of the wrong length is an error before anything is written; a
/// refused scratch allocation fails the call.
pub fn maxpool2d<T: Float>(p: &Pool2dParams, input: &[T], output: &mut [T]) -> KernelResult<()> {
    p.check_buffers(input.len(), output.len())?;
    let (oh, ow) = (p.out_h(), p.out_w());
    let (kh, kw) = p.kernel;
    let (sh, sw) = p.stride;
    let (ph, pw) = p.padding;
    let (dh, dw) = p.dilation;
    let (ih, iw) = (p.in_h, p.in_w);
    let (x_lo, x_hi) = interior(ow, iw, kw, sw, pw, dw);
    for_each_plane(input, ih * iw, output, oh * ow, |src, dst| {
        // The window's rows folded into one; every entry is written before
        // it is read.
        with_scratch::<T, _>(iw, |vmax| {
            for (y, out) in dst.chunks_exact_mut(ow).enumerate() {
                let y0 = (y * sh) as isize - ph as isize;
                let mut taps = taps_inside(y0, kh, dh, ih)
                    .map(|ky| &src[(y0 + (ky * dh) as isize) as usize * iw..][..iw]);
                match taps.next() {
                    Some(first) => vmax.copy_from_slice(first),
                    None => vmax.fill(T::neg_infinity()),
                }
                for row in taps {
                    // SAFETY: plain Rust on slices, compiled for the ISA level in use.
                    unsafe { fold_row(vmax, row) };
                }
                if x_lo < x_hi {
                    // SAFETY: as above; interior windows lie inside the row.
                    unsafe {
                        window_max(&vmax[x_lo * sw - pw..], &mut out[x_lo..x_hi], kw, sw, dw)
                    };
                }
                for x in (0..x_lo).chain(x_hi..ow) {
                    let x0 = (x * sw) as isize - pw as isize;
                    out[x] = taps_inside(x0, kw, dw, iw)
                        .map(|kx| vmax[(x0 + (kx * dw) as isize) as usize])
                        .fold(T::neg_infinity(), nan_max);
                }
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::test_util::Rng;

    #[test]
    fn only_taps_inside_the_input_are_visited() {
        assert_eq!(taps_inside(0, 3, 1, 5), 0..3);
        assert_eq!(taps_inside(-2, 3, 1, 5), 2..3);
        assert_eq!(taps_inside(-3, 4, 2, 5), 2..4);
        assert_eq!(taps_inside(4, 3, 2, 5), 0..1);
        assert_eq!(taps_inside(5, 3, 1, 5), 0..0);
        assert_eq!(taps_inside(-10, 3, 1, 5), 3..3);
        // A window of 10**12 taps over one element: one tap, found at once.
        assert_eq!(
            taps_inside(-500_000_000_000, 1_000_000_000_000, 1, 1),
            500_000_000_000..500_000_000_001
        );
    }

    fn params(
        h: usize,
        w: usize,
        k: usize,
        s: usize,
        pad: usize,
        d: usize,
        ceil: bool,
    ) -> Pool2dParams {
        Pool2dParams {
            batch: 1,
            channels: 1,
            in_h: h,
            in_w: w,
            kernel: (k, k),
            stride: (s, s),
            padding: (pad, pad),
            dilation: (d, d),
            ceil_mode: ceil,
        }
    }

    /// Straight from the definition: the maximum over the window's in-bounds
    /// positions.
    fn naive(p: &Pool2dParams, x: &[f64]) -> Vec<f64> {
        let (oh, ow) = (p.out_h(), p.out_w());
        let mut out = Vec::new();
        for plane in x.chunks(p.in_h * p.in_w) {
            for y in 0..oh {
                for xo in 0..ow {
                    let mut vals = Vec::new();
                    for ky in 0..p.kernel.0 {
                        for kx in 0..p.kernel.1 {
                            let iy = (y * p.stride.0 + ky * p.dilation.0) as isize
                                - p.padding.0 as isize;
                            let ix = (xo * p.stride.1 + kx * p.dilation.1) as isize
                                - p.padding.1 as isize;
                            if iy >= 0
                                && ix >= 0
                                && (iy as usize) < p.in_h
                                && (ix as usize) < p.in_w
                            {
                                vals.push(plane[iy as usize * p.in_w + ix as usize]);
                            }
                        }
                    }
                    out.push(vals.into_iter().fold(f64::NEG_INFINITY, f64::max));
                }
            }
        }
        out
    }

    #[test]
    fn hand_computed() {
        // 4x5 ramp, kernel 2, stride 2, ceil mode: the last column's windows
        // are clipped to one column.
        let x: Vec<f32> = (0..20).map(|i| i as f32).collect();
        let p = params(4, 5, 2, 2, 0, 1, true);
        assert_eq!((p.out_h(), p.out_w()), (2, 3));
        let mut out = [f32::NAN; 6];
        maxpool2d(&p, &x, &mut out).unwrap();
        assert_eq!(out, [6., 8., 9., 16., 18., 19.]);

        // Padding 1 with kernel 3 stride 2 on [[-1 -2] [-3 -4]]: padding must
        // not win as 0.
        let x = [-1.0f64, -2.0, -3.0, -4.0];
        let p = params(2, 2, 3, 2, 1, 1, false);
        let mut out = [f64::NAN; 1];
        maxpool2d(&p, &x, &mut out).unwrap();
        assert_eq!(out, [-1.0]);

        // Dilation 2 on a 3x3 ramp picks the corners.
        let x: Vec<f64> = (0..9).map(|i| -(i as f64)).collect();
        let p = params(3, 3, 2, 1, 0, 2, false);
        let mut out = [f64::NAN; 1];
        maxpool2d(&p, &x, &mut out).unwrap();
        assert_eq!(out, [0.0]);
    }

    #[test]
    fn nan_propagates() {
        let x = [1.0f32, f32::NAN, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let p = params(2, 4, 2, 2, 0, 1, false);
        let mut out = [0.0f32; 2];
        maxpool2d(&p, &x, &mut out).unwrap();
        assert!(out[0].is_nan());
        assert_eq!(out[1], 8.0);
    }

    #[test]
    fn matches_naive() {
        let mut rng = Rng::new(9);
        for &(h, w) in &[(7, 9), (8, 5), (11, 11)] {
            for k in 1..4 {
                for s in 1..4 {
                    for pad in 0..=k / 2 {
                        for d in 1..3 {
                            for ceil in [false, true] {
                                let mut p = params(h, w, k, s, pad, d, ceil);
                                p.batch = 2;
                                p.channels = 3;
                                p.kernel = (k, k.max(2) - 1);
                                p.padding = (pad, pad.min(p.kernel.1 / 2));
                                p.stride = (s, 1 + s % 2);
                                let x = rng.vec(p.input_len());
                                let mut out = vec![f64::NAN; p.output_len()];
                                maxpool2d(&p, &x, &mut out).unwrap();
                                assert_eq!(out, naive(&p, &x), "{p:?}");
                            }
                        }
                    }
                }
            }
        }
    }
}
