//! Depthwise convolution (one input channel per group, any channel
//! multiplier), the direct algorithm's path for MobileNet-, EfficientNet-
//! and ConvNeXt-style layers.
//!
//! f32 on a CPU with AVX2 and FMA runs on blocks of 8 channels interleaved
//! per pixel (`blocked`): every lane of every vector product is useful
//! whatever the plane's size or the stride. Elsewhere (f64, other CPUs),
//! each output plane is computed on its own. The input plane it reads is
//! copied once, zero-padded, into a per-thread buffer split by phase in both
//! dimensions (padded pixel `(r, c)` goes to sub-plane `(r % stride_h,
//! c % stride_w)` at `(r / stride_h, c / stride_w)`), so that for any stride
//! and dilation each kernel tap reads the sub-plane of one phase at a fixed
//! offset. The output is then computed as one flat run over the sub-plane's
//! width (`out_h` rows of `ceil(padded_w / stride_w)` columns; the columns
//! past `out_w` are computed and dropped), in chunks of `CHUNK` values held
//! in registers across all taps, starting from the bias. Small planes (7x7,
//! 14x14) thus still fill whole vectors. The valid columns are copied out and
//! the fused epilogue (an activation) runs on the finished plane while it is
//! still in cache. The multiplier's output planes of one input channel share
//! its copy.
//!
//! Channels-last (NHWC) input runs 16 channels a register on AVX-512 for
//! stride 1 (`nhwc`), else on the 8-channel blocks in place.
//!
//! These loops are plain Rust compiled once per [ISA level](crate::isa), so
//! they run on 16 (AVX-512), 8 (AVX2) or the baseline's lanes.

#[cfg(target_arch = "x86_64")]
mod blocked;
#[cfg(target_arch = "x86_64")]
mod nhwc;
#[cfg(target_arch = "x86_64")]
mod pairs;

/// Copies 8 NCHW planes into a zero-padded buffer of 8-channel pixels
/// (see [`blocked::pack`]); the direct algorithm's blocked path shares it.
#[cfg(target_arch = "x86_64")]
pub(in crate::cpu::conv2d) use blocked::{pack as pack_padded, pack_pixels, zero_borders};

use rayon::prelude::*;

use super::{threads_for_macs, Epilogue};
use crate::alloc::{check_len, try_zeroed_vec, KernelResult};
use crate::cpu::scratch::with_scratch;
use crate::isa::multiversion;
use crate::params::Conv2dParams;
use crate::Float;

/// Output columns accumulated in registers at once.
const CHUNK: usize = 32;

/// Output planes per parallel task, at least: enough to amortise a task.
const MIN_TASK_ELEMENTS: usize = 4096;

/// What one of this path's multiply-accumulates costs, in those of the
/// register-tiled convolutions that [`threads_for_macs`] counts: it moves far
/// more memory per product (mobilenet_v2's 576-channel 3x3 layer at 14x14,
/// 1.0 M products, took 0.10 ms on one thread, where a 1x1 layer of as many
/// takes 0.02 ms), so layers from 0.13 M products up are shared between
/// threads.
const MAC_COST: usize = 8;

/// Largest column stride this path takes: its copy of a plane grows with the
/// stride (a phase row per stride step), so larger ones go to the generic kernel.
const MAX_STRIDE_W: usize = 4;

/// Whether this path takes `p`: depthwise (one input channel per group, any
/// multiplier of output channels per group), column stride at most 4.
pub fn applies(p: &Conv2dParams) -> bool {
    p.in_channels_per_group() == 1 && p.groups > 1 && p.stride.1 <= MAX_STRIDE_W
}

/// Geometry of the padded, phase-split copy of one input plane and of the
/// flat output run.
struct Layout {
    /// Rows and columns of one sub-plane.
    sub_h: usize,
    sub_w: usize,
    /// Elements of the copy (sub-planes plus the slack the last chunk reads).
    copy_len: usize,
    /// Elements of the flat output run, a multiple of [`CHUNK`].
    flat_len: usize,
    /// Offset in the copy of each tap's first read, in `(ky, kx)` order.
    taps: Vec<usize>,
}

impl Layout {
    fn new(p: &Conv2dParams) -> Self {
        let (sh, sw) = p.stride;
        let (sub_h, sub_w) = (p.padded_h().div_ceil(sh), p.padded_w().div_ceil(sw));
        let sub_len = sub_h * sub_w;
        let mut taps = Vec::with_capacity(p.kernel_h * p.kernel_w);
        for ky in 0..p.kernel_h {
            let r = ky * p.dilation.0;
            for kx in 0..p.kernel_w {
                let c = kx * p.dilation.1;
                taps.push(((r % sh) * sw + c % sw) * sub_len + (r / sh) * sub_w + c / sw);
            }
        }
        let flat_len = (p.out_h() * sub_w).next_multiple_of(CHUNK);
        let last_read = taps.iter().max().copied().unwrap_or(0) + flat_len;
        Layout {
            sub_h,
            sub_w,
            copy_len: (sh * sw * sub_len).max(last_read),
            flat_len,
            taps,
        }
    }
}

/// Depthwise 2-D convolution (see the [module contract](super)), with
/// `epilogue` applied to each output plane. `p` must satisfy [`applies`].
///
/// `packed`: for f32 layers where [`reads_packed`] holds, the weights and
/// bias as [`pack_blocked`] packs them, kept by the caller (packed once per
/// layer); without them such a call packs them itself. Other calls do not
/// read it; a buffer of the wrong length is refused all the same.
///
/// Fails, before writing anything, when a buffer has the wrong length or `p`
/// is not depthwise; a refused scratch allocation fails the call (some
/// planes may then have been written).
pub fn conv2d<T: Float>(
    p: &Conv2dParams,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    packed: Option<&[f32]>,
    output: &mut [T],
    epilogue: Option<Epilogue<T>>,
) -> KernelResult<()> {
    p.check_buffers(input.len(), bias.map(<[T]>::len), output.len())?;
    check_len("conv2d weight", weight.len(), p.weight_len())?;
    if !applies(p) {
        return Err(crate::KernelError::Precondition {
            what: "depthwise convolution needs one input channel per group and a column stride of at most 4",
        });
    }
    if let Some(packed) = packed {
        check_len(
            "packed depthwise weights",
            packed.len(),
            blocked_packed_len(p)?,
        )?;
    }
    #[cfg(target_arch = "x86_64")]
    if blocked_applies() {
        let blocked =
            |x: &[f32], w: &[f32], b: Option<&[f32]>, out: &mut [f32], e: Option<Epilogue<f32>>| {
                let own;
                let packed = match packed {
                    Some(packed) => packed,
                    None => {
                        let mut v =
                            try_zeroed_vec(blocked_packed_len(p)?, "packed depthwise weights")?;
                        pack_blocked(p, w, b, &mut v)?;
                        own = v;
                        &own[..]
                    }
                };
                blocked::conv2d(p, blocked::Io::Nchw, x, packed, out, Default::default(), e)
            };
        if let Some(done) = super::with_f32(input, weight, bias, output, epilogue, blocked) {
            return done;
        }
    }
    let (oh, ow) = (p.out_h(), p.out_w());
    let plane_out = oh * ow;
    if plane_out == 0 || p.batch == 0 {
        return Ok(());
    }
    let plane_in = p.in_h * p.in_w;
    let mult = p.out_channels_per_group();
    let ntaps = p.kernel_h * p.kernel_w;
    let layout = Layout::new(p);
    let layout = &layout;
    // One task: the `mult` output planes of one (image, input channel), with
    // a buffer whose padding positions are zero (`fill` writes only the
    // plane's pixels, the same positions for every plane of the layer, so a
    // buffer is zeroed once, not once per plane).
    let task = |scratch: &mut [T], t: usize, out: &mut [T]| {
        let (n, g) = (t / p.groups, t % p.groups);
        let src = &input[(n * p.in_channels + g) * plane_in..][..plane_in];
        let (copy, flat) = scratch.split_at_mut(layout.copy_len);
        fill(p, layout, src, copy);
        for (j, plane) in out.chunks_exact_mut(plane_out).enumerate() {
            let oc = g * mult + j;
            let w = &weight[oc * ntaps..][..ntaps];
            let b = bias.map_or(T::zero(), |b| b[oc]);
            // SAFETY: `copy` and `flat` have the layout's lengths, so every
            // tap's run of `flat_len` reads lies inside `copy`.
            unsafe { flat_conv(layout, copy, w, b, flat) };
            for (y, row) in plane.chunks_exact_mut(ow).enumerate() {
                row.copy_from_slice(&flat[y * layout.sub_w..][..ow]);
            }
            if let Some(e) = epilogue {
                e((t * mult + j) * plane_out, plane);
            }
        }
    };
    let block = mult * plane_out;
    let tasks = p.batch * p.groups;
    let scratch_len = layout.copy_len + layout.flat_len;
    if threads_for_macs(p.macs().saturating_mul(MAC_COST)) > 1 && tasks > 1 {
        let per = MIN_TASK_ELEMENTS.div_ceil(block).max(1);
        // A zeroed buffer per piece of work rayon hands a thread (a few per
        // call): measured faster than the per-thread scratch with only the
        // padding positions zeroed per plane, whose many short fills cost
        // 25% more on mobilenet_v2's depthwise layers.
        output
            .par_chunks_mut(block)
            .enumerate()
            .with_min_len(per)
            .try_for_each_init(
                || try_zeroed_vec::<T>(scratch_len, "depthwise plane copy"),
                |buf, (t, out)| {
                    let buf = buf.as_mut().map_err(|e| e.clone())?;
                    task(buf, t, out);
                    Ok(())
                },
            )
    } else {
        with_scratch::<T, _>(scratch_len, |scratch| {
            scratch[..layout.copy_len].fill(T::zero());
            for (t, out) in output.chunks_mut(block).enumerate() {
                task(scratch, t, out);
            }
        })
    }
}

/// Whether [`conv2d_blocked`] takes `p`: depthwise with one output channel
/// per input channel, on a CPU with the blocked kernels
/// ([`crate::cpu::blocked::available`]).
pub fn applies_blocked(p: &Conv2dParams) -> bool {
    applies(p) && p.out_channels == p.in_channels && crate::cpu::blocked::available()
}

/// Elements of [`pack_blocked`]'s output for `p`: per block of
/// [`crate::cpu::blocked::BLOCK`] output channels, a vector per tap and one
/// of bias. An overflowing size is an error.
pub fn blocked_packed_len(p: &Conv2dParams) -> KernelResult<usize> {
    let block = crate::cpu::blocked::BLOCK;
    crate::alloc::checked_product(
        "packed depthwise weights",
        &[
            p.out_channels.div_ceil(block),
            p.kernel_h * p.kernel_w + 1,
            block,
        ],
    )
}

/// `weight` (PyTorch's `[out_channels, 1, kh, kw]`) and `bias` packed for
/// [`conv2d_blocked`] and [`conv2d_nhwc`] into `packed`
/// ([`blocked_packed_len`] elements): once per layer, not per call (the
/// per-call packing took a third of a 7x7 layer's time with 5x5 kernels).
pub fn pack_blocked(
    p: &Conv2dParams,
    weight: &[f32],
    bias: Option<&[f32]>,
    packed: &mut [f32],
) -> KernelResult<()> {
    p.check_weights(weight.len(), bias.map(<[f32]>::len))?;
    let len = blocked_packed_len(p)?;
    check_len("packed depthwise weights", packed.len(), len)?;
    if len == 0 {
        return Ok(());
    }
    let block = len / p.out_channels.div_ceil(crate::cpu::blocked::BLOCK);
    for (ob, dst) in packed.chunks_exact_mut(block).enumerate() {
        pack_block(p, weight, bias, ob, dst);
    }
    Ok(())
}

/// Block `ob` of `p`'s weights and bias as the blocked loops read them: a
/// vector of [`crate::cpu::blocked::BLOCK`] lanes per tap (`(ky, kx)`
/// order), then the bias, into `dst` (`(taps + 1) * BLOCK` elements).
/// Lanes past the last channel (the last block of a layer) get zero
/// weights and bias: in the blocked layout they are written, as zeros.
fn pack_block(p: &Conv2dParams, weight: &[f32], bias: Option<&[f32]>, ob: usize, dst: &mut [f32]) {
    const CB: usize = crate::cpu::blocked::BLOCK;
    let ntaps = p.kernel_h * p.kernel_w;
    let c0 = ob * CB;
    let valid = CB.min(p.out_channels - c0);
    let (wb, bb) = dst[..(ntaps + 1) * CB].split_at_mut(ntaps * CB);
    for (t, w) in wb.chunks_exact_mut(CB).enumerate() {
        for (l, w) in w.iter_mut().enumerate() {
            *w = if l < valid {
                weight[(c0 + l) * ntaps + t]
            } else {
                0.0
            };
        }
    }
    for (l, b) in bb.iter_mut().enumerate() {
        *b = match bias {
            Some(b) if l < valid => b[c0 + l],
            _ => 0.0,
        };
    }
}

/// Depthwise convolution in the channel-blocked layout
/// ([`crate::cpu::blocked`]): `input` and `output` are the blocked forms of
/// the NCHW tensors, `packed` the weights and bias ([`pack_blocked`]);
/// `fused` applies in registers, then `epilogue` (offsets in the blocked
/// output). `p` must satisfy [`applies_blocked`].
pub fn conv2d_blocked(
    p: &Conv2dParams,
    input: &[f32],
    packed: &[f32],
    output: &mut [f32],
    fused: crate::cpu::blocked::Fused<'_>,
    epilogue: Option<Epilogue<f32>>,
) -> KernelResult<()> {
    use crate::cpu::blocked::blocked_len;
    check_len(
        "blocked depthwise input",
        input.len(),
        blocked_len(p.batch, p.in_channels, p.in_h * p.in_w)?,
    )?;
    check_len(
        "blocked depthwise output",
        output.len(),
        blocked_len(p.batch, p.out_channels, p.out_h() * p.out_w())?,
    )?;
    check_len(
        "packed depthwise weights",
        packed.len(),
        blocked_packed_len(p)?,
    )?;
    if !applies_blocked(p) {
        return Err(crate::KernelError::Precondition {
            what: "the blocked depthwise convolution needs one output channel per input channel, a column stride of at most 4, AVX2 and FMA",
        });
    }
    #[cfg(target_arch = "x86_64")]
    return blocked::conv2d(
        p,
        blocked::Io::Blocked,
        input,
        packed,
        output,
        fused,
        epilogue,
    );
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (fused, epilogue);
        Ok(())
    }
}

/// Whether [`conv2d_nhwc`] takes `p`: [`applies_blocked`], with a whole
/// number of channel blocks ([`crate::cpu::blocked::BLOCK`]), so each
/// block's lanes are one vector of every pixel.
pub fn applies_nhwc(p: &Conv2dParams) -> bool {
    applies_blocked(p) && p.in_channels.is_multiple_of(crate::cpu::blocked::BLOCK)
}

/// Depthwise convolution of channels-last (NHWC) input into channels-last
/// output: `input` is `[batch][in_h][in_w][channels]`, `output`
/// `[batch][out_h][out_w][channels]`, `packed` the weights and bias
/// ([`pack_blocked`]). Read in place, with no transposes: PyTorch hands
/// channels-last activations to swapped layers (ConvNeXt's blocks). `p`
/// must satisfy [`applies_nhwc`].
pub fn conv2d_nhwc(
    p: &Conv2dParams,
    input: &[f32],
    packed: &[f32],
    output: &mut [f32],
) -> KernelResult<()> {
    p.check_buffers(input.len(), None, output.len())?;
    check_len(
        "packed depthwise weights",
        packed.len(),
        blocked_packed_len(p)?,
    )?;
    if !applies_nhwc(p) {
        return Err(crate::KernelError::Precondition {
            what: "the channels-last depthwise convolution needs one output channel per input channel, a multiple of 8 channels, a column stride of at most 4, AVX2 and FMA",
        });
    }
    #[cfg(target_arch = "x86_64")]
    if nhwc::applies(p) {
        return nhwc::conv2d(p, input, packed, output);
    }
    #[cfg(target_arch = "x86_64")]
    return blocked::conv2d(
        p,
        blocked::Io::Nhwc,
        input,
        packed,
        output,
        Default::default(),
        None,
    );
    #[cfg(not(target_arch = "x86_64"))]
    Ok(())
}

/// Whether [`conv2d`] runs `p`, in f32, on channel blocks and so reads the
/// weights [`pack_blocked`] packs (which its caller may keep).
pub fn reads_packed(p: &Conv2dParams) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        applies(p) && blocked_applies()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = p;
        false
    }
}

/// Whether f32 layers run on channel blocks ([`blocked`]) rather than plane
/// by plane: with AVX2 and FMA, unless a test forces the planes.
#[cfg(target_arch = "x86_64")]
fn blocked_applies() -> bool {
    #[cfg(test)]
    if FORCE_PLANES.with(|f| f.get()) {
        return false;
    }
    blocked::available()
}

#[cfg(all(test, target_arch = "x86_64"))]
thread_local! {
    /// Makes f32 layers run plane by plane, so tests cover both paths.
    static FORCE_PLANES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Writes the zero-padded, phase-split copy of the plane `src` into `copy`
/// (of `layout.copy_len` elements): padded pixel `(r, c)` goes to
/// `copy[((r % sh) * sw + c % sw) * sub_len + (r / sh) * sub_w + c / sw]`.
/// Only those positions are written, the same ones for every plane of `p`:
/// everything else must already be zero.
fn fill<T: Float>(p: &Conv2dParams, layout: &Layout, src: &[T], copy: &mut [T]) {
    let (sh, sw) = p.stride;
    let sub_len = layout.sub_h * layout.sub_w;
    let (top, left) = (p.padding.top, p.padding.left);
    for (y, row) in src.chunks_exact(p.in_w).enumerate() {
        let r = top + y;
        let base = (r % sh) * sw * sub_len + (r / sh) * layout.sub_w;
        if sw == 1 {
            copy[base + left..][..p.in_w].copy_from_slice(row);
            continue;
        }
        if sw == 2 {
            // Pairs of columns split into the two phases (vectorises).
            let odd = left % 2;
            let (first, rest) = row.split_at(odd.min(row.len()));
            // `left + odd` is even: each pair lands at the same index of both phases.
            let c0 = (left + odd) / 2;
            if let Some(&v) = first.first() {
                copy[base + sub_len + left / 2] = v;
            }
            let (ph0, ph1) = copy[base..].split_at_mut(sub_len);
            let pairs = rest.chunks_exact(2);
            let tail = pairs.remainder();
            let n = rest.len() / 2;
            for ((a, b), pair) in ph0[c0..c0 + n]
                .iter_mut()
                .zip(&mut ph1[c0..c0 + n])
                .zip(pairs)
            {
                *a = pair[0];
                *b = pair[1];
            }
            if let Some(&v) = tail.first() {
                ph0[c0 + n] = v;
            }
            continue;
        }
        // One phase at a time: a strided read into a unit-stride write. A
        // row narrower than the stride leaves some phases empty, and not
        // always the last ones (2 columns after 1 of padding, stride 3:
        // phases 1 and 2).
        for phase in 0..sw {
            let x0 = (phase + sw - left % sw) % sw;
            if x0 >= p.in_w {
                continue;
            }
            let dst = &mut copy[base + phase * sub_len + (left + x0) / sw..];
            for (d, &v) in dst.iter_mut().zip(row[x0..].iter().step_by(sw)) {
                *d = v;
            }
        }
    }
}

multiversion! {
    /// The flat output run from the copy: see [`flat_conv_impl`].
    unsafe fn flat_conv<T>(layout: &Layout, copy: &[T], w: &[T], bias: T, flat: &mut [T]) => flat_conv_impl
}

/// `flat[i] = bias + sum over taps t of w[t] * copy[layout.taps[t] + i]`, in
/// chunks of [`CHUNK`] accumulated in registers.
///
/// # Safety
/// `flat` has `layout.flat_len` elements, `w` one per tap, and `copy` at
/// least `layout.taps[t] + layout.flat_len` for every tap.
#[inline(always)]
unsafe fn flat_conv_impl<T: Float>(layout: &Layout, copy: &[T], w: &[T], bias: T, flat: &mut [T]) {
    for (c, out) in flat.chunks_exact_mut(CHUNK).enumerate() {
        let i0 = c * CHUNK;
        let mut acc = [bias; CHUNK];
        for (&off, &wv) in layout.taps.iter().zip(w) {
            // SAFETY: off + i0 + CHUNK <= off + flat_len <= copy.len().
            let s = unsafe { copy.get_unchecked(off + i0..off + i0 + CHUNK) };
            for i in 0..CHUNK {
                acc[i] += wv * s[i];
            }
        }
        out.copy_from_slice(&acc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::conv2d::direct;
    use crate::params::Padding2d;

    /// Every stride, dilation, padding, multiplier, channel count (one
    /// partial channel block, and two) and plane size the grid holds, against
    /// the generic direct kernel, in f32 (blocked and plane by plane) and
    /// f64, on this thread and on two.
    #[test]
    fn matches_direct_convolution() {
        grid();
        crate::cpu::test_util::on_two_threads(grid);
    }

    fn grid() {
        let mut cases = 0;
        for &(k, stride, dil, pad) in &[
            (3, 1, 1, (1, 1, 1, 1)),
            (3, 2, 1, (1, 1, 1, 1)),
            (5, 2, 1, (2, 2, 2, 2)),
            (5, 1, 2, (4, 4, 4, 4)),
            (3, 3, 1, (0, 2, 1, 0)),
            (1, 1, 1, (0, 0, 0, 0)),
            (7, 1, 1, (3, 3, 3, 3)),
            (3, 2, 1, (0, 1, 0, 1)),
            (5, 1, 1, (2, 1, 0, 2)),
        ] {
            for &(h, w, c) in &[
                (7, 7, 3),
                (9, 40, 11),
                (1, 33, 3),
                (12, 5, 11),
                (14, 14, 3),
                (37, 41, 9), // a larger plane of odd sizes
                (5, 60, 11), // wide enough to read blocked input in place
                // Rows of 1 to 6 output pixels.
                (6, 3, 3),
                (5, 6, 3),
                (3, 2, 3),
            ] {
                for &mult in &[1, 2] {
                    let p = Conv2dParams {
                        batch: 2,
                        in_channels: c,
                        in_h: h,
                        in_w: w,
                        out_channels: c * mult,
                        kernel_h: k,
                        kernel_w: k,
                        stride: (stride, stride),
                        padding: Padding2d {
                            top: pad.0,
                            bottom: pad.1,
                            left: pad.2,
                            right: pad.3,
                        },
                        dilation: (dil, dil),
                        groups: c,
                    };
                    if p.padded_h() < p.effective_kernel_h()
                        || p.padded_w() < p.effective_kernel_w()
                    {
                        continue;
                    }
                    check::<f32>(&p, 1e-5);
                    #[cfg(target_arch = "x86_64")]
                    {
                        FORCE_PLANES.with(|f| f.set(true));
                        check::<f32>(&p, 1e-5);
                        FORCE_PLANES.with(|f| f.set(false));
                        if mult == 1 {
                            check_blocked(&p);
                        }
                    }
                    check::<f64>(&p, 1e-12);
                    cases += 1;
                    #[cfg(target_arch = "x86_64")]
                    if mult == 1 {
                        // Whole channel blocks, as channels-last input needs:
                        // one block, and two; with AVX-512 (stride 1) one
                        // vector, three, two groups of five, and groups of
                        // five and four (each a plane per vector).
                        for c in [8, 16, 48, 160, 144] {
                            let p = Conv2dParams {
                                in_channels: c,
                                out_channels: c,
                                groups: c,
                                ..p
                            };
                            check_nhwc(&p);
                        }
                    }
                }
            }
        }
        assert!(cases > 40, "{cases}");
    }

    fn check<T: Float>(p: &Conv2dParams, tol: f64) {
        let val = |i: usize| T::from_f64(((i * 7919) % 23) as f64 / 11.0 - 1.0).unwrap();
        let x: Vec<T> = (0..p.input_len()).map(val).collect();
        let w: Vec<T> = (0..p.weight_len()).map(|i| val(i * 3 + 1)).collect();
        let b: Vec<T> = (0..p.out_channels).map(|i| val(i + 5)).collect();
        let mut want = vec![T::zero(); p.output_len()];
        direct::conv2d(p, &x, &w, Some(&b), &mut want).unwrap();
        // The epilogue adds a residual (the output's index, which checks the
        // offsets it is given) and applies ReLU.
        let r = |i: usize| T::from_f64(i as f64 * 1e-3).unwrap();
        want.iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = (*v + r(i)).max(T::zero()));
        let mut got = vec![T::nan(); p.output_len()];
        let relu = |at: usize, s: &mut [T]| {
            for (i, v) in s.iter_mut().enumerate() {
                *v = (*v + r(at + i)).max(T::zero());
            }
        };
        conv2d(p, &x, &w, Some(&b), None, &mut got, Some(&relu)).unwrap();
        let compare = |got: &[T]| {
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                let d = (*g - *e).abs().to_f64().unwrap();
                assert!(d <= tol, "{p:?} at {i}: {g:?} vs {e:?}");
            }
        };
        compare(&got);
        // f32 on channel blocks again, with the weights packed beforehand
        // (as the op keeps them).
        if let (Some(w32), Some(b32)) = (crate::float::as_f32(&w), crate::float::as_f32(&b)) {
            if reads_packed(p) {
                let mut packed = vec![f32::NAN; blocked_packed_len(p).unwrap()];
                pack_blocked(p, w32, Some(b32), &mut packed).unwrap();
                got.fill(T::nan());
                conv2d(p, &x, &w, Some(&b), Some(&packed), &mut got, Some(&relu)).unwrap();
                compare(&got);
                // A packed buffer of the wrong length is refused.
                let short = &packed[..packed.len() - 1];
                assert!(conv2d(p, &x, &w, Some(&b), Some(short), &mut got, None).is_err());
            }
        }
    }

    /// The blocked entry point against the NCHW one: input reordered in, the
    /// output (with the same residual, in the blocked layout, and ReLU)
    /// reordered back; the padding lanes come out zero.
    #[cfg(target_arch = "x86_64")]
    fn check_blocked(p: &Conv2dParams) {
        use crate::cpu::blocked::{available, blocked_len, from_blocked, to_blocked};
        if !available() {
            // AI3_CPU_ISA rules the blocked kernels out: nothing runs them.
            return;
        }
        let val = |i: usize| ((i * 7919) % 23) as f32 / 11.0 - 1.0;
        let x: Vec<f32> = (0..p.input_len()).map(val).collect();
        let w: Vec<f32> = (0..p.weight_len()).map(|i| val(i * 3 + 1)).collect();
        let b: Vec<f32> = (0..p.out_channels).map(|i| val(i + 5)).collect();
        let r: Vec<f32> = (0..p.output_len()).map(|i| val(i + 11)).collect();
        let mut want = vec![0.0; p.output_len()];
        direct::conv2d(p, &x, &w, Some(&b), &mut want).unwrap();
        want.iter_mut()
            .zip(&r)
            .for_each(|(v, r)| *v = (*v + r).max(0.0));
        let (plane_in, plane_out) = (p.in_h * p.in_w, p.out_h() * p.out_w());
        let mut xb = vec![0.0; blocked_len(p.batch, p.in_channels, plane_in).unwrap()];
        to_blocked(p.batch, p.in_channels, plane_in, &x, &mut xb).unwrap();
        let mut rb = vec![0.0; blocked_len(p.batch, p.out_channels, plane_out).unwrap()];
        to_blocked(p.batch, p.out_channels, plane_out, &r, &mut rb).unwrap();
        let e = |at: usize, s: &mut [f32]| {
            for (v, r) in s.iter_mut().zip(&rb[at..]) {
                *v = (*v + r).max(0.0);
            }
        };
        // The residual and ReLU as an epilogue, then fused in registers.
        let fused = crate::cpu::blocked::Fused {
            residual: Some(&rb),
            clamp: Some((0.0, f32::INFINITY)),
        };
        for (fused, epilogue) in [
            (Default::default(), Some(&e as Epilogue<f32>)),
            (fused, None),
        ] {
            let mut ob = vec![f32::NAN; rb.len()];
            conv2d_blocked(p, &xb, &packed(p, &w, &b), &mut ob, fused, epilogue).unwrap();
            let cb = p.out_channels.div_ceil(8);
            for (i, v) in ob.iter().enumerate() {
                let lane = (i % 8) + ((i / (8 * plane_out)) % cb) * 8;
                assert!(
                    lane < p.out_channels || *v == 0.0,
                    "{p:?}: padding lane {lane} holds {v}"
                );
            }
            let mut got = vec![0.0; p.output_len()];
            from_blocked(p.batch, p.out_channels, plane_out, &ob, &mut got).unwrap();
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                let fused = epilogue.is_none();
                assert!(
                    (g - e).abs() <= 1e-5,
                    "{p:?} fused={fused} at {i}: {g} vs {e}"
                );
            }
        }
    }

    /// The channels-last entry point against the NCHW one, both layouts
    /// made by transposing.
    #[cfg(target_arch = "x86_64")]
    fn check_nhwc(p: &Conv2dParams) {
        if !crate::cpu::blocked::available() {
            // AI3_CPU_ISA rules the blocked kernels out: nothing runs them.
            return;
        }
        let val = |i: usize| ((i * 7919) % 23) as f32 / 11.0 - 1.0;
        let x: Vec<f32> = (0..p.input_len()).map(val).collect();
        let w: Vec<f32> = (0..p.weight_len()).map(|i| val(i * 3 + 1)).collect();
        let b: Vec<f32> = (0..p.out_channels).map(|i| val(i + 5)).collect();
        let mut want = vec![0.0; p.output_len()];
        direct::conv2d(p, &x, &w, Some(&b), &mut want).unwrap();
        use crate::cpu::test_util::channels_last;
        let (plane_in, plane_out) = (p.in_h * p.in_w, p.out_h() * p.out_w());
        let xt = channels_last(&x, p.in_channels, plane_in, false);
        let mut ot = vec![f32::NAN; p.output_len()];
        conv2d_nhwc(p, &xt, &packed(p, &w, &b), &mut ot).unwrap();
        let got = channels_last(&ot, p.out_channels, plane_out, true);
        for (i, (g, e)) in got.iter().zip(&want).enumerate() {
            assert!((g - e).abs() <= 1e-5, "{p:?} at {i}: {g} vs {e}");
        }
    }

    #[test]
    fn refuses_what_is_not_depthwise_and_wrong_buffers() {
        let p = Conv2dParams {
            batch: 1,
            in_channels: 4,
            in_h: 5,
            in_w: 5,
            out_channels: 4,
            kernel_h: 3,
            kernel_w: 3,
            stride: (1, 1),
            padding: Padding2d::default(),
            dilation: (1, 1),
            groups: 2,
        };
        let (x, w) = (vec![0f32; 100], vec![0f32; 4 * 2 * 9]);
        let mut out = vec![0f32; 4 * 9];
        assert!(conv2d(&p, &x, &w, None, None, &mut out, None).is_err());
        let p = Conv2dParams { groups: 4, ..p };
        let mut short = vec![0f32; 3];
        assert!(conv2d(&p, &x, &w[..36], None, None, &mut short, None).is_err());
        // Channels last takes whole blocks of 8 channels only.
        assert!(!applies_nhwc(&p));
        let mut packed = vec![0f32; blocked_packed_len(&p).unwrap()];
        pack_blocked(&p, &w[..36], None, &mut packed).unwrap();
        assert!(conv2d_nhwc(&p, &x, &packed, &mut out).is_err());
        // Packing checks its buffers.
        assert!(pack_blocked(&p, &w[..35], None, &mut packed).is_err());
        assert!(pack_blocked(&p, &w[..36], Some(&[0.0; 3]), &mut packed).is_err());
        assert!(pack_blocked(&p, &w[..36], None, &mut packed[1..]).is_err());
        if applies_blocked(&p) {
            let mut ob = vec![0f32; 8 * 9];
            let xb = vec![0f32; 8 * 25];
            assert!(
                conv2d_blocked(&p, &xb, &packed[1..], &mut ob, Default::default(), None).is_err()
            );
        }
    }

    /// The weights and bias of `p` packed for the blocked entry points.
    #[cfg(target_arch = "x86_64")]
    fn packed(p: &Conv2dParams, w: &[f32], b: &[f32]) -> Vec<f32> {
        let mut packed = vec![f32::NAN; blocked_packed_len(p).unwrap()];
        pack_blocked(p, w, Some(b), &mut packed).unwrap();
        packed
    }
}
