//! Direct convolution on channel blocks, for f32 on AVX2 and FMA: the
//! pointwise tile's structure ([`crate::cpu::blocked::pointwise`]) with
//! kernel taps. Each image's input is copied once into a zero-padded buffer
//! whose pixels hold 8 input channels side by side (`[in block][padded
//! row][padded column][8]`, the channel-blocked layout with borders), so a
//! tap is a fixed offset and one cache line serves 8 input channels. The
//! register tile (`cpu/blocked/tile.rs`, wider on AVX-512) is a
//! few blocks of 8 output channels by a few pixels of one output row: per
//! input channel of a tap, one weight vector per block and a broadcast of
//! each pixel's value feed an FMA per block and pixel. The
//! vectors run over output channels, so small planes (7x7, 14x14) and
//! thin layers fill every lane, which the NCHW kernels vectorised over a
//! row's pixels cannot.
//!
//! Weights are packed once ([`pack`]): `[out block][in block][tap][input
//! lane][8 output lanes]`, then the bias. Each image is split into tasks of
//! (group of output blocks, output row); a row is cut into tiles of equal
//! size so no tile runs nearly empty. Input and output are NCHW (each
//! image's planes transposed into the padded copy, each tile's results
//! scattered to 8 planes), or both channel-blocked, as the layout planner
//! keeps them between layers (the padded copy then takes whole rows, each
//! tile stores its vectors as they are, and the fused epilogue runs on each
//! finished row). The padded copy is per-thread scratch: only its borders
//! are zeroed on each call.

use rayon::prelude::*;

use super::super::{threads_for_macs, Epilogue, SharedMut};
use crate::alloc::{check_len, checked_product, KernelResult};
use crate::cpu::blocked::tile::{self, Tile, OBT_MAX};
use crate::cpu::blocked::{check_conv_buffers, Fused, PackedWeights, BLOCK as CB};
use crate::cpu::conv2d::depthwise;
use crate::cpu::scratch::with_scratch_named;
use crate::params::Conv2dParams;

/// Whether this path takes `p`: one group, on a CPU with AVX2 and FMA (the
/// caller checks that the elements are f32).
pub fn applies(p: &Conv2dParams) -> bool {
    p.groups == 1 && crate::cpu::blocked::available()
}

fn blocks(c: usize) -> usize {
    c.div_ceil(CB)
}

/// The packed weights' layout: a row per input lane of each tap of each
/// input block; in pairs of output blocks on AVX-512 for layers whose tiles
/// read whole input blocks with windows one or two pixels apart (stride 1
/// or 2 across), for which the AVX-512 tile has instances with the step
/// between windows a constant.
///
/// Measured on an Intel Xeon with AVX-512 (the kernel alone, one thread,
/// hot, 5 paired rounds): pairs took 0.89-0.98x the time on stride-1 3x3
/// layers (128 -> 128 at 28x28 0.91x, 256 -> 256 at 14x14 0.94x, 32 -> 48
/// at 28x28 0.89x; 64 -> 64 at 56x56 1.04x); on stride-2 ones 0.87x on 128
/// -> 128 at 56x56 (0.90x at batch 10), 0.89x on ConvNeXt's 2x2
/// downsampling 96 -> 192 at 56x56, 0.99-1.00x on 256 -> 256 at 28x28 and
/// 512 -> 512 at 14x14. (With the step a run-time value, before the tile
/// had constant-step instances for stride 2, pairs had read 1.38x on 128
/// -> 128 at 56x56.)
fn weights(p: &Conv2dParams) -> PackedWeights {
    PackedWeights::new(
        blocks(p.out_channels),
        blocks(p.in_channels) * p.kernel_h * p.kernel_w * CB,
        matches!(p.stride.1, 1 | 2) && p.in_channels >= CB,
    )
}

/// Elements of the packed weights and bias ([`pack`]).
pub fn packed_len(p: &Conv2dParams) -> KernelResult<usize> {
    let w = checked_product(
        "packed blocked direct weights",
        &[
            blocks(p.out_channels).next_multiple_of(weights(p).unit()),
            blocks(p.in_channels),
            p.kernel_h,
            p.kernel_w,
            CB,
            CB,
        ],
    )?;
    w.checked_add(blocks(p.out_channels) * CB)
        .ok_or(crate::KernelError::Overflow {
            what: "packed blocked direct weights",
        })
}

/// Packs `weight` (`[out][in][kh][kw]`, one group) and `bias` for
/// [`conv2d`]: per output block (or pair of them on AVX-512, see
/// `PackedWeights`), per input block, tap and input lane, the block's 8
/// output lanes; then the bias. Lanes past the channel counts are zero.
pub fn pack(
    p: &Conv2dParams,
    weight: &[f32],
    bias: Option<&[f32]>,
    packed: &mut [f32],
) -> KernelResult<()> {
    p.check_weights(weight.len(), bias.map(<[f32]>::len))?;
    check_len(
        "packed blocked direct weights",
        packed.len(),
        packed_len(p)?,
    )?;
    let (ic, taps) = (p.in_channels, p.kernel_h * p.kernel_w);
    let layout = weights(p);
    let (w, b) = packed.split_at_mut(layout.len());
    w.fill(0.0);
    b.fill(0.0);
    for o in 0..p.out_channels {
        let (ob, ol) = (o / CB, o % CB);
        for i in 0..ic {
            let (ib, il) = (i / CB, i % CB);
            for t in 0..taps {
                w[layout.at(ob, (ib * taps + t) * CB + il, ol)] = weight[(o * ic + i) * taps + t];
            }
        }
        if let Some(bias) = bias {
            b[o] = bias[o];
        }
    }
    Ok(())
}

/// Where [`conv2d`] reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Io {
    /// NCHW input and output.
    Nchw,
    /// Channel-blocked input and output.
    Blocked,
    /// NCHW input of at most [`CB`] channels (an RGB input layer), blocked
    /// output: the input is read where it lies, with no reorder into blocks.
    NchwToBlocked,
}

impl Io {
    fn blocked_in(self) -> bool {
        self == Io::Blocked
    }

    fn blocked_out(self) -> bool {
        self != Io::Nchw
    }
}

/// The convolution `p` (one group) of `input` with weights [`pack`]ed into
/// `packed`, into `output`, in the layouts `io` gives (see [`Io`]): with
/// blocked output, `fused` applies in registers and `epilogue`, if any,
/// runs on each finished row of a block, with offsets in the blocked
/// output; NCHW output takes neither. Fails, before writing anything, when
/// a buffer has the wrong length or `p` is not [`applies`] (or has more
/// than [`CB`] input channels for [`Io::NchwToBlocked`]); a refused scratch
/// allocation fails the call.
///
/// An NCHW input of fewer than [`CB`] channels is copied into a padded
/// buffer of `in_channels` values per pixel (not a whole block), rows
/// split between the threads: an RGB layer's copy is 3/8 of a block's.
pub fn conv2d(
    p: &Conv2dParams,
    io: Io,
    input: &[f32],
    packed: &[f32],
    output: &mut [f32],
    fused: Fused<'_>,
    epilogue: Option<Epilogue<f32>>,
) -> KernelResult<()> {
    let (blocked_in, blocked) = (io.blocked_in(), io.blocked_out());
    check_conv_buffers(p, (blocked_in, blocked), input.len(), output.len())?;
    if !blocked && (epilogue.is_some() || fused.residual.is_some() || fused.clamp.is_some()) {
        return Err(crate::KernelError::Precondition {
            what: "the blocked direct convolution fuses an epilogue only into blocked output",
        });
    }
    fused.check(output.len())?;
    check_len(
        "packed blocked direct weights",
        packed.len(),
        packed_len(p)?,
    )?;
    if !applies(p) {
        return Err(crate::KernelError::Precondition {
            what: "the blocked direct convolution needs one group, AVX2 and FMA",
        });
    }
    if io == Io::NchwToBlocked && p.in_channels > CB {
        return Err(crate::KernelError::Precondition {
            what: "the blocked direct convolution reads NCHW input into blocked output only for at most 8 input channels",
        });
    }
    let (oh, ow) = (p.out_h(), p.out_w());
    if p.batch == 0 || oh * ow == 0 {
        return Ok(());
    }
    let (icb, ocb) = (blocks(p.in_channels), blocks(p.out_channels));
    let (pw, ph) = (p.padded_w(), p.padded_h());
    // Values per pixel of the padded copy: a whole block, or every channel
    // of an NCHW input of fewer.
    let compact = !blocked_in && p.in_channels < CB;
    let px_in = if compact { p.in_channels } else { CB };
    let in_block = ph * pw * px_in;
    let taps: Vec<usize> = (0..p.kernel_h)
        .flat_map(|ky| {
            (0..p.kernel_w).map(move |kx| (ky * p.dilation.0 * pw + kx * p.dilation.1) * px_in)
        })
        .collect();
    let taps = &taps;
    let layout = weights(p);
    let w_stride = layout.stride();
    let bias = &packed[layout.len()..];
    let plane_in = p.in_h * p.in_w;
    let plane_out = oh * ow;
    let last_lanes = p.in_channels - icb.saturating_sub(1) * CB;
    let block_tiles = tile::BlockTiles::new(ocb);
    let groups = block_tiles.count();
    let threads = threads_for_macs(p.macs());
    let buf_len = checked_product("padded input copy", &[icb, ph, pw, px_in])?;
    with_scratch_named::<f32, _>(buf_len, "padded input copy", |buf| {
        for n in 0..p.batch {
            let pack_block = |(b, dst): (usize, &mut [f32])| {
                // The buffer is reused: its borders are zeroed, the rest packed.
                depthwise::zero_borders(p, pw, dst);
                if blocked_in {
                    let src = &input[(n * icb + b) * plane_in * CB..][..plane_in * CB];
                    depthwise::pack_pixels(p, pw, src, CB, dst);
                    return;
                }
                let image = &input[n * p.in_channels * plane_in..][..p.in_channels * plane_in];
                let valid = CB.min(p.in_channels - b * CB);
                // Lanes past the last channel read it again (their weights are zero).
                let srcs: [&[f32]; CB] = std::array::from_fn(|l| {
                    &image[(b * CB + l.min(valid - 1)) * plane_in..][..plane_in]
                });
                // SAFETY: AVX2 and FMA (`applies`); `dst` is one block's
                // padded buffer, each source one input plane.
                unsafe { depthwise::pack_padded(p, pw, &srcs, dst) };
            };
            if compact {
                let image = &input[n * p.in_channels * plane_in..][..p.in_channels * plane_in];
                pack_channels(p, pw, image, buf, threads > 1);
            } else if threads > 1 {
                buf.par_chunks_mut(in_block)
                    .enumerate()
                    .for_each(pack_block);
            } else {
                buf.chunks_mut(in_block).enumerate().for_each(pack_block);
            }
            let buf = &*buf;
            // Output block `ob`'s plane starts at `ob * out_block`, pixel `q`
            // (NCHW channel `ob * CB + c`) at `q * px + c * lane`.
            let (image_out, out_block, px, lane) = if blocked {
                (ocb * plane_out * CB, plane_out * CB, CB, 1)
            } else {
                (p.out_channels * plane_out, CB * plane_out, 1, plane_out)
            };
            let out = SharedMut(output[n * image_out..].as_mut_ptr());
            let residual = fused.residual.map(|r| &r[n * image_out..]);
            let task = |t: usize| {
                let out = &out;
                let (group, y) = (t / oh, t % oh);
                let (ob, nob) = block_tiles.get(group);
                // Empty without input channels (the tiles then read nothing).
                let row = buf.get(y * p.stride.0 * pw * px_in..).unwrap_or_default();
                // Channels of each output block of the tile.
                let valid: [usize; OBT_MAX] =
                    std::array::from_fn(|o| CB.min(p.out_channels.saturating_sub((ob + o) * CB)));
                let at = ob * out_block + y * ow * px;
                // SAFETY: AVX2 and FMA; the tiles read row y's windows
                // inside the padded buffer, the weights and bias of blocks
                // ob..ob + nob, and write row y of those channels' planes,
                // which this task alone owns (the residual, checked, has the
                // output's length).
                unsafe {
                    tile::row(
                        nob,
                        ow,
                        &Tile {
                            x: row.as_ptr(),
                            x_block: in_block,
                            icb,
                            last_lanes,
                            taps,
                            step: p.stride.1 * px_in,
                            w: packed.as_ptr().add(layout.start(ob)),
                            w_stride,
                            w_pairs: layout.pairs,
                            bias: bias.as_ptr().add(ob * CB),
                            out: out.0.add(at),
                            out_block,
                            blocked,
                            lane,
                            valid,
                            residual: residual.map_or(std::ptr::null(), |r| r[at..].as_ptr()),
                            clamp: fused.clamp,
                            start: crate::cpu::blocked::tile::Start::Bias,
                        },
                    )
                };
                if let Some(e) = epilogue {
                    for o in 0..nob {
                        let row = (ob + o) * out_block + y * ow * CB;
                        // SAFETY: row y of output block ob + o, which this
                        // task alone wrote, is finished.
                        let s = unsafe { std::slice::from_raw_parts_mut(out.0.add(row), ow * CB) };
                        e(n * image_out + row, s);
                    }
                }
            };
            let tasks = groups * oh;
            if threads > 1 && tasks > 1 {
                (0..tasks).into_par_iter().for_each(task);
            } else {
                (0..tasks).for_each(task);
            }
        }
    })
}

/// Copies one NCHW image of fewer than [`CB`] channels into `buf` as a
/// zero-padded `[padded row][padded column][channel]` array (`pw` padded
/// columns), rows split between the threads when `parallel`.
fn pack_channels(p: &Conv2dParams, pw: usize, image: &[f32], buf: &mut [f32], parallel: bool) {
    let (c, plane) = (p.in_channels, p.in_h * p.in_w);
    debug_assert!(c < CB, "{c} channels are packed as blocks");
    let (top, left) = (p.padding.top, p.padding.left);
    let row_len = pw * c;
    if row_len == 0 {
        // No input channel (or column): nothing to copy.
        return;
    }
    let pack_row = |(y, row): (usize, &mut [f32])| {
        let Some(iy) = y.checked_sub(top).filter(|&iy| iy < p.in_h) else {
            row.fill(0.0);
            return;
        };
        row[..left * c].fill(0.0);
        row[(left + p.in_w) * c..].fill(0.0);
        let inner = &mut row[left * c..][..p.in_w * c];
        let src = |ch: usize| &image[ch * plane + iy * p.in_w..][..p.in_w];
        // Pixel by pixel with the channel count known to the compiler: a
        // strided pass per channel took a third of an RGB layer's time.
        match c {
            0 => {}
            1 => inner.copy_from_slice(src(0)),
            2 => interleave::<2>(inner, std::array::from_fn(src)),
            3 => interleave::<3>(inner, std::array::from_fn(src)),
            4 => interleave::<4>(inner, std::array::from_fn(src)),
            5 => interleave::<5>(inner, std::array::from_fn(src)),
            6 => interleave::<6>(inner, std::array::from_fn(src)),
            // 7: the caller copies whole blocks of 8 channels or more as blocks.
            _ => interleave::<7>(inner, std::array::from_fn(src)),
        }
    };
    let buf = &mut buf[..p.padded_h() * row_len];
    if parallel {
        buf.par_chunks_mut(row_len)
            .enumerate()
            .with_min_len(8)
            .for_each(pack_row);
    } else {
        buf.chunks_mut(row_len).enumerate().for_each(pack_row);
    }
}

/// Writes `C` rows of `src` into `dst` pixel by pixel: `dst[x * C + c] =
/// src[c][x]`.
fn interleave<const C: usize>(dst: &mut [f32], src: [&[f32]; C]) {
    for (x, d) in dst.chunks_exact_mut(C).enumerate() {
        for (d, s) in d.iter_mut().zip(&src) {
            *d = s[x];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::blocked::{blocked_len, from_blocked, to_blocked};
    use crate::cpu::test_util::{assert_close, cast, conv_grid, reference_conv, Rng};
    use crate::params::Padding2d;

    fn check(p: &Conv2dParams, rng: &mut Rng) {
        let x = rng.vec(p.input_len());
        let w = rng.vec(p.weight_len());
        let b = rng.vec(p.out_channels);
        for bias in [None, Some(b.as_slice())] {
            let want = reference_conv(p, &x, &w, bias);
            let mut packed = vec![f32::NAN; packed_len(p).unwrap()];
            let b32 = bias.map(cast::<f32>);
            pack(p, &cast::<f32>(&w), b32.as_deref(), &mut packed).unwrap();
            let mut out = vec![f32::NAN; p.output_len()];
            conv2d(
                p,
                Io::Nchw,
                &cast::<f32>(&x),
                &packed,
                &mut out,
                Default::default(),
                None,
            )
            .unwrap();
            assert_close(&out, &want, 1e-5, &format!("{p:?} bias={}", bias.is_some()));
            // Blocked in and out, with a ReLU as an epilogue: the same
            // values, and zeros in the output's padding lanes; then with a
            // residual and a clamp fused in registers.
            let plane_out = p.out_h() * p.out_w();
            let (in_plane, ocb) = (p.in_h * p.in_w, p.out_channels.div_ceil(CB));
            let mut xb = vec![0f32; blocked_len(p.batch, p.in_channels, in_plane).unwrap()];
            to_blocked(p.batch, p.in_channels, in_plane, &cast::<f32>(&x), &mut xb).unwrap();
            let blocked_out = blocked_len(p.batch, p.out_channels, plane_out).unwrap();
            let r = rng.vec(p.output_len());
            let mut rb = vec![0f32; blocked_out];
            to_blocked(
                p.batch,
                p.out_channels,
                plane_out,
                &cast::<f32>(&r),
                &mut rb,
            )
            .unwrap();
            let relu = |_: usize, s: &mut [f32]| s.iter_mut().for_each(|v| *v = v.max(0.0));
            let fused = Fused {
                residual: Some(&rb),
                clamp: Some((-0.5, 0.75)),
            };
            for (fused, epilogue, f) in [
                (Fused::default(), Some(&relu as Epilogue<f32>), None),
                (fused, None, Some(&r)),
            ] {
                let mut ob = vec![f32::NAN; blocked_out];
                conv2d(p, Io::Blocked, &xb, &packed, &mut ob, fused, epilogue).unwrap();
                if p.in_channels <= CB {
                    // The same from the NCHW input.
                    let mut from_nchw = vec![f32::NAN; blocked_out];
                    let x = cast::<f32>(&x);
                    conv2d(
                        p,
                        Io::NchwToBlocked,
                        &x,
                        &packed,
                        &mut from_nchw,
                        fused,
                        epilogue,
                    )
                    .unwrap();
                    assert_eq!(from_nchw, ob, "NCHW input {p:?}");
                }
                for (i, v) in ob.iter().enumerate() {
                    let ch = (i / (plane_out * CB)) % ocb * CB + i % CB;
                    assert!(ch < p.out_channels || *v == 0.0, "padding lane {ch}: {v}");
                }
                let mut got = vec![f32::NAN; p.output_len()];
                from_blocked(p.batch, p.out_channels, plane_out, &ob, &mut got).unwrap();
                let want: Vec<f64> = match f {
                    None => want.iter().map(|v| v.max(0.0)).collect(),
                    Some(r) => want
                        .iter()
                        .zip(r)
                        .map(|(v, r)| (v + r).clamp(-0.5, 0.75))
                        .collect(),
                };
                assert_close(
                    &got,
                    &want,
                    1e-5,
                    &format!(
                        "blocked {p:?} bias={} fused={}",
                        bias.is_some(),
                        f.is_some()
                    ),
                );
            }
        }
    }

    /// The shared grid's one-group layers (strides, dilation, asymmetric
    /// padding, 3 input channels), then layers with partial and several
    /// channel blocks on planes whose rows split into unequal tiles, and
    /// 1 to 7 input channels, on this thread and on two.
    #[test]
    fn matches_reference() {
        if !crate::cpu::blocked::available() {
            // AI3_CPU_ISA rules the blocked kernels out: nothing runs them.
            return;
        }
        let more = |ic, oc, hw: (usize, usize), k, s| Conv2dParams {
            batch: 2,
            in_channels: ic,
            in_h: hw.0,
            in_w: hw.1,
            out_channels: oc,
            kernel_h: k,
            kernel_w: k,
            stride: (s, s),
            padding: Padding2d::symmetric(k / 2, k / 2),
            dilation: (1, 1),
            groups: 1,
        };
        let mut cases: Vec<Conv2dParams> =
            conv_grid().into_iter().filter(|p| p.groups == 1).collect();
        cases.extend([
            more(20, 11, (7, 7), 3, 1),
            more(16, 32, (14, 13), 3, 1),
            more(9, 24, (15, 17), 3, 2),
            more(3, 16, (23, 19), 7, 2),
            more(8, 8, (1, 20), 1, 1),
            // Five output blocks: a tile of 4 and one of 1 (on AVX-512 the
            // last pair of packed weights half padding), strided or not.
            more(16, 40, (9, 9), 3, 2),
            more(16, 36, (8, 8), 3, 1),
            // No input channel: the output is the bias.
            more(0, 12, (6, 5), 3, 1),
            // The AVX-512 tile's constant steps: stride 2 on blocks with
            // rows of several full tiles (weights in pairs), an RGB input
            // at stride 4; stride 3 reads its step at run time.
            more(16, 40, (6, 52), 3, 2),
            more(3, 24, (16, 37), 4, 4),
            more(16, 24, (7, 31), 3, 3),
            // Stride 2 across only (pairs), and down only (none).
            Conv2dParams {
                stride: (1, 2),
                ..more(12, 20, (5, 30), 3, 1)
            },
            Conv2dParams {
                stride: (2, 1),
                ..more(12, 20, (9, 14), 3, 1)
            },
        ]);
        // Every channel count an NCHW input is interleaved for.
        cases.extend((1..CB).map(|c| more(c, 9 + c, (5 + c, 11 - c), 3, 1 + c % 2)));
        let run = || {
            let mut rng = Rng::new(3);
            for p in &cases {
                check(p, &mut rng);
            }
        };
        run();
        crate::cpu::test_util::on_two_threads(run);
    }

    #[test]
    fn refuses_groups_and_wrong_buffers() {
        let p = crate::cpu::test_util::small_problem();
        assert_eq!(p.groups, 2);
        assert!(!applies(&p));
        let packed = vec![0f32; packed_len(&p).unwrap()];
        let (x, mut out) = (vec![0f32; p.input_len()], vec![0f32; p.output_len()]);
        let none = Fused::default();
        assert!(conv2d(&p, Io::Nchw, &x, &packed, &mut out, none, None).is_err());
        let p = Conv2dParams { groups: 1, ..p };
        // NCHW input into blocked output: at most one block of channels.
        let many = Conv2dParams {
            in_channels: CB + 1,
            ..p
        };
        let wide = vec![0f32; packed_len(&many).unwrap()];
        let n_out = blocked_len(p.batch, p.out_channels, p.out_h() * p.out_w()).unwrap();
        let (xm, mut om) = (vec![0f32; many.input_len()], vec![0f32; n_out]);
        assert!(conv2d(&many, Io::NchwToBlocked, &xm, &wide, &mut om, none, None).is_err());
        assert!(conv2d(&many, Io::Blocked, &xm, &wide, &mut om, none, None).is_err());
        assert!(conv2d(&p, Io::Nchw, &x[1..], &packed, &mut out, none, None).is_err());
        assert!(conv2d(&p, Io::Nchw, &x, &packed[1..], &mut out, none, None).is_err());
        assert!(conv2d(&p, Io::Blocked, &x, &packed, &mut out, none, None).is_err());
        let e = |_: usize, _: &mut [f32]| ();
        assert!(conv2d(&p, Io::Nchw, &x, &packed, &mut out, none, Some(&e)).is_err());
        // Fusion into NCHW output, a short residual, reversed bounds.
        let clamp = Fused {
            residual: None,
            clamp: Some((0.0, 6.0)),
        };
        assert!(conv2d(&p, Io::Nchw, &x, &packed, &mut out, clamp, None).is_err());
        let plane = p.in_h * p.in_w;
        let xb = vec![0f32; blocked_len(p.batch, p.in_channels, plane).unwrap()];
        let n_out = blocked_len(p.batch, p.out_channels, p.out_h() * p.out_w()).unwrap();
        let mut ob = vec![0f32; n_out];
        assert!(conv2d(&p, Io::Blocked, &xb, &packed, &mut ob, none, None).is_ok());
        let short = vec![0f32; n_out - 1];
        let bad = Fused {
            residual: Some(&short),
            clamp: None,
        };
        assert!(conv2d(&p, Io::Blocked, &xb, &packed, &mut ob, bad, None).is_err());
        let bad = Fused {
            residual: None,
            clamp: Some((1.0, 0.0)),
        };
        assert!(conv2d(&p, Io::Blocked, &xb, &packed, &mut ob, bad, None).is_err());
    }
}
