//! The channel-blocked layout, NCHW8c, and the kernels that read and write it.
//!
//! A value of logical shape `[n, c, h, w]` is stored as `[n, ceil(c / 8), h,
//! w, 8]`: each pixel holds [`BLOCK`] consecutive channels side by side, so a
//! vector over them is one aligned-size load and every lane is useful
//! whatever the plane's size. The lanes past `c` in the last block (padding
//! lanes) hold finite values that no kernel lets reach a real channel: the
//! reorders write them as zeros, and the kernels that read them multiply
//! them by zero weights or drop them (see ai3-core's layout planner, which
//! admits only operations that keep them finite).
//!
//! This is the layout ONNX Runtime's NCHWc transformer and oneDNN's blocked
//! formats keep between convolutions; ai3's graph planner keeps runs of
//! operations in it and reorders only at their edges ([`to_blocked`],
//! [`from_blocked`]). The convolution kernels ([`pointwise`], and the
//! blocked entry points of the depthwise, direct and Winograd kernels) are
//! f32 with AVX2 and FMA ([`available`]); all but the depthwise one
//! accumulate on one register tile per ISA level (`tile`: AVX-512 puts two
//! blocks in each zmm register). The reorders and [`global_avg_pool`] are
//! portable.

pub mod pointwise;
pub mod scaled;
pub(crate) mod tile;

use rayon::prelude::*;

use crate::alloc::{check_len, checked_product, KernelResult};
use crate::isa::multiversion;
use crate::Float;

/// Channels per block: the lanes of one AVX2 f32 vector.
pub const BLOCK: usize = 8;

/// Where the blocked convolutions' packed weights put each value: per
/// output block, `rows` vectors of [`BLOCK`] output lanes (one per input
/// lane of each tap of each input block), or on AVX-512 per pair of output
/// blocks, each row the two blocks' lanes side by side (16 values, one zmm
/// load for the register tile rather than two halves and an insert; see
/// [`tile::Tile::w_pairs`]). An odd block count's last pair is half zero
/// padding. The layout follows the CPU level, which is fixed for the
/// process ([`crate::isa::level`]), and the layer's shape, so packing and
/// running agree.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PackedWeights {
    /// Output blocks.
    pub blocks: usize,
    /// Rows of weights per output block.
    pub rows: usize,
    /// Whether blocks are packed in pairs.
    pub pairs: bool,
}

impl PackedWeights {
    /// The layout for `blocks` output blocks of `rows` rows: in pairs on
    /// AVX-512 where the kernel asks for them (`paired`).
    pub fn new(blocks: usize, rows: usize, paired: bool) -> Self {
        Self {
            blocks,
            rows,
            pairs: paired && crate::isa::avx512(),
        }
    }
    /// Output blocks packed a unit (a tile's first block is a multiple).
    pub fn unit(&self) -> usize {
        if self.pairs {
            2
        } else {
            1
        }
    }
    /// Elements of the weights (without the bias that follows them).
    pub fn len(&self) -> usize {
        self.blocks.next_multiple_of(self.unit()) * self.rows * BLOCK
    }
    /// Elements between units (blocks, or pairs of them).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub fn stride(&self) -> usize {
        self.unit() * self.rows * BLOCK
    }
    /// Where output block `ob`'s weights start (`ob` a multiple of the
    /// unit).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub fn start(&self, ob: usize) -> usize {
        ob / self.unit() * self.stride()
    }
    /// The offset of row `row`, output lane `lane` of output block `ob`.
    pub fn at(&self, ob: usize, row: usize, lane: usize) -> usize {
        let u = self.unit();
        (ob / u * self.rows + row) * u * BLOCK + ob % u * BLOCK + lane
    }
}

/// Elements below which a reorder or pool stays on the calling thread.
const SERIAL_ELEMENTS: usize = 1 << 16;

/// Whether the blocked convolution kernels run here (f32 with AVX2 and FMA).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::isa::avx2()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// What the blocked 1x1 and direct convolutions apply to their sums in
/// registers, after the bias and before storing them: the residual, then a
/// clamp. Cheaper than an [`Epilogue`](crate::cpu::conv2d::Epilogue) pass
/// over the finished output (16 -> 96 channels at 112x112 with ReLU6:
/// 180 -> 120 us), which remains for the other activations.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fused<'a> {
    /// Added to the output: a tensor in the output's blocked layout, of its
    /// length (ResNet's skip connection).
    pub residual: Option<&'a [f32]>,
    /// Then the bounds the output is clamped to, `lo <= hi` (ReLU: `(0,
    /// inf)`, ReLU6: `(0, 6)`); NaN passes through, as in PyTorch.
    pub clamp: Option<(f32, f32)>,
}

impl Fused<'_> {
    /// Checks the residual's length against the output's and the bounds'
    /// order (neither NaN).
    pub(crate) fn check(&self, output: usize) -> KernelResult<()> {
        if let Some(r) = self.residual {
            check_len("blocked conv2d residual", r.len(), output)?;
        }
        match self.clamp {
            Some((lo, hi)) if lo.is_nan() || hi.is_nan() || lo > hi => {
                Err(crate::KernelError::Precondition {
                    what: "a fused clamp needs its lower bound at most its upper bound",
                })
            }
            _ => Ok(()),
        }
    }
}

/// Elements of the blocked form of `[n, c, plane]` (`plane = h * w`).
pub fn blocked_len(n: usize, c: usize, plane: usize) -> KernelResult<usize> {
    checked_product("blocked layout", &[n, c.div_ceil(BLOCK), plane, BLOCK])
}

/// Checks a convolution's input and output lengths: each the blocked form
/// of `p`'s NCHW tensor when its flag (input, output) says so, else the
/// NCHW one.
pub(crate) fn check_conv_buffers(
    p: &crate::params::Conv2dParams,
    (blocked_in, blocked_out): (bool, bool),
    input: usize,
    output: usize,
) -> KernelResult<()> {
    if !blocked_in && !blocked_out {
        return p.check_buffers(input, None, output);
    }
    let want_in = if blocked_in {
        blocked_len(p.batch, p.in_channels, p.in_h * p.in_w)?
    } else {
        p.input_len()
    };
    check_len("blocked conv2d input", input, want_in)?;
    let plane_out = p.out_h() * p.out_w();
    let want_out = if blocked_out {
        blocked_len(p.batch, p.out_channels, plane_out)?
    } else {
        p.output_len()
    };
    check_len("blocked conv2d output", output, want_out)
}

/// Writes `src` (`[n, c, plane]`, NCHW) into `dst` in the blocked layout, the
/// padding lanes zero.
pub fn to_blocked<T: Float>(
    n: usize,
    c: usize,
    plane: usize,
    src: &[T],
    dst: &mut [T],
) -> KernelResult<()> {
    check_len("reorder source", src.len(), n * c * plane)?;
    check_len("reorder destination", dst.len(), blocked_len(n, c, plane)?)?;
    let cb = c.div_ceil(BLOCK);
    let task = |t: usize, block: &mut [T]| {
        let (img, b) = (t / cb, t % cb);
        let lanes = BLOCK.min(c - b * BLOCK);
        let planes = &src[(img * c + b * BLOCK) * plane..][..lanes * plane];
        #[cfg(target_arch = "x86_64")]
        if lanes == BLOCK && transpose::run(true, planes, plane, block) {
            return;
        }
        for (q, px) in block.chunks_exact_mut(BLOCK).enumerate() {
            for (l, v) in px.iter_mut().enumerate() {
                *v = if l < lanes {
                    planes[l * plane + q]
                } else {
                    T::zero()
                };
            }
        }
    };
    for_each_block(dst, plane * BLOCK, task);
    Ok(())
}

/// Writes `src` (the blocked form of `[n, c, plane]`) into `dst` as NCHW,
/// dropping the padding lanes.
pub fn from_blocked<T: Float>(
    n: usize,
    c: usize,
    plane: usize,
    src: &[T],
    dst: &mut [T],
) -> KernelResult<()> {
    check_len("reorder source", src.len(), blocked_len(n, c, plane)?)?;
    check_len("reorder destination", dst.len(), n * c * plane)?;
    let cb = c.div_ceil(BLOCK);
    // The NCHW planes of channel block `b` of image `img` from its pixels.
    let block = |img: usize, b: usize, planes: &mut [T]| {
        let block = &src[(img * cb + b) * plane * BLOCK..][..plane * BLOCK];
        let lanes = planes.len() / plane.max(1);
        #[cfg(target_arch = "x86_64")]
        if lanes == BLOCK && transpose::run(false, block, plane, planes) {
            return;
        }
        for l in 0..lanes {
            for (q, v) in planes[l * plane..][..plane].iter_mut().enumerate() {
                *v = block[q * BLOCK + l];
            }
        }
    };
    if c.is_multiple_of(BLOCK) {
        for_each_block(dst, BLOCK * plane, |t, planes| {
            block(t / cb, t % cb, planes)
        });
    } else {
        // The last block of each image is partial: tasks by image.
        for_each_block(dst, c * plane, |img, image| {
            for (b, planes) in image.chunks_mut(BLOCK * plane).enumerate() {
                block(img, b, planes);
            }
        });
    }
    Ok(())
}

/// Global average pooling in the blocked layout: `src` is the blocked form
/// of `[n, c, plane]`, `dst` that of `[n, c, 1]`, each lane the mean of its
/// channel's plane (padding lanes included, which stay finite).
pub fn global_avg_pool<T: Float>(
    n: usize,
    c: usize,
    plane: usize,
    src: &[T],
    dst: &mut [T],
) -> KernelResult<()> {
    check_len("global pool input", src.len(), blocked_len(n, c, plane)?)?;
    check_len("global pool output", dst.len(), blocked_len(n, c, 1)?)?;
    let scale = T::one() / T::from_usize(plane.max(1)).unwrap_or_else(T::one);
    if plane == 0 {
        dst.fill(T::nan());
        return Ok(());
    }
    // SAFETY: `block` has whole pixels of BLOCK, `out` BLOCK values.
    let mean = |(out, block): (&mut [T], &[T])| unsafe { block_mean(block, scale, out) };
    if src.len() >= SERIAL_ELEMENTS && rayon::current_num_threads() > 1 {
        dst.par_chunks_exact_mut(BLOCK)
            .zip(src.par_chunks_exact(plane * BLOCK))
            .for_each(mean);
    } else {
        dst.chunks_exact_mut(BLOCK)
            .zip(src.chunks_exact(plane * BLOCK))
            .for_each(mean);
    }
    Ok(())
}

/// `out = f(x, s)` with `x` and `out` the blocked forms of `[n, c, plane]`
/// and `s` that of `[s_batch, c, 1]` (`s_batch` 1 or `n`): each pixel's
/// lanes meet their channel's value of `s` (a per-channel scale or shift,
/// as in squeeze-and-excitation), then `post` runs on each finished block.
#[allow(clippy::too_many_arguments)]
pub fn per_channel<T: Float>(
    n: usize,
    c: usize,
    plane: usize,
    x: &[T],
    s: &[T],
    s_batch: usize,
    out: &mut [T],
    f: impl Fn(T, T) -> T + Sync,
    post: impl Fn(&mut [T]) + Sync,
) -> KernelResult<()> {
    check_len("per-channel input", x.len(), blocked_len(n, c, plane)?)?;
    check_len("per-channel output", out.len(), x.len())?;
    check_len("per-channel operand", s.len(), blocked_len(s_batch, c, 1)?)?;
    if s_batch != 1 && s_batch != n {
        return Err(crate::KernelError::Precondition {
            what: "a per-channel operand has a batch of 1 or the input's",
        });
    }
    let cb = c.div_ceil(BLOCK);
    let task = |t: usize, block: &mut [T]| {
        let (img, b) = (t / cb, t % cb);
        let sv = &s[((img % s_batch) * cb + b) * BLOCK..][..BLOCK];
        let src = &x[t * plane * BLOCK..][..plane * BLOCK];
        // SAFETY: `src` and `block` have `plane` pixels of BLOCK, `sv` BLOCK values.
        unsafe { per_channel_block(src, sv, block, &f) };
        post(block);
    };
    for_each_block(out, plane * BLOCK, task);
    Ok(())
}

/// `out = x * scale + shift` per channel (eval-mode batch norm) in the
/// blocked layout: `x` and `out` are the blocked forms of `[n, c, plane]`,
/// `scale` and `shift` hold `ceil(c / 8) * 8` values (zeros past `c`, so the
/// padding lanes come out zero); then `post` runs on each finished block.
#[allow(clippy::too_many_arguments)]
pub fn scale_shift<T: Float>(
    n: usize,
    c: usize,
    plane: usize,
    x: &[T],
    scale: &[T],
    shift: &[T],
    out: &mut [T],
    post: impl Fn(&mut [T]) + Sync,
) -> KernelResult<()> {
    check_len("batch norm input", x.len(), blocked_len(n, c, plane)?)?;
    check_len("batch norm output", out.len(), x.len())?;
    let lanes = blocked_len(1, c, 1)?;
    check_len("batch norm scale", scale.len(), lanes)?;
    check_len("batch norm shift", shift.len(), lanes)?;
    let cb = c.div_ceil(BLOCK);
    let task = |t: usize, block: &mut [T]| {
        let b = t % cb;
        let (sc, sh) = (&scale[b * BLOCK..][..BLOCK], &shift[b * BLOCK..][..BLOCK]);
        let src = &x[t * plane * BLOCK..][..plane * BLOCK];
        // SAFETY: `src` and `block` have `plane` pixels of BLOCK, `sc` and
        // `sh` BLOCK values.
        unsafe { scale_shift_block(src, sc, sh, block) };
        post(block);
    };
    for_each_block(out, plane * BLOCK, task);
    Ok(())
}

multiversion! {
    /// `out[q][l] = src[q][l] * scale[l] + shift[l]` for every pixel `q`.
    unsafe fn scale_shift_block<T>(src: &[T], scale: &[T], shift: &[T], out: &mut [T]) => scale_shift_block_impl
}

#[inline(always)]
unsafe fn scale_shift_block_impl<T: Float>(src: &[T], scale: &[T], shift: &[T], out: &mut [T]) {
    let sc: [T; BLOCK] = std::array::from_fn(|l| scale[l]);
    let sh: [T; BLOCK] = std::array::from_fn(|l| shift[l]);
    for (o, px) in out.chunks_exact_mut(BLOCK).zip(src.chunks_exact(BLOCK)) {
        for l in 0..BLOCK {
            o[l] = px[l] * sc[l] + sh[l];
        }
    }
}

multiversion! {
    /// `out[q][l] = f(src[q][l], s[l])` for every pixel `q`.
    unsafe fn per_channel_block<T, F: Fn(T, T) -> T>(src: &[T], s: &[T], out: &mut [T], f: &F) => per_channel_block_impl
}

#[inline(always)]
unsafe fn per_channel_block_impl<T: Float, F: Fn(T, T) -> T>(
    src: &[T],
    s: &[T],
    out: &mut [T],
    f: &F,
) {
    let sv: [T; BLOCK] = std::array::from_fn(|l| s[l]);
    for (o, px) in out.chunks_exact_mut(BLOCK).zip(src.chunks_exact(BLOCK)) {
        for l in 0..BLOCK {
            o[l] = f(px[l], sv[l]);
        }
    }
}

multiversion! {
    /// `out[l] = scale * sum over pixels q of block[q][l]`.
    unsafe fn block_mean<T>(block: &[T], scale: T, out: &mut [T]) => block_mean_impl
}

#[inline(always)]
unsafe fn block_mean_impl<T: Float>(block: &[T], scale: T, out: &mut [T]) {
    // Four accumulators: independent adds in flight.
    let mut acc = [[T::zero(); BLOCK]; 4];
    let mut pixels = block.chunks_exact(4 * BLOCK);
    for four in &mut pixels {
        for (a, px) in acc.iter_mut().zip(four.chunks_exact(BLOCK)) {
            for l in 0..BLOCK {
                a[l] += px[l];
            }
        }
    }
    for px in pixels.remainder().chunks_exact(BLOCK) {
        for l in 0..BLOCK {
            acc[0][l] += px[l];
        }
    }
    for l in 0..BLOCK {
        out[l] = (acc[0][l] + acc[1][l] + acc[2][l] + acc[3][l]) * scale;
    }
}

/// Runs `task(i, chunk)` over `dst` in chunks of `len` elements, in parallel
/// when there is enough to share.
fn for_each_block<T: Send>(dst: &mut [T], len: usize, task: impl Fn(usize, &mut [T]) + Sync) {
    if len == 0 {
        return;
    }
    if dst.len() >= SERIAL_ELEMENTS && rayon::current_num_threads() > 1 {
        dst.par_chunks_mut(len)
            .enumerate()
            .for_each(|(i, c)| task(i, c));
    } else {
        dst.chunks_mut(len)
            .enumerate()
            .for_each(|(i, c)| task(i, c));
    }
}

/// 8x8 register transposes between 8 planes and pixels of 8 lanes.
#[cfg(target_arch = "x86_64")]
pub(crate) mod transpose {
    use std::arch::x86_64::*;

    use super::BLOCK;
    use crate::Float;

    /// Transposes `src` into `dst`, 8 planes of `plane` pixels into pixels
    /// of 8 lanes (`to_pixels`) or back, when they are f32 and the CPU has
    /// AVX2 ([`reorder`]); whether it ran.
    pub(crate) fn run<T: Float>(to_pixels: bool, src: &[T], plane: usize, dst: &mut [T]) -> bool {
        match (crate::float::as_f32(src), crate::float::as_f32_mut(dst)) {
            (Some(s), Some(d))
                if crate::isa::avx2() && s.len() == 8 * plane && d.len() == s.len() =>
            {
                // SAFETY: AVX2 checked, and both hold 8 * plane elements.
                unsafe { reorder(to_pixels, s, plane, d) };
                true
            }
            _ => false,
        }
    }

    /// Stores column `j` of the 8x8 matrix whose rows are `r` at `dst[j]`.
    ///
    /// # Safety
    /// AVX; each pointer is valid for 8 values.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn store_transposed(r: [__m256; 8], dst: [*mut f32; 8]) {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        // SAFETY: each destination is valid for 8 values (the caller's contract).
        unsafe {
            _mm256_storeu_ps(dst[0], _mm256_permute2f128_ps::<0x20>(s0, s4));
            _mm256_storeu_ps(dst[1], _mm256_permute2f128_ps::<0x20>(s1, s5));
            _mm256_storeu_ps(dst[2], _mm256_permute2f128_ps::<0x20>(s2, s6));
            _mm256_storeu_ps(dst[3], _mm256_permute2f128_ps::<0x20>(s3, s7));
            _mm256_storeu_ps(dst[4], _mm256_permute2f128_ps::<0x31>(s0, s4));
            _mm256_storeu_ps(dst[5], _mm256_permute2f128_ps::<0x31>(s1, s5));
            _mm256_storeu_ps(dst[6], _mm256_permute2f128_ps::<0x31>(s2, s6));
            _mm256_storeu_ps(dst[7], _mm256_permute2f128_ps::<0x31>(s3, s7));
        }
    }

    /// `dst[q * 8 + l] = src[l * plane + q]` (`to_pixels`), or the other
    /// way: 8 pixels of the 8 lanes at a time through [`store_transposed`],
    /// the rows of the 8x8 tile being lanes one way and pixels the other.
    ///
    /// # Safety
    /// AVX2 and FMA; `src` has `8 * plane` elements and `dst` as many.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn reorder(to_pixels: bool, src: &[f32], plane: usize, dst: &mut [f32]) {
        let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
        // Element (lane l, pixel q) in either layout.
        let planar = |l: usize, q: usize| l * plane + q;
        let pixel = |l: usize, q: usize| q * BLOCK + l;
        // Source and destination index of element (l, q).
        let at = |l: usize, q: usize| {
            if to_pixels {
                (planar(l, q), pixel(l, q))
            } else {
                (pixel(l, q), planar(l, q))
            }
        };
        let mut q = 0;
        // SAFETY (whole body): every index is of a lane < 8 and a pixel
        // < plane (q + 8 <= plane for the tiles).
        unsafe {
            while q + 8 <= plane {
                if to_pixels {
                    let rows = std::array::from_fn(|l| _mm256_loadu_ps(s.add(planar(l, q))));
                    store_transposed(rows, std::array::from_fn(|j| d.add(pixel(0, q + j))));
                } else {
                    let rows = std::array::from_fn(|j| _mm256_loadu_ps(s.add(pixel(0, q + j))));
                    store_transposed(rows, std::array::from_fn(|l| d.add(planar(l, q))));
                }
                q += 8;
            }
            for q in q..plane {
                for l in 0..BLOCK {
                    let (i, o) = at(l, q);
                    *d.add(o) = *s.add(i);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::test_util::Rng;

    fn reorder_case<T: Float + std::fmt::Debug>(n: usize, c: usize, plane: usize) {
        let mut rng = Rng::new((n * 31 + c * 7 + plane) as u64);
        let src: Vec<T> = crate::cpu::test_util::cast(&rng.vec(n * c * plane));
        let mut blocked = vec![T::nan(); blocked_len(n, c, plane).unwrap()];
        to_blocked(n, c, plane, &src, &mut blocked).unwrap();
        let cb = c.div_ceil(BLOCK);
        for img in 0..n {
            for ch in 0..cb * BLOCK {
                for q in 0..plane {
                    let got = blocked[((img * cb + ch / BLOCK) * plane + q) * BLOCK + ch % BLOCK];
                    let want = if ch < c {
                        src[(img * c + ch) * plane + q]
                    } else {
                        T::zero()
                    };
                    assert_eq!(got, want, "n={n} c={c} plane={plane} ({img}, {ch}, {q})");
                }
            }
        }
        let mut back = vec![T::nan(); src.len()];
        from_blocked(n, c, plane, &blocked, &mut back).unwrap();
        assert_eq!(back, src, "round trip n={n} c={c} plane={plane}");
    }

    /// Full and partial blocks, planes shorter and longer than a transpose,
    /// enough elements to go parallel; f32 (transposes) and f64 (scalar).
    #[test]
    fn reorders_round_trip_and_zero_the_padding_lanes() {
        for &(n, c, plane) in &[
            (1, 8, 49),
            (2, 16, 7),
            (1, 3, 10),
            (2, 11, 37),
            (1, 24, 3136),
            (3, 13, 2000),
            (1, 1, 1),
        ] {
            reorder_case::<f32>(n, c, plane);
            reorder_case::<f64>(n, c, plane);
        }
        crate::cpu::test_util::on_two_threads(|| reorder_case::<f32>(2, 24, 3000));
    }

    #[test]
    fn reorders_refuse_wrong_lengths() {
        let mut d = vec![0.0f32; 16];
        assert!(to_blocked(1, 3, 2, &[0.0; 5], &mut d).is_err());
        assert!(to_blocked(1, 3, 2, &[0.0; 6], &mut d[..15]).is_err());
        assert!(from_blocked(1, 3, 2, &d, &mut [0.0; 5]).is_err());
    }

    #[test]
    fn per_channel_meets_each_channel_with_its_value() {
        let (n, c, plane) = (2, 11, 29);
        let mut rng = Rng::new(9);
        let x: Vec<f64> = rng.vec(n * c * plane);
        let s: Vec<f64> = rng.vec(n * c);
        for s_batch in [1, n] {
            let mut xb = vec![0.0; blocked_len(n, c, plane).unwrap()];
            to_blocked(n, c, plane, &x, &mut xb).unwrap();
            let mut sb = vec![0.0; blocked_len(s_batch, c, 1).unwrap()];
            to_blocked(s_batch, c, 1, &s[..s_batch * c], &mut sb).unwrap();
            let mut ob = vec![f64::NAN; xb.len()];
            let post = |b: &mut [f64]| b.iter_mut().for_each(|v| *v = v.max(0.0));
            per_channel(n, c, plane, &xb, &sb, s_batch, &mut ob, |a, b| a - b, post).unwrap();
            let mut got = vec![0.0; x.len()];
            from_blocked(n, c, plane, &ob, &mut got).unwrap();
            for (i, g) in got.iter().enumerate() {
                let (img, ch) = (i / (c * plane), (i / plane) % c);
                let want = (x[i] - s[(img % s_batch) * c + ch]).max(0.0);
                assert_eq!(*g, want, "s_batch={s_batch} at {i}");
            }
        }
    }

    /// Partial last block (its padding lanes must come out zero), enough
    /// elements to go parallel, a fused `post`.
    #[test]
    fn scale_shift_is_per_channel_and_zeroes_the_padding_lanes() {
        for &(n, c, plane) in &[(2, 11, 29), (1, 24, 4000)] {
            let mut rng = Rng::new(11);
            let x: Vec<f64> = rng.vec(n * c * plane);
            let (sc, sh): (Vec<f64>, Vec<f64>) = (rng.vec(c), rng.vec(c));
            let lanes = blocked_len(1, c, 1).unwrap();
            let pad = |v: &[f64]| {
                let mut p = vec![0.0; lanes];
                p[..c].copy_from_slice(v);
                p
            };
            let mut xb = vec![0.0; blocked_len(n, c, plane).unwrap()];
            to_blocked(n, c, plane, &x, &mut xb).unwrap();
            let mut ob = vec![f64::NAN; xb.len()];
            let post = |b: &mut [f64]| b.iter_mut().for_each(|v| *v = v.max(0.0));
            scale_shift(n, c, plane, &xb, &pad(&sc), &pad(&sh), &mut ob, post).unwrap();
            let mut o2 = vec![f64::NAN; xb.len()];
            crate::cpu::test_util::on_two_threads(|| {
                scale_shift(n, c, plane, &xb, &pad(&sc), &pad(&sh), &mut o2, post).unwrap()
            });
            assert_eq!(o2, ob);
            let cb = c.div_ceil(BLOCK);
            for img in 0..n {
                for ch in c..cb * BLOCK {
                    for q in 0..plane {
                        let at = ((img * cb + ch / BLOCK) * plane + q) * BLOCK + ch % BLOCK;
                        assert_eq!(ob[at], 0.0, "padding lane {ch}");
                    }
                }
            }
            let mut got = vec![0.0; x.len()];
            from_blocked(n, c, plane, &ob, &mut got).unwrap();
            for (i, g) in got.iter().enumerate() {
                let ch = (i / plane) % c;
                assert_eq!(*g, (x[i] * sc[ch] + sh[ch]).max(0.0), "at {i}");
            }
        }
        let mut out = vec![0.0f32; 16];
        assert!(scale_shift(1, 3, 2, &[0.0; 16], &[0.0; 7], &[0.0; 8], &mut out, |_| ()).is_err());
    }

    #[test]
    fn global_average_matches_the_plane_means() {
        let (n, c, plane) = (2, 11, 29);
        let mut rng = Rng::new(5);
        let src: Vec<f32> = crate::cpu::test_util::cast(&rng.vec(n * c * plane));
        let mut blocked = vec![0.0; blocked_len(n, c, plane).unwrap()];
        to_blocked(n, c, plane, &src, &mut blocked).unwrap();
        let mut pooled = vec![f32::NAN; blocked_len(n, c, 1).unwrap()];
        global_avg_pool(n, c, plane, &blocked, &mut pooled).unwrap();
        let mut got = vec![0.0; n * c];
        from_blocked(n, c, 1, &pooled, &mut got).unwrap();
        for (i, g) in got.iter().enumerate() {
            let want: f64 = src[i * plane..][..plane]
                .iter()
                .map(|&v| v as f64)
                .sum::<f64>()
                / plane as f64;
            assert!((*g as f64 - want).abs() < 1e-5, "{i}: {g} vs {want}");
        }
        assert!(pooled.iter().all(|v| v.is_finite()));
    }
}
