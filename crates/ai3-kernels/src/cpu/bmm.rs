//! Batched matrix multiplication (`torch.matmul` on stacks of matrices),
//! each product through the gemm crate.

use rayon::prelude::*;

use crate::alloc::{check_len, checked_product, KernelError, KernelResult};
use crate::cpu::matmul::{matmul, MatPtr};
use crate::Float;

/// `out[i] = a[offsets[i].0..] @ b[offsets[i].1..]` for each batch `i`: `a`'s
/// matrices are `[m, k]`, `b`'s `[k, n]`, `out` holds `offsets.len()`
/// contiguous `[m, n]` results. Offsets are in elements, so a batch
/// dimension broadcast by the caller repeats a matrix without copying it.
/// Buffers too short for an offset, or an output of the wrong length, are an
/// error before anything is written.
pub fn bmm<T: Float>(
    offsets: &[(usize, usize)],
    (m, k, n): (usize, usize, usize),
    a: &[T],
    b: &[T],
    out: &mut [T],
) -> KernelResult<()> {
    let (a_len, b_len) = (
        checked_product("matmul lhs", &[m, k])?,
        checked_product("matmul rhs", &[k, n])?,
    );
    let o_len = checked_product("matmul output", &[offsets.len(), m, n])?;
    check_len("matmul output", out.len(), o_len)?;
    for &(oa, ob) in offsets {
        if oa.checked_add(a_len).is_none_or(|e| e > a.len())
            || ob.checked_add(b_len).is_none_or(|e| e > b.len())
        {
            return Err(KernelError::Precondition {
                what: "matmul batch offsets reach past the operands",
            });
        }
    }
    if o_len == 0 {
        return Ok(());
    }
    if k == 0 {
        out.fill(T::zero());
        return Ok(());
    }
    let one = |(i, dst): (usize, &mut [T]), par: gemm::Parallelism| {
        let (oa, ob) = offsets[i];
        let lhs = MatPtr {
            ptr: a[oa..].as_ptr(),
            rs: k,
            cs: 1,
        };
        let rhs = MatPtr {
            ptr: b[ob..].as_ptr(),
            rs: n,
            cs: 1,
        };
        // SAFETY: both views lie inside the operands (checked above); `dst` is
        // this batch's `m x n` block of the output, distinct from them.
        unsafe { matmul(m, n, k, dst.as_mut_ptr(), n, false, lhs, rhs, par) };
    };
    if offsets.len() >= rayon::current_num_threads() {
        out.par_chunks_mut(m * n)
            .enumerate()
            .for_each(|c| one(c, gemm::Parallelism::None));
    } else {
        out.chunks_mut(m * n)
            .enumerate()
            .for_each(|c| one(c, gemm::Parallelism::Rayon(0)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_batches_match_a_reference() {
        let (m, k, n) = (3, 4, 5);
        let a: Vec<f64> = (0..2 * m * k).map(|i| i as f64 * 0.5 - 3.0).collect();
        let b: Vec<f64> = (0..k * n).map(|i| (i % 7) as f64 - 2.0).collect();
        let offsets = [(0, 0), (m * k, 0)]; // b broadcast over the batch
        let mut out = vec![f64::NAN; 2 * m * n];
        bmm(&offsets, (m, k, n), &a, &b, &mut out).unwrap();
        for bi in 0..2 {
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k)
                        .map(|c| a[bi * m * k + i * k + c] * b[c * n + j])
                        .sum();
                    assert_eq!(out[bi * m * n + i * n + j], want);
                }
            }
        }
        assert!(bmm(&[(m * k + 1, 0)], (m, k, n), &a, &b, &mut out[..m * n]).is_err());
    }
}
