//! Scaled dot-product attention, `softmax(q @ kᵀ * scale + mask) @ v`, one
//! file per algorithm:
//! - [`naive`] materialises each head's `q_len x kv_len` scores;
//! - [`flash`] walks the keys in blocks with an online softmax, so its
//!   memory does not grow with the sequence length.
//!
//! Both follow PyTorch's `scaled_dot_product_attention`: a causal mask keeps
//! keys `j <= i` for query `i`, and a query row whose every score is masked
//! (`-inf`) gives zeros, not NaN.

pub mod flash;
pub mod naive;

use crate::alloc::{KernelError, KernelResult};
use crate::params::AttentionParams;
use crate::Float;

/// An additive mask read through strides: the score of query `i` and key `j`
/// in flat head `bh` (batch-major) gets `data[offsets[bh] + i * row_stride +
/// j * col_stride]` added. A stride of 0 broadcasts.
#[derive(Clone, Copy)]
pub struct Mask<'a, T> {
    /// The mask's elements.
    pub data: &'a [T],
    /// Where each of the `batch * heads` flat heads starts.
    pub offsets: &'a [usize],
    /// Step between query rows.
    pub row_stride: usize,
    /// Step between keys.
    pub col_stride: usize,
}

impl<T> Mask<'_, T> {
    /// Checks that every element the mask is read at is in bounds.
    fn check(&self, p: &AttentionParams) -> KernelResult<()> {
        if self.offsets.len() != p.batch * p.heads {
            return Err(KernelError::Length {
                what: "attention mask offsets",
                expected: p.batch * p.heads,
                got: self.offsets.len(),
            });
        }
        if p.q_len == 0 || p.kv_len == 0 {
            return Ok(());
        }
        let span = (p.q_len - 1)
            .checked_mul(self.row_stride)
            .and_then(|r| (p.kv_len - 1).checked_mul(self.col_stride)?.checked_add(r))
            .ok_or(KernelError::Overflow {
                what: "attention mask extent",
            })?;
        for &o in self.offsets {
            if o.checked_add(span)
                .is_none_or(|last| last >= self.data.len())
            {
                return Err(KernelError::Precondition {
                    what: "attention mask strides reach past its elements",
                });
            }
        }
        Ok(())
    }
}

/// What both algorithms do first: check buffers and mask before any write,
/// and settle the cases with nothing to compute (no output; no keys, which
/// gives zeros as in PyTorch). Returns whether the kernel still has work.
pub(crate) fn prologue<T: Float>(
    p: &AttentionParams,
    q: &[T],
    k: &[T],
    v: &[T],
    mask: Option<&Mask<'_, T>>,
    out: &mut [T],
) -> KernelResult<bool> {
    p.check_buffers(q.len(), k.len(), v.len(), out.len())?;
    mask.map_or(Ok(()), |m| m.check(p))?;
    if p.kv_len == 0 {
        out.fill(T::zero());
    }
    Ok(!out.is_empty() && p.kv_len > 0)
}

/// The flat key/value head that flat query head `bh` reads.
pub(crate) fn kv_head(p: &AttentionParams, bh: usize) -> usize {
    (bh / p.heads) * p.kv_heads + (bh % p.heads) / p.group()
}

/// The scores of query `i` (row `row` of a block whose first key is `j0`)
/// finished in place: scaled, masked and made causal. Returns their maximum.
#[inline]
#[allow(clippy::too_many_arguments)]
pub(crate) fn finish_scores<T: Float>(
    p: &AttentionParams,
    scores: &mut [T],
    scale: T,
    mask: Option<&Mask<'_, T>>,
    bh: usize,
    i: usize,
    j0: usize,
) -> T {
    let masked = |s: &mut [T]| {
        if let Some(m) = mask {
            let base = m.offsets[bh] + i * m.row_stride + j0 * m.col_stride;
            for (c, x) in s.iter_mut().enumerate() {
                *x = *x * scale + m.data[base + c * m.col_stride];
            }
        } else {
            s.iter_mut().for_each(|x| *x *= scale);
        }
    };
    masked(scores);
    if p.causal && j0 + scores.len() > i + 1 {
        let keep = (i + 1).saturating_sub(j0);
        scores[keep..].fill(T::neg_infinity());
    }
    // Selects in 16 interleaved lanes, not f32::max, so the loop vectorises;
    // a NaN score is skipped here but still makes its row NaN through the
    // exponentials' sum.
    let mut lanes = [T::neg_infinity(); 16];
    let mut chunks = scores.chunks_exact(16);
    for c in &mut chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            *m = if x > *m { x } else { *m };
        }
    }
    let mut max = T::neg_infinity();
    for &x in lanes.iter().chain(chunks.remainder()) {
        max = if x > max { x } else { max };
    }
    if max == T::neg_infinity() && scores.iter().any(|x| x.is_nan()) {
        return T::nan(); // only NaNs (and masked keys): the row is NaN, not masked
    }
    max
}

/// The sum of `xs` in 16 interleaved partial sums, which the compiler
/// keeps in vector registers (a plain `sum` is one serial chain of adds).
pub(crate) fn lane_sum<T: Float>(xs: &[T]) -> T {
    let mut acc = [T::zero(); 16];
    let mut chunks = xs.chunks_exact(16);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    chunks.remainder().iter().copied().sum::<T>() + acc.iter().copied().sum::<T>()
}

#[cfg(test)]
mod tests;
