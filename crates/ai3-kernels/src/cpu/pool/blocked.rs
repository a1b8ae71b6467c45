//! Max and average pooling in the channel-blocked layout
//! ([`crate::cpu::blocked`]): each pixel holds 8 channels side by side, so
//! a window's taps are whole vectors, reduced lane by lane, and every lane
//! is useful whatever the plane's width. The windows (in-bounds taps,
//! divisors) are those of the NCHW kernels, found once per call.

use super::avg::divisors;
use super::for_each_plane;
use super::separable::{add, nan_max, window_taps, Reduce, Taps};
#[cfg(target_arch = "x86_64")]
use super::separable::{fold_rows, interior};
use crate::alloc::{check_len, KernelError, KernelResult};
use crate::cpu::blocked::{blocked_len, BLOCK};
#[cfg(target_arch = "x86_64")]
use crate::cpu::scratch::with_scratch;
use crate::isa::multiversion;
use crate::params::{AvgPoolOptions, Pool2dParams};
use crate::Float;

/// [`maxpool2d`](super::maxpool2d) on the blocked forms of its input and
/// output. A buffer of the wrong length is an error before anything is
/// written.
pub fn maxpool2d_blocked<T: Float>(
    p: &Pool2dParams,
    input: &[T],
    output: &mut [T],
) -> KernelResult<()> {
    pool(p, Reduce::Max, input, output, None)
}

/// [`avgpool2d`](super::avgpool2d) on the blocked forms of its input and
/// output (the padding lanes stay zero). A buffer of the wrong length, or a
/// dilation, is an error before anything is written.
pub fn avgpool2d_blocked<T: Float>(
    p: &Pool2dParams,
    opts: &AvgPoolOptions,
    input: &[T],
    output: &mut [T],
) -> KernelResult<()> {
    if p.dilation != (1, 1) {
        return Err(KernelError::Precondition {
            what: "average pooling has no dilation",
        });
    }
    let (rows, cols) = divisors::<T>(p, opts)?;
    pool(p, Reduce::Sum, input, output, Some((&rows, &cols)))
}

fn pool<T: Float>(
    p: &Pool2dParams,
    reduce: Reduce,
    input: &[T],
    output: &mut [T],
    divisors: Option<(&[T], &[T])>,
) -> KernelResult<()> {
    let (in_plane, out_plane) = (p.in_h * p.in_w, p.out_h() * p.out_w());
    check_len(
        "blocked pooling input",
        input.len(),
        blocked_len(p.batch, p.channels, in_plane)?,
    )?;
    check_len(
        "blocked pooling output",
        output.len(),
        blocked_len(p.batch, p.channels, out_plane)?,
    )?;
    let (rows, cols) = window_taps(p)?;
    let g = Geometry {
        iw: p.in_w,
        dilation: p.dilation,
        rows: &rows,
        cols: &cols,
        divisors,
    };
    // The AVX2 kernel's view of the windows, when the elements are f32.
    #[cfg(target_arch = "x86_64")]
    let g32 = if crate::isa::avx2() { g.as_f32() } else { None };
    // Output rows whose windows, 1 apart, all lie inside the input: one
    // run of the AVX2 kernel's row fold.
    #[cfg(target_arch = "x86_64")]
    let flat_rows = match p.stride.0 {
        1 => interior(p.out_h(), p.in_h, p.kernel.0, 1, p.padding.0, p.dilation.0),
        _ => (0, 0),
    };
    for_each_plane(
        input,
        in_plane * BLOCK,
        output,
        out_plane * BLOCK,
        |src, dst| {
            #[cfg(target_arch = "x86_64")]
            if let (Some(g32), Some(s32), Some(d32)) = (
                &g32,
                crate::float::as_f32(src),
                crate::float::as_f32_mut(dst),
            ) {
                // Every element of `folded` is written before it is read.
                return with_scratch::<f32, _>(p.out_h() * p.in_w * BLOCK, |folded| {
                    // SAFETY: AVX2 and FMA are available (g32 is only built
                    // then); `folded` holds `out_h` rows of the input's width.
                    unsafe { plane_f32(s32, d32, g32, reduce, flat_rows, folded) };
                });
            }
            // SAFETY: plain Rust on slices, compiled for the ISA level in use.
            unsafe {
                match reduce {
                    Reduce::Max => plane(src, dst, &g, nan_max::<T>),
                    Reduce::Sum => plane(src, dst, &g, add::<T>),
                }
            }
            Ok(())
        },
    )
}

/// The windows of one call, shared by every plane.
struct Geometry<'a, T> {
    iw: usize,
    dilation: (usize, usize),
    rows: &'a [Taps],
    cols: &'a [Taps],
    divisors: Option<(&'a [T], &'a [T])>,
}

impl<T: Float> Geometry<'_, T> {
    /// The same windows with f32 divisors, when `T` is f32.
    #[cfg(target_arch = "x86_64")]
    fn as_f32(&self) -> Option<Geometry<'_, f32>> {
        crate::float::as_f32::<T>(&[])?;
        Some(Geometry {
            iw: self.iw,
            dilation: self.dilation,
            rows: self.rows,
            cols: self.cols,
            divisors: match self.divisors {
                Some((r, c)) => Some((crate::float::as_f32(r)?, crate::float::as_f32(c)?)),
                None => None,
            },
        })
    }

    /// `meet` over the in-bounds taps of the window at `(y0, ty)`, `(x0,
    /// tx)`, starting from its first tap (`load(at)` reads the pixel at
    /// element `at` of the plane); `empty` for a window without taps.
    #[inline(always)]
    fn window<V>(
        &self,
        (y0, ty): &Taps,
        (x0, tx): &Taps,
        load: impl Fn(usize) -> V,
        meet: impl Fn(V, V) -> V,
        empty: V,
    ) -> V {
        if ty.is_empty() || tx.is_empty() {
            return empty;
        }
        let at = |ky: usize, kx: usize| {
            let iy = (y0 + (ky * self.dilation.0) as isize) as usize;
            let ix = (x0 + (kx * self.dilation.1) as isize) as usize;
            load((iy * self.iw + ix) * BLOCK)
        };
        let mut v = at(ty.start, tx.start);
        for kx in tx.start + 1..tx.end {
            v = meet(v, at(ty.start, kx));
        }
        for ky in ty.start + 1..ty.end {
            for kx in tx.clone() {
                v = meet(v, at(ky, kx));
            }
        }
        v
    }
}

multiversion! {
    /// One blocked plane: `dst[y][x][l]` = `f` over the in-bounds taps of
    /// window `(y, x)` of `src[.][.][l]`, divided when `g.divisors` says.
    unsafe fn plane<T, F: Fn(T, T) -> T>(src: &[T], dst: &mut [T], g: &Geometry<'_, T>, f: F) => plane_impl
}

#[inline(always)]
unsafe fn plane_impl<T: Float, F: Fn(T, T) -> T>(
    src: &[T],
    dst: &mut [T],
    g: &Geometry<'_, T>,
    f: F,
) {
    let ow = g.cols.len();
    let load =
        |at: usize| -> [T; BLOCK] { (&src[at..][..BLOCK]).try_into().expect("a whole pixel") };
    // Lane by lane, no branch: the compiler keeps the pixel in one vector.
    let meet = |a: [T; BLOCK], px: [T; BLOCK]| std::array::from_fn(|l| f(a[l], px[l]));
    for (y, ty) in g.rows.iter().enumerate() {
        for (x, tx) in g.cols.iter().enumerate() {
            // Sums and maxima both start from the first tap: a window has
            // at least one (PyTorch's padding is at most half the window).
            let mut v = g.window(ty, tx, load, meet, [T::nan(); BLOCK]);
            if let Some((rows, cols)) = g.divisors {
                let d = rows[y] * cols[x];
                v = v.map(|e| e / d);
            }
            dst[(y * ow + x) * BLOCK..][..BLOCK].copy_from_slice(&v);
        }
    }
}

/// [`plane`] for f32 with AVX2, separable: the window's rows are first
/// folded into one row per output row (`folded`, `out_h` rows of the
/// input's width: contiguous passes, vectorised at the ISA's width; output
/// rows `flat` as one run), whose windows along the width then give the
/// output pixels, a pixel a vector. Maxima keep [`nan_max`]'s NaN rule
/// (`maxps` gives its second operand when either is NaN, so a NaN tap wins;
/// a NaN already in the maximum is put back). squeezenet1_1's first max
/// pooling (64 channels, 111x111 -> 55x55, two threads): 69 -> 38 us
/// against a window at a time; the generic version was not vectorised at
/// all (128 channels at 55x55 -> 27x27, batch 10: 1.16 ms against ONNX
/// Runtime's 0.23).
///
/// # Safety
/// AVX2 and FMA; `folded` holds `out_h * in_w * BLOCK` elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn plane_f32(
    src: &[f32],
    dst: &mut [f32],
    g: &Geometry<'_, f32>,
    reduce: Reduce,
    flat: (usize, usize),
    folded: &mut [f32],
) {
    use std::arch::x86_64::*;
    let (ow, row) = (g.cols.len(), g.iw * BLOCK);
    // SAFETY: plain Rust on slices, compiled for the ISA level in use.
    unsafe { fold_rows(reduce, src, row, g.rows, g.dilation.0, flat, folded) };
    let meet = |acc: __m256, v: __m256| match reduce {
        Reduce::Max => {
            let m = _mm256_max_ps(acc, v);
            _mm256_blendv_ps(m, acc, _mm256_cmp_ps::<_CMP_UNORD_Q>(acc, acc))
        }
        Reduce::Sum => _mm256_add_ps(acc, v),
    };
    let dw = g.dilation.1 * BLOCK;
    for (y, (f, out)) in folded
        .chunks_exact(row)
        .zip(dst.chunks_exact_mut(ow * BLOCK))
        .enumerate()
    {
        for (x, (x0, tx)) in g.cols.iter().enumerate() {
            if tx.is_empty() {
                // No tap inside the input (PyTorch's shapes rule it out).
                out[x * BLOCK..][..BLOCK].fill(f32::NAN);
                continue;
            }
            // SAFETY: the taps `tx` of the window at `x0` lie inside the
            // folded row; `out` holds `ow` pixels.
            unsafe {
                let p = f.as_ptr().offset(*x0 * BLOCK as isize);
                let mut v = _mm256_loadu_ps(p.add(tx.start * dw));
                for kx in tx.start + 1..tx.end {
                    v = meet(v, _mm256_loadu_ps(p.add(kx * dw)));
                }
                if let Some((rows, cols)) = g.divisors {
                    v = _mm256_div_ps(v, _mm256_set1_ps(rows[y] * cols[x]));
                }
                _mm256_storeu_ps(out.as_mut_ptr().add(x * BLOCK), v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::blocked::{from_blocked, to_blocked};
    use crate::cpu::pool::{avgpool2d, maxpool2d};
    use crate::cpu::test_util::Rng;

    /// Against the NCHW kernels: strides, padding, dilation, ceil_mode,
    /// partial channel blocks, NaNs, on this thread and on two.
    #[test]
    fn blocked_pooling_matches_the_nchw_kernels() {
        let case = |batch, channels, in_h, in_w, k, s, pad, d, ceil_mode| Pool2dParams {
            batch,
            channels,
            in_h,
            in_w,
            kernel: (k, k),
            stride: (s, s),
            padding: (pad, pad),
            dilation: (d, d),
            ceil_mode,
        };
        let cases = [
            case(1, 64, 111, 111, 3, 2, 0, 1, true),
            case(2, 13, 14, 12, 2, 2, 0, 1, false),
            case(1, 8, 9, 11, 3, 1, 1, 1, false),
            case(2, 5, 10, 7, 3, 2, 1, 2, true),
            case(1, 16, 7, 7, 7, 1, 3, 1, false),
            case(1, 3, 1, 1, 1, 1, 0, 1, false),
        ];
        let run = || {
            let mut rng = Rng::new(4);
            for p in &cases {
                let (ip, op) = (p.in_h * p.in_w, p.out_h() * p.out_w());
                let mut x: Vec<f64> = rng.vec(p.batch * p.channels * ip);
                let at = (ip + 2) % x.len();
                x[at] = f64::NAN;
                let mut xb = vec![0.0; blocked_len(p.batch, p.channels, ip).unwrap()];
                to_blocked(p.batch, p.channels, ip, &x, &mut xb).unwrap();
                let opts = [
                    AvgPoolOptions {
                        count_include_pad: true,
                        divisor_override: None,
                    },
                    AvgPoolOptions {
                        count_include_pad: false,
                        divisor_override: None,
                    },
                    AvgPoolOptions {
                        count_include_pad: false,
                        divisor_override: Some(3),
                    },
                ];
                let mut want = vec![0.0; p.batch * p.channels * op];
                let mut ob = vec![f64::INFINITY; blocked_len(p.batch, p.channels, op).unwrap()];
                let mut got = vec![0.0; want.len()];
                let mut check = |want: &[f64], ob: &[f64], what: &str| {
                    from_blocked(p.batch, p.channels, op, ob, &mut got).unwrap();
                    for (i, (g, w)) in got.iter().zip(want).enumerate() {
                        let same = g == w || (g.is_nan() && w.is_nan()) || (g - w).abs() < 1e-12;
                        assert!(same, "{what} {p:?} at {i}: {g} vs {w}");
                    }
                    let cb = p.channels.div_ceil(BLOCK);
                    for (i, v) in ob.iter().enumerate() {
                        let ch = (i / (op * BLOCK)) % cb * BLOCK + i % BLOCK;
                        assert!(
                            ch < p.channels || *v == 0.0,
                            "{what} padding lane {ch}: {v}"
                        );
                    }
                };
                maxpool2d(p, &x, &mut want).unwrap();
                maxpool2d_blocked(p, &xb, &mut ob).unwrap();
                check(&want, &ob, "max");
                if p.dilation == (1, 1) {
                    for o in &opts {
                        avgpool2d(p, o, &x, &mut want).unwrap();
                        avgpool2d_blocked(p, o, &xb, &mut ob).unwrap();
                        check(&want, &ob, "avg");
                    }
                } else {
                    assert!(avgpool2d_blocked(p, &opts[0], &xb, &mut ob).is_err());
                }
            }
        };
        run();
        crate::cpu::test_util::on_two_threads(run);
        // f32, whose maxima and averages run on AVX2 code (3x3 stride 1 as
        // GoogLeNet's, 2x2 stride 2 as VGG's over an odd width, 3x3 stride
        // 2, 2 wide stride 1): NaNs at every tap position of some window,
        // among infinities, win as in the NCHW kernel; averages match it.
        let f32_cases = [
            cases[0],
            cases[1],
            cases[2],
            cases[3],
            case(1, 16, 28, 28, 3, 1, 1, 1, false),
            case(2, 8, 14, 15, 2, 2, 0, 1, false),
            case(1, 24, 13, 13, 3, 2, 0, 1, true),
            case(1, 8, 6, 9, 2, 1, 0, 1, false),
            case(1, 8, 5, 6, 3, 1, 0, 1, false),
            case(1, 8, 4, 7, 3, 2, 1, 1, false),
        ];
        let mut rng = Rng::new(5);
        for p in &f32_cases {
            let (ip, op) = (p.in_h * p.in_w, p.out_h() * p.out_w());
            let mut x: Vec<f32> = crate::cpu::test_util::cast(&rng.vec(p.batch * p.channels * ip));
            for (i, v) in x.iter_mut().enumerate() {
                match i % 23 {
                    0 => *v = f32::NAN,
                    7 => *v = f32::INFINITY,
                    11 => *v = f32::NEG_INFINITY,
                    _ => {}
                }
            }
            let mut xb = vec![0.0; blocked_len(p.batch, p.channels, ip).unwrap()];
            to_blocked(p.batch, p.channels, ip, &x, &mut xb).unwrap();
            let mut want = vec![0.0f32; p.batch * p.channels * op];
            maxpool2d(p, &x, &mut want).unwrap();
            let mut ob = vec![0.0f32; blocked_len(p.batch, p.channels, op).unwrap()];
            maxpool2d_blocked(p, &xb, &mut ob).unwrap();
            let mut got = vec![0.0f32; want.len()];
            from_blocked(p.batch, p.channels, op, &ob, &mut got).unwrap();
            assert!(
                want.iter().any(|v| v.is_nan()),
                "{p:?}: no NaN reached the output"
            );
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    g == w || (g.is_nan() && w.is_nan()),
                    "f32 {p:?} at {i}: {g} vs {w}"
                );
            }
            if p.dilation != (1, 1) {
                continue;
            }
            let finite: Vec<f32> = x
                .iter()
                .map(|v| if v.is_finite() { *v } else { 1.5 })
                .collect();
            to_blocked(p.batch, p.channels, ip, &finite, &mut xb).unwrap();
            for count_include_pad in [true, false] {
                let o = AvgPoolOptions {
                    count_include_pad,
                    divisor_override: None,
                };
                avgpool2d(p, &o, &finite, &mut want).unwrap();
                avgpool2d_blocked(p, &o, &xb, &mut ob).unwrap();
                from_blocked(p.batch, p.channels, op, &ob, &mut got).unwrap();
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-6 * (1.0 + w.abs()),
                        "f32 avg {p:?} at {i}: {g} vs {w}"
                    );
                }
            }
        }
        let p = case(1, 3, 4, 4, 2, 2, 0, 1, false);
        let (x, mut o) = (vec![0.0f32; 32], vec![0.0f32; 32]);
        assert!(maxpool2d_blocked(&p, &x[1..], &mut o).is_err());
        assert!(maxpool2d_blocked(&p, &x, &mut o[1..]).is_err());
    }
}
