//! Explicit 2-D padding with PyTorch's `F.pad` modes, used to materialise
//! non-zero padding modes before a convolution that only knows zero padding.

use rayon::prelude::*;

use crate::alloc::{check_len, checked_product, checked_sum, try_vec_with_capacity};
use crate::alloc::{KernelError, KernelResult};
use crate::params::Padding2d;
use crate::Float;

/// How [`pad2d`] fills the border, matching `torch.nn.functional.pad` modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PadMode {
    /// `'constant'` with value 0.
    Zeros,
    /// `'reflect'`: mirror without repeating the edge (`[a b c] -> b | a b c | b`).
    Reflect,
    /// `'replicate'`: repeat the edge value.
    Replicate,
    /// `'circular'`: wrap around to the other side.
    Circular,
}

impl PadMode {
    /// PyTorch's name for the mode (`'zeros'`, `'reflect'`, ...).
    pub fn name(self) -> &'static str {
        match self {
            PadMode::Zeros => "zeros",
            PadMode::Reflect => "reflect",
            PadMode::Replicate => "replicate",
            PadMode::Circular => "circular",
        }
    }

    /// The source index for padded coordinate `i` (relative to the original
    /// start) in a dimension of length `n`, or `None` for a zero.
    #[inline]
    fn source(self, i: isize, n: usize) -> Option<usize> {
        let n = n as isize;
        if (0..n).contains(&i) {
            return Some(i as usize);
        }
        let s = match self {
            PadMode::Zeros => return None,
            // One reflection suffices: the caller guarantees padding < n.
            PadMode::Reflect => {
                if i < 0 {
                    -i
                } else {
                    2 * (n - 1) - i
                }
            }
            PadMode::Replicate => i.clamp(0, n - 1),
            PadMode::Circular => i.rem_euclid(n),
        };
        Some(s as usize)
    }
}

/// Pads each of `planes` images `[in_h, in_w]` into
/// `[in_h + top + bottom, in_w + left + right]`, as PyTorch's `F.pad`.
///
/// For `Reflect` each padding must be smaller than its dimension (PyTorch's
/// rule; an error otherwise), for `Circular` no larger than it. Buffers of
/// other lengths than the sizes say are an error.
///
/// ```
/// use ai3_kernels::cpu::pad::{pad2d, PadMode};
/// use ai3_kernels::params::Padding2d;
/// let pad = Padding2d { top: 0, bottom: 0, left: 2, right: 1 };
/// let mut out = [0.0f32; 6];
/// pad2d(PadMode::Reflect, 1, 1, 3, pad, &[1.0, 2.0, 3.0], &mut out).unwrap();
/// assert_eq!(out, [3.0, 2.0, 1.0, 2.0, 3.0, 2.0]);
/// ```
pub fn pad2d<T: Float>(
    mode: PadMode,
    planes: usize,
    in_h: usize,
    in_w: usize,
    padding: Padding2d,
    input: &[T],
    output: &mut [T],
) -> KernelResult<()> {
    let out_h = checked_sum("padded height", &[in_h, padding.top, padding.bottom])?;
    let out_w = checked_sum("padded width", &[in_w, padding.left, padding.right])?;
    check_len(
        "pad input",
        input.len(),
        checked_product("pad input size", &[planes, in_h, in_w])?,
    )?;
    let out_len = checked_product("pad output size", &[planes, out_h, out_w])?;
    check_len("pad output", output.len(), out_len)?;
    let too_wide =
        padding.top.max(padding.bottom) >= in_h || padding.left.max(padding.right) >= in_w;
    if mode == PadMode::Reflect && too_wide && out_len > 0 {
        return Err(KernelError::Precondition {
            what: "reflect padding must be smaller than the padded dimension",
        });
    }
    if out_len == 0 {
        return Ok(());
    }
    // The column map is the same for every row and plane.
    let mut cols = try_vec_with_capacity(out_w, "padding column map")?;
    cols.extend((0..out_w).map(|x| mode.source(x as isize - padding.left as isize, in_w)));
    let plane = |(p, out): (usize, &mut [T])| {
        let src = &input[p * in_h * in_w..][..in_h * in_w];
        for (y, row) in out.chunks_exact_mut(out_w).enumerate() {
            match mode.source(y as isize - padding.top as isize, in_h) {
                None => row.fill(T::zero()),
                Some(sy) => {
                    let srow = &src[sy * in_w..][..in_w];
                    row[padding.left..padding.left + in_w].copy_from_slice(srow);
                    let border = (0..padding.left).chain(padding.left + in_w..out_w);
                    for x in border {
                        row[x] = cols[x].map_or(T::zero(), |sx| srow[sx]);
                    }
                }
            }
        }
    };
    if output.len() >= 1 << 16 {
        output
            .par_chunks_mut(out_h * out_w)
            .enumerate()
            .for_each(plane);
    } else {
        output.chunks_mut(out_h * out_w).enumerate().for_each(plane);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pads the 2x3 image [[1 2 3] [4 5 6]] with top 1, bottom 1, left 2, right 1.
    fn run(mode: PadMode) -> Vec<f64> {
        let pad = Padding2d {
            top: 1,
            bottom: 1,
            left: 2,
            right: 1,
        };
        let input = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut out = vec![f64::NAN; 4 * 6];
        pad2d(mode, 1, 2, 3, pad, &input, &mut out).unwrap();
        out
    }

    #[test]
    fn zeros() {
        #[rustfmt::skip]
        let want = [
            0., 0., 0., 0., 0., 0.,
            0., 0., 1., 2., 3., 0.,
            0., 0., 4., 5., 6., 0.,
            0., 0., 0., 0., 0., 0.,
        ];
        assert_eq!(run(PadMode::Zeros), want);
    }

    #[test]
    fn reflect() {
        // Rows: -1 -> 1, 2 -> 0. Cols: -2 -> 2, -1 -> 1, 3 -> 1.
        #[rustfmt::skip]
        let want = [
            6., 5., 4., 5., 6., 5.,
            3., 2., 1., 2., 3., 2.,
            6., 5., 4., 5., 6., 5.,
            3., 2., 1., 2., 3., 2.,
        ];
        assert_eq!(run(PadMode::Reflect), want);
    }

    #[test]
    fn replicate() {
        #[rustfmt::skip]
        let want = [
            1., 1., 1., 2., 3., 3.,
            1., 1., 1., 2., 3., 3.,
            4., 4., 4., 5., 6., 6.,
            4., 4., 4., 5., 6., 6.,
        ];
        assert_eq!(run(PadMode::Replicate), want);
    }

    #[test]
    fn circular() {
        // Rows: -1 -> 1, 2 -> 0. Cols: -2 -> 1, -1 -> 2, 3 -> 0.
        #[rustfmt::skip]
        let want = [
            5., 6., 4., 5., 6., 4.,
            2., 3., 1., 2., 3., 1.,
            5., 6., 4., 5., 6., 4.,
            2., 3., 1., 2., 3., 1.,
        ];
        assert_eq!(run(PadMode::Circular), want);
    }

    #[test]
    fn several_planes_and_large() {
        let (planes, h, w) = (3, 70, 90);
        let input: Vec<f32> = (0..planes * h * w).map(|i| i as f32).collect();
        let pad = Padding2d {
            top: 3,
            bottom: 1,
            left: 0,
            right: 5,
        };
        let (oh, ow) = (h + 4, w + 5);
        let mut out = vec![f32::NAN; planes * oh * ow];
        pad2d(PadMode::Circular, planes, h, w, pad, &input, &mut out).unwrap();
        for p in 0..planes {
            for y in 0..oh {
                for x in 0..ow {
                    let sy = (y + h - 3) % h;
                    let sx = x % w;
                    assert_eq!(out[(p * oh + y) * ow + x], input[(p * h + sy) * w + sx]);
                }
            }
        }
    }
}
