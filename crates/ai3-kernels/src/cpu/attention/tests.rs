use super::*;
use crate::cpu::test_util::{assert_close, cast, Rng};

/// Textbook attention in f64, with PyTorch's zeros for fully masked rows.
fn reference(
    p: &AttentionParams,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    mask: Option<&Mask<'_, f64>>,
) -> Vec<f64> {
    let (lq, lk, d, dv) = (p.q_len, p.kv_len, p.head_dim, p.v_dim);
    let mut out = vec![0.0; p.batch * p.heads * lq * dv];
    for bh in 0..p.batch * p.heads {
        let kvh = (bh / p.heads) * p.kv_heads + (bh % p.heads) / p.group();
        for i in 0..lq {
            let mut s: Vec<f64> = (0..lk)
                .map(|j| {
                    let dot: f64 = (0..d)
                        .map(|c| q[(bh * lq + i) * d + c] * k[(kvh * lk + j) * d + c])
                        .sum();
                    let m = mask.map_or(0.0, |m| {
                        m.data[m.offsets[bh] + i * m.row_stride + j * m.col_stride]
                    });
                    if p.causal && j > i {
                        f64::NEG_INFINITY
                    } else {
                        dot * p.scale + m
                    }
                })
                .collect();
            let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            if max == f64::NEG_INFINITY {
                continue;
            }
            s.iter_mut().for_each(|x| *x = (*x - max).exp());
            let sum: f64 = s.iter().sum();
            for c in 0..dv {
                out[(bh * lq + i) * dv + c] = (0..lk)
                    .map(|j| s[j] / sum * v[(kvh * lk + j) * dv + c])
                    .sum();
            }
        }
    }
    out
}

type Kernel<T> =
    fn(&AttentionParams, &[T], &[T], &[T], Option<&Mask<'_, T>>, &mut [T]) -> KernelResult<()>;

fn check_case(p: AttentionParams, with_mask: bool, seed: u64) {
    let mut rng = Rng::new(seed);
    let (lq, lk, lv, lo) = p.lens().unwrap();
    let (q, k, v) = (rng.vec(lq), rng.vec(lk), rng.vec(lv));
    // A [q_len, kv_len] mask broadcast over heads, with one row fully masked.
    let mut mdata = rng.vec(p.q_len * p.kv_len);
    if p.q_len > 1 {
        mdata[p.kv_len..2 * p.kv_len].fill(f64::NEG_INFINITY);
    }
    let offsets = vec![0; p.batch * p.heads];
    let m64 = Mask {
        data: &mdata,
        offsets: &offsets,
        row_stride: p.kv_len,
        col_stride: 1,
    };
    let mask = with_mask.then_some(&m64);
    let want = reference(&p, &q, &k, &v, mask);
    let kernels: [(&str, Kernel<f64>, Kernel<f32>); 2] = [
        ("naive", naive::attention, naive::attention),
        ("flash", flash::attention, flash::attention),
    ];
    for (name, k64, k32) in kernels {
        let mut out = vec![f64::NAN; lo];
        k64(&p, &q, &k, &v, mask, &mut out).unwrap();
        assert_close(
            &out,
            &want,
            1e-12,
            &format!("{name} f64 {p:?} mask={with_mask}"),
        );
        let md32: Vec<f32> = cast(&mdata);
        let m32 = Mask {
            data: &md32,
            offsets: &offsets,
            row_stride: p.kv_len,
            col_stride: 1,
        };
        let mut out = vec![f32::NAN; lo];
        k32(
            &p,
            &cast(&q),
            &cast(&k),
            &cast(&v),
            with_mask.then_some(&m32),
            &mut out,
        )
        .unwrap();
        assert_close(
            &out,
            &want,
            1e-5,
            &format!("{name} f32 {p:?} mask={with_mask}"),
        );
    }
}

#[allow(clippy::too_many_arguments)]
fn params(
    batch: usize,
    heads: usize,
    kv_heads: usize,
    q_len: usize,
    kv_len: usize,
    d: usize,
    dv: usize,
    causal: bool,
) -> AttentionParams {
    AttentionParams {
        batch,
        heads,
        kv_heads,
        q_len,
        kv_len,
        head_dim: d,
        v_dim: dv,
        scale: 1.0 / (d as f64).sqrt(),
        causal,
    }
}

#[test]
fn both_algorithms_match_the_reference() {
    let mut seed = 0;
    for (b, h, kh) in [(1, 1, 1), (2, 3, 3), (1, 4, 2)] {
        for (lq, lk) in [(1, 1), (5, 7), (70, 300), (300, 70), (64, 256), (129, 257)] {
            for (d, dv) in [(8, 8), (5, 3)] {
                for causal in [false, true] {
                    for mask in [false, true] {
                        seed += 1;
                        check_case(params(b, h, kh, lq, lk, d, dv, causal), mask, seed);
                    }
                }
            }
        }
    }
}

#[test]
fn no_keys_give_zeros_and_wrong_buffers_are_errors() {
    let p = params(1, 2, 2, 3, 0, 4, 4, false);
    for kernel in [naive::attention::<f32>, flash::attention::<f32>] {
        let mut out = vec![f32::NAN; 24];
        kernel(&p, &[0.0; 24], &[], &[], None, &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 0.0));
        let p = params(1, 2, 2, 3, 2, 4, 4, false);
        assert!(kernel(&p, &[0.0; 24], &[0.0; 15], &[0.0; 16], None, &mut out).is_err());
        let gqa = params(1, 3, 2, 3, 2, 4, 4, false);
        assert!(kernel(
            &gqa,
            &[0.0; 36],
            &[0.0; 16],
            &[0.0; 16],
            None,
            &mut [0.0; 36]
        )
        .is_err());
        let short = Mask {
            data: &[0.0f32; 5],
            offsets: &[0, 0],
            row_stride: 2,
            col_stride: 1,
        };
        assert!(kernel(
            &p,
            &[0.0; 24],
            &[0.0; 16],
            &[0.0; 16],
            Some(&short),
            &mut out
        )
        .is_err());
    }
}

#[test]
fn a_nan_makes_its_row_nan_in_both_algorithms() {
    let p = params(1, 1, 1, 3, 600, 4, 2, false);
    let (lq, lk, lv, lo) = p.lens().unwrap();
    let mut q = vec![0.5f32; lq];
    q[4] = f32::NAN; // query row 1
    let (k, v) = (vec![0.25f32; lk], vec![1.0f32; lv]);
    for kernel in [naive::attention::<f32>, flash::attention::<f32>] {
        let mut out = vec![0.0f32; lo];
        kernel(&p, &q, &k, &v, None, &mut out).unwrap();
        assert!(out[2..4].iter().all(|x| x.is_nan()), "{out:?}");
        assert!(out[..2]
            .iter()
            .chain(&out[4..])
            .all(|&x| (x - 1.0).abs() < 1e-6));
    }
}
