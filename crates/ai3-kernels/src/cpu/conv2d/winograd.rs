//! Winograd F(2x2, 3x3) convolution (Lavin & Gray, 2016).
//!
//! Every 2x2 output tile comes from a 4x4 input tile: `Y = Aᵀ [(G g Gᵀ) ⊙
//! (Bᵀ d B)] A`. Summed over input channels, the elementwise product becomes,
//! for each of the 16 transform positions, a GEMM `(tiles x icg) @ (icg x
//! ocg)`, which is where the time goes. The filter transform `G g Gᵀ` is done
//! once by [`transform_filter`] when a model is built.
//!
//! Only 3x3 kernels with stride 1 and dilation 1 qualify ([`check`]); any
//! padding and any groups are fine.

use rayon::prelude::*;

use super::{for_each_image_group, TaskBudget};
use crate::cpu::matmul::{matmul, MatPtr};
use crate::params::Conv2dParams;
use crate::Float;

/// Number of transform positions in a 4x4 tile.
const POSITIONS: usize = 16;

/// Whether Winograd F(2x2, 3x3) can run `p`; the error names the unmet constraint.
///
/// ```
/// use ai3_kernels::cpu::conv2d::winograd;
/// use ai3_kernels::params::{Conv2dParams, Padding2d};
/// let p = Conv2dParams {
///     batch: 1, in_channels: 1, in_h: 8, in_w: 8, out_channels: 1,
///     kernel_h: 5, kernel_w: 5, stride: (1, 1), padding: Padding2d::default(),
///     dilation: (1, 1), groups: 1,
/// };
/// assert_eq!(winograd::check(&p).unwrap_err(), "winograd needs a 3x3 kernel, got 5x5");
/// ```
pub fn check(p: &Conv2dParams) -> Result<(), String> {
    if (p.kernel_h, p.kernel_w) != (3, 3) {
        return Err(format!(
            "winograd needs a 3x3 kernel, got {}x{}",
            p.kernel_h, p.kernel_w
        ));
    }
    if p.stride != (1, 1) {
        return Err(format!("winograd needs stride 1, got {:?}", p.stride));
    }
    if p.dilation != (1, 1) {
        return Err(format!("winograd needs dilation 1, got {:?}", p.dilation));
    }
    Ok(())
}

/// Length of the transformed filter [`transform_filter`] returns.
pub fn transformed_filter_len(p: &Conv2dParams) -> usize {
    POSITIONS * p.out_channels * p.in_channels_per_group()
}

/// Transforms a `[out_channels, in_channels / groups, 3, 3]` weight into
/// `U = G g Gᵀ`, laid out `[groups, 16, icg, ocg]`: for each group and
/// transform position a row-major `icg x ocg` matrix, the right-hand side of
/// that position's GEMM.
///
/// Call it once when the model is built; `p` must pass [`check`].
pub fn transform_filter<T: Float>(p: &Conv2dParams, weight: &[T]) -> Vec<T> {
    debug_assert!(check(p).is_ok());
    debug_assert_eq!(weight.len(), p.weight_len());
    let icg = p.in_channels_per_group();
    let ocg = p.out_channels_per_group();
    let mut u = vec![T::zero(); transformed_filter_len(p)];
    for o in 0..p.out_channels {
        let (g, oo) = (o / ocg, o % ocg);
        for c in 0..icg {
            let taps = &weight[(o * icg + c) * 9..][..9];
            let t = filter_tile(taps);
            for (xi, &v) in t.iter().enumerate() {
                u[((g * POSITIONS + xi) * icg + c) * ocg + oo] = v;
            }
        }
    }
    u
}

/// Winograd F(2x2, 3x3) 2-D convolution with a weight from [`transform_filter`]
/// (see the [module contract](super)); `p` must pass [`check`].
///
/// Tiles on the right and bottom edges that stick out of the output are
/// computed on zero-extended input and clipped when written.
pub fn conv2d<T: Float>(
    p: &Conv2dParams,
    input: &[T],
    transformed_filter: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
) {
    debug_assert!(check(p).is_ok());
    debug_assert_eq!(input.len(), p.input_len());
    debug_assert_eq!(transformed_filter.len(), transformed_filter_len(p));
    debug_assert_eq!(output.len(), p.output_len());
    debug_assert!(bias.is_none_or(|b| b.len() == p.out_channels));

    let icg = p.in_channels_per_group();
    let ocg = p.out_channels_per_group();
    let plane_in = p.in_h * p.in_w;
    let tiles_w = p.out_w().div_ceil(2);
    let tiles = p.out_h().div_ceil(2) * tiles_w;

    for_each_image_group(p, output, |n, g, out, budget| {
        let img = &input[(n * p.in_channels + g * icg) * plane_in..][..icg * plane_in];
        let u_g = &transformed_filter[g * POSITIONS * icg * ocg..][..POSITIONS * icg * ocg];
        let bias_g = bias.map(|b| &b[g * ocg..(g + 1) * ocg]);
        // Tiles are processed in blocks so the transformed input and the
        // products stay within the workspace budget.
        let block = (budget.workspace / (POSITIONS * (icg + ocg))).clamp(1, tiles);
        // V: [block, 16, icg]; M: [block, 16, ocg]. Tile-major keeps each
        // tile's transforms contiguous for the parallel transform loops; the
        // GEMMs read them through strides.
        let mut v = vec![T::zero(); block * POSITIONS * icg];
        let mut m = vec![T::zero(); block * POSITIONS * ocg];
        let mut t0 = 0;
        while t0 < tiles {
            let nt = block.min(tiles - t0);
            input_transform(p, img, t0, tiles_w, &mut v[..nt * POSITIONS * icg], budget);
            for xi in 0..POSITIONS {
                let lhs = MatPtr {
                    ptr: v[xi * icg..].as_ptr(),
                    rs: POSITIONS * icg,
                    cs: 1,
                };
                let rhs = MatPtr {
                    ptr: u_g[xi * icg * ocg..].as_ptr(),
                    rs: ocg,
                    cs: 1,
                };
                // SAFETY: rows < nt of v and m (strided by 16 * icg / 16 * ocg
                // from position xi) are in bounds; u_g holds 16 icg x ocg
                // matrices; v, m and u_g are distinct buffers.
                unsafe {
                    matmul(
                        nt,
                        ocg,
                        icg,
                        m[xi * ocg..].as_mut_ptr(),
                        POSITIONS * ocg,
                        false,
                        lhs,
                        rhs,
                        budget.gemm_parallelism(),
                    )
                };
            }
            output_transform(
                p,
                &m[..nt * POSITIONS * ocg],
                t0,
                tiles_w,
                bias_g,
                out,
                budget,
            );
            t0 += nt;
        }
    });
}

/// Writes `Bᵀ d B` for tiles `t0 ..` (one `[16, icg]` chunk of `v` per tile),
/// reading zeros outside the image.
fn input_transform<T: Float>(
    p: &Conv2dParams,
    img: &[T],
    t0: usize,
    tiles_w: usize,
    v: &mut [T],
    budget: TaskBudget,
) {
    let icg = p.in_channels_per_group();
    let plane_in = p.in_h * p.in_w;
    let tile = |i: usize, vt: &mut [T]| {
        let t = t0 + i;
        // Top-left corner of the 4x4 input tile, in unpadded coordinates.
        let y0 = 2 * (t / tiles_w) as isize - p.padding.top as isize;
        let x0 = 2 * (t % tiles_w) as isize - p.padding.left as isize;
        let inside = y0 >= 0 && x0 >= 0 && y0 + 4 <= p.in_h as isize && x0 + 4 <= p.in_w as isize;
        for c in 0..icg {
            let plane = &img[c * plane_in..][..plane_in];
            let mut d = [T::zero(); 16];
            for (r, drow) in d.chunks_exact_mut(4).enumerate() {
                let iy = y0 + r as isize;
                if !inside && (iy < 0 || iy >= p.in_h as isize) {
                    continue;
                }
                let row = &plane[iy as usize * p.in_w..][..p.in_w];
                for (j, dv) in drow.iter_mut().enumerate() {
                    let ix = x0 + j as isize;
                    if inside || (ix >= 0 && ix < p.in_w as isize) {
                        *dv = row[ix as usize];
                    }
                }
            }
            for (xi, &val) in data_tile(&d).iter().enumerate() {
                vt[xi * icg + c] = val;
            }
        }
    };
    let chunk = POSITIONS * icg;
    if budget.parallel_inside {
        v.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, vt)| tile(i, vt));
    } else {
        v.chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, vt)| tile(i, vt));
    }
}

/// Applies `Aᵀ m A` to each tile's products and writes the clipped 2x2
/// results (plus bias) into the group's output planes.
fn output_transform<T: Float>(
    p: &Conv2dParams,
    m: &[T],
    t0: usize,
    tiles_w: usize,
    bias: Option<&[T]>,
    out: &mut [T],
    budget: TaskBudget,
) {
    let ocg = p.out_channels_per_group();
    let (oh, ow) = (p.out_h(), p.out_w());
    let nt = m.len() / (POSITIONS * ocg);
    let plane = |oo: usize, dst: &mut [T]| {
        let b = bias.map_or(T::zero(), |b| b[oo]);
        for i in 0..nt {
            let t = t0 + i;
            let (y0, x0) = (2 * (t / tiles_w), 2 * (t % tiles_w));
            let mut mt = [T::zero(); 16];
            for (xi, mv) in mt.iter_mut().enumerate() {
                *mv = m[(i * POSITIONS + xi) * ocg + oo];
            }
            let y = output_tile(&mt);
            for a in 0..2.min(oh - y0) {
                for c in 0..2.min(ow - x0) {
                    dst[(y0 + a) * ow + x0 + c] = y[a * 2 + c] + b;
                }
            }
        }
    };
    if budget.parallel_inside {
        out.par_chunks_mut(oh * ow)
            .enumerate()
            .for_each(|(oo, dst)| plane(oo, dst));
    } else {
        out.chunks_mut(oh * ow)
            .enumerate()
            .for_each(|(oo, dst)| plane(oo, dst));
    }
}

/// `G g Gᵀ` for one 3x3 filter (row-major in, row-major 4x4 out).
fn filter_tile<T: Float>(g: &[T]) -> [T; 16] {
    let half = T::from_f64(0.5).unwrap_or_else(T::zero);
    // G applied to a column of three values.
    let col = |a: T, b: T, c: T| [a, (a + b + c) * half, (a - b + c) * half, c];
    // t = G g: 4x3.
    let mut t = [[T::zero(); 3]; 4];
    for j in 0..3 {
        let r = col(g[j], g[3 + j], g[6 + j]);
        for i in 0..4 {
            t[i][j] = r[i];
        }
    }
    let mut u = [T::zero(); 16];
    for i in 0..4 {
        let r = col(t[i][0], t[i][1], t[i][2]);
        u[i * 4..i * 4 + 4].copy_from_slice(&r);
    }
    u
}

/// `Bᵀ d B` for one 4x4 input tile (row-major).
fn data_tile<T: Float>(d: &[T; 16]) -> [T; 16] {
    // Bᵀ applied to four values.
    let bt = |a: T, b: T, c: T, e: T| [a - c, b + c, c - b, b - e];
    let mut t = [T::zero(); 16];
    for j in 0..4 {
        let r = bt(d[j], d[4 + j], d[8 + j], d[12 + j]);
        for i in 0..4 {
            t[i * 4 + j] = r[i];
        }
    }
    let mut v = [T::zero(); 16];
    for i in 0..4 {
        let r = bt(t[i * 4], t[i * 4 + 1], t[i * 4 + 2], t[i * 4 + 3]);
        v[i * 4..i * 4 + 4].copy_from_slice(&r);
    }
    v
}

/// `Aᵀ m A` for one 4x4 tile of products, giving the 2x2 output (row-major).
fn output_tile<T: Float>(m: &[T; 16]) -> [T; 4] {
    // Aᵀ applied to four values.
    let at = |a: T, b: T, c: T, e: T| [a + b + c, b - c - e];
    let mut t = [T::zero(); 8];
    for j in 0..4 {
        let r = at(m[j], m[4 + j], m[8 + j], m[12 + j]);
        t[j] = r[0];
        t[4 + j] = r[1];
    }
    let mut y = [T::zero(); 4];
    for i in 0..2 {
        let r = at(t[i * 4], t[i * 4 + 1], t[i * 4 + 2], t[i * 4 + 3]);
        y[i * 2..i * 2 + 2].copy_from_slice(&r);
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::test_util::{assert_close, cast, reference_conv, Rng};
    use crate::params::Padding2d;

    fn params(
        batch: usize,
        ic: usize,
        oc: usize,
        groups: usize,
        hw: (usize, usize),
        padding: Padding2d,
    ) -> Conv2dParams {
        Conv2dParams {
            batch,
            in_channels: ic,
            in_h: hw.0,
            in_w: hw.1,
            out_channels: oc,
            kernel_h: 3,
            kernel_w: 3,
            stride: (1, 1),
            padding,
            dilation: (1, 1),
            groups,
        }
    }

    #[test]
    fn winograd_matches_reference() {
        check_grid();
    }

    #[test]
    fn winograd_matches_reference_on_two_threads() {
        crate::cpu::test_util::on_two_threads(check_grid);
    }

    fn check_grid() {
        let mut rng = Rng::new(11);
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
        // Odd and even output sizes, so partial edge tiles are covered.
        let sizes = [(3, 3), (5, 4), (7, 9), (8, 11), (10, 6)];
        let channels = [(3, 4, 1), (4, 6, 2), (4, 4, 4), (1, 1, 1)];
        for &padding in &paddings {
            for &hw in &sizes {
                for &(ic, oc, groups) in &channels {
                    for batch in [1, 3] {
                        let p = params(batch, ic, oc, groups, hw, padding);
                        assert!(check(&p).is_ok());
                        let input = rng.vec(p.input_len());
                        let weight = rng.vec(p.weight_len());
                        let bias_v = rng.vec(p.out_channels);
                        for bias in [None, Some(bias_v.as_slice())] {
                            let want = reference_conv(&p, &input, &weight, bias);
                            let what = format!("winograd {p:?} bias={}", bias.is_some());

                            let u = transform_filter(&p, &weight);
                            let mut out = vec![f64::NAN; p.output_len()];
                            conv2d(&p, &input, &u, bias, &mut out);
                            assert_close(&out, &want, 1e-10, &what);

                            let u32 = transform_filter(&p, &cast::<f32>(&weight));
                            let b32 = bias.map(cast::<f32>);
                            let mut out32 = vec![f32::NAN; p.output_len()];
                            conv2d(&p, &cast::<f32>(&input), &u32, b32.as_deref(), &mut out32);
                            assert_close(&out32, &want, 1e-4, &what);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn winograd_blocks_large_images() {
        // 500 x 301 tiles exceed the workspace bound's tile block for these
        // channels, so several blocks (the last one partial) are exercised.
        let p = params(1, 2, 3, 1, (1000, 601), Padding2d::symmetric(1, 1));
        let mut rng = Rng::new(5);
        let input = rng.vec(p.input_len());
        let weight = rng.vec(p.weight_len());
        let want = reference_conv(&p, &input, &weight, None);
        let u = transform_filter(&p, &cast::<f32>(&weight));
        let mut out = vec![f32::NAN; p.output_len()];
        conv2d(&p, &cast::<f32>(&input), &u, None, &mut out);
        assert_close(&out, &want, 1e-4, "winograd blocked");
    }

    #[test]
    fn check_names_the_unmet_constraint() {
        let ok = params(1, 2, 2, 1, (6, 6), Padding2d::default());
        assert_eq!(check(&ok), Ok(()));
        let k = Conv2dParams {
            kernel_h: 5,
            kernel_w: 5,
            ..ok
        };
        assert_eq!(
            check(&k),
            Err("winograd needs a 3x3 kernel, got 5x5".to_string())
        );
        let k = Conv2dParams {
            kernel_h: 3,
            kernel_w: 1,
            ..ok
        };
        assert_eq!(
            check(&k),
            Err("winograd needs a 3x3 kernel, got 3x1".to_string())
        );
        let s = Conv2dParams {
            stride: (2, 1),
            ..ok
        };
        assert_eq!(
            check(&s),
            Err("winograd needs stride 1, got (2, 1)".to_string())
        );
        let d = Conv2dParams {
            dilation: (2, 2),
            ..ok
        };
        assert_eq!(
            check(&d),
            Err("winograd needs dilation 1, got (2, 2)".to_string())
        );
    }
}
