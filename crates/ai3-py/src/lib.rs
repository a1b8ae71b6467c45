//! `ai3._core`: the Python extension. It only converts between Python and
//! `ai3-core`: DLPack in and out, the GIL released around every computation,
//! errors mapped once (see `errors`). No algorithm logic lives here.

mod args;
mod dlpack;
mod errors;
mod model;

use ai3_core::registry::{self, REGISTRY};
use ai3_core::{Error, OpKind};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::args::parse_request;
use crate::errors::to_py;
use crate::model::Model;

/// Every registry row: op, algorithm, device, summary, and why it is unavailable (or None).
#[pyfunction]
fn algorithms(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    // Grouped by operation, ai3's own algorithms before the user's C++.
    let mut rows: Vec<_> = REGISTRY.iter().collect();
    rows.sort_by_key(|e| {
        let op = OpKind::ALL.iter().position(|&o| o == e.op);
        (op, e.algorithm == registry::Algorithm::Custom)
    });
    rows.into_iter()
        .map(|e| {
            let d = PyDict::new(py);
            d.set_item("op", e.op.name())?;
            d.set_item("algorithm", e.algorithm.name())?;
            d.set_item("device", e.device.name())?;
            d.set_item("summary", e.summary)?;
            d.set_item("unavailable", (e.available)().err())?;
            Ok(d)
        })
        .collect()
}

/// The names a user may select for each operation, `'default'` included.
#[pyfunction]
fn selectable() -> Vec<(&'static str, Vec<&'static str>)> {
    OpKind::ALL
        .iter()
        .map(|&op| (op.name(), registry::selectable_names(op)))
        .collect()
}

/// Every operation a model can hold, as `Model.add` takes it: `op`, `inputs`
/// (`(min, max)`, `max` `None` for any number) and `params`, a list of
/// `(name, kind, required)`.
#[pyfunction]
fn operations(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    OpKind::ALL
        .iter()
        .map(|&op| {
            let spec = op.spec();
            let d = PyDict::new(py);
            d.set_item("op", op.name())?;
            d.set_item("inputs", (spec.inputs.min, spec.inputs.max))?;
            let params: Vec<_> = spec
                .params
                .iter()
                .map(|p| (p.name, p.kind.name(), p.required))
                .collect();
            d.set_item("params", params)?;
            Ok(d)
        })
        .collect()
}

/// Checks an algorithm name for an operation; raises `ai3.AlgorithmError` if unknown.
#[pyfunction]
fn check_algorithm(op: &str, algorithm: &str) -> PyResult<()> {
    let kind = OpKind::from_name(op)
        .ok_or_else(|| to_py(Error::invalid(op, format!("unknown operation '{op}'"))))?;
    parse_request(kind, algorithm).map(|_| ())
}

/// Whether `algorithm` for `op` runs the user's C++: `'custom'`, or `'default'`
/// when the op's header sets `DEFAULT_<OP>` and the function is implemented.
#[pyfunction]
fn runs_custom(op: &str, algorithm: &str) -> PyResult<bool> {
    let kind = OpKind::from_name(op)
        .ok_or_else(|| to_py(Error::invalid(op, format!("unknown operation '{op}'"))))?;
    Ok(registry::runs_custom(kind, parse_request(kind, algorithm)?))
}

/// Sets how many threads ai3's kernels use (a new pool; running calls keep theirs).
#[pyfunction]
fn set_num_threads(n: usize) -> PyResult<()> {
    ai3_core::threads::set_num_threads(n).map_err(to_py)
}

/// How many threads ai3's kernels use.
#[pyfunction]
fn get_num_threads() -> usize {
    ai3_core::threads::num_threads()
}

/// The instruction-set level the CPU kernels use: `"avx512"`, `"avx2"` or
/// `"portable"` (the best the CPU has, capped by `AI3_CPU_ISA`; fixed per process).
#[pyfunction]
fn cpu_isa() -> &'static str {
    ai3_core::isa::level().name()
}

/// Turns parking of PyTorch's idle OpenMP threads on (for runs started from
/// the calling thread) or off (`ai3_core::threads`); returns whether it is on.
#[pyfunction]
fn _park_openmp(on: bool) -> bool {
    ai3_core::threads::park_openmp(on)
}

/// Makes the outputs and arenas runs allocate (not zeroed) come filled with
/// NaN from now on, or not: for test suites, which then see any element a
/// kernel leaves unwritten (`ai3_core::tensor::poison_unfilled`).
#[pyfunction]
fn _poison_unfilled(on: bool) {
    ai3_core::tensor::poison_unfilled(on)
}

/// Whether runs park the idle threads of PyTorch's OpenMP runtime.
#[pyfunction]
fn _parks_openmp() -> bool {
    ai3_core::threads::parks_openmp()
}

/// Imports a tensor through DLPack and copies it into ai3-owned memory.
///
/// Returns `(address seen on import, capsule of the copy, address of the copy)`,
/// so tests can check that neither direction of the crossing copies.
#[pyfunction]
fn dlpack_roundtrip<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
) -> PyResult<(usize, Bound<'py, PyAny>, usize)> {
    let t = dlpack::import(x, "dlpack_roundtrip")?;
    let seen = t.data_ptr() as usize;
    let copy = t.to_contiguous().map_err(to_py)?;
    let written = copy.data_ptr() as usize;
    Ok((seen, dlpack::export(py, copy)?, written))
}

/// The Python extension module `ai3._core`.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Model>()?;
    m.add_function(wrap_pyfunction!(algorithms, m)?)?;
    m.add_function(wrap_pyfunction!(operations, m)?)?;
    m.add_function(wrap_pyfunction!(selectable, m)?)?;
    m.add_function(wrap_pyfunction!(check_algorithm, m)?)?;
    m.add_function(wrap_pyfunction!(runs_custom, m)?)?;
    m.add_function(wrap_pyfunction!(dlpack_roundtrip, m)?)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(get_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_isa, m)?)?;
    m.add_function(wrap_pyfunction!(_park_openmp, m)?)?;
    m.add_function(wrap_pyfunction!(_parks_openmp, m)?)?;
    m.add_function(wrap_pyfunction!(_poison_unfilled, m)?)?;
    Ok(())
}
