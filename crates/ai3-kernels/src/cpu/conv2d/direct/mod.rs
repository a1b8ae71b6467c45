//! Direct convolution, register-blocked.
//!
//! The input is copied once into a zero-padded, column-phase-split buffer
//! (`Padded`) so every tap becomes a unit-stride shifted read. The output is
//! cut into blocks of `MR` output channels by `NV` slots (a slot is up to one
//! vector of consecutive columns of one output row, of any image); a
//! microkernel (`kernel`) keeps the block's accumulators in registers while it
//! reduces over input channels and kernel taps. Weights are packed ([`pack`],
//! once per layer in a model) so the `MR` weights of a tap are adjacent.
//!
//! Parallel over (group, slot chunk, output-channel chunk); the channel chunk
//! is sized so its packed weights stay in L2 while a slot group's input stays
//! in L1 across the chunk's channel blocks.

#[cfg(target_arch = "x86_64")]
pub mod blocked;
mod kernel;

use rayon::prelude::*;

use super::padded::{Padded, SendPtr};
use super::{min_len, threads_for};
use crate::alloc::{
    check_len, checked_product, try_vec_with_capacity, try_zeroed_vec, KernelResult,
};
use crate::params::Conv2dParams;
use crate::Float;
use kernel::{Tile, NV_MAX};

/// Bytes of packed weights one task keeps hot.
const WEIGHT_CHUNK_BYTES: usize = 256 << 10;

/// Direct 2-D convolution (see the [module contract](super)).
///
/// Supports stride, dilation, asymmetric zero padding and groups (including
/// depthwise). Packs the weights on every call: a model packs them once with
/// [`pack`] and calls [`conv2d_packed`].
///
/// Fails, before writing anything, when a buffer has the wrong length, and
/// when the padded copy of the input overflows or cannot be allocated.
pub fn conv2d<T: Float>(
    p: &Conv2dParams,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
) -> KernelResult<()> {
    run(p, input, weight, bias, output, false)
}

/// [`conv2d`] with weights and bias from [`pack`].
pub fn conv2d_packed<T: Float>(
    p: &Conv2dParams,
    input: &[T],
    packed: &[T],
    output: &mut [T],
) -> KernelResult<()> {
    run_packed(p, input, packed, output, false)
}

/// Register block `(MR, NV)` for `ocg` output channels per group.
fn block_shape(ocg: usize) -> (usize, usize) {
    kernel::SHAPES
        .into_iter()
        .find(|&(mr, _)| ocg >= mr)
        .unwrap_or(kernel::SHAPES[kernel::SHAPES.len() - 1])
}

/// `(oc blocks per group, elements of one block's weights)` of the packing.
fn packing(p: &Conv2dParams) -> (usize, usize) {
    let (mr, _) = block_shape(p.out_channels_per_group());
    let nob = p.out_channels_per_group().div_ceil(mr);
    (
        nob,
        p.in_channels_per_group() * p.kernel_h * p.kernel_w * mr,
    )
}

/// Whether `T` layers of `p` run on channel blocks ([`blocked`]): f32 with
/// one group on a CPU with AVX2 and FMA, unless the test asks for the
/// `portable` microkernel.
#[cfg_attr(
    not(target_arch = "x86_64"),
    allow(clippy::extra_unused_type_parameters)
)]
fn on_blocks<T: Float>(p: &Conv2dParams, portable: bool) -> bool {
    #[cfg(target_arch = "x86_64")]
    return !portable
        && std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
        && blocked::applies(p);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (p, portable);
        false
    }
}

/// Whether `T` layers of `p` run on the channel-blocked kernel
/// ([`blocked`]) rather than the NCHW microkernel.
pub fn runs_blocked<T: Float>(p: &Conv2dParams) -> bool {
    on_blocks::<T>(p, false)
}

/// Direct convolution into the channel-blocked layout
/// ([`crate::cpu::blocked`]): `output` is the blocked form of the NCHW
/// tensor, `input` too, or, when `nchw_input` (a layer of at most
/// [`crate::cpu::blocked::BLOCK`] input channels, such as an RGB input
/// layer: [`reads_nchw_into_blocked`]), the NCHW tensor itself, read where
/// it lies with no reorder into blocks. `packed` as [`pack`] leaves it for
/// f32; `fused` applies in registers, then `epilogue` (offsets in the
/// blocked output). `p` must satisfy [`runs_blocked`] for f32.
pub fn conv2d_blocked(
    p: &Conv2dParams,
    nchw_input: bool,
    input: &[f32],
    packed: &[f32],
    output: &mut [f32],
    fused: crate::cpu::blocked::Fused<'_>,
    epilogue: Option<super::Epilogue<f32>>,
) -> KernelResult<()> {
    #[cfg(target_arch = "x86_64")]
    {
        let io = if nchw_input {
            blocked::Io::NchwToBlocked
        } else {
            blocked::Io::Blocked
        };
        blocked::conv2d(p, io, input, packed, output, fused, epilogue)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (p, nchw_input, input, packed, output, fused, epilogue);
        Err(crate::KernelError::Precondition {
            what: "the blocked direct convolution needs x86-64 with AVX2 and FMA",
        })
    }
}

/// Whether [`conv2d_blocked`] takes `p` with NCHW input: [`runs_blocked`]
/// for f32, with at most [`crate::cpu::blocked::BLOCK`] input channels.
pub fn reads_nchw_into_blocked(p: &Conv2dParams) -> bool {
    runs_blocked::<f32>(p) && p.in_channels <= crate::cpu::blocked::BLOCK
}

/// Length of what [`pack`] writes for `T` (`p` has passed
/// [`Conv2dParams::check_sizes`]).
pub fn packed_len<T: Float>(p: &Conv2dParams) -> KernelResult<usize> {
    packed_len_for(p, on_blocks::<T>(p, false))
}

fn packed_len_for(p: &Conv2dParams, blocks: bool) -> KernelResult<usize> {
    #[cfg(target_arch = "x86_64")]
    if blocks {
        return blocked::packed_len(p);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = blocks;
    const WHAT: &str = "packed direct weights";
    let (mr, _) = block_shape(p.out_channels_per_group());
    let nob = p.out_channels_per_group().div_ceil(mr);
    let wblock = checked_product(
        WHAT,
        &[p.in_channels_per_group(), p.kernel_h, p.kernel_w, mr],
    )?;
    let block = wblock
        .checked_add(mr)
        .ok_or(crate::KernelError::Overflow { what: WHAT })?;
    checked_product(WHAT, &[p.groups, nob, block])
}

/// Packs `weight` and `bias` for [`conv2d_packed`] into `packed` (of
/// [`packed_len`] elements): weights `[group][oc block][icg][taps][MR]` so the
/// `MR` weights of a tap are adjacent, then the bias `[group][oc block][MR]`,
/// both padded with zeros (or as [`blocked::pack`] packs them, for the
/// layers that run on channel blocks). Depends only on the weight's
/// geometry, not on the input's size.
pub fn pack<T: Float>(
    p: &Conv2dParams,
    weight: &[T],
    bias: Option<&[T]>,
    packed: &mut [T],
) -> KernelResult<()> {
    pack_for(p, weight, bias, packed, on_blocks::<T>(p, false))
}

fn pack_for<T: Float>(
    p: &Conv2dParams,
    weight: &[T],
    bias: Option<&[T]>,
    packed: &mut [T],
    blocks: bool,
) -> KernelResult<()> {
    p.check_sizes()?;
    #[cfg(target_arch = "x86_64")]
    if blocks {
        use crate::float::{as_f32, as_f32_mut};
        if let (Some(w), Some(d)) = (as_f32(weight), as_f32_mut(packed)) {
            let b = bias.map(|b| as_f32(b).expect("T is f32"));
            return blocked::pack(p, w, b, d);
        }
    }
    p.check_weights(weight.len(), bias.map(<[T]>::len))?;
    check_len(
        "packed direct weights",
        packed.len(),
        packed_len_for(p, blocks)?,
    )?;
    let icg = p.in_channels_per_group();
    let ocg = p.out_channels_per_group();
    let ntaps = p.kernel_h * p.kernel_w;
    let (mr, _) = block_shape(ocg);
    let (nob, wblock) = packing(p);
    let (weights, pbias) = packed.split_at_mut(p.groups * nob * wblock);
    weights.fill(T::zero());
    pbias.fill(T::zero());
    weights
        .par_chunks_mut(wblock)
        .zip(pbias.par_chunks_mut(mr))
        .with_min_len(min_len(p))
        .enumerate()
        .for_each(|(gb, (dst, db))| {
            let (g, ob) = (gb / nob, gb % nob);
            for m in 0..mr.min(ocg - ob * mr) {
                let o = g * ocg + ob * mr + m;
                let src = &weight[o * icg * ntaps..][..icg * ntaps];
                for (k, &v) in src.iter().enumerate() {
                    dst[k * mr + m] = v;
                }
                db[m] = bias.map_or(T::zero(), |b| b[o]);
            }
        });
    Ok(())
}

/// [`conv2d`], optionally with the portable microkernel whatever the CPU.
fn run<T: Float>(
    p: &Conv2dParams,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
    portable: bool,
) -> KernelResult<()> {
    p.check_buffers(input.len(), bias.map(<[T]>::len), output.len())?;
    if output.is_empty() {
        return Ok(());
    }
    let blocks = on_blocks::<T>(p, portable);
    let mut packed = try_zeroed_vec(packed_len_for(p, blocks)?, "packed direct weights")?;
    pack_for(p, weight, bias, &mut packed, blocks)?;
    run_packed(p, input, &packed, output, portable)
}

/// [`conv2d_packed`], optionally with the portable microkernel.
fn run_packed<T: Float>(
    p: &Conv2dParams,
    input: &[T],
    packed: &[T],
    output: &mut [T],
    portable: bool,
) -> KernelResult<()> {
    #[cfg(target_arch = "x86_64")]
    if on_blocks::<T>(p, portable) {
        use crate::float::{as_f32, as_f32_mut};
        if let (Some(x), Some(w), Some(out)) = (as_f32(input), as_f32(packed), as_f32_mut(output)) {
            return blocked::conv2d(p, blocked::Io::Nchw, x, w, out, Default::default(), None);
        }
    }
    p.check_buffers(input.len(), None, output.len())?;
    check_len(
        "packed direct weights",
        packed.len(),
        packed_len_for(p, false)?,
    )?;

    let (oh, ow) = (p.out_h(), p.out_w());
    let plane_out = oh * ow;
    if output.is_empty() {
        return Ok(());
    }
    let ocg = p.out_channels_per_group();
    let vl = kernel::vector_len::<T>();
    let (mr, nv) = block_shape(ocg);
    let tile = kernel::select::<T>(mr, nv, portable);

    let pad = Padded::new(p, input)?;
    let taps = pad.tap_offsets(p)?;

    // Slots: (input offset within the group, output offset within the
    // block's first channel, real columns).
    let spr = ow.div_ceil(vl);
    let mut slots = try_vec_with_capacity(p.batch * oh * spr, "direct convolution slots")?;
    for n in 0..p.batch {
        for y in 0..oh {
            for x0 in (0..ow).step_by(vl) {
                slots.push((
                    n * pad.img_stride + pad.pixel_offset(p, y, x0),
                    n * p.out_channels * plane_out + y * ow + x0,
                    vl.min(ow - x0),
                ));
            }
        }
    }
    let nsg = slots.len().div_ceil(nv);

    let (nob, wblock) = packing(p);
    let (packed, pbias) = packed.split_at(p.groups * nob * wblock);
    let icg = p.in_channels_per_group();
    let ntaps = p.kernel_h * p.kernel_w;

    // Tasks: (group, slot chunk, oc chunk).
    let ob_chunk = (WEIGHT_CHUNK_BYTES / (wblock * std::mem::size_of::<T>()).max(1)).clamp(1, nob);
    let n_obc = nob.div_ceil(ob_chunk);
    let threads = threads_for(p);
    let sg_chunk = (nsg * n_obc * p.groups / (16 * threads)).clamp(1, 64);
    let n_sgc = nsg.div_ceil(sg_chunk);
    let ntasks = p.groups * n_sgc * n_obc;

    let out = SendPtr(output.as_mut_ptr());
    let inp = SendPtr(pad.buf.as_ptr() as *mut T);
    (0..ntasks)
        .into_par_iter()
        .with_min_len(min_len(p))
        .for_each(|t| {
            let (out, inp) = (&out, &inp);
            let g = t / (n_sgc * n_obc);
            let sgc = (t / n_obc) % n_sgc;
            let obc = t % n_obc;
            let in_g = g * icg * pad.chan_stride;
            let out_g = g * ocg * plane_out;
            let mut a = Tile {
                inp: [std::ptr::null(); NV_MAX],
                out: [std::ptr::null_mut(); NV_MAX],
                len: [0; NV_MAX],
                w: std::ptr::null(),
                bias: std::ptr::null(),
                icg,
                chan_stride: pad.chan_stride,
                taps: taps.as_ptr(),
                ntaps,
                oc_stride: plane_out,
                mr_valid: 0,
            };
            let mut o_offs = [0usize; NV_MAX];
            for sg in sgc * sg_chunk..((sgc + 1) * sg_chunk).min(nsg) {
                // `v` indexes three arrays in lockstep.
                #[allow(clippy::needless_range_loop)]
                for v in 0..nv {
                    let s = sg * nv + v;
                    // A padding slot re-reads the group's first pixel and writes nothing.
                    let (i_off, o_off, len) = slots.get(s).copied().unwrap_or((0, 0, 0));
                    // SAFETY: offsets were computed inside the padded buffer and
                    // the output; reads past a row stay inside the buffer's slack.
                    a.inp[v] = unsafe { inp.0.add(in_g + i_off) };
                    o_offs[v] = out_g + o_off;
                    a.len[v] = len;
                }
                for ob in obc * ob_chunk..((obc + 1) * ob_chunk).min(nob) {
                    let gb = g * nob + ob;
                    a.w = packed[gb * wblock..].as_ptr();
                    a.bias = pbias[gb * mr..].as_ptr();
                    a.mr_valid = mr.min(ocg - ob * mr);
                    // SAFETY: block-relative output offsets (ob * mr channels on)
                    // are written by this task only.
                    unsafe {
                        for (dst, &o_off) in a.out.iter_mut().zip(&o_offs).take(nv) {
                            *dst = out.0.add(o_off + ob * mr * plane_out);
                        }
                        tile(&a);
                    }
                }
            }
        });
    Ok(())
}

#[cfg(test)]
mod tests {
    crate::cpu::test_util::blocked_conv_tests!("direct", crate::cpu::conv2d::direct);

    #[test]
    fn huge_padding_is_an_allocation_error() {
        crate::cpu::test_util::check_conv_refuses_huge_padding(super::conv2d::<f32>);
    }

    /// One packing serves batches and planes of every size, with groups
    /// (the NCHW microkernel) and without (channel blocks, where the CPU
    /// has them).
    #[test]
    fn weights_packed_once_serve_every_input_size() {
        use crate::cpu::test_util::{assert_close, cast, reference_conv, Rng};
        use crate::params::{Conv2dParams, Padding2d};
        for groups in [2, 1] {
            let layer = |batch: usize, hw: usize| Conv2dParams {
                batch,
                in_channels: 6,
                in_h: hw,
                in_w: hw + 3,
                out_channels: 10,
                kernel_h: 3,
                kernel_w: 3,
                stride: (1, 2),
                padding: Padding2d::symmetric(1, 0),
                dilation: (1, 1),
                groups,
            };
            let mut rng = Rng::new(5);
            let first = layer(1, 7);
            let weight = rng.vec(first.weight_len());
            let bias = rng.vec(first.out_channels);
            let mut packed = vec![f32::NAN; super::packed_len::<f32>(&first).unwrap()];
            super::pack(&first, &cast(&weight), Some(&cast(&bias)), &mut packed).unwrap();
            for p in [first, layer(3, 12), layer(2, 5)] {
                let input = rng.vec(p.input_len());
                let want = reference_conv(&p, &input, &weight, Some(&bias));
                let mut out = vec![f32::NAN; p.output_len()];
                super::conv2d_packed(&p, &cast(&input), &packed, &mut out).unwrap();
                assert_close(&out, &want, 1e-4, "direct packed once");
            }
        }
    }
}
