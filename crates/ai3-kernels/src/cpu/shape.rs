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

/// The loop of [`gather`] and [`permute`], on checked, non-empty dimensions.
fn gather_rows<T: Float>(
    offset: usize,
    dims: &[usize],
    strides: &[usize],
    input: &[T],
    output: &mut [T],
) {
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
        ];
        for &(shape, perm) in cases {
            let x = ramp(shape.iter().product());
            let want = naive_permute(shape, perm, &x);
            let mut out = vec![f64::NAN; x.len()];
            permute(shape, perm, &x, &mut out).unwrap();
            assert_eq!(out, want, "{shape:?} {perm:?}");
        }
    }
}
