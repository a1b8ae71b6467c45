//! FFT convolution.
//!
//! Only the outputs whose windows touch the input need a transform (the
//! others, reading padding alone, are the bias), and they read only part of
//! the padded plane: a `Span` per dimension. That part of each zero-padded
//! input plane is placed in an `fft_h x fft_w` buffer (`fft_h >= span.len`
//! per dimension, both 2^a 3^b 5^c so the FFTs are fast), so the circular
//! correlation the FFT computes equals the linear one at every position an
//! output reads. Huge padding with a stride longer than the kernel thus
//! costs what the input does, not what the padded plane would.
//!
//! Per output channel the products
//! `X_c ⊙ conj(K_oc,c)` are summed over the group's input channels in the
//! frequency domain, and one inverse FFT per (image, output channel) gives
//! the stride-1 correlation, which is sampled at `(y * stride, x * stride)`.
//!
//! Spectra are laid out `[fft_w / 2 + 1, fft_h]` (transposed), so both the
//! column FFTs and the frequency-domain products run over contiguous memory.
//! `conj(K)` is small-support: rather than FFT a mostly-zero plane, it is
//! evaluated as a separable DFT of the `kh x kw` taps (dilation only changes
//! the phase), once per (output channel, input channel) and shared by every
//! image of a chunk of the batch.

use std::sync::Arc;

use rayon::prelude::*;
use realfft::{ComplexToReal, RealFftPlanner, RealToComplex};
use rustfft::num_complex::Complex;
use rustfft::{Fft, FftPlanner};

use super::{valid_range, SharedMut, WORKSPACE_ELEMENTS};
use crate::alloc::{
    check_len, checked_product, try_vec_with_capacity, try_zeroed_vec, KernelError, KernelResult,
};
use crate::params::Conv2dParams;
use crate::Float;

/// The smallest `n' >= n` of the form 2^a 3^b 5^c (with `a >= 1` when
/// `even`), or `None` when it does not fit in `usize`.
///
/// Found by walking the products of powers of 3 and 5 and doubling each up
/// to `n`: a few hundred steps whatever `n`, where testing `n, n + 1, ...`
/// in turn would take billions of steps for a padded size of 10^12.
fn fft_len(n: usize, even: bool) -> Option<usize> {
    let n = n.max(1);
    let mut best: Option<usize> = None;
    let mut p5 = 1usize;
    loop {
        let mut p35 = p5;
        loop {
            let mut m = if even { p35.checked_mul(2) } else { Some(p35) };
            while let Some(v) = m.filter(|&v| v < n) {
                m = v.checked_mul(2);
            }
            if let Some(v) = m {
                best = Some(best.map_or(v, |b| b.min(v)));
            }
            match p35.checked_mul(3) {
                Some(v) if p35 < n => p35 = v,
                _ => break,
            }
        }
        match p5.checked_mul(5) {
            Some(v) if p5 < n => p5 = v,
            _ => break,
        }
    }
    best
}

/// The outputs along one dimension whose windows touch the input, and the
/// stretch of the padded input they read.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Span {
    /// The first such output.
    first: usize,
    /// How many outputs from `first` on touch the input; 0 when none does.
    count: usize,
    /// Padded positions they read, from `first * stride` on:
    /// `(count - 1) * stride + effective kernel`.
    len: usize,
    /// Input positions before the stretch (it starts inside the input).
    skip: usize,
    /// Where the first input position the stretch holds falls in it.
    at: usize,
    /// The stride.
    stride: usize,
}

impl Span {
    /// The span of a dimension of `n` inputs after `before` padding, read by
    /// `out` windows of `eff` positions every `stride`.
    fn new(n: usize, before: usize, stride: usize, eff: usize, out: usize) -> Self {
        // Output x reads [x * stride, x * stride + eff); the input lies in
        // [before, before + n). The first output touching it is the first
        // whose last tap lands in it, the last the last whose first tap
        // does. Sizes were checked to fit (the padded size is a usize), so
        // nothing overflows: first < end gives first * stride < before + n.
        let (first, _) = valid_range(out, n, stride, eff - 1, before);
        let (_, end) = valid_range(out, n, stride, 0, before);
        if n == 0 || first >= end {
            return Self {
                first: 0,
                count: 0,
                len: 0,
                skip: 0,
                at: 0,
                stride,
            };
        }
        let count = end - first;
        let begin = first * stride;
        Self {
            first,
            count,
            len: (count - 1) * stride + eff,
            skip: begin.saturating_sub(before),
            at: before.saturating_sub(begin),
            stride,
        }
    }

    /// The input positions (of `n`) the stretch holds, and where the first
    /// falls in it.
    fn inputs(&self, n: usize) -> (std::ops::Range<usize>, usize) {
        let end = n.min(self.skip.saturating_add(self.len.saturating_sub(self.at)));
        (self.skip..end.max(self.skip), self.at)
    }
}

/// The height and width spans of a problem.
fn spans(p: &Conv2dParams) -> (Span, Span) {
    (
        Span::new(
            p.in_h,
            p.padding.top,
            p.stride.0,
            p.effective_kernel_h(),
            p.out_h(),
        ),
        Span::new(
            p.in_w,
            p.padding.left,
            p.stride.1,
            p.effective_kernel_w(),
            p.out_w(),
        ),
    )
}

/// FFT sizes of a problem: `(fft_h, fft_w, fft_w / 2 + 1)`, or an overflow
/// error when the read part of the padded input is too large for FFT sizes
/// that fit in `usize`.
pub fn fft_shape(p: &Conv2dParams) -> KernelResult<(usize, usize, usize)> {
    let overflow = |what| KernelError::Overflow { what };
    let (sh, sw) = spans(p);
    let h = fft_len(sh.len, false).ok_or(overflow("FFT height"))?;
    let w = fft_len(sw.len, true).ok_or(overflow("FFT width"))?;
    Ok((h, w, w / 2 + 1))
}

/// Scratch elements (complex values) one call needs: the spectra of a chunk of
/// the batch plus each thread's accumulators. The registry's workspace
/// estimate reads this.
pub fn workspace_complex_elements(p: &Conv2dParams) -> KernelResult<usize> {
    const WHAT: &str = "FFT workspace";
    let (h, w, wc) = fft_shape(p)?;
    let spec = checked_product(WHAT, &[h, wc])?;
    let images = images_per_chunk(p, spec);
    let threads = rayon::current_num_threads();
    let spectra = checked_product(WHAT, &[images, p.in_channels, spec])?;
    let per_thread = checked_product(WHAT, &[images + 1, spec])?
        .checked_add(checked_product(WHAT, &[h, w])?)
        .ok_or(KernelError::Overflow { what: WHAT })?;
    spectra
        .checked_add(checked_product(WHAT, &[threads, per_thread])?)
        .ok_or(KernelError::Overflow { what: WHAT })
}

/// Images whose input spectra are held at once, bounding memory for big batches.
fn images_per_chunk(p: &Conv2dParams, spec: usize) -> usize {
    (WORKSPACE_ELEMENTS / p.in_channels.saturating_mul(spec).max(1)).clamp(1, p.batch.max(1))
}

/// `e^{+2πi·(a·b mod n)/n}` computed in f64, the product reduced exactly
/// (in 128 bits) whatever the sizes.
fn twiddle<T: Float>(a: usize, b: usize, n: usize) -> Complex<T> {
    let k = (a as u128 * b as u128 % n as u128) as usize;
    let a = 2.0 * std::f64::consts::PI * (k as f64) / n as f64;
    let c = |v: f64| T::from_f64(v).unwrap_or_else(T::zero);
    Complex::new(c(a.cos()), c(a.sin()))
}

/// Plans and tables shared by every task of one call.
struct Plan<T: Float> {
    h: usize,
    w: usize,
    wc: usize,
    r2c: Arc<dyn RealToComplex<T>>,
    c2r: Arc<dyn ComplexToReal<T>>,
    col_fwd: Arc<dyn Fft<T>>,
    col_inv: Arc<dyn Fft<T>>,
    /// Real and imaginary parts of `e^{+2πi·u·ky·dh/fft_h}`, each `[kh, fft_h]`.
    eh: (Vec<T>, Vec<T>),
    /// `[wc, kw]`: `e^{+2πi·v·kx·dw/fft_w}`.
    ew: Vec<Complex<T>>,
    scratch_len: usize,
}

impl<T: Float> Plan<T> {
    /// Plans the FFTs of `(h, w, wc)` (from [`fft_shape`]) and tabulates the
    /// kernel's twiddles.
    fn new(p: &Conv2dParams, (h, w, wc): (usize, usize, usize)) -> KernelResult<Self> {
        const WHAT: &str = "FFT twiddle tables";
        // The tables before the plans: they are the larger, and the plans'
        // own tables (a few times h + w values) cannot be allocated fallibly.
        let mut ehr = try_vec_with_capacity(checked_product(WHAT, &[p.kernel_h, h])?, WHAT)?;
        let mut ehi = try_vec_with_capacity(ehr.capacity(), WHAT)?;
        for ky in 0..p.kernel_h {
            for u in 0..h {
                // ky * dilation < span.len <= h: no overflow.
                let z: Complex<T> = twiddle(u, ky * p.dilation.0, h);
                ehr.push(z.re);
                ehi.push(z.im);
            }
        }
        let mut ew = try_vec_with_capacity(checked_product(WHAT, &[wc, p.kernel_w])?, WHAT)?;
        for v in 0..wc {
            ew.extend((0..p.kernel_w).map(|kx| twiddle(v, kx * p.dilation.1, w)));
        }
        let mut real = RealFftPlanner::<T>::new();
        let mut cplx = FftPlanner::<T>::new();
        let r2c = real.plan_fft_forward(w);
        let c2r = real.plan_fft_inverse(w);
        let col_fwd = cplx.plan_fft_forward(h);
        let col_inv = cplx.plan_fft_inverse(h);
        let eh = (ehr, ehi);
        let scratch_len = r2c
            .get_scratch_len()
            .max(c2r.get_scratch_len())
            .max(col_fwd.get_inplace_scratch_len())
            .max(col_inv.get_inplace_scratch_len())
            .max(1);
        Ok(Self {
            h,
            w,
            wc,
            r2c,
            c2r,
            col_fwd,
            col_inv,
            eh,
            ew,
            scratch_len,
        })
    }

    /// Complex values in one spectrum.
    fn spec(&self) -> usize {
        self.h * self.wc
    }
}

/// Per-thread buffers, reused across the tasks a thread runs.
struct Buffers<T: Float> {
    real: Vec<T>,
    rows: Vec<Complex<T>>,
    scratch: Vec<Complex<T>>,
    /// One interleaved spectrum, `[wc, fft_h]`, for the column FFTs.
    cols: Vec<Complex<T>>,
    /// Split accumulators, `[nb, 2, wc, fft_h]`.
    acc: Vec<T>,
    /// Split `conj(K)` of one frequency column: `[2, fft_h]`.
    kern: Vec<T>,
    taps: Vec<Complex<T>>,
}

impl<T: Float> Buffers<T> {
    /// Buffers for the FFTs, with accumulators for `images` images and the
    /// taps of a `kh`-row kernel (none of either for the forward transforms).
    fn new(plan: &Plan<T>, images: usize, kh: usize) -> KernelResult<Self> {
        const WHAT: &str = "per-thread FFT buffers";
        let acc = checked_product(WHAT, &[images, 2, plan.spec()])?;
        Ok(Self {
            real: try_zeroed_vec(plan.w, WHAT)?,
            rows: try_zeroed_vec(plan.wc, WHAT)?,
            scratch: try_zeroed_vec(plan.scratch_len, WHAT)?,
            cols: try_zeroed_vec(plan.spec(), WHAT)?,
            acc: try_zeroed_vec(acc, WHAT)?,
            kern: try_zeroed_vec(2 * plan.h, WHAT)?,
            taps: try_zeroed_vec(checked_product(WHAT, &[kh, plan.wc])?, WHAT)?,
        })
    }
}

/// FFT 2-D convolution (see the [module contract](super)).
///
/// Filter spectra depend on the FFT size and so on the input size: they are
/// computed per call, once per (output channel, input channel) for each chunk
/// of the batch.
///
/// Fails, before writing anything, when a buffer has the wrong length or the
/// spectra (at least as large as the read part of the padded input) overflow or cannot be
/// allocated; a refused per-thread buffer fails the call too (some of the
/// output may then have been written).
pub fn conv2d<T: Float>(
    p: &Conv2dParams,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
) -> KernelResult<()> {
    p.check_buffers(input.len(), bias.map(<[T]>::len), output.len())?;
    check_len("conv2d weight", weight.len(), p.weight_len())?;
    if p.output_len() == 0 {
        return Ok(());
    }
    let (sh, sw) = spans(p);
    if sh.count == 0 || sw.count == 0 {
        // Every window reads padding alone.
        let plane = p.out_h() * p.out_w();
        for (o, dst) in output.chunks_exact_mut(plane).enumerate() {
            dst.fill(bias.map_or(T::zero(), |b| b[o % p.out_channels]));
        }
        return Ok(());
    }
    const WHAT: &str = "FFT input spectra";
    let shape = fft_shape(p)?;
    let spec = checked_product(WHAT, &[shape.0, shape.2])?;
    let spec2 = checked_product(WHAT, &[2, spec])?;
    let chunk = images_per_chunk(p, spec);
    // Split layout: per (image, channel) `[2, wc, fft_h]`, real parts first.
    let mut spectra = try_zeroed_vec(checked_product(WHAT, &[chunk, p.in_channels, spec2])?, WHAT)?;
    let plan = Plan::<T>::new(p, shape)?;
    let out = SharedMut(output.as_mut_ptr());
    let plane_out = p.out_h() * p.out_w();
    for n0 in (0..p.batch).step_by(chunk) {
        let nb = chunk.min(p.batch - n0);
        let spectra = &mut spectra[..nb * p.in_channels * spec2];
        // Each thread's buffers: a refused allocation fails that thread's
        // tasks, and the first such error is the call's.
        spectra
            .par_chunks_mut(spec2)
            .with_min_len(super::min_len(p))
            .enumerate()
            .try_for_each_init(
                || Buffers::new(&plan, 0, 0),
                |buf, (i, dst)| -> KernelResult<()> {
                    let buf = buf.as_mut().map_err(|e| e.clone())?;
                    let plane_len = p.in_h * p.in_w;
                    let plane = &input[(n0 * p.in_channels + i) * plane_len..][..plane_len];
                    forward(p, (sh, sw), &plan, plane, dst, buf);
                    Ok(())
                },
            )?;
        let spectra = &*spectra;
        (0..p.out_channels)
            .into_par_iter()
            .with_min_len(super::min_len(p))
            .try_for_each_init(
                || Buffers::new(&plan, nb, p.kernel_h),
                |buf, o| -> KernelResult<()> {
                    let buf = buf.as_mut().map_err(|e| e.clone())?;
                    accumulate(p, &plan, o, nb, spectra, weight, buf);
                    for i in 0..nb {
                        let start = ((n0 + i) * p.out_channels + o) * plane_out;
                        // SAFETY: each (image, output channel) plane is written by
                        // exactly one task, and it lies inside `output`.
                        let dst = unsafe { plane_mut(out, start, plane_out) };
                        let b = bias.map_or(T::zero(), |b| b[o]);
                        inverse(p, (sh, sw), &plan, i, b, dst, buf);
                    }
                    Ok(())
                },
            )?;
    }
    Ok(())
}

/// The `len` elements of the shared output starting at `start`.
///
/// # Safety
/// The range must lie inside the buffer and be touched by no other task.
unsafe fn plane_mut<'a, T>(out: SharedMut<T>, start: usize, len: usize) -> &'a mut [T] {
    std::slice::from_raw_parts_mut(out.0.add(start), len)
}

/// Writes the split spectrum `[2, wc, fft_h]` of the part of one input plane
/// the spans read, placed where the spans put it in an otherwise zero
/// `fft_h x fft_w` buffer.
fn forward<T: Float>(
    p: &Conv2dParams,
    (sh, sw): (Span, Span),
    plan: &Plan<T>,
    plane: &[T],
    dst: &mut [T],
    buf: &mut Buffers<T>,
) {
    let h = plan.h;
    buf.cols.fill(Complex::new(T::zero(), T::zero()));
    let (rows, top) = sh.inputs(p.in_h);
    let (cols, left) = sw.inputs(p.in_w);
    let width = cols.len();
    for (u, row) in (top..).zip(plane.chunks_exact(p.in_w).skip(rows.start).take(rows.len())) {
        buf.real.fill(T::zero());
        buf.real[left..left + width].copy_from_slice(&row[cols.clone()]);
        // Lengths match the plan by construction, so this cannot fail.
        let _ = plan
            .r2c
            .process_with_scratch(&mut buf.real, &mut buf.rows, &mut buf.scratch);
        for (v, &z) in buf.rows.iter().enumerate() {
            buf.cols[v * h + u] = z;
        }
    }
    plan.col_fwd
        .process_with_scratch(&mut buf.cols, &mut buf.scratch);
    let (re, im) = dst.split_at_mut(plan.spec());
    for ((r, i), z) in re.iter_mut().zip(im.iter_mut()).zip(&buf.cols) {
        *r = z.re;
        *i = z.im;
    }
}

/// Sums `X_c ⊙ conj(K_o,c)` over output channel `o`'s input channels into
/// `buf.acc` (`[nb, 2, wc, fft_h]`).
///
/// `conj(K)` is built one frequency column at a time (`kh` complex
/// multiply-adds per bin) and used at once by every image of the chunk; the
/// split layout lets both loops vectorise.
fn accumulate<T: Float>(
    p: &Conv2dParams,
    plan: &Plan<T>,
    o: usize,
    nb: usize,
    spectra: &[T],
    weight: &[T],
    buf: &mut Buffers<T>,
) {
    let (h, wc) = (plan.h, plan.wc);
    let (kh, kw) = (p.kernel_h, p.kernel_w);
    let spec = plan.spec();
    let icg = p.in_channels_per_group();
    let g = o / p.out_channels_per_group();
    let zero = Complex::new(T::zero(), T::zero());
    // Sized by `Buffers::new` for this chunk.
    buf.acc[..nb * 2 * spec].fill(T::zero());
    let (ehr, ehi) = (&plan.eh.0, &plan.eh.1);
    for c in 0..icg {
        let w = &weight[(o * icg + c) * kh * kw..][..kh * kw];
        // taps[ky][v] = sum_kx w[ky, kx] e^{+2πi v kx dw / fft_w}
        for ky in 0..kh {
            for v in 0..wc {
                let e = &plan.ew[v * kw..][..kw];
                let mut s = zero;
                for (&wv, &ev) in w[ky * kw..][..kw].iter().zip(e) {
                    s = s + ev * wv;
                }
                buf.taps[ky * wc + v] = s;
            }
        }
        let ci = g * icg + c;
        for v in 0..wc {
            // kern[u] = conj(K)[u, v] = sum_ky e^{+2πi u ky dh / fft_h} taps[ky][v]
            let (kr, ki) = buf.kern.split_at_mut(h);
            kr.fill(T::zero());
            ki.fill(T::zero());
            for ky in 0..kh {
                let t = buf.taps[ky * wc + v];
                add_scaled(kr, ki, &ehr[ky * h..][..h], &ehi[ky * h..][..h], t);
            }
            for i in 0..nb {
                let x = &spectra[(i * p.in_channels + ci) * 2 * spec..][..2 * spec];
                let xr = &x[v * h..][..h];
                let xi = &x[spec + v * h..][..h];
                let (ar, ai) = buf.acc[i * 2 * spec..][..2 * spec].split_at_mut(spec);
                let ar = &mut ar[v * h..][..h];
                let ai = &mut ai[v * h..][..h];
                add_product(ar, ai, (xr, xi), (kr, ki));
            }
        }
    }
}

/// `(re, im) += (er, ei) * t`, elementwise in split complex form.
///
/// The loops of [`accumulate`] live in functions of their own, whose slice
/// arguments the compiler knows do not alias, and index slices cut to one
/// length, so they vectorise whatever the code around them.
fn add_scaled<T: Float>(re: &mut [T], im: &mut [T], er: &[T], ei: &[T], t: Complex<T>) {
    let n = re.len();
    let (im, er, ei) = (&mut im[..n], &er[..n], &ei[..n]);
    for u in 0..n {
        re[u] += er[u] * t.re - ei[u] * t.im;
        im[u] += er[u] * t.im + ei[u] * t.re;
    }
}

/// `(ar, ai) += (xr, xi) * (kr, ki)`, elementwise in split complex form.
fn add_product<T: Float>(
    ar: &mut [T],
    ai: &mut [T],
    (xr, xi): (&[T], &[T]),
    (kr, ki): (&[T], &[T]),
) {
    let n = ar.len();
    let (ai, xr, xi, kr, ki) = (&mut ai[..n], &xr[..n], &xi[..n], &kr[..n], &ki[..n]);
    for u in 0..n {
        let (x_r, x_i, k_r, k_i) = (xr[u], xi[u], kr[u], ki[u]);
        ar[u] += x_r * k_r - x_i * k_i;
        ai[u] += x_r * k_i + x_i * k_r;
    }
}

/// Inverse-transforms image `i`'s accumulated spectrum and writes the
/// strided samples, scaled and biased, to the spans' outputs in `dst`
/// (`[out_h, out_w]`); the other outputs, reading padding alone, get the bias.
fn inverse<T: Float>(
    p: &Conv2dParams,
    (sh, sw): (Span, Span),
    plan: &Plan<T>,
    i: usize,
    bias: T,
    dst: &mut [T],
    buf: &mut Buffers<T>,
) {
    let (h, w, wc) = (plan.h, plan.w, plan.wc);
    let spec = plan.spec();
    let (ar, ai) = buf.acc[i * 2 * spec..][..2 * spec].split_at(spec);
    for ((z, &r), &im) in buf.cols.iter_mut().zip(ar).zip(ai) {
        *z = Complex::new(r, im);
    }
    plan.col_inv
        .process_with_scratch(&mut buf.cols, &mut buf.scratch);
    let scale = T::one() / T::from_usize(h * w).unwrap_or_else(T::one);
    let ow = p.out_w();
    if sh.count < p.out_h() || sw.count < ow {
        dst.fill(bias);
    }
    let rows = dst.chunks_exact_mut(ow).skip(sh.first).take(sh.count);
    for (y, out_row) in rows.enumerate() {
        let u = y * sh.stride;
        for (v, r) in buf.rows.iter_mut().enumerate() {
            *r = buf.cols[v * h + u];
        }
        // The signal is real: the DC and Nyquist bins' imaginary parts are
        // rounding noise, which realfft would reject.
        buf.rows[0].im = T::zero();
        buf.rows[wc - 1].im = T::zero();
        let _ = plan
            .c2r
            .process_with_scratch(&mut buf.rows, &mut buf.real, &mut buf.scratch);
        let outs = out_row[sw.first..][..sw.count].iter_mut();
        for (o, &r) in outs.zip(buf.real.iter().step_by(sw.stride)) {
            *o = r * scale + bias;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::test_util::{check_conv_algorithm, on_two_threads};

    #[test]
    fn fft_len_is_smooth_and_minimal() {
        assert_eq!(fft_len(7, false), Some(8));
        assert_eq!(fft_len(11, false), Some(12));
        assert_eq!(fft_len(58, true), Some(60));
        assert_eq!(fft_len(49, true), Some(50));
        assert_eq!(fft_len(13, true), Some(16));
        assert_eq!(fft_len(1, false), Some(1));
        assert_eq!(fft_len(1, true), Some(2));
        let smooth = |mut m: usize| {
            for f in [2, 3, 5] {
                while m.is_multiple_of(f) {
                    m /= f;
                }
            }
            m == 1
        };
        for n in 1..3000 {
            for even in [false, true] {
                let want = (n..).find(|&m| smooth(m) && (!even || m.is_multiple_of(2)));
                assert_eq!(fft_len(n, even), want, "{n} {even}");
            }
        }
    }

    #[test]
    fn fft_len_of_huge_sizes_is_quick_and_never_overflows() {
        // 2^40 is smooth; walking up from 10^12 one at a time took minutes.
        assert_eq!(fft_len(1 << 40, false), Some(1 << 40));
        let m = fft_len(1_000_000_000_001, true).unwrap();
        assert!(m > 1_000_000_000_001 && m.is_multiple_of(2) && m <= 1 << 40);
        assert_eq!(fft_len(usize::MAX, false), None);
        assert_eq!(fft_len(1 << 63, true), Some(1 << 63));
        // 2^10 * 3^10 * 5^16 is the next even smooth number; none lies in [2^64 - 2, 2^64).
        assert_eq!(
            fft_len((1 << 63) + 1, true),
            Some(9_226_406_250_000_000_000)
        );
        assert_eq!(fft_len(usize::MAX - 1, true), None);
    }

    #[test]
    fn wrong_lengths_are_errors_before_any_write() {
        crate::cpu::test_util::check_conv_lengths(conv2d::<f32>);
    }

    #[test]
    fn huge_padding_is_an_allocation_error() {
        crate::cpu::test_util::check_conv_refuses_huge_padding(conv2d::<f32>);
    }

    #[test]
    fn twiddles_reduce_products_exactly() {
        // big * big overflows 64 bits. 2^3 = 1 mod 7, so 2^62 = 4 and
        // big = 5 mod 7, and big * big = 25 = 4 mod 7.
        let big = (1usize << 62) + 1;
        let z: Complex<f64> = twiddle(big, big, 7);
        let angle = 2.0 * std::f64::consts::PI * 4.0 / 7.0;
        assert!(
            (z - Complex::new(angle.cos(), angle.sin())).norm() < 1e-12,
            "{z}"
        );
    }

    #[test]
    fn matches_reference() {
        check_conv_algorithm("fft", conv2d::<f32>, conv2d::<f64>);
    }

    #[test]
    fn matches_reference_on_larger_shapes() {
        crate::cpu::conv2d::padded::check_larger_shapes("fft", conv2d::<f32>, conv2d::<f64>);
    }

    /// Strides far longer than the kernel with huge padding read a few rows
    /// and columns of a padded plane millions wide: the FFT covers only
    /// those (it took half a minute over the whole plane). Also: windows
    /// that skip the input's first rows, outputs that read padding alone on
    /// either side, and planes whose every output does.
    #[test]
    fn transforms_only_what_outputs_read() {
        use crate::cpu::test_util::{check_conv_case, Rng};
        use crate::params::Padding2d;
        let mut rng = Rng::new(5);
        let pad = |top, bottom, left, right| Padding2d {
            top,
            bottom,
            left,
            right,
        };
        // (padding, stride, (in_h, in_w), (kernel_h, kernel_w), the largest FFT side)
        for (padding, stride, in_hw, k, most) in [
            (
                pad(1, 1, 100_000, 100_000),
                (100, 1_000_000),
                (40, 7),
                (9, 3),
                20,
            ),
            (pad(3, 3, 2, 2), (7, 1_000_000), (40, 7), (9, 3), 64),
            (pad(1, 1, 30, 2_000_000), (1, 1_000_000), (6, 7), (3, 3), 16),
            (pad(1, 1, 1, 1), (3, 3), (11, 10), (1, 1), 16),
            (pad(5, 0, 9, 12), (2, 3), (6, 7), (2, 2), 16),
            (pad(50, 50, 0, 0), (60, 1), (6, 7), (2, 2), 16),
            (pad(50, 50, 2, 2), (200, 200), (6, 7), (3, 3), 8),
        ] {
            let p = Conv2dParams {
                batch: 2,
                in_channels: 4,
                in_h: in_hw.0,
                in_w: in_hw.1,
                out_channels: 4,
                kernel_h: k.0,
                kernel_w: k.1,
                stride,
                padding,
                dilation: (2, 2),
                groups: 2,
            };
            let (h, w, _) = fft_shape(&p).unwrap();
            assert!(h <= most && w <= most, "{p:?}: FFT {h} x {w}");
            check_conv_case("fft", &p, &mut rng, conv2d::<f32>, conv2d::<f64>);
        }
    }

    #[test]
    fn spans_of_huge_sizes_do_not_overflow() {
        // A stride of 2^63 after 2^63 - 5 padding: output 1 reads input
        // position 5 alone, output 0 padding alone.
        let big = 1usize << 63;
        let s = Span::new(8, big - 5, big, 1, 2);
        assert_eq!((s.first, s.count, s.len, s.skip, s.at), (1, 1, 1, 5, 0));
        assert_eq!(s.inputs(8), (5..6, 0));
        // Output 1 reads its window's last position from input position 0.
        let s = Span::new(8, big, big - 1, 2, 2);
        assert_eq!((s.first, s.count, s.len, s.skip, s.at), (1, 1, 2, 0, 1));
        assert_eq!(s.inputs(8), (0..1, 1));
        assert_eq!(Span::new(8, 100, 1000, 3, 1).count, 0);
        assert_eq!(Span::new(0, 1, 1, 1, 3).count, 0);
    }

    #[test]
    fn matches_reference_on_two_threads() {
        on_two_threads(|| check_conv_algorithm("fft", conv2d::<f32>, conv2d::<f64>));
    }
}
