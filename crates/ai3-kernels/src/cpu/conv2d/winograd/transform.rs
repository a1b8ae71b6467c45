//! The three Winograd F(2x2, 3x3) transforms, written one tile row at a time
//! so that every loop runs over consecutive tiles (contiguous memory) and
//! vectorises.

#![allow(clippy::needless_range_loop)] // indexed loops over fixed-size chunks vectorise best

use crate::Float;

/// `G g Gᵀ` for one 3x3 filter (row-major in, row-major 4x4 out).
pub(super) fn filter_tile<T: Float>(g: &[T]) -> [T; 16] {
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

/// `G g Gᵀ` of Winograd F(4x4, 3x3) (interpolation points 0, ±1, ±2) for
/// one 3x3 f32 filter (row-major in, row-major 6x6 out), computed in f64.
pub(super) fn filter_tile4(g: &[f32]) -> [f32; 36] {
    const G: [[f64; 3]; 6] = [
        [1.0 / 4.0, 0.0, 0.0],
        [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
        [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
        [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
        [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
        [0.0, 0.0, 1.0],
    ];
    // t = G g: 6x3.
    let t: [[f64; 3]; 6] = std::array::from_fn(|i| {
        std::array::from_fn(|j| (0..3).map(|k| G[i][k] * g[3 * k + j] as f64).sum())
    });
    std::array::from_fn(|x| {
        let (i, j) = (x / 6, x % 6);
        (0..3).map(|k| t[i][k] * G[j][k]).sum::<f64>() as f32
    })
}

/// Splits the columns `x_start, x_start + 1, ..` (`2 * even.len()` of them,
/// in input coordinates, possibly negative or past the row) of `row` into
/// even and odd ones, zero outside the row; `None` is an all-zero row.
#[inline(always)]
pub(super) fn deinterleave<T: Float>(
    row: Option<&[T]>,
    x_start: isize,
    even: &mut [T],
    odd: &mut [T],
) {
    let n = even.len();
    let odd = &mut odd[..n];
    let Some(row) = row else {
        even.fill(T::zero());
        odd.fill(T::zero());
        return;
    };
    let w = row.len() as isize;
    // Pairs k with both columns x_start + 2k and x_start + 2k + 1 inside the row.
    let k0 = if x_start >= 0 {
        0
    } else {
        ((-x_start) as usize).div_ceil(2)
    };
    let k1 = if w - x_start <= 0 {
        0
    } else {
        ((w - x_start) / 2) as usize
    };
    let k1 = k1.min(n);
    let k0 = k0.min(k1);
    let at = |x: isize| {
        if x >= 0 && x < w {
            row[x as usize]
        } else {
            T::zero()
        }
    };
    for k in (0..k0).chain(k1..n) {
        let x = x_start + 2 * k as isize;
        even[k] = at(x);
        odd[k] = at(x + 1);
    }
    if k0 < k1 {
        let base = (x_start + 2 * k0 as isize) as usize;
        let src = &row[base..base + 2 * (k1 - k0)];
        for ((pair, e), o) in src
            .chunks_exact(2)
            .zip(&mut even[k0..k1])
            .zip(&mut odd[k0..k1])
        {
            *e = pair[0];
            *o = pair[1];
        }
    }
}

/// `Bᵀ d B` for a row of `tw` consecutive tiles.
///
/// `e[i]` / `o[i]` hold the even / odd columns of input row `i` of the tiles
/// (`tw + 1` each); `v[xi]` receives transform position `xi` of each tile.
#[inline(always)]
pub(super) fn input_row<T: Float>(e: [&[T]; 4], o: [&[T]; 4], v: &mut [&mut [T]; 16], tw: usize) {
    // Vertical pass (Bᵀ over the four rows), separately for even and odd
    // columns; horizontal pass below. Both are linear, so order is free.
    let e = e.map(|s| &s[..tw + 1]);
    let o = o.map(|s| &s[..tw + 1]);
    let [v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15] = v;
    let (v0, v1, v2, v3) = (&mut v0[..tw], &mut v1[..tw], &mut v2[..tw], &mut v3[..tw]);
    let (v4, v5, v6, v7) = (&mut v4[..tw], &mut v5[..tw], &mut v6[..tw], &mut v7[..tw]);
    let (v8, v9, v10, v11) = (&mut v8[..tw], &mut v9[..tw], &mut v10[..tw], &mut v11[..tw]);
    let (v12, v13, v14, v15) = (
        &mut v12[..tw],
        &mut v13[..tw],
        &mut v14[..tw],
        &mut v15[..tw],
    );
    for t in 0..tw {
        // Columns 0..4 of the tile are e[t], o[t], e[t + 1], o[t + 1].
        let col = |r: [&[T]; 4], k: usize| {
            let (a, b, c, d) = (r[0][k], r[1][k], r[2][k], r[3][k]);
            [a - c, b + c, c - b, b - d]
        };
        let c0 = col(e, t);
        let c1 = col(o, t);
        let c2 = col(e, t + 1);
        let c3 = col(o, t + 1);
        let row = |i: usize| [c0[i] - c2[i], c1[i] + c2[i], c2[i] - c1[i], c1[i] - c3[i]];
        let [a, b, c, d] = row(0);
        v0[t] = a;
        v1[t] = b;
        v2[t] = c;
        v3[t] = d;
        let [a, b, c, d] = row(1);
        v4[t] = a;
        v5[t] = b;
        v6[t] = c;
        v7[t] = d;
        let [a, b, c, d] = row(2);
        v8[t] = a;
        v9[t] = b;
        v10[t] = c;
        v11[t] = d;
        let [a, b, c, d] = row(3);
        v12[t] = a;
        v13[t] = b;
        v14[t] = c;
        v15[t] = d;
    }
}

/// `Aᵀ m A` plus `bias` for a row of `tw` consecutive tiles: `m[xi]` holds
/// transform position `xi` of each tile; the two output rows receive `2 * tw`
/// values each, clipped to their lengths (the last tile of an odd-width
/// output is cut in half). `row1` is `None` past the bottom of the output.
#[inline(always)]
pub(super) fn output_row<T: Float>(
    m: &[&[T]; 16],
    tw: usize,
    bias: T,
    row0: &mut [T],
    row1: Option<&mut [T]>,
) {
    // Chunks of CH tiles: the transform runs on whole vectors, then each
    // output row is written by one interleaving pass.
    const CH: usize = 16;
    let mut t0 = 0;
    let mut row1 = row1;
    while t0 < tw {
        let n = CH.min(tw - t0);
        let mut y = [[T::zero(); CH]; 4];
        if n == CH {
            let mm: [&[T; CH]; 16] =
                std::array::from_fn(|xi| m[xi][t0..t0 + CH].try_into().expect("chunk"));
            for t in 0..CH {
                let s0: [T; 4] = std::array::from_fn(|j| mm[j][t] + mm[4 + j][t] + mm[8 + j][t]);
                let s1: [T; 4] =
                    std::array::from_fn(|j| mm[4 + j][t] - mm[8 + j][t] - mm[12 + j][t]);
                y[0][t] = s0[0] + s0[1] + s0[2] + bias;
                y[1][t] = s0[1] - s0[2] - s0[3] + bias;
                y[2][t] = s1[0] + s1[1] + s1[2] + bias;
                y[3][t] = s1[1] - s1[2] - s1[3] + bias;
            }
        } else {
            for t in 0..n {
                let k = t0 + t;
                let s0: [T; 4] = std::array::from_fn(|j| m[j][k] + m[4 + j][k] + m[8 + j][k]);
                let s1: [T; 4] = std::array::from_fn(|j| m[4 + j][k] - m[8 + j][k] - m[12 + j][k]);
                y[0][t] = s0[0] + s0[1] + s0[2] + bias;
                y[1][t] = s0[1] - s0[2] - s0[3] + bias;
                y[2][t] = s1[0] + s1[1] + s1[2] + bias;
                y[3][t] = s1[1] - s1[2] - s1[3] + bias;
            }
        }
        let x0 = 2 * t0;
        let len = (2 * n).min(row0.len() - x0);
        interleave(&y[0], &y[1], &mut row0[x0..x0 + len]);
        if let Some(r1) = row1.as_deref_mut() {
            interleave(&y[2], &y[3], &mut r1[x0..x0 + len]);
        }
        t0 += n;
    }
}

/// `dst[2k] = a[k]`, `dst[2k + 1] = b[k]` for as much of `dst` as there is.
#[inline(always)]
fn interleave<T: Float, const N: usize>(a: &[T; N], b: &[T; N], dst: &mut [T]) {
    if dst.len() == 2 * N {
        let dst: &mut [T] = &mut dst[..2 * N];
        for k in 0..N {
            dst[2 * k] = a[k];
            dst[2 * k + 1] = b[k];
        }
    } else {
        for (k, d) in dst.iter_mut().enumerate() {
            *d = if k % 2 == 0 { a[k / 2] } else { b[k / 2] };
        }
    }
}
