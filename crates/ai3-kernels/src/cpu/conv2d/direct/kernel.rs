//! Register-blocked microkernels of the direct convolution.
//!
//! One call computes `MR` output channels for `NV` "slots"; a slot is a run of
//! up to one vector (`VL` elements) of consecutive output columns in one
//! output row. The `MR x NV` vector accumulators stay in registers over the
//! whole reduction (input channels x kernel taps): per tap, `NV` input
//! vectors are loaded once and each of the `MR` weights is broadcast once, so
//! every load feeds several FMAs.

use std::any::TypeId;

use crate::Float;

/// Most slots one call may take.
pub(super) const NV_MAX: usize = 16;

/// One microkernel call's operands. Pointers are into the padded input, the
/// packed weights and the NCHW output.
pub(super) struct Tile<T> {
    /// Per slot: the read position of its first pixel's top-left tap in the
    /// group's first input channel.
    pub inp: [*const T; NV_MAX],
    /// Per slot: where its first pixel goes in the block's first output channel.
    pub out: [*mut T; NV_MAX],
    /// Per slot: how many output columns are real (0 for a padding slot).
    pub len: [usize; NV_MAX],
    /// Packed weights of the block: `[in_channels_per_group][taps][MR]`.
    pub w: *const T,
    /// `MR` bias values (zeros past the real channels).
    pub bias: *const T,
    /// Input channels to reduce over.
    pub icg: usize,
    /// Distance between input channel planes.
    pub chan_stride: usize,
    /// Offsets of the kernel taps.
    pub taps: *const usize,
    /// Number of taps.
    pub ntaps: usize,
    /// Distance between output channel planes.
    pub oc_stride: usize,
    /// Output channels of the block that are real (at most `MR`).
    pub mr_valid: usize,
}

/// A microkernel.
pub(super) type TileFn<T> = unsafe fn(&Tile<T>);

/// Register block shapes `(MR, NV)` the kernels are instantiated for.
pub(super) const SHAPES: [(usize, usize); 3] = [(8, 3), (4, 6), (1, 8)];

/// Elements per vector: the columns of one slot.
pub(super) fn vector_len<T: 'static>() -> usize {
    if TypeId::of::<T>() == TypeId::of::<f64>() {
        8
    } else {
        16
    }
}

/// The fastest microkernel for `T` and block shape `(mr, nv)` (one of [`SHAPES`]).
/// `force_portable` picks the plain Rust kernel whatever the CPU (for tests).
pub(super) fn select<T: Float>(mr: usize, nv: usize, force_portable: bool) -> TileFn<T> {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = force_portable;
    // The kernel of module `$isa` for `T` and `(mr, nv)`, when T is f32 or f64.
    #[cfg(target_arch = "x86_64")]
    macro_rules! from {
        ($isa:ident) => {
            if TypeId::of::<T>() == TypeId::of::<f32>() {
                let f: TileFn<f32> = match (mr, nv) {
                    (8, _) => $isa::tile_f32::<8, 3>,
                    (4, _) => $isa::tile_f32::<4, 6>,
                    _ => $isa::tile_f32::<1, 8>,
                };
                // SAFETY: T is f32, so the two function pointer types are the same.
                return unsafe { std::mem::transmute::<TileFn<f32>, TileFn<T>>(f) };
            }
            if TypeId::of::<T>() == TypeId::of::<f64>() {
                let f: TileFn<f64> = match (mr, nv) {
                    (8, _) => $isa::tile_f64::<8, 3>,
                    (4, _) => $isa::tile_f64::<4, 6>,
                    _ => $isa::tile_f64::<1, 8>,
                };
                // SAFETY: T is f64, so the two function pointer types are the same.
                return unsafe { std::mem::transmute::<TileFn<f64>, TileFn<T>>(f) };
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    if !force_portable && crate::isa::avx512() {
        from!(avx512);
    }
    #[cfg(target_arch = "x86_64")]
    if !force_portable && crate::isa::avx2() {
        from!(avx2);
    }
    match (mr, nv, vector_len::<T>()) {
        (8, _, 16) => portable::<T, 8, 3, 16>,
        (4, _, 16) => portable::<T, 4, 6, 16>,
        (_, _, 16) => portable::<T, 1, 16, 16>,
        (8, _, _) => portable::<T, 8, 3, 8>,
        (4, _, _) => portable::<T, 4, 6, 8>,
        _ => portable::<T, 1, 16, 8>,
    }
}

/// Plain Rust microkernel for machines without AVX-512: one slot at a time,
/// accumulators in an array the compiler may vectorise.
///
/// # Safety
/// The tile's pointers must cover every element the reduction reads and the
/// `len` columns of `mr_valid` channels it writes.
unsafe fn portable<T: Float, const MR: usize, const NV: usize, const VL: usize>(a: &Tile<T>) {
    for v in 0..NV {
        let len = a.len[v];
        if len == 0 {
            continue;
        }
        let mut acc = [[T::zero(); VL]; MR];
        for (m, row) in acc.iter_mut().enumerate() {
            *row = [*a.bias.add(m); VL];
        }
        let mut w = a.w;
        for c in 0..a.icg {
            let base = a.inp[v].add(c * a.chan_stride);
            for t in 0..a.ntaps {
                let src = std::slice::from_raw_parts(base.add(*a.taps.add(t)), VL);
                for (m, row) in acc.iter_mut().enumerate() {
                    let wm = *w.add(m);
                    for (d, &s) in row.iter_mut().zip(src) {
                        *d += wm * s;
                    }
                }
                w = w.add(MR);
            }
        }
        for (m, row) in acc.iter().enumerate().take(a.mr_valid) {
            let dst = std::slice::from_raw_parts_mut(a.out[v].add(m * a.oc_stride), len);
            dst.copy_from_slice(&row[..len]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::Tile;

    macro_rules! tile_kernel {
        ($name:ident, $t:ty, $vec:ty, $zero:ident, $set1:ident, $loadu:ident, $fmadd:ident,
         $storeu:ident, $mstore:ident, $mask:ty) => {
            /// AVX-512 microkernel: `MR x NV` accumulators in registers.
            ///
            /// # Safety
            /// AVX-512F must be available; the tile's pointers must cover a
            /// full vector per slot read and the `len` columns of `mr_valid`
            /// channels written.
            #[target_feature(enable = "avx512f")]
            pub(super) unsafe fn $name<const MR: usize, const NV: usize>(a: &Tile<$t>) {
                const VL: usize = 64 / std::mem::size_of::<$t>();
                let mut acc = [[$zero(); NV]; MR];
                for m in 0..MR {
                    let b = $set1(*a.bias.add(m));
                    for v in 0..NV {
                        acc[m][v] = b;
                    }
                }
                let mut inp = [a.inp[0]; NV];
                for v in 0..NV {
                    inp[v] = a.inp[v];
                }
                let mut w = a.w;
                for _ in 0..a.icg {
                    for t in 0..a.ntaps {
                        let off = *a.taps.add(t);
                        let mut x = [$zero(); NV];
                        for v in 0..NV {
                            x[v] = $loadu(inp[v].add(off));
                        }
                        for m in 0..MR {
                            let wm = $set1(*w.add(m));
                            for v in 0..NV {
                                acc[m][v] = $fmadd(wm, x[v], acc[m][v]);
                            }
                        }
                        w = w.add(MR);
                    }
                    for v in 0..NV {
                        inp[v] = inp[v].add(a.chan_stride);
                    }
                }
                for v in 0..NV {
                    let len = a.len[v];
                    if len == 0 {
                        continue;
                    }
                    let k: $mask = if len >= <$mask>::BITS as usize {
                        <$mask>::MAX
                    } else {
                        ((1u32 << len) - 1) as $mask
                    };
                    for m in 0..MR {
                        if m < a.mr_valid {
                            let dst = a.out[v].add(m * a.oc_stride);
                            if len >= VL {
                                $storeu(dst, acc[m][v]);
                            } else {
                                $mstore(dst, k, acc[m][v]);
                            }
                        }
                    }
                }
            }
        };
    }

    tile_kernel!(
        tile_f32,
        f32,
        __m512,
        _mm512_setzero_ps,
        _mm512_set1_ps,
        _mm512_loadu_ps,
        _mm512_fmadd_ps,
        _mm512_storeu_ps,
        _mm512_mask_storeu_ps,
        u16
    );
    tile_kernel!(
        tile_f64,
        f64,
        __m512d,
        _mm512_setzero_pd,
        _mm512_set1_pd,
        _mm512_loadu_pd,
        _mm512_fmadd_pd,
        _mm512_storeu_pd,
        _mm512_mask_storeu_pd,
        u8
    );
}

/// AVX2 microkernels for CPUs without AVX-512. A slot (16 f32 or 8 f64
/// columns) is two 256-bit vectors; with 16 registers the accumulators of
/// all `MR x NV` slots do not fit, so the kernel walks the slots one at a
/// time and the channels four at a time (8 accumulators, 2 input vectors and
/// a broadcast weight in registers).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::Tile;

    macro_rules! tile_kernel {
        ($name:ident, $t:ty, $zero:ident, $set1:ident, $loadu:ident, $fmadd:ident,
         $storeu:ident) => {
            /// AVX2 microkernel (see the [module](self)).
            ///
            /// # Safety
            /// AVX2 and FMA must be available; the tile's pointers must cover
            /// a full slot per read and the `len` columns of `mr_valid`
            /// channels written.
            #[target_feature(enable = "avx2,fma")]
            pub(super) unsafe fn $name<const MR: usize, const NV: usize>(a: &Tile<$t>) {
                const LANES: usize = 32 / std::mem::size_of::<$t>();
                // Channels per pass: a constant once MR is known.
                let rg = if MR >= 4 { 4 } else { 1 };
                for v in 0..NV {
                    let len = a.len[v];
                    if len == 0 {
                        continue;
                    }
                    let mut r0 = 0;
                    while r0 < MR && r0 < a.mr_valid {
                        let mut acc = [[$zero(); 2]; 4];
                        for (m, row) in acc.iter_mut().enumerate().take(rg) {
                            let b = $set1(*a.bias.add(r0 + m));
                            *row = [b, b];
                        }
                        let mut inp = a.inp[v];
                        let mut w = a.w.add(r0);
                        for _ in 0..a.icg {
                            for t in 0..a.ntaps {
                                let src = inp.add(*a.taps.add(t));
                                let (x0, x1) = ($loadu(src), $loadu(src.add(LANES)));
                                for (m, row) in acc.iter_mut().enumerate().take(rg) {
                                    let wm = $set1(*w.add(m));
                                    row[0] = $fmadd(wm, x0, row[0]);
                                    row[1] = $fmadd(wm, x1, row[1]);
                                }
                                w = w.add(MR);
                            }
                            inp = inp.add(a.chan_stride);
                        }
                        for (m, row) in acc.iter().enumerate().take(rg.min(a.mr_valid - r0)) {
                            let dst = a.out[v].add((r0 + m) * a.oc_stride);
                            if len >= 2 * LANES {
                                $storeu(dst, row[0]);
                                $storeu(dst.add(LANES), row[1]);
                            } else {
                                let mut tmp = [0.0 as $t; 2 * LANES];
                                $storeu(tmp.as_mut_ptr(), row[0]);
                                $storeu(tmp.as_mut_ptr().add(LANES), row[1]);
                                std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, len);
                            }
                        }
                        r0 += rg;
                    }
                }
            }
        };
    }

    tile_kernel!(
        tile_f32,
        f32,
        _mm256_setzero_ps,
        _mm256_set1_ps,
        _mm256_loadu_ps,
        _mm256_fmadd_ps,
        _mm256_storeu_ps
    );
    tile_kernel!(
        tile_f64,
        f64,
        _mm256_setzero_pd,
        _mm256_set1_pd,
        _mm256_loadu_pd,
        _mm256_fmadd_pd,
        _mm256_storeu_pd
    );
}
