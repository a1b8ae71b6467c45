//! The blocked 1x1 convolution of an input whose channels are first
//! multiplied, image by image, by a per-channel scale: squeeze-and-
//! excitation's `conv(x * s)` (EfficientNet's and MobileNetV3's blocks,
//! `s` of shape `[n, c, 1, 1]`), with no pass over `x` to scale it.
//!
//! `conv(x * s) = conv'(x)` where `conv'`'s weight for input channel `c`
//! is the weight times `s[c]`: a row of the packed weights
//! (`PackedWeights`: one row per input channel) scaled by one
//! value. Where an image's weights are far fewer than its input's elements
//! (`WEIGHTS_PER_INPUT`: layers with few output channels on large
//! planes, EfficientNet-B0's first five projections), each image's weights
//! are scaled (once for a scale the batch shares), and the 1x1 kernel runs
//! on the input as it is, image `n` on its own weights. Elsewhere the input
//! is scaled into a per-thread copy first, the pass a `mul` node would
//! make (`ai3._fusion` folds the scale only where the weights are scaled).

use super::pointwise::{self, Pointwise};
use super::{blocked_len, Fused, BLOCK};
use crate::alloc::{check_len, checked_product, KernelResult};
use crate::cpu::conv2d::Epilogue;
use crate::cpu::scratch::with_scratch_named;

/// How many times fewer elements the scaled weights must have than the
/// input (of the images that share a scale) for the weights to be scaled
/// rather than the input. Each image's weights are its own to stream as
/// well as to write: in efficientnet_b0 on a 2-core Zen 4 with AVX-512
/// (the layer against a `mul` node and the unscaled layer, per-node
/// medians) weights a third to a half of the input (240 -> 80 to 672 ->
/// 112 at 14x14) took 1.07-1.16x the time at batch 1 and 10, and weights
/// 1% to 6% of it (32 -> 16 at 112x112 to 240 -> 40 at 28x28) 0.75-0.96x.
const WEIGHTS_PER_INPUT: usize = 8;

/// Elements of scaled weights from which the scaling is shared between the
/// threads.
const PARALLEL_ELEMENTS: usize = 1 << 15;

/// [`pointwise::conv2d`] of `input` with input channel `c` of image `n`
/// multiplied by `scale[(n % scale_batch) * ceil(c / 8) * 8 + c]` first:
/// `scale` is the blocked form of `[scale_batch, in_channels, 1, 1]`, with
/// `scale_batch` 1 (one scale for every image) or the batch. `packed` is
/// [`pointwise::pack`]'s, `fused` and `epilogue` as
/// [`pointwise::conv2d`]'s (the epilogue's offsets in the whole output).
/// Fails, before writing anything, on a buffer of the wrong length or
/// another `scale_batch`; a refused scratch allocation fails the call.
#[allow(clippy::too_many_arguments)]
pub fn conv2d(
    s: &Pointwise,
    input: &[f32],
    scale: &[f32],
    scale_batch: usize,
    packed: &[f32],
    output: &mut [f32],
    fused: Fused<'_>,
    epilogue: Option<Epilogue<f32>>,
) -> KernelResult<()> {
    if scale_batch != 1 && scale_batch != s.batch {
        return Err(crate::KernelError::Precondition {
            what: "a 1x1 convolution's input scale has a batch of 1 or the input's",
        });
    }
    check_len(
        "1x1 input scale",
        scale.len(),
        blocked_len(scale_batch, s.in_channels, 1)?,
    )?;
    pointwise::check(s, input, packed, output, fused)?;
    if s.batch == 0 || s.in_channels == 0 {
        // Nothing to scale: the output is the bias (and what is fused).
        return pointwise::conv2d(s, input, packed, output, fused, epilogue);
    }
    let lanes = s.in_channels.div_ceil(BLOCK) * BLOCK;
    let weights = s.weights().len();
    let image_in = blocked_len(1, s.in_channels, s.in_plane())?;
    // Images that share one scale: every image, or one.
    let shared = if scale_batch == 1 { s.batch } else { 1 };
    if s.subsample.is_none()
        && weights.saturating_mul(WEIGHTS_PER_INPUT) <= image_in.saturating_mul(shared)
    {
        // Each image's scaled weights (one set for a shared scale), then
        // the bias: one call of the kernel over the batch, its images split
        // between the threads as the unscaled layer's are.
        let sets = s.batch / shared;
        let bias = &packed[weights..];
        let len = checked_product("scaled 1x1 weights", &[sets, weights])?;
        return with_scratch_named(len + bias.len(), "scaled 1x1 weights", |w| {
            let (ws, wb) = w.split_at_mut(len);
            wb.copy_from_slice(bias);
            let row = s.weights().unit() * BLOCK;
            for (set, dst) in ws.chunks_mut(weights).enumerate() {
                scale_rows(&packed[..weights], row, &scale[set * lanes..][..lanes], dst);
            }
            let w_image = if shared == 1 { weights } else { 0 };
            pointwise::conv2d_per_image(s, input, w, w_image, output, fused, epilogue);
        });
    }
    with_scratch_named(input.len(), "scaled 1x1 input", |x| {
        super::per_channel(
            s.batch,
            s.in_channels,
            s.in_plane(),
            input,
            scale,
            scale_batch,
            x,
            |v, c| v * c,
            |_| {},
        )?;
        pointwise::conv2d(s, x, packed, output, fused, epilogue)
    })?
}

/// Writes packed weights `packed` ([`pointwise::pack`]'s, without the
/// bias) into `w` with each input channel's row of `row` weights (one
/// packed unit of output blocks' lanes, see `PackedWeights`) multiplied by
/// its value in `sv` (one per input lane), in parallel when large.
fn scale_rows(packed: &[f32], row: usize, sv: &[f32], w: &mut [f32]) {
    use rayon::prelude::*;

    let lanes = sv.len();
    let scale = |(i, (dst, src)): (usize, (&mut [f32], &[f32]))| {
        let c = sv[i % lanes];
        dst.iter_mut().zip(src).for_each(|(d, &v)| *d = v * c);
    };
    if w.len() >= PARALLEL_ELEMENTS && rayon::current_num_threads() > 1 {
        w.par_chunks_mut(row)
            .zip(packed.par_chunks(row))
            .enumerate()
            .with_min_len(PARALLEL_ELEMENTS / 2 / row)
            .for_each(scale);
    } else {
        w.chunks_mut(row)
            .zip(packed.chunks(row))
            .enumerate()
            .for_each(scale);
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::cpu::blocked::pointwise::tests::{blocked, plain, Case};
    use crate::cpu::test_util::Rng;

    /// `s` with a scale of `scale_batch` images, against an f64 reference
    /// that scales the input first, with a residual and a clamp fused or
    /// as an epilogue.
    fn case(s: Pointwise, scale_batch: usize) {
        let c = Case::new(
            s,
            true,
            (s.in_channels * 31 + s.out_channels * 5 + s.plane) as u64,
        );
        let sc = Rng::new(s.plane as u64).vec(scale_batch * s.in_channels);
        let sb = blocked(&sc, scale_batch, s.in_channels, 1);
        let want = c.want(Some((&sc, scale_batch)));
        let e = c.epilogue();
        for (fused, epilogue) in [
            (Fused::default(), Some(&e as Epilogue<f32>)),
            (c.fused(), None),
        ] {
            let mut ob = vec![f32::NAN; c.rb.len()];
            conv2d(
                &s,
                &c.xb,
                &sb,
                scale_batch,
                &c.packed,
                &mut ob,
                fused,
                epilogue,
            )
            .unwrap();
            let what = format!("scale batch {scale_batch} epilogue={}", epilogue.is_some());
            c.check(&ob, &want, &what);
        }
    }

    fn grid() {
        // Weights scaled (few output channels on large planes, one image or
        // several, each with its own weights or, with a scale of batch 1,
        // shared; over the parallel size), input scaled (more output
        // channels; partial blocks), and weights scaled only for a shared
        // scale (3 images of 20 -> 12 at 7x7).
        let cases = [
            (1, 96, 24, 3136),
            (2, 40, 16, 784),
            (3, 240, 40, 784),
            (1, 256, 128, 3136),
            (3, 20, 12, 49),
            (2, 11, 5, 30),
            (1, 1152, 320, 49),
            (2, 100, 300, 4),
            (1, 672, 112, 196),
            // No input channel: the bias.
            (2, 0, 16, 9),
        ];
        for (batch, ic, oc, plane) in cases {
            let s = plain((batch, ic, oc, plane));
            case(s, batch);
            case(s, 1);
        }
        // Strided: the input is scaled, then subsampled.
        let u = super::super::pointwise::Subsample {
            in_h: 9,
            in_w: 8,
            stride: (2, 2),
        };
        let (h, w) = u.out_hw();
        case(
            Pointwise {
                subsample: Some(u),
                ..plain((2, 24, 16, h * w))
            },
            2,
        );
    }

    #[test]
    fn matches_the_reference_on_one_thread_and_two() {
        if !crate::cpu::blocked::available() {
            return;
        }
        grid();
        crate::cpu::test_util::on_two_threads(grid);
    }

    #[test]
    fn a_scale_of_another_batch_or_length_is_an_error() {
        let s = Pointwise {
            batch: 2,
            in_channels: 8,
            out_channels: 8,
            plane: 4,
            subsample: None,
        };
        let x = vec![0.0; blocked_len(2, 8, 4).unwrap()];
        let packed = vec![0.0; s.packed_len().unwrap()];
        let mut out = vec![0.0; x.len()];
        let f = Fused::default();
        let err = conv2d(&s, &x, &[0.0; 24], 3, &packed, &mut out, f, None).unwrap_err();
        assert!(err.to_string().contains("batch of 1"), "{err}");
        let err = conv2d(&s, &x, &[0.0; 9], 1, &packed, &mut out, f, None).unwrap_err();
        assert!(err.to_string().contains("input scale"), "{err}");
    }
}
