//! Moving elements to new positions: constant padding and cyclic shifts
//! (`F.pad(mode='constant')`, `torch.roll`). Each writes every element of a
//! contiguous output, row by row (a row: the last dimension).

use crate::alloc::{check_len, checked_product, KernelError, KernelResult};
use crate::cpu::par::for_each_row;
use crate::Float;

/// The index of output row `r` along each dimension but the last.
fn row_index(mut r: usize, dims: &[usize], index: &mut [usize]) {
    for d in (0..index.len()).rev() {
        index[d] = r % dims[d];
        r /= dims[d];
    }
}

/// Contiguous row strides (in rows) of every dimension but the last.
fn row_strides(dims: &[usize]) -> Vec<usize> {
    let outer = dims.len().saturating_sub(1);
    let mut strides = vec![1usize; outer];
    for d in (0..outer.saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * dims[d + 1];
    }
    strides
}

/// `output` = `input` of shape `shape` with `before[d]` and `after[d]`
/// elements of `value` added on each side of dimension `d`. Buffers of other
/// lengths are an error before anything is written.
pub fn pad_constant<T: Float>(
    shape: &[usize],
    before: &[usize],
    after: &[usize],
    value: T,
    input: &[T],
    output: &mut [T],
) -> KernelResult<()> {
    if before.len() != shape.len() || after.len() != shape.len() || shape.is_empty() {
        return Err(KernelError::Precondition {
            what: "pad needs one before and one after per dimension",
        });
    }
    let out_dims = shape
        .iter()
        .zip(before.iter().zip(after))
        .map(|(&n, (&b, &a))| n.checked_add(b)?.checked_add(a))
        .collect::<Option<Vec<usize>>>()
        .ok_or(KernelError::Overflow {
            what: "padded size",
        })?;
    check_len(
        "pad input",
        input.len(),
        checked_product("pad input", shape)?,
    )?;
    check_len(
        "pad output",
        output.len(),
        checked_product("pad output", &out_dims)?,
    )?;
    let last = shape.len() - 1;
    let (n, inner) = (shape[last], out_dims[last]);
    let in_rows = row_strides(shape);
    for_each_row(output, inner, |r, row| {
        let mut index = vec![0usize; last];
        row_index(r, &out_dims, &mut index);
        let mut src = 0;
        for d in 0..last {
            match index[d].checked_sub(before[d]) {
                Some(i) if i < shape[d] => src += i * in_rows[d],
                _ => {
                    row.fill(value);
                    return;
                }
            }
        }
        row[..before[last]].fill(value);
        row[before[last]..before[last] + n].copy_from_slice(&input[src * n..][..n]);
        row[before[last] + n..].fill(value);
    });
    Ok(())
}

/// `output = torch.roll(input, shifts)` for `input` of shape `shape`: element
/// `i` of dimension `d` moves to `(i + shifts[d]) % shape[d]` (`shifts`
/// already reduced to `0..shape[d]`). Buffers of other lengths are an error.
pub fn roll<T: Float>(
    shape: &[usize],
    shifts: &[usize],
    input: &[T],
    output: &mut [T],
) -> KernelResult<()> {
    if shifts.len() != shape.len()
        || shape.is_empty()
        || shifts.iter().zip(shape).any(|(&s, &n)| s >= n.max(1))
    {
        return Err(KernelError::Precondition {
            what: "roll needs one shift per dimension, below its size",
        });
    }
    let len = checked_product("roll size", shape)?;
    check_len("roll input", input.len(), len)?;
    check_len("roll output", output.len(), len)?;
    let last = shape.len() - 1;
    let n = shape[last];
    let rows = row_strides(shape);
    for_each_row(output, n, |r, row| {
        let mut index = vec![0usize; last];
        row_index(r, shape, &mut index);
        let src: usize = (0..last)
            .map(|d| ((index[d] + shape[d] - shifts[d]) % shape[d]) * rows[d])
            .sum();
        let from = &input[src * n..][..n];
        let s = shifts[last];
        row[s..].copy_from_slice(&from[..n - s]);
        row[..s].copy_from_slice(&from[n - s..]);
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pad_and_roll_move_elements_like_pytorch() {
        let x: Vec<f64> = (0..6).map(|i| i as f64).collect(); // [[0, 1, 2], [3, 4, 5]]
        let mut out = vec![f64::NAN; 4 * 4];
        pad_constant(&[2, 3], &[1, 0], &[1, 1], -1.0, &x, &mut out).unwrap();
        #[rustfmt::skip]
        let want = [-1., -1., -1., -1., 0., 1., 2., -1., 3., 4., 5., -1., -1., -1., -1., -1.];
        assert_eq!(out, want);
        let mut out = vec![f64::NAN; 6];
        roll(&[2, 3], &[1, 1], &x, &mut out).unwrap();
        assert_eq!(out, [5., 3., 4., 2., 0., 1.]);
        assert!(roll(&[2, 3], &[0, 3], &x, &mut out).is_err());
        assert!(pad_constant(&[2, 3], &[0, 0], &[0, 0], 0.0, &x, &mut out[..5]).is_err());
    }
}
