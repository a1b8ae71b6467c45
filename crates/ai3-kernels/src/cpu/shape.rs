//! Data movement: concatenation, slicing along one axis, and permutation.
//! Each writes a contiguous output; every output element is written.

use rayon::prelude::*;

use super::par::{for_each_row, PARALLEL_MIN};
use crate::alloc::{check_len, checked_product, checked_sum, KernelError, KernelResult};
use crate::Float;

/// Concatenates along an axis. Each part is `[outer, chunk]`, where `chunk`
/// is its size along the axis times the product of the dimensions after it;
/// `output` is `[outer, sum of chunks]`. Buffers of other lengths are an error.
pub fn concat<T: Float>(
    outer: usize,
    parts: &[(&[T], usize)],
    output: &mut [T],
) -> KernelResult<()> {
    let mut row = 0usize;
    for &(p, c) in parts {
        check_len(
            "concat input",
            p.len(),
            checked_product("concat input size", &[outer, c])?,
        )?;
        row = checked_sum("concat output size", &[row, c])?;
    }
    check_len(
        "concat output",
        output.len(),
        checked_product("concat output size", &[outer, row])?,
    )?;
    if row == 0 {
        return Ok(());
    }
    let fill = |o: usize, dst: &mut [T]| {
        let mut at = 0;
        for &(src, c) in parts {
            dst[at..at + c].copy_from_slice(&src[o * c..(o + 1) * c]);
            at += c;
        }
    };
    if output.len() >= PARALLEL_MIN && outer > 1 {
        output
            .par_chunks_mut(row)
            .enumerate()
            .for_each(|(o, dst)| fill(o, dst));
    } else {
        output
            .chunks_mut(row)
            .enumerate()
            .for_each(|(o, dst)| fill(o, dst));
    }
    Ok(())
}

/// Copies elements `[start, start + len)` of each of the `outer` rows of
/// `row` elements of `input` into `output` (`[outer, len]`): one piece of a
/// `chunk` or `split`, with `start` and `len` already multiplied by the
/// product of the dimensions after the axis. Buffers of other lengths, or a
/// range outside the row, are an error.
pub fn narrow<T: Float>(
    outer: usize,
    row: usize,
    start: usize,
    len: usize,
    input: &[T],
    output: &mut [T],
) -> KernelResult<()> {
    check_len(
        "slice input",
        input.len(),
        checked_product("slice input size", &[outer, row])?,
    )?;
    check_len(
        "slice output",
        output.len(),
        checked_product("slice output size", &[outer, len])?,
    )?;
    if checked_sum("slice end", &[start, len])? > row {
        return Err(KernelError::Precondition {
            what: "slice range outside the row",
        });
    }
    if len == 0 {
        return Ok(());
    }
    let copy = |(o, dst): (usize, &mut [T])| {
        dst.copy_from_slice(&input[o * row + start..][..len]);
    };
    if output.len() >= PARALLEL_MIN && outer > 1 {
        output.par_chunks_mut(len).enumerate().for_each(copy);
    } else {
        output.chunks_mut(len).enumerate().for_each(copy);
    }
    Ok(())
}

/// Output shape (after dropping size-1 dimensions and merging dimensions
/// that stay adjacent) and the input stride of each output dimension.
fn collapse_permutation(shape: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let mut in_strides = vec![1usize; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        in_strides[k] = in_strides[k + 1] * shape[k + 1];
    }
    let (mut dims, mut strides): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    for &p in perm {
        let (d, s) = (shape[p], in_strides[p]);
        if d == 1 {
            continue;
        }
        match (dims.last_mut(), strides.last_mut()) {
            (Some(ld), Some(ls)) if *ls == s * d => {
                *ld *= d;
                *ls = s;
            }
            _ => {
                dims.push(d);
                strides.push(s);
            }
        }
    }
    if dims.is_empty() {
        return (vec![1], vec![1]);
    }
    (dims, strides)
}

/// `output = input.permute(perm).contiguous()` for a contiguous `input` of
/// `shape`; `perm` is a permutation of `0..shape.len()`. Buffers of other
/// lengths than `shape`'s, or a `perm` that is no permutation, are an error.
pub fn permute<T: Float>(
    shape: &[usize],
    perm: &[usize],
    input: &[T],
    output: &mut [T],
) -> KernelResult<()> {
    // As long as the shape itself: no size from the user's data.
    let mut seen = vec![false; perm.len()];
    let is_perm = perm.len() == shape.len()
        && perm
            .iter()
            .all(|&p| p < perm.len() && !std::mem::replace(&mut seen[p], true));
    if !is_perm {
        return Err(KernelError::Precondition {
            what: "permute needs a permutation of the input's dimensions",
        });
    }
    let len = checked_product("permute size", shape)?;
    check_len("permute input", input.len(), len)?;
    check_len("permute output", output.len(), len)?;
    if output.is_empty() {
        return Ok(());
    }
    let (dims, strides) = collapse_permutation(shape, perm);
    gather_rows(0, &dims, &strides, input, output);
    Ok(())
}

/// Whether a collapsed permutation ([`collapse_permutation`]) is a batch of
/// matrix transposes, `[n, a, b]` with strides `[a * b, 1, a]` (or `[a, b]`
/// with `[1, a]`): NCHW to NHWC and back (`[n, h * w, c]` from `[n, c, h *
/// w]`), ConvNeXt's permutes around its LayerNorm and MLP. Returns `(n, a,
/// b)`.
fn as_transpose(dims: &[usize], strides: &[usize]) -> Option<(usize, usize, usize)> {
    match (dims, strides) {
        (&[a, b], &[1, s]) if s == a => Some((1, a, b)),
        (&[n, a, b], &[sn, 1, s]) if s == a && sn == a * b => Some((n, a, b)),
        _ => None,
    }
}

/// Square tiles of the output that [`transpose`] hands to a task: a task
/// reads `TRANSPOSE_TILE` rows of the input and writes as many of the
/// output, each a short contiguous run, all within L1 and L2.
const TRANSPOSE_TILE: usize = 64;

/// `output[n][i][j] = input[n][j][i]` for `n < batch`, `i < a`, `j < b`
/// (input `[batch, b, a]`, output `[batch, a, b]`), in tiles
/// ([`TRANSPOSE_TILE`]), in parallel for large inputs; f32 with AVX2 in
/// 8x8 register transposes. The element-by-element strided gather took
/// 1.4 ns an element on ConvNeXt's permutes (2 threads, AVX2).
fn transpose<T: Float>(batch: usize, a: usize, b: usize, input: &[T], output: &mut [T]) {
    let (ti, tj) = (a.div_ceil(TRANSPOSE_TILE), b.div_ceil(TRANSPOSE_TILE));
    let tasks = batch * ti * tj;
    let parallel = output.len() >= PARALLEL_MIN && tasks > 1;
    let fast = crate::isa::avx2() && crate::float::as_f32(input).is_some();
    let out = super::conv2d::SharedMut(output.as_mut_ptr());
    let task = |t: usize| {
        let out = &out;
        let (n, r) = (t / (ti * tj), t % (ti * tj));
        let (i0, j0) = (r / tj * TRANSPOSE_TILE, r % tj * TRANSPOSE_TILE);
        let (i1, j1) = ((i0 + TRANSPOSE_TILE).min(a), (j0 + TRANSPOSE_TILE).min(b));
        let x = &input[n * a * b..][..a * b];
        let y = out.0.wrapping_add(n * a * b);
        // Whole 8x8 tiles first where they run; the rest element by element.
        let (i8, j8) = whole_tiles(fast, x, y, a, b, (i0, i1), (j0, j1));
        for i in i0..i1 {
            let js = if i < i8 { j8..j1 } else { j0..j1 };
            for j in js {
                // SAFETY: i < a and j < b: inside image n's output, which
                // only this task's tile (rows i0..i1, columns j0..j1) writes.
                unsafe { *y.add(i * b + j) = x[j * a + i] };
            }
        }
    };
    if parallel {
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// [`transpose`]'s whole 8x8 tiles of output rows `i.0..i.1` and columns
/// `j.0..j.1` of image `x` (`b x a`) into `y` (`a x b`) when `fast` (f32
/// with AVX2): where they end, rows and columns (`(i.0, j.0)` when none
/// ran).
fn whole_tiles<T: Float>(
    fast: bool,
    x: &[T],
    y: *mut T,
    a: usize,
    b: usize,
    i: (usize, usize),
    j: (usize, usize),
) -> (usize, usize) {
    #[cfg(target_arch = "x86_64")]
    if fast {
        let ends = (i.0 + (i.1 - i.0) / 8 * 8, j.0 + (j.1 - j.0) / 8 * 8);
        // SAFETY: AVX2 is available and T is f32 (`fast`); the tiles lie
        // within the tile of rows i and columns j of the image's matrices.
        unsafe {
            transpose_f32(
                x.as_ptr().cast(),
                y.cast(),
                a,
                b,
                (i.0, ends.0),
                (j.0, ends.1),
            )
        };
        return ends;
    }
    let _ = (fast, x, y, a, b);
    (i.0, j.0)
}

/// The whole 8x8 tiles of [`transpose`]'s rows `i0..i8` and columns
/// `j0..j8` (multiples of 8 apart), 8 input rows loaded and stored
/// transposed.
///
/// # Safety
/// AVX2 and FMA; `x` holds a `b x a` matrix and `y` an `a x b` one, and
/// the ranges lie within them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn transpose_f32(
    x: *const f32,
    y: *mut f32,
    a: usize,
    b: usize,
    (i0, i8): (usize, usize),
    (j0, j8): (usize, usize),
) {
    use super::blocked::transpose::store_transposed;
    use std::arch::x86_64::_mm256_loadu_ps;
    for i in (i0..i8).step_by(8) {
        for j in (j0..j8).step_by(8) {
            // SAFETY: input rows j..j+8 at columns i..i+8, output rows
            // i..i+8 at columns j..j+8, all inside (the caller's contract).
            unsafe {
                let rows = std::array::from_fn(|k| _mm256_loadu_ps(x.add((j + k) * a + i)));
                store_transposed(rows, std::array::from_fn(|m| y.add((i + m) * b + j)));
            }
        }
    }
}

/// `output[i] = input[offset + sum(i_k * strides[k])]` for every index `i`
/// of an output of shape `dims` (row-major): a strided view of `input` made
/// contiguous. A stride of 0 repeats an element (broadcasting). Buffers that
/// do not match `dims`, or a view reaching past `input`, are an error.
pub fn gather<T: Float>(
    offset: usize,
    dims: &[usize],
    strides: &[usize],
    input: &[T],
    output: &mut [T],
) -> KernelResult<()> {
    if dims.len() != strides.len() {
        return Err(KernelError::Precondition {
            what: "gather needs one stride per dimension",
        });
    }
    let len = checked_product("gather size", dims)?;
    check_len("gather output", output.len(), len)?;
    if len == 0 {
        return Ok(());
    }
    let last = dims.iter().zip(strides).try_fold(offset, |acc, (&d, &s)| {
        acc.checked_add((d - 1).checked_mul(s)?)
    });
    if last.is_none_or(|l| l >= input.len()) {
        return Err(KernelError::Precondition {
            what: "gather reads past its input",
        });
    }
    if dims.is_empty() {
        output[0] = input[offset];
        return Ok(());
    }
    gather_rows(offset, dims, strides, input, output);
    Ok(())
}

/// `output[i, :] = table[rows[i], :]` for a table of rows of `width`
/// elements: the lookup of an embedding. Every row index must be below the
/// table's row count (the caller validates the user's indices).
pub fn take_rows<T: Float>(
    table: &[T],
    width: usize,
    rows: &[usize],
    output: &mut [T],
) -> KernelResult<()> {
    let len = rows.len().checked_mul(width).ok_or(KernelError::Overflow {
        what: "embedding output",
    })?;
    check_len("embedding output", output.len(), len)?;
    if width == 0 {
        return Ok(());
    }
    let count = table.len() / width;
    if !table.len().is_multiple_of(width) || rows.iter().any(|&r| r >= count) {
        return Err(KernelError::Precondition {
            what: "take_rows reads a row past its table",
        });
    }
    for (dst, &r) in output.chunks_exact_mut(width).zip(rows) {
        dst.copy_from_slice(&table[r * width..(r + 1) * width]);
    }
    Ok(())
}

/// The loop of [`gather`] and [`permute`], on checked, non-empty
/// dimensions: tiles for a batch of transposes ([`as_transpose`]), else row
/// by row.
fn gather_rows<T: Float>(
    offset: usize,
    dims: &[usize],
    strides: &[usize],
    input: &[T],
    output: &mut [T],
) {
    if let Some((batch, a, b)) = as_transpose(dims, strides) {
        // The checks put the last element read, offset + batch * a * b - 1,
        // inside the input.
        return transpose(batch, a, b, &input[offset..][..output.len()], output);
    }
    let rank = dims.len();
    let (inner, step) = (dims[rank - 1], strides[rank - 1]);
    let run = |r: usize, dst: &mut [T]| {
        let (mut rest, mut off) = (r, offset);
        for k in (0..rank - 1).rev() {
            off += (rest % dims[k]) * strides[k];
            rest /= dims[k];
        }
        match step {
            1 => dst.copy_from_slice(&input[off..off + inner]),
            0 => dst.fill(input[off]),
            _ => {
                for (d, &s) in dst.iter_mut().zip(input[off..].iter().step_by(step)) {
                    *d = s;
                }
            }
        }
    };
    for_each_row(output, inner, run);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_rows_copies_and_checks() {
        let table = ramp(6); // 3 rows of 2
        let mut out = vec![0.0; 6];
        take_rows(&table, 2, &[2, 0, 2], &mut out).unwrap();
        assert_eq!(out, vec![4.0, 5.0, 0.0, 1.0, 4.0, 5.0]);
        assert!(take_rows(&table, 2, &[3], &mut out[..2]).is_err());
        assert!(take_rows(&table, 2, &[0], &mut out).is_err());
    }

    fn ramp(n: usize) -> Vec<f64> {
        (0..n).map(|i| i as f64).collect()
    }

    #[test]
    fn concat_matches_naive() {
        // [2, 1, 3] and [2, 2, 3] along dim 1 -> [2, 3, 3].
        let a = ramp(6);
        let b: Vec<f64> = ramp(12).iter().map(|v| 100.0 + v).collect();
        let mut out = vec![f64::NAN; 18];
        concat(2, &[(&a, 3), (&b, 6)], &mut out).unwrap();
        let mut want = Vec::new();
        for o in 0..2 {
            want.extend_from_slice(&a[o * 3..o * 3 + 3]);
            want.extend_from_slice(&b[o * 6..o * 6 + 6]);
        }
        assert_eq!(out, want);
        // Large, parallel, with an empty part.
        let n = PARALLEL_MIN;
        let (a, b) = (ramp(4 * n), ramp(4 * n));
        let mut out = vec![f64::NAN; 8 * n];
        concat(4, &[(&a, n), (&[], 0), (&b, n)], &mut out).unwrap();
        for o in 0..4 {
            assert_eq!(&out[2 * o * n..(2 * o + 1) * n], &a[o * n..(o + 1) * n]);
            assert_eq!(
                &out[(2 * o + 1) * n..(2 * o + 2) * n],
                &b[o * n..(o + 1) * n]
            );
        }
    }

    #[test]
    fn narrow_matches_naive() {
        // [3, 5, 2] rows of 10, take dim-1 indices 1..4.
        let x = ramp(30);
        let mut out = vec![f64::NAN; 18];
        narrow(3, 10, 2, 6, &x, &mut out).unwrap();
        let want: Vec<f64> = (0..3)
            .flat_map(|o| {
                (1..4).flat_map(move |j| (0..2).map(move |i| (o * 10 + j * 2 + i) as f64))
            })
            .collect();
        assert_eq!(out, want);
    }

    /// Gathers the permuted tensor index by index.
    fn naive_permute(shape: &[usize], perm: &[usize], x: &[f64]) -> Vec<f64> {
        let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
        let n: usize = shape.iter().product();
        (0..n)
            .map(|flat| {
                let mut rest = flat;
                let mut idx = vec![0; shape.len()];
                for k in (0..shape.len()).rev() {
                    idx[k] = rest % out_shape[k];
                    rest /= out_shape[k];
                }
                let mut in_idx = vec![0; shape.len()];
                for (k, &p) in perm.iter().enumerate() {
                    in_idx[p] = idx[k];
                }
                x[in_idx.iter().zip(shape).fold(0, |a, (&i, &d)| a * d + i)]
            })
            .collect()
    }

    /// A strided view that is a batch of transposes, from an offset (the
    /// tiled path), and one that is not, against indexing by hand.
    #[test]
    fn gather_matches_indexing() {
        let x = ramp(5 + 2 * 24 * 20);
        let views: &[(usize, &[usize], &[usize])] = &[
            (5, &[2, 24, 20], &[480, 1, 24]),
            (5, &[20, 24], &[1, 20]),
            (3, &[4, 5, 6], &[90, 1, 7]),
        ];
        for &(offset, dims, strides) in views {
            let mut want = Vec::new();
            for n in 0..dims[0] {
                for i in 0..dims[1] {
                    let rest = dims.get(2).map_or(1, |&d| d);
                    for j in 0..rest {
                        let k = strides.get(2).map_or(0, |&s| j * s);
                        want.push(x[offset + n * strides[0] + i * strides[1] + k]);
                    }
                }
            }
            let mut out = vec![f64::NAN; want.len()];
            gather(offset, dims, strides, &x, &mut out).unwrap();
            assert_eq!(out, want, "{dims:?} {strides:?}");
            let xf: Vec<f32> = x.iter().map(|&v| v as f32).collect();
            let mut outf = vec![f32::NAN; want.len()];
            gather(offset, dims, strides, &xf, &mut outf).unwrap();
            let wantf: Vec<f32> = want.iter().map(|&v| v as f32).collect();
            assert_eq!(outf, wantf, "f32 {dims:?} {strides:?}");
        }
    }

    #[test]
    fn permute_matches_naive() {
        let cases: &[(&[usize], &[usize])] = &[
            (&[2, 3], &[1, 0]),
            (&[2, 3, 4], &[0, 2, 1]),
            (&[2, 3, 4, 5], &[0, 2, 3, 1]),
            (&[2, 3, 4, 5], &[3, 2, 1, 0]),
            (&[2, 3, 4, 5], &[0, 1, 2, 3]),
            (&[1, 3, 1, 5], &[2, 3, 0, 1]),
            (&[4, 1, 6], &[1, 2, 0]),
            (&[7], &[0]),
            (&[], &[]),
            (&[64, 48, 20], &[2, 0, 1]),
            (&[3, 0, 2], &[2, 1, 0]),
            // Batches of transposes (NCHW <-> NHWC): whole 8x8 tiles, partial
            // ones at either edge, several tiles of TRANSPOSE_TILE, one row,
            // and large enough to run in parallel.
            (&[2, 16, 4, 6], &[0, 2, 3, 1]),
            (&[2, 4, 6, 16], &[0, 3, 1, 2]),
            (&[3, 13, 5, 7], &[0, 2, 3, 1]),
            (&[1, 96, 9, 9], &[0, 2, 3, 1]),
            (&[1, 9, 9, 96], &[0, 3, 1, 2]),
            (&[2, 70, 1, 130], &[0, 3, 2, 1]),
            (&[1, 1, 7, 40], &[0, 3, 2, 1]),
            (&[2, 96, 56, 56], &[0, 2, 3, 1]),
            (&[2, 56, 56, 96], &[0, 3, 1, 2]),
            (&[200, 300], &[1, 0]),
        ];
        for &(shape, perm) in cases {
            let x = ramp(shape.iter().product());
            let want = naive_permute(shape, perm, &x);
            let mut out = vec![f64::NAN; x.len()];
            permute(shape, perm, &x, &mut out).unwrap();
            assert_eq!(out, want, "{shape:?} {perm:?}");
            // f32 (AVX2's register transposes where the CPU has it); the
            // ramp's values are exact in f32.
            let xf: Vec<f32> = x.iter().map(|&v| v as f32).collect();
            let mut outf = vec![f32::NAN; x.len()];
            permute(shape, perm, &xf, &mut outf).unwrap();
            let wantf: Vec<f32> = want.iter().map(|&v| v as f32).collect();
            assert_eq!(outf, wantf, "f32 {shape:?} {perm:?}");
        }
        assert_eq!(as_transpose(&[5, 7], &[1, 5]), Some((1, 5, 7)));
        assert_eq!(as_transpose(&[2, 5, 7], &[35, 1, 5]), Some((2, 5, 7)));
        assert_eq!(as_transpose(&[2, 5, 7], &[70, 1, 5]), None);
        assert_eq!(as_transpose(&[5, 7], &[7, 1]), None);
    }
}
