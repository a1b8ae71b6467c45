//! Elementwise activations: one parallel map, and the scalar formulas
//! ([`scalar`]) written exactly as PyTorch's CPU kernels compute them.

use crate::alloc::{check_len, KernelResult};
use crate::isa::multiversion;
use crate::Float;

use super::par::{for_each_chunk, CHUNK, PARALLEL_MIN};

/// The activation functions on one element, with PyTorch's formulas and NaN
/// behaviour (NaN in, NaN out).
pub mod scalar {
    use crate::Float;

    #[inline]
    fn c<T: Float>(v: f64) -> T {
        T::from_f64(v).unwrap_or_else(T::nan)
    }

    /// `max(x, 0)`.
    #[inline]
    pub fn relu<T: Float>(x: T) -> T {
        // NaN passes through, as in PyTorch. Neither arm is `x` itself: an
        // in-place map (`*v = relu(*v)`) would otherwise vectorise into a
        // masked store of the zeros, ~10x a plain store on AMD's cores.
        if x.is_nan() {
            x + x
        } else {
            x.max(T::zero())
        }
    }

    /// `x` clamped to `[min, max]`; NaN passes through.
    #[inline]
    pub fn hardtanh<T: Float>(x: T, min: T, max: T) -> T {
        if x < min {
            min
        } else if x > max {
            max
        } else {
            x
        }
    }

    /// `min(max(x, 0), 6)`.
    #[inline]
    pub fn relu6<T: Float>(x: T) -> T {
        hardtanh(x, T::zero(), c(6.0))
    }

    /// `x * relu6(x + 3) / 6`.
    #[inline]
    pub fn hardswish<T: Float>(x: T) -> T {
        x * relu6(x + c(3.0)) / c(6.0)
    }

    /// `relu6(x + 3) / 6`.
    #[inline]
    pub fn hardsigmoid<T: Float>(x: T) -> T {
        relu6(x + c(3.0)) / c(6.0)
    }

    /// `1 / (1 + exp(-x))`.
    #[inline]
    pub fn sigmoid<T: Float>(x: T) -> T {
        T::one() / (T::one() + (-x).exp())
    }

    /// `x * sigmoid(x)`, computed as `x / (1 + exp(-x))`.
    #[inline]
    pub fn silu<T: Float>(x: T) -> T {
        x / (T::one() + (-x).exp())
    }

    /// The error function. In f32 it is Abramowitz & Stegun 7.1.26 (absolute
    /// error below 1.5e-7), the formula PyTorch's vectorised CPU `erf` uses
    /// for float; in f64 it is `libm`'s correctly rounded-ish `erf`, as
    /// PyTorch uses Sleef's 1-ulp `erf` for double.
    #[inline]
    pub fn erf<T: Float>(x: T) -> T {
        if std::mem::size_of::<T>() != 4 {
            return c(libm::erf(x.to_f64().unwrap_or(f64::NAN)));
        }
        let a = x.abs();
        let t = T::one() / (c::<T>(0.3275911) * a + T::one());
        let r = (((c::<T>(1.061405429) * t + c(-1.453152027)) * t + c(1.421413741)) * t
            + c(-0.284496736))
            * t
            + c(0.254829592);
        let y = T::one() - r * t * (-(x * x)).exp();
        if x.is_sign_negative() {
            -y
        } else {
            y
        }
    }

    /// Exact GELU: `0.5 x (1 + erf(x / sqrt(2)))`.
    #[inline]
    pub fn gelu<T: Float>(x: T) -> T {
        x * c(0.5) * (T::one() + erf(x * c(std::f64::consts::FRAC_1_SQRT_2)))
    }

    /// GELU's tanh approximation: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    #[inline]
    pub fn gelu_tanh<T: Float>(x: T) -> T {
        let k: T = c((2.0 / std::f64::consts::PI).sqrt());
        let inner = k * (x + c::<T>(0.044715) * x * x * x);
        c::<T>(0.5) * x * (T::one() + inner.tanh())
    }

    /// Hyperbolic tangent.
    #[inline]
    pub fn tanh<T: Float>(x: T) -> T {
        x.tanh()
    }
}

/// `output[i] = f(input[i])`, in parallel for large inputs. Every output
/// element is written; buffers of different lengths are an error.
pub fn map<T: Float, F: Fn(T) -> T + Sync>(
    input: &[T],
    output: &mut [T],
    f: F,
) -> KernelResult<()> {
    check_len("elementwise output", output.len(), input.len())?;
    // SAFETY (both calls): plain Rust on slices, compiled for the ISA level in use.
    if input.len() >= PARALLEL_MIN {
        for_each_chunk(output, CHUNK, &|t, o| unsafe {
            map_slice(&input[t * CHUNK..][..o.len()], o, &f)
        });
    } else {
        unsafe { map_slice(input, output, &f) };
    }
    Ok(())
}

/// `data[i] = f(data[i])`, in parallel for large inputs (fused epilogues).
pub fn map_inplace<T: Float, F: Fn(T) -> T + Sync>(data: &mut [T], f: F) {
    // SAFETY (both calls): plain Rust on slices, compiled for the ISA level in use.
    if data.len() >= PARALLEL_MIN {
        for_each_chunk(data, CHUNK, &|_, c| unsafe { map_slice_inplace(c, &f) });
    } else {
        unsafe { map_slice_inplace(data, &f) };
    }
}

/// `data[i] = f(data[i])` on the calling thread (a kernel's epilogue on a
/// block one of its tasks just wrote).
pub fn map_inplace_serial<T: Float, F: Fn(T) -> T>(data: &mut [T], f: F) {
    // SAFETY: plain Rust on slices, compiled for the ISA level in use.
    unsafe { map_slice_inplace(data, &f) };
}

multiversion! {
    /// `o[i] = f(x[i])` over the shorter of the two.
    unsafe fn map_slice<T, F: Fn(T) -> T>(x: &[T], o: &mut [T], f: &F) => map_slice_impl
}

#[inline(always)]
unsafe fn map_slice_impl<T: Float, F: Fn(T) -> T>(x: &[T], o: &mut [T], f: &F) {
    for (o, &x) in o.iter_mut().zip(x) {
        *o = f(x);
    }
}

multiversion! {
    /// `d[i] = f(d[i])`.
    unsafe fn map_slice_inplace<T, F: Fn(T) -> T>(d: &mut [T], f: &F) => map_slice_inplace_impl
}

#[inline(always)]
unsafe fn map_slice_inplace_impl<T: Float, F: Fn(T) -> T>(d: &mut [T], f: &F) {
    for x in d.iter_mut() {
        *x = f(*x);
    }
}

/// `output[i] = max(input[i], 0)`, with `relu(NaN) = NaN` like PyTorch.
pub fn relu<T: Float>(input: &[T], output: &mut [T]) -> KernelResult<()> {
    map(input, output, scalar::relu)
}

/// [`relu`] in place.
pub fn relu_inplace<T: Float>(data: &mut [T]) {
    map_inplace(data, scalar::relu);
}

/// The activations with an f32 vector kernel: each needs `exp`, which the C
/// library computes one element at a time (3-6 ns per element here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vectorised {
    /// GELU, exact or (`tanh`) in its tanh form.
    Gelu {
        /// PyTorch's `approximate='tanh'`.
        tanh: bool,
    },
    /// `x * sigmoid(x)`.
    Silu,
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
}

impl Vectorised {
    /// The [`scalar`] form of this activation.
    fn scalar(self, x: f32) -> f32 {
        match self {
            Vectorised::Gelu { tanh: false } => scalar::gelu(x),
            Vectorised::Gelu { tanh: true } => scalar::gelu_tanh(x),
            Vectorised::Silu => scalar::silu(x),
            Vectorised::Sigmoid => scalar::sigmoid(x),
        }
    }
}

/// `act` on f32 in place, in parallel for large inputs: by hand with AVX-512
/// and AVX2, one set of formulas for both levels (a rational `erf`, the
/// logistic through a table of `2^(j/8)`; without them, ConvNeXt's 56x56
/// GELU layers took 6 ns per element and EfficientNet's SiLU about 3),
/// else [`scalar`]'s per element.
pub fn vectorised_f32_inplace(data: &mut [f32], act: Vectorised) {
    if data.len() >= PARALLEL_MIN {
        for_each_chunk(data, CHUNK, &|_, c| vectorised_f32_serial(c, act));
    } else {
        vectorised_f32_serial(data, act);
    }
}

/// [`vectorised_f32_inplace`] on the calling thread (a kernel's epilogue).
pub fn vectorised_f32_serial(data: &mut [f32], act: Vectorised) {
    #[cfg(target_arch = "x86_64")]
    if crate::isa::avx512() {
        // SAFETY: avx512f is available.
        unsafe { apply_avx512(data, act) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::isa::level() >= crate::isa::Isa::Avx2 {
        // SAFETY: AVX2 and FMA are available.
        unsafe { apply_avx2(data, act) };
        return;
    }
    data.iter_mut().for_each(|x| *x = act.scalar(*x));
}

/// The vector operations the activations' formulas take, on 8 lanes
/// (`__m256`, AVX2 and FMA) or 16 (`__m512`, AVX-512F), so that one set of
/// formulas ([`act_lanes`]) serves both levels. Every method is one
/// instruction or two and `#[inline(always)]`, without `#[target_feature]`:
/// each inlines into the `#[target_feature]` entry point that calls it
/// ([`apply_avx2`], [`apply_avx512`]), the only places they run. Keep each
/// method one expression: one of several statements (a single method that
/// converted, permuted and shifted for `2^(k/8)`) was left a call from the
/// closures of [`each`], its intrinsics called too, and the AVX-512
/// logistic forms took 15x the time.
///
/// # Safety
/// Every method needs the CPU level of its type.
#[cfg(target_arch = "x86_64")]
trait Lanes: Copy {
    /// Lanes of a vector.
    const LEN: usize;
    unsafe fn splat(v: f32) -> Self;
    /// `LEN` values from `p`.
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(self, p: *mut f32);
    /// The first `len < LEN` values from `p`, the other lanes zero.
    unsafe fn load_first(p: *const f32, len: usize) -> Self;
    /// Stores the first `len < LEN` lanes at `p`.
    unsafe fn store_first(self, p: *mut f32, len: usize);
    unsafe fn add(self, o: Self) -> Self;
    unsafe fn sub(self, o: Self) -> Self;
    unsafe fn mul(self, o: Self) -> Self;
    unsafe fn div(self, o: Self) -> Self;
    /// `self * b + c`, fused.
    unsafe fn fmadd(self, b: Self, c: Self) -> Self;
    /// The smaller; `o` where either is NaN.
    unsafe fn min(self, o: Self) -> Self;
    /// The larger; `o` where either is NaN.
    unsafe fn max(self, o: Self) -> Self;
    /// To the nearest integer.
    unsafe fn round(self) -> Self;
    /// The integer lanes of the same width.
    type Int: Copy;
    /// [`EXP2_EIGHTHS`], indexed by the low 3 bits of a lane ([`Lanes::permute`]).
    unsafe fn eighths() -> Self;
    /// To integers, rounding to the nearest.
    unsafe fn to_int(self) -> Self::Int;
    /// `table`'s lane `k & 7` in each lane ([`Lanes::eighths`]'s layout).
    unsafe fn permute(table: Self, k: Self::Int) -> Self;
    /// `(k >> 3) << 23`: `2^(k >> 3)` as an addend to a float's exponent bits.
    unsafe fn exponent_bits(k: Self::Int) -> Self::Int;
    /// `e` added to the lanes' bits.
    unsafe fn add_bits(self, e: Self::Int) -> Self;
}

#[cfg(target_arch = "x86_64")]
impl Lanes for std::arch::x86_64::__m256 {
    const LEN: usize = 8;
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        unsafe { std::arch::x86_64::_mm256_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe { std::arch::x86_64::_mm256_storeu_ps(p, self) }
    }
    #[inline(always)]
    unsafe fn load_first(p: *const f32, len: usize) -> Self {
        let mut lanes = [0.0f32; 8];
        // SAFETY: the caller's `len` values at `p`, into 8 lanes.
        unsafe {
            std::ptr::copy_nonoverlapping(p, lanes.as_mut_ptr(), len.min(8));
            Self::load(lanes.as_ptr())
        }
    }
    #[inline(always)]
    unsafe fn store_first(self, p: *mut f32, len: usize) {
        let mut lanes = [0.0f32; 8];
        // SAFETY: 8 lanes out, the caller's `len` of them to `p`.
        unsafe {
            self.store(lanes.as_mut_ptr());
            std::ptr::copy_nonoverlapping(lanes.as_ptr(), p, len.min(8));
        }
    }
    #[inline(always)]
    unsafe fn add(self, o: Self) -> Self {
        unsafe { std::arch::x86_64::_mm256_add_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn sub(self, o: Self) -> Self {
        unsafe { std::arch::x86_64::_mm256_sub_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn mul(self, o: Self) -> Self {
        unsafe { std::arch::x86_64::_mm256_mul_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn div(self, o: Self) -> Self {
        unsafe { std::arch::x86_64::_mm256_div_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn fmadd(self, b: Self, c: Self) -> Self {
        unsafe { std::arch::x86_64::_mm256_fmadd_ps(self, b, c) }
    }
    #[inline(always)]
    unsafe fn min(self, o: Self) -> Self {
        unsafe { std::arch::x86_64::_mm256_min_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn max(self, o: Self) -> Self {
        unsafe { std::arch::x86_64::_mm256_max_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn round(self) -> Self {
        use std::arch::x86_64::*;
        unsafe { _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(self) }
    }
    type Int = std::arch::x86_64::__m256i;
    #[inline(always)]
    unsafe fn eighths() -> Self {
        unsafe { Self::load(EXP2_EIGHTHS.as_ptr()) }
    }
    #[inline(always)]
    unsafe fn to_int(self) -> Self::Int {
        unsafe { std::arch::x86_64::_mm256_cvtps_epi32(self) }
    }
    #[inline(always)]
    unsafe fn permute(table: Self, k: Self::Int) -> Self {
        unsafe { std::arch::x86_64::_mm256_permutevar8x32_ps(table, k) }
    }
    #[inline(always)]
    unsafe fn exponent_bits(k: Self::Int) -> Self::Int {
        use std::arch::x86_64::*;
        unsafe { _mm256_slli_epi32::<23>(_mm256_srai_epi32::<3>(k)) }
    }
    #[inline(always)]
    unsafe fn add_bits(self, e: Self::Int) -> Self {
        use std::arch::x86_64::*;
        unsafe { _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(self), e)) }
    }
}

#[cfg(target_arch = "x86_64")]
impl Lanes for std::arch::x86_64::__m512 {
    const LEN: usize = 16;
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        unsafe { std::arch::x86_64::_mm512_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe { std::arch::x86_64::_mm512_storeu_ps(p, self) }
    }
    #[inline(always)]
    unsafe fn load_first(p: *const f32, len: usize) -> Self {
        // SAFETY: the mask covers the caller's `len` values.
        unsafe { std::arch::x86_64::_mm512_maskz_loadu_ps(first_lanes(len), p) }
    }
    #[inline(always)]
    unsafe fn store_first(self, p: *mut f32, len: usize) {
        // SAFETY: the mask covers the caller's `len` values.
        unsafe { std::arch::x86_64::_mm512_mask_storeu_ps(p, first_lanes(len), self) }
    }
    #[inline(always)]
    unsafe fn add(self, o: Self) -> Self {
        unsafe { std::arch::x86_64::_mm512_add_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn sub(self, o: Self) -> Self {
        unsafe { std::arch::x86_64::_mm512_sub_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn mul(self, o: Self) -> Self {
        unsafe { std::arch::x86_64::_mm512_mul_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn div(self, o: Self) -> Self {
        unsafe { std::arch::x86_64::_mm512_div_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn fmadd(self, b: Self, c: Self) -> Self {
        unsafe { std::arch::x86_64::_mm512_fmadd_ps(self, b, c) }
    }
    #[inline(always)]
    unsafe fn min(self, o: Self) -> Self {
        unsafe { std::arch::x86_64::_mm512_min_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn max(self, o: Self) -> Self {
        unsafe { std::arch::x86_64::_mm512_max_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn round(self) -> Self {
        use std::arch::x86_64::*;
        unsafe { _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(self) }
    }
    type Int = std::arch::x86_64::__m512i;
    #[inline(always)]
    unsafe fn eighths() -> Self {
        // The eighths in both halves, so the permute's fourth index bit does
        // not matter.
        unsafe { Self::load(EXP2_EIGHTHS_TWICE.as_ptr()) }
    }
    #[inline(always)]
    unsafe fn to_int(self) -> Self::Int {
        unsafe { std::arch::x86_64::_mm512_cvtps_epi32(self) }
    }
    #[inline(always)]
    unsafe fn permute(table: Self, k: Self::Int) -> Self {
        unsafe { std::arch::x86_64::_mm512_permutexvar_ps(k, table) }
    }
    #[inline(always)]
    unsafe fn exponent_bits(k: Self::Int) -> Self::Int {
        use std::arch::x86_64::*;
        unsafe { _mm512_slli_epi32::<23>(_mm512_srai_epi32::<3>(k)) }
    }
    #[inline(always)]
    unsafe fn add_bits(self, e: Self::Int) -> Self {
        use std::arch::x86_64::*;
        unsafe { _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(self), e)) }
    }
}

/// The mask of the first `len` of 16 lanes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn first_lanes(len: usize) -> std::arch::x86_64::__mmask16 {
    ((1u32 << len.min(16)) - 1) as std::arch::x86_64::__mmask16
}

/// `act` over `data` in place with AVX2 and FMA ([`apply_lanes`] on 8
/// lanes).
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn apply_avx2(data: &mut [f32], act: Vectorised) {
    // SAFETY: the caller's promise.
    unsafe { apply_lanes::<std::arch::x86_64::__m256>(data, act) }
}

/// `act` over `data` in place with AVX-512 ([`apply_lanes`] on 16 lanes).
/// Before it shared AVX2's formulas, this level computed exact GELU with
/// Abramowitz and Stegun's `erf` and a full `exp` (two divisions a vector)
/// and the logistic forms with that `exp`, one vector at a time: on a Zen
/// 4 (one thread, in L1, the faster of 5 runs each) the shared formulas
/// took 0.65x the time on exact GELU, 0.73x on tanh-GELU, SiLU and
/// sigmoid, and a 1x1 layer's SiLU epilogue (EfficientNet's expansions,
/// two threads) added 22% to the convolution's time where it had added
/// 31% (geometric means over seven shapes).
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn apply_avx512(data: &mut [f32], act: Vectorised) {
    // SAFETY: the caller's promise.
    unsafe { apply_lanes::<std::arch::x86_64::__m512>(data, act) }
}

/// `act` over `data` in place: [`side_by_side`] vectors at a time
/// ([`act_lanes`]), then single vectors, then the tail in one vector
/// (zero-padded). Inlined into the `#[target_feature]` entry points.
///
/// # Safety
/// The CPU has `V`'s level.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn apply_lanes<V: Lanes>(data: &mut [f32], act: Vectorised) {
    // SAFETY: the caller's promise.
    unsafe {
        match side_by_side(act) {
            3 => apply_by::<V, 3>(data, act),
            _ => apply_by::<V, 2>(data, act),
        }
    }
}

/// Vectors [`apply_lanes`] computes side by side for `act`, each step of
/// the formula applied to all of them before the next, so that their
/// dependency chains (a polynomial's FMAs, a division) interleave: one
/// vector's chain at a time left Zen 1's pipes waiting on latencies, its
/// scheduler holding too few of the next vector's operations to fill them.
/// Measured there (AVX2, one thread, in L1, ns an element against one
/// vector at a time): exact GELU 1.80 -> 1.30 by two, 1.15 by three, 1.16
/// by four; SiLU 0.95 -> 0.91 by two, 0.95-0.98 by three or four;
/// tanh-GELU 1.25 -> 1.16 by two, then (with [`one_plus_exp_neg`]'s table)
/// 0.92x that by three.
#[cfg(target_arch = "x86_64")]
fn side_by_side(act: Vectorised) -> usize {
    match act {
        Vectorised::Gelu { .. } => 3,
        _ => 2,
    }
}

/// [`apply_lanes`] with `N` vectors side by side.
///
/// # Safety
/// The CPU has `V`'s level.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn apply_by<V: Lanes, const N: usize>(data: &mut [f32], act: Vectorised) {
    let mut groups = data.chunks_exact_mut(V::LEN * N);
    for c in &mut groups {
        // SAFETY: c holds LEN * N values; the CPU has V's level (the
        // caller's promise).
        unsafe {
            let p = c.as_mut_ptr();
            let v = act_lanes::<V, N>(each(|i| V::load(p.add(V::LEN * i))), act);
            for (i, v) in v.into_iter().enumerate() {
                v.store(p.add(V::LEN * i));
            }
        }
    }
    let mut chunks = groups.into_remainder().chunks_exact_mut(V::LEN);
    for c in &mut chunks {
        // SAFETY: c holds LEN values; as above.
        unsafe {
            let [v] = act_lanes::<V, 1>([V::load(c.as_ptr())], act);
            v.store(c.as_mut_ptr());
        }
    }
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        // SAFETY: the tail's len < LEN values; as above.
        unsafe {
            let [v] = act_lanes::<V, 1>([V::load_first(tail.as_ptr(), tail.len())], act);
            v.store_first(tail.as_mut_ptr(), tail.len());
        }
    }
}

/// `f(i)` for each of `N` vectors: one step of a formula on all of them.
///
/// Keep each step's closure one expression of intrinsics: LLVM inlines
/// those, but kept a closure of several statements (one that built the
/// exponent's bits) as a call, its intrinsics called too: 4.8x the time.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn each<T, const N: usize>(f: impl FnMut(usize) -> T) -> [T; N] {
    std::array::from_fn(f)
}

/// `v num(v^2) / den(v^2)` for `v` clamped to `[-limit, limit]` (NaN stays
/// NaN): the odd rational form of `erf` ([`act_lanes`]), the polynomials'
/// coefficients highest degree first.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn odd_rational<V: Lanes, const N: usize>(
    v: [V; N],
    limit: f32,
    num: &[f32],
    den: &[f32],
) -> [V; N] {
    // SAFETY: the CPU has V's level (the caller's promise).
    unsafe {
        // min/max return their second operand where one is NaN: v goes second.
        let (lo, hi) = (V::splat(-limit), V::splat(limit));
        let v = each::<_, N>(|i| lo.max(hi.min(v[i])));
        let s = each::<_, N>(|i| v[i].mul(v[i]));
        let mut p = [V::splat(num[0]); N];
        let mut q = [V::splat(den[0]); N];
        for k in 1..num.len().max(den.len()) {
            if let Some(c) = num.get(k) {
                p = each::<_, N>(|i| p[i].fmadd(s[i], V::splat(*c)));
            }
            if let Some(c) = den.get(k) {
                q = each::<_, N>(|i| q[i].fmadd(s[i], V::splat(*c)));
            }
        }
        each::<_, N>(|i| v[i].mul(p[i]).div(q[i]))
    }
}

/// The logistic's denominator `1 + exp(-v)` on `N` vectors, as
/// `1 + 2^(t/8)` with `t = -8 v log2(e)` clamped to `[-1008, 1024]`:
/// `2^(t/8) = 2^e 2^(j/8) 2^(f/8)` with `k = e 8 + j` the nearest integer
/// to `t` (`j` its low 3 bits), `2^(j/8)` from [`EXP2_EIGHTHS`] (a
/// permute), `2^e` added to its exponent bits and `2^(f/8)` by
/// [`EXP2_8_POLY`] (degree 3), where `k = 1024` (`e = 128`, `j = 0`) gives
/// infinity. So `v` below about -88.7 (`-inf` among them) has an infinite
/// denominator, the logistic 0 and `x / (1 + exp(-x))` NaN at `x = -inf`,
/// as PyTorch's; NaN stays NaN. Within 6.1e-7 of f64's SiLU and sigmoid
/// (relative) over `[-8, 8]`, 4e-6 down to -87: the rounding of `t` grows
/// with `|v|`.
///
/// No division or screening but the caller's one division. The table
/// spares two of a degree-5 polynomial's FMAs on `2^f` over `[-1/2,
/// 1/2]`: SiLU and sigmoid 0.91x the time, tanh-GELU 0.95x (one thread, in
/// L1, Zen 1). That form in turn took SiLU to 0.72x the time of Eigen's
/// rational logistic (11 FMAs and a division on one dependency chain),
/// which handed arguments below -9 to a slower `exp`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn one_plus_exp_neg<V: Lanes, const N: usize>(v: [V; N]) -> [V; N] {
    // SAFETY: the CPU has V's level (the caller's promise).
    unsafe {
        let m = V::splat(-8.0 * std::f32::consts::LOG2_E);
        let (lo, hi) = (V::splat(-1008.0), V::splat(1024.0));
        // min/max return their second operand where one is NaN: t goes second.
        let t = each::<_, N>(|i| lo.max(hi.min(v[i].mul(m))));
        let n = each::<_, N>(|i| t[i].round());
        let f = each::<_, N>(|i| t[i].sub(n[i]));
        let mut p = [V::splat(EXP2_8_POLY[0]); N];
        for c in &EXP2_8_POLY[1..] {
            p = each::<_, N>(|i| p[i].fmadd(f[i], V::splat(*c)));
        }
        let table = V::eighths();
        let k: [V::Int; N] = each(|i| n[i].to_int());
        let frac = each::<_, N>(|i| V::permute(table, k[i]));
        let e: [V::Int; N] = each(|i| V::exponent_bits(k[i]));
        let scale = each::<_, N>(|i| frac[i].add_bits(e[i]));
        let one = V::splat(1.0);
        each::<_, N>(|i| p[i].fmadd(scale[i], one))
    }
}

/// `2^(j/8)` for `j` in `0..8`.
#[cfg(target_arch = "x86_64")]
const EXP2_EIGHTHS: [f32; 8] = [
    1.0,
    1.090_507_7,
    1.189_207_1,
    1.296_839_6,
    std::f32::consts::SQRT_2,
    1.542_210_8,
    1.681_792_9,
    1.834_008,
];

/// [`EXP2_EIGHTHS`] twice: a 16-lane table whose lane `j + 8` is lane `j`.
#[cfg(target_arch = "x86_64")]
const EXP2_EIGHTHS_TWICE: [f32; 16] = {
    let mut t = [0.0; 16];
    let mut j = 0;
    while j < 16 {
        t[j] = EXP2_EIGHTHS[j % 8];
        j += 1;
    }
    t
};

/// `2^(f/8)` for `f` in `[-1/2, 1/2]`, degree 3, highest first.
#[cfg(target_arch = "x86_64")]
const EXP2_8_POLY: [f32; 4] = [1.083_937_5e-4, 3.754_126e-3, 8.664_340_5e-2, 1.0];

/// An activation of the form `factor(x) * sigmoid(v(x))`: SiLU (`x *
/// sigmoid(x)`), sigmoid (`1 * sigmoid(x)`) and tanh-GELU (`x * sigmoid(2 k
/// (x + 0.044715 x^3))`, `k = sqrt(2 / pi)`).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
enum Logistic {
    Silu,
    Sigmoid,
    GeluTanh,
}

#[cfg(target_arch = "x86_64")]
impl Logistic {
    /// `act`'s logistic form, if it has one.
    fn of(act: Vectorised) -> Option<Logistic> {
        match act {
            Vectorised::Silu => Some(Logistic::Silu),
            Vectorised::Sigmoid => Some(Logistic::Sigmoid),
            Vectorised::Gelu { tanh: true } => Some(Logistic::GeluTanh),
            Vectorised::Gelu { tanh: false } => None,
        }
    }

    /// `factor(x) / (1 + exp(-v(x)))` ([`one_plus_exp_neg`]) on `N`
    /// vectors.
    #[inline(always)]
    unsafe fn eval<V: Lanes, const N: usize>(self, x: [V; N]) -> [V; N] {
        // SAFETY: the CPU has V's level (the caller's promise).
        unsafe {
            let (factor, v) = match self {
                Logistic::Silu => (x, x),
                Logistic::Sigmoid => ([V::splat(1.0); N], x),
                Logistic::GeluTanh => {
                    let k2 = V::splat(2.0 * (2.0 / std::f32::consts::PI).sqrt());
                    let c = V::splat(0.044715);
                    let x3 = each::<_, N>(|i| x[i].mul(x[i]).mul(x[i]));
                    let inner = each::<_, N>(|i| c.fmadd(x3[i], x[i]));
                    (x, each::<_, N>(|i| k2.mul(inner[i])))
                }
            };
            let d = one_plus_exp_neg(v);
            each::<_, N>(|i| factor[i].div(d[i]))
        }
    }
}

/// The rational `erf` of [`act_lanes`]: `erf(z) = z p(z^2) / q(z^2)` on `z`
/// clamped to `[-4, 4]`, numerator (without its `z`) and denominator
/// highest degree first: Eigen's coefficients for its float `erf` (used by
/// XLA and TVM as well).
#[cfg(target_arch = "x86_64")]
const ERF_NUM: [f32; 7] = [
    -2.726_142_3e-10,
    2.770_681_4e-8,
    -2.101_024e-6,
    -5.692_506_4e-5,
    -7.349_906_3e-4,
    -2.954_6e-3,
    -1.609_603_3e-2,
];
#[cfg(target_arch = "x86_64")]
const ERF_DEN: [f32; 5] = [
    -1.456_607_15e-5,
    -2.133_740_5e-4,
    -1.682_827e-3,
    -7.373_329_3e-3,
    -1.426_473_9e-2,
];

/// The activations' vector formulas, on `N` vectors side by side
/// ([`side_by_side`]) of either level's lanes: [`Logistic::eval`] for the
/// logistic forms; exact GELU, `x / 2 (1 + erf(x / sqrt 2))`, with a
/// rational `erf` ([`ERF_NUM`], [`ERF_DEN`]; no `exp`): GELU within 1.5e-6
/// of f64's, 0.72 ns an element against 1.05 with Abramowitz and Stegun's
/// formula and `exp` (one thread, AVX2, in L1, a Zen 4), which PyTorch uses
/// and [`scalar::erf`] follows.
///
/// Without `#[target_feature]` so it may be `#[inline(always)]`: LLVM
/// declined to inline it, and a call per vector (the vector passed through
/// memory, `act` matched each time) cost more than the formula. Only
/// [`apply_by`] calls it, inlined into an entry point with the features.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn act_lanes<V: Lanes, const N: usize>(x: [V; N], act: Vectorised) -> [V; N] {
    // SAFETY (whole body): the CPU has V's level (the caller's promise).
    unsafe {
        if let Some(form) = Logistic::of(act) {
            return form.eval(x);
        }
        let r = V::splat(std::f32::consts::FRAC_1_SQRT_2);
        let z = each::<_, N>(|i| x[i].mul(r));
        // At the clamp this is exactly 1 or -1 (f32 with FMA), as erf(z) rounds.
        let erf = odd_rational(z, 4.0, &ERF_NUM, &ERF_DEN);
        let (half, one) = (V::splat(0.5), V::splat(1.0));
        each::<_, N>(|i| x[i].mul(half).mul(one.add(erf[i])))
    }
}

#[cfg(test)]
mod tests {
    use super::scalar::*;
    use super::*;

    #[test]
    fn vectorised_activations_match_the_scalar_formulas() {
        let mut xs: Vec<f32> = (-4000..4000).map(|i| i as f32 * 0.003).collect();
        xs.extend([-100.0, -30.0, 30.0, 100.0, 0.0, -0.0, 1e-30, f32::NAN]);
        xs.extend([f32::INFINITY, f32::NEG_INFINITY]);
        let acts = [
            Vectorised::Gelu { tanh: false },
            Vectorised::Gelu { tanh: true },
            Vectorised::Silu,
            Vectorised::Sigmoid,
        ];
        // Every tail length of the 8- and 16-lane loops, and lengths around
        // the groups of 2 and 3 vectors side by side (`side_by_side`).
        for len in [xs.len(), 1, 7, 9, 15, 17, 23, 24, 25, 31, 33, 41, 47, 49] {
            let xs = &xs[xs.len() - len..];
            for act in acts {
                let mut got = xs.to_vec();
                vectorised_f32_inplace(&mut got, act);
                for (&x, &g) in xs.iter().zip(&got) {
                    let want = act.scalar(x);
                    let ok = (g.is_nan() && want.is_nan())
                        || g == want
                        || (g - want).abs() <= 2e-6 * want.abs().max(1.0);
                    assert!(ok, "{act:?} of {x}: {g} vs {want}");
                }
            }
        }
    }

    /// The vector sigmoid within 2e-7 of f64's everywhere, within 1e-5
    /// relative where it is tiny; SiLU, sigmoid and both GELUs, computed in
    /// long buffers (several vectors side by side) that mix arguments far
    /// below zero with others, give each element the value it has alone
    /// (one vector, padded).
    #[test]
    fn logistic_forms_are_accurate_and_elementwise() {
        let xs: Vec<f32> = (-400_000..400_000).map(|i| i as f32 * 5e-5).collect();
        let mut got = xs.clone();
        vectorised_f32_inplace(&mut got, Vectorised::Sigmoid);
        for (&x, &g) in xs.iter().zip(&got) {
            let want = 1.0 / (1.0 + (-(x as f64)).exp());
            assert!(
                (g as f64 - want).abs() <= 2e-7,
                "sigmoid({x}) = {g}, not {want}"
            );
        }
        let tiny: Vec<f32> = (1..8000).map(|i| -9.0 - i as f32 * 0.009).collect();
        let mut got = tiny.clone();
        vectorised_f32_inplace(&mut got, Vectorised::Sigmoid);
        for (&x, &g) in tiny.iter().zip(&got) {
            let want = 1.0 / (1.0 + (-(x as f64)).exp());
            assert!(
                (g as f64 / want - 1.0).abs() <= 1e-5,
                "sigmoid({x}) = {g}, not {want}"
            );
        }
        // Every 37th argument far below the others: most runs of 64 hold one.
        let mixed: Vec<f32> = (0..4099)
            .map(|i| {
                if i % 37 == 0 {
                    -10.0 - (i % 11) as f32
                } else {
                    ((i as f32) * 0.71).sin() * 6.0
                }
            })
            .collect();
        // Exact GELU too: every form runs several vectors side by side
        // (`side_by_side`), then single ones, then a padded tail.
        for act in [
            Vectorised::Silu,
            Vectorised::Sigmoid,
            Vectorised::Gelu { tanh: true },
            Vectorised::Gelu { tanh: false },
        ] {
            for xs in [&mixed[..], &mixed[..4096], &tiny[..], &xs[..]] {
                let mut together = xs.to_vec();
                vectorised_f32_inplace(&mut together, act);
                for (&x, &t) in xs.iter().zip(&together).step_by(7) {
                    let mut alone = [x];
                    vectorised_f32_inplace(&mut alone, act);
                    assert_eq!(t.to_bits(), alone[0].to_bits(), "{act:?} of {x}");
                }
            }
        }
    }

    /// The vector exact GELU within 1.5e-6 of f64's on [-8, 8], and
    /// exactly `x` or zero where `erf(x / sqrt 2)` rounds to 1 or -1 in f32,
    /// however large `x` (a rational `erf` a step short of 1 at its clamp
    /// would leave `x` times that step).
    #[test]
    fn exact_gelu_is_accurate_and_saturates() {
        let gelu = |x: f64| 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2));
        let xs: Vec<f32> = (-80_000..80_000).map(|i| i as f32 * 1e-4).collect();
        let mut got = xs.clone();
        vectorised_f32_inplace(&mut got, Vectorised::Gelu { tanh: false });
        for (&x, &g) in xs.iter().zip(&got) {
            let want = gelu(x as f64);
            assert!(
                (g as f64 - want).abs() <= 1.5e-6,
                "gelu({x}) = {g}, not {want}"
            );
        }
        let edge = 4.0 * std::f32::consts::SQRT_2;
        let far: Vec<f32> = (0..2000).map(|i| edge * 1.0001 * 1.01f32.powi(i)).collect();
        for sign in [1.0f32, -1.0] {
            let xs: Vec<f32> = far.iter().map(|x| sign * x).collect();
            let mut got = xs.clone();
            vectorised_f32_inplace(&mut got, Vectorised::Gelu { tanh: false });
            for (&x, &g) in xs.iter().zip(&got) {
                let want = if sign > 0.0 { x } else { 0.0 };
                assert_eq!(g, want, "gelu({x})");
            }
        }
    }

    #[test]
    fn relu_small_and_nan() {
        let x = [
            -2.0f32,
            -0.0,
            0.0,
            1.5,
            f32::NAN,
            f32::NEG_INFINITY,
            f32::INFINITY,
        ];
        let mut y = [7.0f32; 7];
        super::relu(&x, &mut y).unwrap();
        assert_eq!(&y[..4], &[0.0, 0.0, 0.0, 1.5]);
        assert!(y[4].is_nan());
        assert_eq!(y[5], 0.0);
        assert_eq!(y[6], f32::INFINITY);
        let mut z = x;
        relu_inplace(&mut z);
        assert_eq!(&z[..4], &y[..4]);
        assert!(z[4].is_nan());
    }

    #[test]
    fn relu_large_parallel() {
        let x: Vec<f64> = (0..100_003).map(|i| (i as f64) - 50_000.0).collect();
        let mut y = vec![f64::NAN; x.len()];
        super::relu(&x, &mut y).unwrap();
        let mut z = x.clone();
        relu_inplace(&mut z);
        for (i, &v) in x.iter().enumerate() {
            assert_eq!(y[i], v.max(0.0));
            assert_eq!(z[i], v.max(0.0));
        }
    }

    /// The textbook formulas in f64, each written independently of the kernels.
    fn naive(name: &str, x: f64) -> f64 {
        let sig = 1.0 / (1.0 + (-x).exp());
        match name {
            "relu6" => x.clamp(0.0, 6.0),
            "hardtanh" => x.clamp(-0.5, 2.0),
            "hardswish" => x * (x + 3.0).clamp(0.0, 6.0) / 6.0,
            "hardsigmoid" => (x + 3.0).clamp(0.0, 6.0) / 6.0,
            "silu" => x * sig,
            "sigmoid" => sig,
            "gelu" => 0.5 * x * (1.0 + erf_series(x / 2f64.sqrt())),
            "gelu_tanh" => {
                let k = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (k * (x + 0.044715 * x.powi(3))).tanh())
            }
            "tanh" => x.tanh(),
            _ => unreachable!(),
        }
    }

    /// erf by the all-positive series `2/sqrt(pi) e^(-x^2) sum 2^n x^(2n+1) / (2n+1)!!`,
    /// which has no cancellation, so it is accurate for every x the test uses.
    fn erf_series(x: f64) -> f64 {
        let (mut term, mut sum) = (x, x);
        for n in 1..400 {
            term *= 2.0 * x * x / (2 * n + 1) as f64;
            sum += term;
        }
        sum * (-x * x).exp() * 2.0 / std::f64::consts::PI.sqrt()
    }

    fn apply<T: Float>(name: &str, x: T) -> T {
        let (lo, hi) = (T::from_f64(-0.5).unwrap(), T::from_f64(2.0).unwrap());
        match name {
            "relu6" => relu6(x),
            "hardtanh" => hardtanh(x, lo, hi),
            "hardswish" => hardswish(x),
            "hardsigmoid" => hardsigmoid(x),
            "silu" => silu(x),
            "sigmoid" => sigmoid(x),
            "gelu" => gelu(x),
            "gelu_tanh" => gelu_tanh(x),
            "tanh" => super::scalar::tanh(x),
            _ => unreachable!(),
        }
    }

    const NAMES: [&str; 9] = [
        "relu6",
        "hardtanh",
        "hardswish",
        "hardsigmoid",
        "silu",
        "sigmoid",
        "gelu",
        "gelu_tanh",
        "tanh",
    ];

    #[test]
    fn activations_match_naive_formulas() {
        let xs: Vec<f64> = (-160..=160).map(|i| i as f64 / 20.0).collect();
        for name in NAMES {
            for &x in &xs {
                let want = naive(name, x);
                let got = apply(name, x);
                assert!((got - want).abs() <= 1e-12, "{name}({x}): {got} vs {want}");
                let got32 = apply(name, x as f32) as f64;
                let tol = 1e-6 * want.abs().max(1.0);
                assert!((got32 - want).abs() <= tol, "{name}({x}) f32: {got32}");
            }
            assert!(apply(name, f64::NAN).is_nan(), "{name}(NaN)");
            assert!(apply(name, f32::NAN).is_nan(), "{name}(NaN) f32");
        }
    }

    #[test]
    fn map_writes_every_element() {
        for len in [0, 1, 17, PARALLEL_MIN + 5] {
            let x: Vec<f32> = (0..len).map(|i| (i % 13) as f32 - 6.0).collect();
            let mut y = vec![f32::NAN; len];
            map(&x, &mut y, hardswish).unwrap();
            for (i, &v) in x.iter().enumerate() {
                assert_eq!(y[i], hardswish(v), "{len} {i}");
            }
            let mut z = x.clone();
            map_inplace(&mut z, silu);
            for (i, &v) in x.iter().enumerate() {
                assert_eq!(z[i], silu(v));
            }
        }
    }
}
