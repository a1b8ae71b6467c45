//! Criterion benchmarks of the CPU kernels: each conv2d algorithm on the
//! paper's shapes, the linear GEMM, and pooling.
//!
//! `cargo bench -p ai3-benches` (add a filter such as `conv2d/winograd` to run part).
//! Kernel times only; `benches/compare_torch.py` compares with PyTorch.

use ai3_benches::{conv3x3, values, PAPER_CONV_SHAPES, POINTWISE_SHAPES, WINOGRAD_LAYOUT_SHAPES};
use ai3_kernels::cpu::conv2d::{direct, gemm, smm, winograd};
use ai3_kernels::cpu::{linear, pool};
use ai3_kernels::params::{LinearParams, Pool2dParams};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::time::Duration;

fn conv(c: &mut Criterion) {
    let mut group = c.benchmark_group("conv2d");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    // Batch 1 keeps a full run short; the Python benchmark uses the paper's batch 10.
    for &(cin, cout, size) in &PAPER_CONV_SHAPES {
        let p = conv3x3(1, cin, cout, size);
        let x = values(p.input_len(), 1);
        let w = values(p.weight_len(), 2);
        let b = values(cout, 3);
        let wf = winograd::transform_filter(&p, &w).expect("transformed filter");
        let mut out = vec![0f32; p.output_len()];
        let flops = 2 * p.output_len() * cin * 9;
        group.throughput(Throughput::Elements(flops as u64));
        let id = format!("{cin}x{cout}@{size}");
        group.bench_function(BenchmarkId::new("gemm", &id), |bch| {
            bch.iter(|| gemm::conv2d(&p, &x, &w, Some(&b), &mut out).expect("kernel"))
        });
        group.bench_function(BenchmarkId::new("winograd", &id), |bch| {
            bch.iter(|| winograd::conv2d(&p, &x, &wf, Some(&b), &mut out).expect("kernel"))
        });
        group.bench_function(BenchmarkId::new("smm", &id), |bch| {
            bch.iter(|| smm::conv2d(&p, &x, &w, Some(&b), &mut out).expect("kernel"))
        });
        group.bench_function(BenchmarkId::new("direct", &id), |bch| {
            bch.iter(|| direct::conv2d(&p, &x, &w, Some(&b), &mut out).expect("kernel"))
        });
    }
    group.finish();
}

/// Winograd in NCHW against the blocked kernel (NCHW8c in and out), on the
/// 3x3 layers of GoogLeNet, ResNet-50 and SqueezeNet, batch 1 and 10.
fn winograd_layouts(c: &mut Criterion) {
    use ai3_kernels::cpu::blocked::blocked_len;
    use winograd::blocked;
    if !blocked::applies(&conv3x3(1, 8, 8, 8)) {
        return;
    }
    let mut group = c.benchmark_group("winograd_layouts");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(2));
    for &(cin, cout, size) in &WINOGRAD_LAYOUT_SHAPES {
        for batch in [1, 10] {
            let p = conv3x3(batch, cin, cout, size);
            let x = values(p.input_len(), 1);
            let w = values(p.weight_len(), 2);
            let b = values(cout, 3);
            let wf = winograd::transform_filter(&p, &w).expect("transformed filter");
            let mut out = vec![0f32; p.output_len()];
            let mut packed = vec![0f32; blocked::packed_len(&p).expect("length")];
            blocked::pack(&p, &w, Some(&b), &mut packed).expect("packed");
            let plane = size * size;
            let xb = values(blocked_len(batch, cin, plane).expect("length"), 4);
            let mut ob = vec![0f32; blocked_len(batch, cout, plane).expect("length")];
            let id = format!("{cin}x{cout}@{size}b{batch}");
            group.bench_function(BenchmarkId::new("nchw", &id), |bch| {
                bch.iter(|| winograd::conv2d(&p, &x, &wf, Some(&b), &mut out).expect("kernel"))
            });
            group.bench_function(BenchmarkId::new("nchw_on_blocks", &id), |bch| {
                bch.iter(|| {
                    blocked::conv2d(&p, false, &x, &packed, &mut out, None).expect("kernel")
                })
            });
            group.bench_function(BenchmarkId::new("blocked", &id), |bch| {
                bch.iter(|| blocked::conv2d(&p, true, &xb, &packed, &mut ob, None).expect("kernel"))
            });
        }
    }
    group.finish();
}

/// The blocked 1x1 kernel (NCHW8c in and out) on MobileNet's and
/// EfficientNet's expansions and projections and ResNet's bottleneck 1x1s,
/// at batch 1. `AI3_CPU_ISA=avx2` measures the AVX2 register tile on a
/// machine with AVX-512.
fn blocked_pointwise(c: &mut Criterion) {
    use ai3_kernels::cpu::blocked::{available, blocked_len, pointwise, Fused};
    if !available() {
        return;
    }
    let mut group = c.benchmark_group("blocked_pointwise");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(2));
    for &(cin, cout, size) in &POINTWISE_SHAPES {
        let s = pointwise::Pointwise {
            batch: 1,
            in_channels: cin,
            out_channels: cout,
            plane: size * size,
            subsample: None,
        };
        let w = values(cout * cin, 2);
        let b = values(cout, 3);
        let mut packed = vec![0f32; s.packed_len().expect("length")];
        pointwise::pack(&s, &w, Some(&b), &mut packed).expect("packed");
        let x = values(blocked_len(1, cin, s.plane).expect("length"), 4);
        let mut out = vec![0f32; blocked_len(1, cout, s.plane).expect("length")];
        group.throughput(Throughput::Elements(2 * s.macs() as u64));
        group.bench_function(
            BenchmarkId::from_parameter(format!("{cin}x{cout}@{size}")),
            |bch| {
                bch.iter(|| {
                    pointwise::conv2d(&s, &x, &packed, &mut out, Default::default(), None)
                        .expect("kernel")
                })
            },
        );
        // With ReLU6 fused in registers, as MobileNetV2's expansions have it.
        let relu6 = Fused {
            residual: None,
            clamp: Some((0.0, 6.0)),
        };
        group.bench_function(
            BenchmarkId::from_parameter(format!("{cin}x{cout}@{size}+relu6")),
            |bch| {
                bch.iter(|| {
                    pointwise::conv2d(&s, &x, &packed, &mut out, relu6, None).expect("kernel")
                })
            },
        );
    }
    group.finish();
}

fn gemm_linear(c: &mut Criterion) {
    let p = LinearParams {
        rows: 64,
        in_features: 4096,
        out_features: 4096,
    };
    let x = values(p.rows * p.in_features, 4);
    let w = values(p.out_features * p.in_features, 5);
    let b = values(p.out_features, 6);
    let mut out = vec![0f32; p.rows * p.out_features];
    let mut group = c.benchmark_group("linear");
    group.sample_size(20);
    group.throughput(Throughput::Elements(
        (2 * p.rows * p.in_features * p.out_features) as u64,
    ));
    group.bench_function("gemm/64x4096x4096", |bch| {
        bch.iter(|| linear::gemm(&p, &x, &w, Some(&b), &mut out).expect("kernel"))
    });
    // ConvNeXt-T's MLP layers at batch 1 (196 and 49 tokens): the gemm
    // crate against the packed register-tile kernel.
    for (rows, inf, outf) in [(196, 384, 1536), (196, 1536, 384), (3136, 96, 384)] {
        let p = LinearParams {
            rows,
            in_features: inf,
            out_features: outf,
        };
        let x = values(rows * inf, 4);
        let w = values(outf * inf, 5);
        let b = values(outf, 6);
        let mut out = vec![0f32; rows * outf];
        group.throughput(Throughput::Elements((2 * rows * inf * outf) as u64));
        let id = format!("{rows}x{inf}x{outf}");
        group.bench_function(BenchmarkId::new("gemm", &id), |bch| {
            bch.iter(|| linear::gemm(&p, &x, &w, Some(&b), &mut out).expect("kernel"))
        });
        if let Ok(Some(packed)) = linear::packed::PackedWeight::new(&w, Some(&b), outf, inf) {
            group.bench_function(BenchmarkId::new("packed", &id), |bch| {
                bch.iter(|| linear::packed::linear(&p, &x, &packed, &mut out, None))
            });
        }
    }
    group.finish();
}

fn pools(c: &mut Criterion) {
    let p = Pool2dParams {
        batch: 10,
        channels: 64,
        in_h: 112,
        in_w: 112,
        kernel: (2, 2),
        stride: (2, 2),
        padding: (0, 0),
        dilation: (1, 1),
        ceil_mode: false,
    };
    let x = values(p.input_len(), 7);
    let mut out = vec![0f32; p.output_len()];
    let mut group = c.benchmark_group("pool");
    group.sample_size(20);
    group.bench_function("maxpool2d/10x64x112x112", |bch| {
        bch.iter(|| pool::maxpool2d(&p, &x, &mut out).expect("kernel"))
    });
    // SqueezeNet's 3x3 stride-2 ceil-mode pooling of 128 channels at
    // 55x55, batch 10, NCHW and channel-blocked.
    let p = Pool2dParams {
        channels: 128,
        in_h: 55,
        in_w: 55,
        kernel: (3, 3),
        ceil_mode: true,
        ..p
    };
    let x = values(p.input_len(), 8);
    let mut out = vec![0f32; p.output_len()];
    group.bench_function("maxpool2d/10x128x55x55_3x3s2", |bch| {
        bch.iter(|| pool::maxpool2d(&p, &x, &mut out).expect("kernel"))
    });
    group.bench_function("maxpool2d_blocked/10x128x55x55_3x3s2", |bch| {
        bch.iter(|| pool::maxpool2d_blocked(&p, &x, &mut out).expect("kernel"))
    });
    group.finish();
}

criterion_group!(
    benches,
    conv,
    winograd_layouts,
    blocked_pointwise,
    gemm_linear,
    pools
);
criterion_main!(benches);
