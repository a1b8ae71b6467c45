//! Normalisation: eval-mode batch norm as a per-channel affine map, and layer norm.

use rayon::prelude::*;

use crate::alloc::{check_len, KernelResult};
use crate::float::{lane_sum, lane_sum_f32};
use crate::isa::multiversion;
use crate::Float;

/// `output = act(input * scale[c] + shift[c])` for an input `[batch,
/// channels, inner]` (batch norm with its statistics folded into `scale` and
/// `shift`, and the activation that follows it applied in the same pass;
/// `|x| x` for none).
pub fn scale_shift<T: Float, F: Fn(T) -> T + Sync>(
    channels: usize,
    inner: usize,
    scale: &[T],
    shift: &[T],
    input: &[T],
    output: &mut [T],
    act: F,
) -> KernelResult<()> {
    check_len("batch norm scale", scale.len(), channels)?;
    check_len("batch norm shift", shift.len(), channels)?;
    check_len("batch norm output", output.len(), input.len())?;
    if output.is_empty() || inner == 0 {
        return Ok(());
    }
    let plane = |(i, (o, x)): (usize, (&mut [T], &[T]))| {
        let (a, b) = (scale[i % channels], shift[i % channels]);
        // SAFETY: plain Rust on slices, compiled for the ISA level in use.
        unsafe { affine(o, x, a, b, &act) };
    };
    if inner >= 64 {
        output
            .par_chunks_mut(inner)
            .zip(input.par_chunks(inner))
            .enumerate()
            .for_each(plane);
    } else {
        // Small planes ([N, C] input): one task per image.
        let image = channels * inner;
        output
            .par_chunks_mut(image)
            .zip(input.par_chunks(image))
            .for_each(|(o, x)| {
                o.chunks_mut(inner)
                    .zip(x.chunks(inner))
                    .enumerate()
                    .for_each(plane)
            });
    }
    Ok(())
}

multiversion! {
    /// `o[i] = act(x[i] * a + b)`: one plane of [`scale_shift`].
    unsafe fn affine<T, F: Fn(T) -> T>(o: &mut [T], x: &[T], a: T, b: T, act: &F) => affine_impl
}

#[inline(always)]
unsafe fn affine_impl<T: Float, F: Fn(T) -> T>(o: &mut [T], x: &[T], a: T, b: T, act: &F) {
    for (o, &x) in o.iter_mut().zip(x) {
        *o = act(x * a + b);
    }
}

/// Layer norm over the last `cols` elements of each of `rows` rows: `(x -
/// mean) / sqrt(var + eps) * weight + bias`, with the biased variance.
/// Statistics are accumulated over partial sums per row: in f32 for f32
/// (16 lanes), in f64 for f64.
pub fn layernorm<T: Float>(
    cols: usize,
    eps: f64,
    weight: Option<&[T]>,
    bias: Option<&[T]>,
    input: &[T],
    output: &mut [T],
) -> KernelResult<()> {
    check_len("layer norm output", output.len(), input.len())?;
    if let Some(w) = weight {
        check_len("layer norm weight", w.len(), cols)?;
    }
    if let Some(b) = bias {
        check_len("layer norm bias", b.len(), cols)?;
    }
    if cols == 0 {
        return Ok(());
    }
    // Rows grouped into tasks of about CHUNK elements: short rows (ConvNeXt's
    // 96 channels) one by one cost rayon more than their arithmetic.
    let rows_per_task = (crate::cpu::par::CHUNK / cols).max(1);
    output
        .par_chunks_mut(cols)
        .with_min_len(rows_per_task)
        .zip(input.par_chunks(cols))
        // SAFETY: the rows have the same length (checked above), as do
        // `weight` and `bias` (`cols`).
        .for_each(|(o, x)| unsafe { layernorm_row(eps, weight, bias, x, o) });
    Ok(())
}

multiversion! {
    /// One row of [`layernorm`]: see [`layernorm_row_impl`].
    unsafe fn layernorm_row<T>(eps: f64, weight: Option<&[T]>, bias: Option<&[T]>, x: &[T], o: &mut [T]) => layernorm_row_impl
}

/// One row: statistics in f64 over [`LANES`](crate::float::LANES) partial sums, then `(x - mean)
/// * rstd`, times the weight, plus the bias, in `T`.
///
/// # Safety
/// `o` is as long as `x`, and so are `weight` and `bias` when given.
#[inline(always)]
unsafe fn layernorm_row_impl<T: Float>(
    eps: f64,
    weight: Option<&[T]>,
    bias: Option<&[T]>,
    x: &[T],
    o: &mut [T],
) {
    let f = |v: T| v.to_f64().unwrap_or(f64::NAN);
    let t = |v: f64| T::from_f64(v).unwrap_or_else(T::nan);
    let n = x.len() as f64;
    let (mean, var) = match crate::float::as_f32(x) {
        // f32 sums over 16 lanes, each a short run (a 3072-long row: 192
        // values a lane), as PyTorch accumulates float rows in float: f64
        // sums took 1.3-1.6x PyTorch's time for the whole layer norm.
        Some(x) => {
            let mean = lane_sum_f32(x, |v| v) / n as f32;
            let var = lane_sum_f32(x, |v| (v - mean) * (v - mean)) / n as f32;
            (f64::from(mean), f64::from(var))
        }
        None => {
            let mean = lane_sum(x, f) / n;
            (mean, lane_sum(x, |v| (f(v) - mean).powi(2)) / n)
        }
    };
    let (mean, rstd) = (t(mean), t(1.0 / (var + eps).sqrt()));
    let o = &mut o[..x.len()];
    match (weight, bias) {
        (Some(w), Some(b)) => {
            let (w, b) = (&w[..x.len()], &b[..x.len()]);
            for (j, (o, &v)) in o.iter_mut().zip(x).enumerate() {
                *o = (v - mean) * rstd * w[j] + b[j];
            }
        }
        (Some(w), None) => {
            let w = &w[..x.len()];
            for (j, (o, &v)) in o.iter_mut().zip(x).enumerate() {
                *o = (v - mean) * rstd * w[j];
            }
        }
        (None, Some(b)) => {
            let b = &b[..x.len()];
            for (j, (o, &v)) in o.iter_mut().zip(x).enumerate() {
                *o = (v - mean) * rstd + b[j];
            }
        }
        (None, None) => {
            for (o, &v) in o.iter_mut().zip(x) {
                *o = (v - mean) * rstd;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::test_util::{assert_close, cast, Rng};

    #[test]
    fn scale_shift_matches_naive() {
        let mut rng = Rng::new(21);
        for (n, c, inner) in [(2, 3, 5), (4, 7, 1), (1, 2, 100), (3, 1, 64)] {
            let x = rng.vec(n * c * inner);
            let (a, b) = (rng.vec(c), rng.vec(c));
            let want: Vec<f64> = (0..x.len())
                .map(|i| x[i] * a[(i / inner) % c] + b[(i / inner) % c])
                .collect();
            let mut out = vec![f64::NAN; x.len()];
            scale_shift(c, inner, &a, &b, &x, &mut out, |v| v).unwrap();
            assert_close(&out, &want, 1e-14, "f64");
            let mut out32 = vec![f32::NAN; x.len()];
            scale_shift(c, inner, &cast(&a), &cast(&b), &cast(&x), &mut out32, |v| v).unwrap();
            assert_close(&out32, &want, 1e-6, "f32");
            // The fused activation sees the affine result.
            let want_relu: Vec<f64> = want.iter().map(|v| v.max(0.0)).collect();
            scale_shift(c, inner, &a, &b, &x, &mut out, |v: f64| v.max(0.0)).unwrap();
            assert_close(&out, &want_relu, 1e-14, "f64 relu");
        }
    }

    #[test]
    fn layernorm_matches_naive() {
        let mut rng = Rng::new(22);
        for (rows, cols) in [(1, 1), (3, 8), (5, 33), (2, 1000)] {
            let x: Vec<f64> = rng.vec(rows * cols).iter().map(|v| 3.0 + v).collect();
            let (w, b) = (rng.vec(cols), rng.vec(cols));
            // Weight and bias each given or not.
            for (use_w, use_b) in [(false, false), (true, true), (true, false), (false, true)] {
                let mut want = vec![0.0; x.len()];
                for r in 0..rows {
                    let row = &x[r * cols..(r + 1) * cols];
                    let mean = row.iter().sum::<f64>() / cols as f64;
                    let var =
                        row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols as f64;
                    for j in 0..cols {
                        let y = (row[j] - mean) / (var + 1e-5).sqrt();
                        let y = if use_w { y * w[j] } else { y };
                        want[r * cols + j] = if use_b { y + b[j] } else { y };
                    }
                }
                let (wo, bo) = (use_w.then_some(w.as_slice()), use_b.then_some(b.as_slice()));
                let mut out = vec![f64::NAN; x.len()];
                layernorm(cols, 1e-5, wo, bo, &x, &mut out).unwrap();
                assert_close(&out, &want, 1e-12, "f64");
                let (w32, b32) = (cast::<f32>(&w), cast::<f32>(&b));
                let (wo, bo) = (
                    use_w.then_some(w32.as_slice()),
                    use_b.then_some(b32.as_slice()),
                );
                let mut out32 = vec![f32::NAN; x.len()];
                layernorm(cols, 1e-5, wo, bo, &cast(&x), &mut out32).unwrap();
                assert_close(&out32, &want, 1e-5, "f32");
            }
        }
    }
}
