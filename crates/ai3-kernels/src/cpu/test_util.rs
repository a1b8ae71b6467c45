//! Helpers shared by the CPU kernels' unit tests: a deterministic generator,
//! a textbook reference convolution in f64, and tolerance checks.

use crate::alloc::{KernelError, KernelResult};
use crate::params::{Conv2dParams, Padding2d};
use crate::Float;

/// SplitMix64: tiny, deterministic, and good enough to fill test tensors.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }

    pub fn vec(&mut self, len: usize) -> Vec<f64> {
        (0..len).map(|_| self.uniform()).collect()
    }
}

pub fn cast<T: Float>(v: &[f64]) -> Vec<T> {
    v.iter()
        .map(|&x| T::from_f64(x).unwrap_or_else(T::nan))
        .collect()
}

/// The convolution exactly as the textbook formula states it.
pub fn reference_conv(
    p: &Conv2dParams,
    input: &[f64],
    weight: &[f64],
    bias: Option<&[f64]>,
) -> Vec<f64> {
    let (oh, ow) = (p.out_h(), p.out_w());
    let icg = p.in_channels_per_group();
    let ocg = p.out_channels_per_group();
    let mut out = vec![0.0; p.output_len()];
    for n in 0..p.batch {
        for o in 0..p.out_channels {
            let g = o / ocg;
            for y in 0..oh {
                for x in 0..ow {
                    let mut s = bias.map_or(0.0, |b| b[o]);
                    for c in 0..icg {
                        let ci = g * icg + c;
                        for ky in 0..p.kernel_h {
                            for kx in 0..p.kernel_w {
                                let iy = (y * p.stride.0 + ky * p.dilation.0) as isize
                                    - p.padding.top as isize;
                                let ix = (x * p.stride.1 + kx * p.dilation.1) as isize
                                    - p.padding.left as isize;
                                if iy < 0
                                    || ix < 0
                                    || iy >= p.in_h as isize
                                    || ix >= p.in_w as isize
                                {
                                    continue;
                                }
                                let iv = input[((n * p.in_channels + ci) * p.in_h + iy as usize)
                                    * p.in_w
                                    + ix as usize];
                                let wv =
                                    weight[((o * icg + c) * p.kernel_h + ky) * p.kernel_w + kx];
                                s += iv * wv;
                            }
                        }
                    }
                    out[((n * p.out_channels + o) * oh + y) * ow + x] = s;
                }
            }
        }
    }
    out
}

/// `[batch][channels][plane]` rewritten channels last, `[batch][plane][channels]`,
/// or back from it with `back`.
pub fn channels_last<T: Copy>(src: &[T], channels: usize, plane: usize, back: bool) -> Vec<T> {
    let mut dst = src.to_vec();
    let image = channels * plane;
    for (n, img) in src.chunks_exact(image.max(1)).enumerate() {
        for c in 0..channels {
            for q in 0..plane {
                let (nchw, nhwc) = (c * plane + q, q * channels + c);
                let (from, to) = if back { (nhwc, nchw) } else { (nchw, nhwc) };
                dst[n * image + to] = img[from];
            }
        }
    }
    dst
}

/// Asserts `got` matches `want` within `rel` of the largest magnitude in `want`.
pub fn assert_close<T: Float>(got: &[T], want: &[f64], rel: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1e-30f64, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let g = g.to_f64().unwrap_or(f64::NAN);
        assert!(
            (g - w).abs() <= rel * scale,
            "{what}: element {i}: got {g}, want {w} (scale {scale})"
        );
    }
}

/// A conv configuration grid covering the cases every algorithm must handle.
pub fn conv_grid() -> Vec<Conv2dParams> {
    let mut out = Vec::new();
    let kernels = [(1, 1), (3, 3), (5, 3)];
    let strides = [(1, 1), (2, 2), (1, 2)];
    let paddings = [
        Padding2d::default(),
        Padding2d::symmetric(1, 1),
        Padding2d {
            top: 2,
            bottom: 0,
            left: 1,
            right: 3,
        },
    ];
    let dilations = [(1, 1), (2, 1)];
    // (in_channels, out_channels, groups)
    let channels = [(3, 4, 1), (4, 6, 2), (4, 4, 4)];
    let images = [(1, 9, 7), (3, 6, 11)];
    for &(kh, kw) in &kernels {
        for &stride in &strides {
            for &padding in &paddings {
                for &dilation in &dilations {
                    for &(ic, oc, groups) in &channels {
                        for &(batch, in_h, in_w) in &images {
                            let p = Conv2dParams {
                                batch,
                                in_channels: ic,
                                in_h,
                                in_w,
                                out_channels: oc,
                                kernel_h: kh,
                                kernel_w: kw,
                                stride,
                                padding,
                                dilation,
                                groups,
                            };
                            if p.effective_kernel_h() <= p.padded_h()
                                && p.effective_kernel_w() <= p.padded_w()
                            {
                                out.push(p);
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// A convolution algorithm taking the plain weight.
pub type ConvFn<T> = fn(&Conv2dParams, &[T], &[T], Option<&[T]>, &mut [T]) -> KernelResult<()>;

/// Checks `conv32` / `conv64` on one problem with random data, with and
/// without bias, against [`reference_conv`] (outputs start as NaN, so every
/// element must be written).
pub fn check_conv_case(
    name: &str,
    p: &Conv2dParams,
    rng: &mut Rng,
    conv32: ConvFn<f32>,
    conv64: ConvFn<f64>,
) {
    let input = rng.vec(p.input_len());
    let weight = rng.vec(p.weight_len());
    let bias_v = rng.vec(p.out_channels);
    for bias in [None, Some(bias_v.as_slice())] {
        let want = reference_conv(p, &input, &weight, bias);
        let what = format!("{name} {p:?} bias={}", bias.is_some());

        let mut out64 = vec![f64::NAN; p.output_len()];
        conv64(p, &input, &weight, bias, &mut out64).unwrap();
        assert_close(&out64, &want, 1e-10, &what);

        let b32 = bias.map(cast::<f32>);
        let mut out32 = vec![f32::NAN; p.output_len()];
        conv32(
            p,
            &cast::<f32>(&input),
            &cast::<f32>(&weight),
            b32.as_deref(),
            &mut out32,
        )
        .unwrap();
        assert_close(&out32, &want, 1e-4, &what);
    }
}

/// Runs `conv` (an algorithm taking the plain weight) over the grid, in f32
/// and f64, with and without bias, against [`reference_conv`].
pub fn check_conv_algorithm(name: &str, conv32: ConvFn<f32>, conv64: ConvFn<f64>) {
    let mut rng = Rng::new(7);
    for p in conv_grid() {
        check_conv_case(name, &p, &mut rng, conv32, conv64);
    }
}

/// A small problem: `[2, 4, 6, 7]` input, 3x3 kernel, padding 1, 2 groups.
pub fn small_problem() -> Conv2dParams {
    Conv2dParams {
        batch: 2,
        in_channels: 4,
        in_h: 6,
        in_w: 7,
        out_channels: 6,
        kernel_h: 3,
        kernel_w: 3,
        stride: (1, 1),
        padding: Padding2d::symmetric(1, 1),
        dilation: (1, 1),
        groups: 2,
    }
}

/// Checks that `conv` (taking the plain weight) rejects an input, weight,
/// bias or output of the wrong length with [`KernelError::Length`], in
/// release builds too, and writes nothing then.
pub fn check_conv_lengths(conv: ConvFn<f32>) {
    let p = small_problem();
    let (i, w, b) = (
        vec![1.0; p.input_len()],
        vec![1.0; p.weight_len()],
        vec![1.0; p.out_channels],
    );
    let mut out = vec![f32::NAN; p.output_len()];
    let mut short = vec![f32::NAN; p.output_len() - 1];
    let length = |r: KernelResult<()>| matches!(r, Err(KernelError::Length { .. }));
    assert!(length(conv(&p, &i, &w, Some(&b), &mut short)));
    assert!(length(conv(&p, &i[1..], &w, Some(&b), &mut out)));
    assert!(length(conv(&p, &i, &w[1..], Some(&b), &mut out)));
    assert!(length(conv(&p, &i, &w, Some(&b[1..]), &mut out)));
    assert!(
        out.iter().chain(&short).all(|v| v.is_nan()),
        "written before the check"
    );
    conv(&p, &i, &w, Some(&b), &mut out).unwrap();
    assert!(out.iter().all(|v| v.is_finite()));
}

/// A layer with padding and dilation 10^6 on a `[1, 2, 8, 8]` input: the
/// output is `[1, 3, 8, 8]`, but a padded copy of the input would take
/// 2e12 elements per channel plane.
pub fn hugely_padded_problem() -> Conv2dParams {
    Conv2dParams {
        batch: 1,
        in_channels: 2,
        in_h: 8,
        in_w: 8,
        out_channels: 3,
        kernel_h: 3,
        kernel_w: 3,
        stride: (1, 1),
        padding: Padding2d::symmetric(1_000_000, 1_000_000),
        dilation: (1_000_000, 1_000_000),
        groups: 1,
    }
}

/// Checks that `conv` reports the hugely padded problem's buffers as an
/// allocation failure (terabytes: more than any test machine has) instead of
/// aborting, and writes nothing.
pub fn check_conv_refuses_huge_padding(conv: ConvFn<f32>) {
    let p = hugely_padded_problem();
    assert_eq!((p.out_h(), p.out_w()), (8, 8));
    let (i, w) = (vec![1.0; p.input_len()], vec![1.0; p.weight_len()]);
    let mut out = vec![f32::NAN; p.output_len()];
    match conv(&p, &i, &w, None, &mut out) {
        Err(KernelError::Alloc { bytes, .. }) => assert!(bytes > 1 << 40, "{bytes}"),
        other => panic!("expected an allocation failure, got {other:?}"),
    }
    assert!(out.iter().all(|v| v.is_nan()), "written before failing");
}

/// Runs `f` on a two-thread pool, so the kernels' "many tasks, one thread
/// each" path is exercised whatever the machine's core count. Convolutions
/// too small to share run on one thread outside tests; from here on they are
/// shared anyway, so these small test problems take the parallel paths.
pub fn on_two_threads(f: impl FnOnce() + Send) {
    crate::cpu::conv2d::SHARE_SMALL.store(true, std::sync::atomic::Ordering::Relaxed);
    rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("a two-thread pool")
        .install(f);
}

/// The standard tests of a blocked conv2d kernel with a portable fallback:
/// the reference grid, larger shapes, the portable path, and two threads.
/// `$module` must expose `conv2d` and `run(p, i, w, b, o, force_portable)`.
macro_rules! blocked_conv_tests {
    ($name:literal, $module:path) => {
        use $crate::cpu::conv2d::padded::check_larger_shapes;
        use $crate::cpu::test_util::{check_conv_algorithm, on_two_threads};
        use $module as kernel;

        fn portable<T: $crate::Float>(
            p: &$crate::params::Conv2dParams,
            i: &[T],
            w: &[T],
            b: Option<&[T]>,
            o: &mut [T],
        ) -> $crate::KernelResult<()> {
            kernel::run(p, i, w, b, o, true)
        }

        #[test]
        fn matches_reference() {
            check_conv_algorithm($name, kernel::conv2d::<f32>, kernel::conv2d::<f64>);
        }

        #[test]
        fn matches_reference_on_larger_shapes() {
            check_larger_shapes($name, kernel::conv2d::<f32>, kernel::conv2d::<f64>);
        }

        #[test]
        fn portable_kernel_matches_reference() {
            check_conv_algorithm($name, portable::<f32>, portable::<f64>);
            check_larger_shapes($name, portable::<f32>, portable::<f64>);
        }

        #[test]
        fn matches_reference_on_two_threads() {
            on_two_threads(|| {
                check_conv_algorithm($name, kernel::conv2d::<f32>, kernel::conv2d::<f64>)
            });
        }

        #[test]
        fn wrong_lengths_are_errors_before_any_write() {
            $crate::cpu::test_util::check_conv_lengths(kernel::conv2d::<f32>);
        }
    };
}
pub(crate) use blocked_conv_tests;
