//! Compiles the user's C++ algorithms and the `cxx` bridge to them.
//!
//! Sources come from `AI3_CUSTOM_DIR` when set (relative paths are resolved
//! against the directory the build was started from), else from the
//! repository's `cpp_custom/`. Every `.cpp` file of that directory is
//! compiled; an operation whose `<op>.cpp` it lacks takes the stock one from
//! `cpp_custom/`, which throws `ai3::NotImplemented`.
//!
//! Extra flags, for include directories and libraries:
//! - `AI3_CXXFLAGS`: passed to the C++ compiler (`-I/usr/include/eigen3 -O3 -fopenmp`);
//! - `AI3_LDFLAGS`: `-L<dir>` and `-l<name>` (`-L/opt/openblas/lib -lopenblas`);
//! - or the same two as `cxxflags = ...` / `ldflags = ...` lines in a
//!   `build.cfg` file inside the sources directory (the environment is added after it).

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

/// The operations with a header/source pair, as in `src/custom/mod.rs`.
const OPS: [&str; 7] = [
    "conv2d",
    "linear",
    "relu",
    "maxpool2d",
    "avgpool2d",
    "adaptiveavgpool2d",
    "flatten",
];

fn main() {
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let stock = manifest.join("../../cpp_custom");
    let stock = stock.canonicalize().unwrap_or_else(|_| {
        fail(&format!(
            "the stock C++ directory {} is missing",
            stock.display()
        ))
    });
    for var in ["AI3_CUSTOM_DIR", "AI3_CXXFLAGS", "AI3_LDFLAGS"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let custom = match env::var("AI3_CUSTOM_DIR") {
        Ok(dir) if !dir.trim().is_empty() => resolve(dir.trim()),
        _ => stock.clone(),
    };
    let is_stock = custom == stock;

    let mut sources = cpp_files(&custom);
    for op in OPS {
        let own = custom.join(format!("{op}.cpp"));
        if !own.exists() {
            sources.push(stock.join(format!("{op}.cpp")));
        }
    }
    sources.sort();
    sources.dedup();

    let (mut cxxflags, mut ldflags) = read_config(&custom);
    cxxflags.extend(split_env("AI3_CXXFLAGS"));
    ldflags.extend(split_env("AI3_LDFLAGS"));

    let mut build = cxx_build::bridge("src/custom/mod.rs");
    build
        .file("src/custom/bridge.cc")
        .files(&sources)
        // The user's directory first, so its headers win over the stock ones.
        .include(&custom)
        .include(&stock)
        .std("c++17")
        .warnings(false);
    for flag in &cxxflags {
        build.flag(flag);
    }
    build.compile("ai3_custom");

    link(&ldflags);
    println!("cargo:rustc-env=AI3_CUSTOM_SOURCE_DIR={}", custom.display());
    println!("cargo:rustc-env=AI3_CUSTOM_STOCK={}", u8::from(is_stock));
    println!("cargo:rerun-if-changed=src/custom/bridge.cc");
    println!("cargo:rerun-if-changed=src/custom/bridge.h");
    for dir in [&custom, &stock] {
        println!("cargo:rerun-if-changed={}", dir.display());
        for f in fs::read_dir(dir).into_iter().flatten().flatten() {
            println!("cargo:rerun-if-changed={}", f.path().display());
        }
    }
}

/// Stops the build with a message cargo shows to the user.
fn fail(msg: &str) -> ! {
    eprintln!("error: ai3 custom C++ build: {msg}");
    std::process::exit(1);
}

/// `AI3_CUSTOM_DIR` as an absolute, existing directory. Relative paths are
/// taken from `PWD` (where `pip install .` was typed), as the build itself runs
/// in the crate's directory.
fn resolve(dir: &str) -> PathBuf {
    let path = Path::new(dir);
    let base = env::var("PWD").map(PathBuf::from).unwrap_or_default();
    let full = if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(path)
    };
    match full.canonicalize() {
        Ok(p) if p.is_dir() => p,
        _ => fail(&format!(
            "AI3_CUSTOM_DIR={dir} is not a directory (looked at {})",
            full.display()
        )),
    }
}

fn cpp_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", dir.display())))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "cpp" || x == "cc"))
        .collect();
    files.sort();
    files
}

fn split_env(var: &str) -> Vec<String> {
    env::var(var)
        .map(|v| v.split_whitespace().map(String::from).collect())
        .unwrap_or_default()
}

/// `cxxflags = ...` and `ldflags = ...` from `<dir>/build.cfg`, if present.
fn read_config(dir: &Path) -> (Vec<String>, Vec<String>) {
    let (mut cxx, mut ld) = (Vec::new(), Vec::new());
    let path = dir.join("build.cfg");
    let Ok(text) = fs::read_to_string(&path) else {
        return (cxx, ld);
    };
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            fail(&format!(
                "{}:{}: expected `key = value`, got `{line}`",
                path.display(),
                n + 1
            ));
        };
        let flags = value.split_whitespace().map(String::from);
        match key.trim() {
            "cxxflags" => cxx.extend(flags),
            "ldflags" => ld.extend(flags),
            other => fail(&format!(
                "{}:{}: unknown key `{other}` (expected cxxflags or ldflags)",
                path.display(),
                n + 1
            )),
        }
    }
    (cxx, ld)
}

/// Passes `-L` and `-l` flags on to the final extension module.
fn link(flags: &[String]) {
    let mut it = flags.iter();
    while let Some(flag) = it.next() {
        let (kind, value) = if let Some(v) = flag.strip_prefix("-L") {
            ("search", v.to_string())
        } else if let Some(v) = flag.strip_prefix("-l") {
            ("lib", v.to_string())
        } else {
            fail(&format!(
                "linker flag `{flag}` is not supported: give libraries as -L<dir> and -l<name>"
            ))
        };
        let value = if value.is_empty() {
            it.next()
                .cloned()
                .unwrap_or_else(|| fail(&format!("`{flag}` needs a value")))
        } else {
            value
        };
        match kind {
            "search" => println!("cargo:rustc-link-search=native={value}"),
            _ => println!("cargo:rustc-link-lib={value}"),
        }
    }
}
