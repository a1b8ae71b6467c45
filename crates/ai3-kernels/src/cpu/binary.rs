//! Binary elementwise operations with NumPy/PyTorch broadcasting.
//!
//! The operation is a closure, so one kernel serves add, sub, mul and div.
//! Broadcast operands are first collapsed: dimensions of size 1 are dropped
//! and neighbouring dimensions that are contiguous in both operands are
//! merged, so `[N, C, H, W] op [N, C, 1, 1]` becomes `N*C` rows of `H*W`
//! elements against one scalar each, and the inner loop never does index
//! arithmetic.

use super::activation::map;
use super::par::{for_each_chunk, for_each_row, CHUNK, PARALLEL_MIN};
use crate::alloc::{check_len, checked_product, KernelError, KernelResult};
use crate::isa::multiversion;
use crate::params::broadcast_shape;
use crate::Float;

/// `output[i] = f(a[i], b[i])` for operands of the same shape (lengths that
/// differ are an error).
pub fn same_shape<T: Float, F: Fn(T, T) -> T + Sync>(
    a: &[T],
    b: &[T],
    output: &mut [T],
    f: F,
) -> KernelResult<()> {
    check_len("binary operand", a.len(), output.len())?;
    check_len("binary operand", b.len(), output.len())?;
    if output.len() >= PARALLEL_MIN {
        for_each_chunk(output, CHUNK, &|t, o| {
            let (a, b) = (&a[t * CHUNK..][..o.len()], &b[t * CHUNK..][..o.len()]);
            // SAFETY: plain Rust on slices, compiled for the ISA level in use.
            unsafe { row(a, 1, b, 1, o, &f) }
        });
    } else {
        // SAFETY: as above.
        unsafe { row(a, 1, b, 1, output, &f) };
    }
    Ok(())
}

/// `output[i] = f(x[i], s)`, or `f(s, x[i])` when `scalar_first` (`2 - x`).
pub fn scalar<T: Float, F: Fn(T, T) -> T + Sync>(
    x: &[T],
    s: T,
    scalar_first: bool,
    output: &mut [T],
    f: F,
) -> KernelResult<()> {
    if scalar_first {
        map(x, output, |v| f(s, v))
    } else {
        map(x, output, |v| f(v, s))
    }
}

multiversion! {
    /// One output row: each operand advances by 1 or stays put (stride 0).
    unsafe fn row<T, F: Fn(T, T) -> T>(a: &[T], sa: usize, b: &[T], sb: usize, out: &mut [T], f: &F) => row_impl
}

#[inline(always)]
unsafe fn row_impl<T: Float, F: Fn(T, T) -> T>(
    a: &[T],
    sa: usize,
    b: &[T],
    sb: usize,
    out: &mut [T],
    f: &F,
) {
    match (sa, sb) {
        (1, 1) => out
            .iter_mut()
            .zip(a.iter().zip(b))
            .for_each(|(o, (&x, &y))| *o = f(x, y)),
        (1, _) => {
            let y = b[0];
            out.iter_mut().zip(a).for_each(|(o, &x)| *o = f(x, y));
        }
        (_, 1) => {
            let x = a[0];
            out.iter_mut().zip(b).for_each(|(o, &y)| *o = f(x, y));
        }
        _ => out.fill(f(a[0], b[0])),
    }
}

/// Output shape and per-operand strides after dropping size-1 dimensions and
/// merging dimensions that are contiguous in both operands. Never empty.
fn collapse(a_shape: &[usize], b_shape: &[usize]) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
    let out = broadcast_shape(a_shape, b_shape).unwrap_or_default();
    let strides = |shape: &[usize]| {
        // Strides aligned to the output's rank; 0 where the operand broadcasts.
        let mut s = vec![0usize; out.len()];
        let mut acc = 1;
        for (i, &d) in shape.iter().enumerate().rev() {
            let k = out.len() - shape.len() + i;
            if d != 1 {
                s[k] = acc;
            }
            acc *= d;
        }
        s
    };
    let (sa, sb) = (strides(a_shape), strides(b_shape));
    let (mut dims, mut ra, mut rb) = (Vec::new(), Vec::new(), Vec::<usize>::new());
    for k in 0..out.len() {
        if out[k] == 1 {
            continue;
        }
        if let (Some(&last), Some(la), Some(lb)) = (dims.last(), ra.last_mut(), rb.last_mut()) {
            // The previous dimension steps over exactly one run of this one in both operands.
            if *la == sa[k] * out[k] && *lb == sb[k] * out[k] {
                let n = dims.len();
                dims[n - 1] = last * out[k];
                *la = sa[k];
                *lb = sb[k];
                continue;
            }
        }
        dims.push(out[k]);
        ra.push(sa[k]);
        rb.push(sb[k]);
    }
    if dims.is_empty() {
        return (vec![1], vec![1], vec![1]);
    }
    (dims, ra, rb)
}

/// `output = f(a, b)` with broadcasting; `output` has the broadcast shape of
/// `a_shape` and `b_shape` (which the caller has checked are compatible) and
/// every element of it is written. Shapes that do not broadcast or buffers of
/// other lengths than the shapes say are an error.
pub fn broadcast<T: Float, F: Fn(T, T) -> T + Sync>(
    a: &[T],
    a_shape: &[usize],
    b: &[T],
    b_shape: &[usize],
    output: &mut [T],
    f: F,
) -> KernelResult<()> {
    let out_shape = broadcast_shape(a_shape, b_shape).ok_or(KernelError::Precondition {
        what: "binary operand shapes do not broadcast",
    })?;
    check_len(
        "binary operand",
        a.len(),
        checked_product("binary operand size", a_shape)?,
    )?;
    check_len(
        "binary operand",
        b.len(),
        checked_product("binary operand size", b_shape)?,
    )?;
    let out_len = checked_product("binary output size", &out_shape)?;
    check_len("binary output", output.len(), out_len)?;
    if output.is_empty() {
        return Ok(());
    }
    let (dims, sa, sb) = collapse(a_shape, b_shape);
    let rank = dims.len();
    let inner = dims[rank - 1];
    let (ia, ib) = (sa[rank - 1], sb[rank - 1]);
    if rank == 1 && ia == 1 && ib == 1 {
        return same_shape(a, b, output, f);
    }
    // Start of output row `r` in each operand: per row, never per element.
    let offsets = |r: usize| {
        let (mut rest, mut oa, mut ob) = (r, 0, 0);
        for k in (0..rank - 1).rev() {
            let i = rest % dims[k];
            rest /= dims[k];
            oa += i * sa[k];
            ob += i * sb[k];
        }
        (oa, ob)
    };
    let run = |r: usize, out: &mut [T]| {
        let (oa, ob) = offsets(r);
        // SAFETY: plain Rust on slices, compiled for the ISA level in use.
        unsafe { row(&a[oa..], ia, &b[ob..], ib, out, &f) };
    };
    for_each_row(output, inner, run);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::test_util::Rng;

    /// Broadcasting straight from the definition: every output index mapped
    /// back into each operand.
    fn naive(a: &[f64], a_shape: &[usize], b: &[f64], b_shape: &[usize]) -> Vec<f64> {
        let out = broadcast_shape(a_shape, b_shape).unwrap();
        let n: usize = out.iter().product();
        let index = |flat: usize, shape: &[usize]| {
            let mut rest = flat;
            let mut idx = vec![0; out.len()];
            for k in (0..out.len()).rev() {
                idx[k] = rest % out[k];
                rest /= out[k];
            }
            let mut off = 0;
            for (i, &d) in shape.iter().enumerate() {
                let k = out.len() - shape.len() + i;
                off = off * d + if d == 1 { 0 } else { idx[k] };
            }
            off
        };
        (0..n)
            .map(|i| a[index(i, a_shape)] - 2.0 * b[index(i, b_shape)])
            .collect()
    }

    #[test]
    fn broadcast_matches_naive() {
        let mut rng = Rng::new(5);
        let cases: &[(&[usize], &[usize])] = &[
            (&[2, 3, 4, 5], &[2, 3, 4, 5]),
            (&[2, 3, 4, 5], &[2, 3, 1, 1]),
            (&[2, 3, 1, 1], &[2, 3, 4, 5]),
            (&[2, 3, 4, 5], &[1, 3, 1, 1]),
            (&[2, 3, 4, 5], &[5]),
            (&[3, 1, 5], &[4, 1]),
            (&[1], &[3, 2]),
            (&[], &[2, 2]),
            (&[1, 1], &[1]),
            (&[4, 1, 3], &[1, 5, 1]),
            (&[2, 1, 3, 1], &[1, 4, 1, 6]),
            (&[64, 32, 40, 1], &[64, 32, 1, 40]),
            (&[8, 64, 32, 32], &[8, 64, 1, 1]),
            (&[3, 0, 2], &[1, 2]),
        ];
        for &(sa, sb) in cases {
            let a = rng.vec(sa.iter().product());
            let b = rng.vec(sb.iter().product());
            let want = naive(&a, sa, &b, sb);
            let mut out = vec![f64::NAN; want.len()];
            broadcast(&a, sa, &b, sb, &mut out, |x, y| x - 2.0 * y).unwrap();
            assert_eq!(out, want, "{sa:?} {sb:?}");
            let (a32, b32): (Vec<f32>, Vec<f32>) = (
                a.iter().map(|&v| v as f32).collect(),
                b.iter().map(|&v| v as f32).collect(),
            );
            let mut out32 = vec![f32::NAN; want.len()];
            broadcast(&a32, sa, &b32, sb, &mut out32, |x, y| x - 2.0 * y).unwrap();
            for (g, w) in out32.iter().zip(&want) {
                assert!((*g as f64 - w).abs() < 1e-5, "{sa:?} {sb:?}");
            }
        }
    }

    #[test]
    fn collapse_merges_squeeze_excitation() {
        let (dims, sa, sb) = collapse(&[8, 64, 7, 7], &[8, 64, 1, 1]);
        assert_eq!((dims, sa, sb), (vec![512, 49], vec![49, 1], vec![1, 0]));
    }

    #[test]
    fn same_shape_and_scalar_write_everything() {
        for len in [1, 100, PARALLEL_MIN + 3] {
            let a: Vec<f64> = (0..len).map(|i| i as f64).collect();
            let b: Vec<f64> = (0..len).map(|i| 1.0 + (i % 7) as f64).collect();
            let mut out = vec![f64::NAN; len];
            same_shape(&a, &b, &mut out, |x, y| x / y).unwrap();
            assert!(out
                .iter()
                .zip(a.iter().zip(&b))
                .all(|(o, (x, y))| *o == x / y));
            let mut out = vec![f64::NAN; len];
            scalar(&a, 2.0, true, &mut out, |x, y| x - y).unwrap();
            assert!(out.iter().zip(&a).all(|(o, x)| *o == 2.0 - x));
            scalar(&a, 2.0, false, &mut out, |x, y| x - y).unwrap();
            assert!(out.iter().zip(&a).all(|(o, x)| *o == x - 2.0));
        }
    }
}
