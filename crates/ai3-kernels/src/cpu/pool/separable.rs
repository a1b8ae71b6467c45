//! The shared driver of max and average pooling: a window's reduction is
//! separable, so each output row first folds its window's input rows into one
//! row (contiguous passes that vectorise), whose windows along the width then
//! give the output row. Only border columns, whose windows touch padding or
//! the clipped `ceil_mode` edge, check bounds.

use super::{for_each_plane, try_table};
use crate::alloc::KernelResult;
use crate::cpu::scratch::with_scratch;
use crate::isa::multiversion;
use crate::params::Pool2dParams;
use crate::Float;

/// How a window's elements combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reduce {
    /// The maximum, where a NaN anywhere wins.
    Max,
    /// The sum (average pooling divides afterwards).
    Sum,
}

impl Reduce {
    /// The result over no element.
    fn identity<T: Float>(self) -> T {
        match self {
            Reduce::Max => T::neg_infinity(),
            Reduce::Sum => T::zero(),
        }
    }
}

/// The larger of `acc` and `v`, where a NaN on either side wins and then sticks.
///
/// Written so that neither arm of the final select is `acc` itself: folding
/// in place (`*a = nan_max(*a, v)`) would otherwise vectorise into masked
/// stores, which cost ~10x a plain store on AMD's cores.
#[inline(always)]
fn nan_max<T: Float>(acc: T, v: T) -> T {
    // `maxps` order: a NaN `v` wins; a NaN `acc` is carried by the sum.
    let m = if acc > v { acc } else { v };
    if acc.is_nan() {
        acc + v
    } else {
        m
    }
}

#[inline(always)]
fn add<T: Float>(a: T, b: T) -> T {
    a + b
}

/// Calls `$body` with `$f` bound to the combining function of `$reduce`, so
/// each loop is compiled once per reduction with the choice outside it.
macro_rules! with_combine {
    ($reduce:expr, |$f:ident| $body:expr) => {
        match $reduce {
            Reduce::Max => {
                let $f = nan_max::<T>;
                $body
            }
            Reduce::Sum => {
                let $f = add::<T>;
                $body
            }
        }
    };
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
pub(super) fn taps_inside(
    start: isize,
    kernel: usize,
    dilation: usize,
    n: usize,
) -> std::ops::Range<usize> {
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
    /// `acc[i] = f(a[i], b[i])`: a window's first two rows in one pass.
    unsafe fn combine_rows<T>(reduce: Reduce, acc: &mut [T], a: &[T], b: &[T]) => combine_rows_impl
}

#[inline(always)]
unsafe fn combine_rows_impl<T: Float>(reduce: Reduce, acc: &mut [T], a: &[T], b: &[T]) {
    with_combine!(reduce, |f| {
        for ((o, &x), &y) in acc.iter_mut().zip(a).zip(b) {
            *o = f(x, y);
        }
    })
}

multiversion! {
    /// `acc[i] = f(acc[i], row[i])`: one more row of a window.
    unsafe fn fold_row<T>(reduce: Reduce, acc: &mut [T], row: &[T]) => fold_row_impl
}

#[inline(always)]
unsafe fn fold_row_impl<T: Float>(reduce: Reduce, acc: &mut [T], row: &[T]) {
    with_combine!(reduce, |f| {
        for (a, &v) in acc.iter_mut().zip(row) {
            *a = f(*a, v);
        }
    })
}

multiversion! {
    /// `out[x] = f(v[x * sw + k * dw], k < kw)` for every `x`, where every
    /// such index lies inside `v`: the windows of a row's interior.
    unsafe fn windows<T>(reduce: Reduce, v: &[T], out: &mut [T], kw: usize, sw: usize, dw: usize) => windows_impl
}

#[inline(always)]
unsafe fn windows_impl<T: Float>(
    reduce: Reduce,
    v: &[T],
    out: &mut [T],
    kw: usize,
    sw: usize,
    dw: usize,
) {
    // The shapes CNNs use, with the window fixed so the loop vectorises
    // (stride 2 as interleaved loads).
    #[inline(always)]
    fn fixed<T: Float, const K: usize, const S: usize>(
        v: &[T],
        out: &mut [T],
        f: impl Fn(T, T) -> T,
    ) {
        let Some(last) = out.len().checked_sub(1) else {
            return;
        };
        let v = &v[..last * S + K];
        for (x, o) in out.iter_mut().enumerate() {
            // SAFETY: x * S + k <= last * S + K - 1 < v.len().
            let tap = |k: usize| unsafe { *v.get_unchecked(x * S + k) };
            *o = (1..K).fold(tap(0), |acc, k| f(acc, tap(k)));
        }
    }
    with_combine!(reduce, |f| match (kw, sw, dw) {
        (3, 2, 1) => fixed::<T, 3, 2>(v, out, f),
        (2, 2, 1) => fixed::<T, 2, 2>(v, out, f),
        (3, 1, 1) => fixed::<T, 3, 1>(v, out, f),
        _ => {
            for (x, o) in out.iter_mut().enumerate() {
                let x0 = x * sw;
                *o = (1..kw).fold(v[x0], |acc, k| f(acc, v[x0 + k * dw]));
            }
        }
    })
}

/// Pools every plane of `input` into `output` by `reduce` over the in-bounds
/// taps of each window (padding is never read), then calls `finish(y, row)`
/// on each output row (average pooling divides there).
///
/// The caller has checked the buffer lengths; a refused scratch or table
/// allocation fails the call.
pub(super) fn pool<T: Float>(
    p: &Pool2dParams,
    reduce: Reduce,
    input: &[T],
    output: &mut [T],
    finish: impl Fn(usize, &mut [T]) + Sync,
) -> KernelResult<()> {
    let (oh, ow) = (p.out_h(), p.out_w());
    let (kh, kw) = p.kernel;
    let (sh, sw) = p.stride;
    let (ph, pw) = p.padding;
    let (dh, dw) = p.dilation;
    let (ih, iw) = (p.in_h, p.in_w);
    let (x_lo, x_hi) = interior(ow, iw, kw, sw, pw, dw);
    // Every plane has the same windows: their in-bounds taps, found once.
    let start = |o: usize, s: usize, pad: usize| (o * s) as isize - pad as isize;
    let rows = try_table(oh, |y| taps_inside(start(y, sh, ph), kh, dh, ih))?;
    let cols = try_table(ow, |x| taps_inside(start(x, sw, pw), kw, dw, iw))?;
    let combine = |a: T, b: T| match reduce {
        Reduce::Max => nan_max(a, b),
        Reduce::Sum => a + b,
    };
    for_each_plane(input, ih * iw, output, oh * ow, |src, dst| {
        // The window's rows folded into one; every entry is written before
        // it is read.
        with_scratch::<T, _>(iw, |folded| {
            for (y, out) in dst.chunks_exact_mut(ow).enumerate() {
                let y0 = start(y, sh, ph);
                let mut taps = rows[y]
                    .clone()
                    .map(|ky| &src[(y0 + (ky * dh) as isize) as usize * iw..][..iw]);
                match (taps.next(), taps.next()) {
                    // SAFETY: plain Rust on slices, compiled for the ISA level in use.
                    (Some(a), Some(b)) => unsafe { combine_rows(reduce, folded, a, b) },
                    (Some(first), None) => folded.copy_from_slice(first),
                    _ => folded.fill(reduce.identity()),
                }
                for row in taps {
                    // SAFETY: as above.
                    unsafe { fold_row(reduce, folded, row) };
                }
                if x_lo < x_hi {
                    let (v, o) = (&folded[x_lo * sw - pw..], &mut out[x_lo..x_hi]);
                    // SAFETY: as above; interior windows lie inside the row.
                    unsafe { windows(reduce, v, o, kw, sw, dw) };
                }
                for x in (0..x_lo).chain(x_hi..ow) {
                    let x0 = start(x, sw, pw);
                    out[x] = cols[x]
                        .clone()
                        .map(|kx| folded[(x0 + (kx * dw) as isize) as usize])
                        .fold(reduce.identity(), combine);
                }
                finish(y, out);
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn nan_max_lets_a_nan_win_from_either_side() {
        assert!(nan_max(f32::NAN, 1.0).is_nan());
        assert!(nan_max(1.0, f32::NAN).is_nan());
        assert!(nan_max(f64::NAN, f64::INFINITY).is_nan());
        assert_eq!(nan_max(-1.0f32, f32::NEG_INFINITY), -1.0);
        assert_eq!(nan_max(f32::NEG_INFINITY, 2.0), 2.0);
    }
}
