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
    /// `a` and `b` combined (for the few border windows; the vector loops
    /// bind the function once with `with_combine!`).
    fn apply<T: Float>(self, a: T, b: T) -> T {
        match self {
            Reduce::Max => nan_max(a, b),
            Reduce::Sum => a + b,
        }
    }

    /// The result over no element.
    pub(super) fn identity<T: Float>(self) -> T {
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
pub(super) fn nan_max<T: Float>(acc: T, v: T) -> T {
    // `maxps` order: a NaN `v` wins; a NaN `acc` is carried by the sum.
    let m = if acc > v { acc } else { v };
    if acc.is_nan() {
        acc + v
    } else {
        m
    }
}

#[inline(always)]
pub(super) fn add<T: Float>(a: T, b: T) -> T {
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
pub(super) fn interior(
    out: usize,
    n: usize,
    k: usize,
    s: usize,
    pad: usize,
    d: usize,
) -> (usize, usize) {
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

/// Where output row `y`'s window starts (`y * stride - pad`) and which of
/// its taps land inside the input; one entry per output row or column.
pub(super) type Taps = (isize, std::ops::Range<usize>);

multiversion! {
    /// `folded[y]` = the input rows of output row `y`'s window (`rows[y]`,
    /// `dh` apart) combined, for every output row of a plane: contiguous
    /// passes over whole rows of width `iw`. Output rows `flat.0..flat.1`
    /// (stride 1, whole windows inside the input) go as one run, so narrow
    /// planes do not pay a loop per row.
    pub(super) unsafe fn fold_rows<T>(reduce: Reduce, src: &[T], iw: usize, rows: &[Taps], dh: usize, flat: (usize, usize), folded: &mut [T]) => fold_rows_impl
}

#[inline(always)]
unsafe fn fold_rows_impl<T: Float>(
    reduce: Reduce,
    src: &[T],
    iw: usize,
    rows: &[Taps],
    dh: usize,
    (lo, hi): (usize, usize),
    folded: &mut [T],
) {
    /// `acc[i] = f(src[base + ky * step + i], ky in taps)`.
    #[inline(always)]
    fn run<T: Float>(
        f: impl Fn(T, T) -> T,
        identity: T,
        src: &[T],
        base: isize,
        step: usize,
        taps: std::ops::Range<usize>,
        acc: &mut [T],
    ) {
        let n = acc.len();
        let row = |ky: usize| &src[(base + (ky * step) as isize) as usize..][..n];
        match taps.len() {
            0 => acc.fill(identity),
            1 => acc.copy_from_slice(row(taps.start)),
            _ => {
                let (a, b) = (row(taps.start), row(taps.start + 1));
                for i in 0..n {
                    acc[i] = f(a[i], b[i]);
                }
                for ky in taps.start + 2..taps.end {
                    let r = row(ky);
                    for i in 0..n {
                        acc[i] = f(acc[i], r[i]);
                    }
                }
            }
        }
    }
    let id = reduce.identity();
    let step = dh * iw;
    with_combine!(reduce, |f| {
        for y in (0..lo).chain(hi..rows.len()) {
            let (y0, taps) = &rows[y];
            let acc = &mut folded[y * iw..(y + 1) * iw];
            run(f, id, src, y0 * iw as isize, step, taps.clone(), acc);
        }
        if lo < hi {
            let (y0, taps) = &rows[lo];
            let acc = &mut folded[lo * iw..hi * iw];
            run(f, id, src, y0 * iw as isize, step, taps.clone(), acc);
        }
    })
}

/// The columns of a plane: input (folded) and output widths `iw` and `ow`,
/// the interior output columns `x_lo..x_hi`, and the window along the width
/// (padding `pw`, kernel `kw`, stride `sw`, dilation `dw`).
#[derive(Clone, Copy)]
struct Cols {
    iw: usize,
    ow: usize,
    x_lo: usize,
    x_hi: usize,
    pw: usize,
    kw: usize,
    sw: usize,
    dw: usize,
}

multiversion! {
    /// For every row pair of `folded` (width `c.iw`) and `out` (width
    /// `c.ow`): `out[x] = f(v[x * sw + k * dw], k < kw)` for the interior
    /// columns `x`, where `v` is the folded row from column `x_lo * sw - pw`
    /// on. Other columns may be written too; the caller's
    /// border pass overwrites them.
    unsafe fn windows<T>(reduce: Reduce, folded: &[T], out: &mut [T], c: Cols) => windows_impl
}

#[inline(always)]
unsafe fn windows_impl<T: Float>(reduce: Reduce, folded: &[T], out: &mut [T], c: Cols) {
    #[rustfmt::skip]
    let Cols { iw, ow, x_lo, x_hi, pw, kw, sw, dw } = c;
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
    if x_lo >= x_hi {
        return;
    }
    // Index loops, not iterator adapters: those are generic functions of
    // their own that need not inline into this ISA-specific one.
    let row = |y: usize| &folded[y * iw + x_lo * sw - pw..(y + 1) * iw];
    let n = out.len() / ow.max(1);
    if sw == 1 && ow == iw && n > 0 {
        // Rows as wide as their folded rows: one run over the plane. The
        // columns between two rows' interiors get values mixed from both,
        // which the caller's border pass overwrites.
        let (v, o) = (&folded[x_lo - pw..], &mut out[x_lo..(n - 1) * ow + x_hi]);
        return with_combine!(reduce, |f| match (kw, dw) {
            (3, 1) => fixed::<T, 3, 1>(v, o, f),
            _ => {
                for (x, o) in o.iter_mut().enumerate() {
                    *o = (1..kw).fold(v[x], |acc, k| f(acc, v[x + k * dw]));
                }
            }
        });
    }
    with_combine!(reduce, |f| match (kw, sw, dw) {
        (3, 2, 1) => {
            for y in 0..n {
                fixed::<T, 3, 2>(row(y), &mut out[y * ow + x_lo..y * ow + x_hi], f);
            }
        }
        (2, 2, 1) => {
            for y in 0..n {
                fixed::<T, 2, 2>(row(y), &mut out[y * ow + x_lo..y * ow + x_hi], f);
            }
        }
        (3, 1, 1) => {
            for y in 0..n {
                fixed::<T, 3, 1>(row(y), &mut out[y * ow + x_lo..y * ow + x_hi], f);
            }
        }
        _ => {
            for y in 0..n {
                let v = row(y);
                for (x, o) in out[y * ow + x_lo..y * ow + x_hi].iter_mut().enumerate() {
                    let x0 = x * sw;
                    *o = (1..kw).fold(v[x0], |acc, k| f(acc, v[x0 + k * dw]));
                }
            }
        }
    })
}

/// Where each output row's and column's window starts (`o * stride -
/// pad`) and which of its taps land inside the input: the same for every
/// plane, so found once per call.
pub(super) fn window_taps(p: &Pool2dParams) -> KernelResult<(Vec<Taps>, Vec<Taps>)> {
    let table = |out: usize, s: usize, pad: usize, k: usize, d: usize, n: usize| {
        try_table(out, |o| {
            let start = (o * s) as isize - pad as isize;
            (start, taps_inside(start, k, d, n))
        })
    };
    Ok((
        table(
            p.out_h(),
            p.stride.0,
            p.padding.0,
            p.kernel.0,
            p.dilation.0,
            p.in_h,
        )?,
        table(
            p.out_w(),
            p.stride.1,
            p.padding.1,
            p.kernel.1,
            p.dilation.1,
            p.in_w,
        )?,
    ))
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
    let (rows, cols) = window_taps(p)?;
    // Output rows whose windows, 1 apart, all lie inside the input.
    let flat_rows = if sh == 1 {
        interior(oh, ih, kh, sh, ph, dh)
    } else {
        (0, 0)
    };
    #[rustfmt::skip]
    let cols_geometry = Cols { iw, ow, x_lo, x_hi, pw, kw, sw, dw };
    for_each_plane(input, ih * iw, output, oh * ow, |src, dst| {
        // Every entry of `folded` is written before it is read.
        with_scratch::<T, _>(oh * iw, |folded| {
            // SAFETY: plain Rust on slices, compiled for the ISA level in
            // use; interior windows lie inside their folded row.
            unsafe {
                fold_rows(reduce, src, iw, &rows, dh, flat_rows, folded);
                windows(reduce, folded, dst, cols_geometry);
            }
            let rows = folded.chunks_exact(iw).zip(dst.chunks_exact_mut(ow));
            for (y, (folded, out)) in rows.enumerate() {
                for x in (0..x_lo).chain(x_hi..ow) {
                    let x0 = start(x, sw, pw);
                    out[x] = cols[x]
                        .1
                        .clone()
                        .map(|kx| folded[(x0 + (kx * dw) as isize) as usize])
                        .fold(reduce.identity(), |a, b| reduce.apply(a, b));
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
