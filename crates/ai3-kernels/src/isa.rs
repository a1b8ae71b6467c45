//! The CPU feature ladder: which instruction set the kernels use.
//!
//! Every kernel with vector code has a path per level: AVX-512, AVX2 with FMA,
//! and portable Rust (which is all that other architectures, aarch64 among
//! them, get). The level is chosen once per process, the first time a kernel
//! asks ([`level`]): the best the CPU has, or lower when the `AI3_CPU_ISA`
//! environment variable (`avx512`, `avx2` or `portable`) asks for it, which is
//! how the tests run the lower paths on a machine that has the higher ones.
//! A level the CPU lacks is never chosen, whatever the variable says.

use std::sync::OnceLock;

/// An instruction-set level, ordered: a higher level has everything a lower one has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust, vectorised by the compiler for the baseline target.
    Portable,
    /// x86-64 AVX2 and FMA (256-bit vectors).
    Avx2,
    /// x86-64 AVX-512 F and VL, with AVX2 and FMA (512-bit vectors).
    Avx512,
}

impl Isa {
    /// The level's name, as `AI3_CPU_ISA` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// The level named `name` (as [`Isa::name`] gives it).
    pub fn parse(name: &str) -> Option<Isa> {
        [Isa::Portable, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .find(|i| i.name().eq_ignore_ascii_case(name.trim()))
    }
}

/// The environment variable that caps the level.
pub const ENV: &str = "AI3_CPU_ISA";

/// The best level this CPU supports.
pub fn detected() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("avx512vl") && has!("avx2") && has!("fma") {
            return Isa::Avx512;
        }
        if has!("avx2") && has!("fma") {
            return Isa::Avx2;
        }
    }
    Isa::Portable
}

/// The level the kernels use: [`detected`], capped by `AI3_CPU_ISA` when it
/// names a level (an unknown name is ignored, with a warning on stderr).
/// Decided on the first call and fixed for the life of the process.
pub fn level() -> Isa {
    static LEVEL: OnceLock<Isa> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let best = detected();
        match std::env::var(ENV) {
            Ok(v) if !v.trim().is_empty() => match Isa::parse(&v) {
                Some(cap) => cap.min(best),
                None => {
                    eprintln!(
                        "ai3: {ENV}={v:?} is not one of avx512, avx2, portable; using {}",
                        best.name()
                    );
                    best
                }
            },
            _ => best,
        }
    })
}

/// Whether the kernels use AVX-512.
#[inline]
pub fn avx512() -> bool {
    level() >= Isa::Avx512
}

/// Whether the kernels use at least AVX2 with FMA.
#[inline]
pub fn avx2() -> bool {
    level() >= Isa::Avx2
}

/// Declares `$name`, which runs `$imp` compiled for the [`level`] in use:
/// with AVX-512 or AVX2 enabled, so the compiler vectorises `$imp`'s loops at
/// that width, or for the baseline target. `$imp` is generic over the
/// element type (and optionally one more parameter, such as the closure an
/// elementwise kernel applies) and marked `#[inline(always)]`, so each copy
/// is compiled in; closures it calls are inlined into the copy too.
macro_rules! multiversion {
    ($(#[$doc:meta])* $vis:vis unsafe fn $name:ident<T $(, $g:ident: $gb:path)?>($($arg:ident: $ty:ty),* $(,)?) => $imp:ident) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        $vis unsafe fn $name<T: $crate::Float $(, $g: $gb)?>($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx512<T: $crate::Float $(, $g: $gb)?>($($arg: $ty),*) {
                    // SAFETY: forwarded.
                    unsafe { $imp($($arg),*) }
                }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2<T: $crate::Float $(, $g: $gb)?>($($arg: $ty),*) {
                    // SAFETY: forwarded.
                    unsafe { $imp($($arg),*) }
                }
                match $crate::isa::level() {
                    // SAFETY: the level is never above what the CPU has; the rest is forwarded.
                    $crate::isa::Isa::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: as above.
                    $crate::isa::Isa::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::isa::Isa::Portable => {}
                }
            }
            // SAFETY: forwarded.
            unsafe { $imp($($arg),*) }
        }
    };
}
pub(crate) use multiversion;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_ordered_and_named() {
        assert!(Isa::Portable < Isa::Avx2 && Isa::Avx2 < Isa::Avx512);
        for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
            assert_eq!(Isa::parse(isa.name()), Some(isa));
        }
        assert_eq!(Isa::parse(" AVX2 "), Some(Isa::Avx2));
        assert_eq!(Isa::parse("sse"), None);
    }

    #[test]
    fn the_level_never_exceeds_the_cpu() {
        assert!(level() <= detected());
        if let Ok(v) = std::env::var(ENV) {
            if let Some(cap) = Isa::parse(&v) {
                assert_eq!(level(), cap.min(detected()));
            }
        }
    }
}
