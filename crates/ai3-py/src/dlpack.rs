//! DLPack in and out, without copies.
//!
//! Import calls the producer's `__dlpack__()` and wraps the memory in a
//! borrowed [`Tensor`] that keeps the producer's `DLManagedTensor` alive.
//! Export hands an owned [`Tensor`] to a `"dltensor"` capsule that
//! `torch.from_dlpack` consumes. The legacy (unversioned) capsule is used
//! because every torch >= 1.10 reads it.

use std::ffi::{c_void, CStr};

use ai3_core::tensor::contiguous_strides;
use ai3_core::{DType, Device, Error, Tensor};
use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::errors::to_py;

const DLTENSOR: &CStr = c"dltensor";
const USED_DLTENSOR: &CStr = c"used_dltensor";

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

const KDL_CPU: i32 = 1;
const KDL_CUDA: i32 = 2;
const KDL_INT: u8 = 0;
const KDL_UINT: u8 = 1;
const KDL_FLOAT: u8 = 2;
const KDL_BFLOAT: u8 = 4;
const KDL_BOOL: u8 = 6;

/// Owns an imported `DLManagedTensor` and calls its deleter once dropped.
struct Imported(*mut DLManagedTensor);

// SAFETY: DLPack producers must allow the deleter to be called from any
// thread; torch's deleter only drops a reference count.
unsafe impl Send for Imported {}
unsafe impl Sync for Imported {}

impl Drop for Imported {
    fn drop(&mut self) {
        // SAFETY: the pointer came from a consumed "dltensor" capsule, so we own it.
        unsafe {
            if let Some(deleter) = (*self.0).deleter {
                deleter(self.0);
            }
        }
    }
}

fn dtype_name(dt: DLDataType) -> String {
    let kind = match dt.code {
        KDL_INT => "int",
        KDL_UINT => "uint",
        KDL_FLOAT => "float",
        KDL_BFLOAT => "bfloat",
        KDL_BOOL => "bool",
        _ => "code",
    };
    format!("{kind}{}", dt.bits)
}

/// Imports any DLPack producer (a torch tensor), or a `"dltensor"` capsule
/// one made (`torch.utils.dlpack.to_dlpack(x)`, ten times quicker to get
/// than `x.__dlpack__()`), as a borrowed tensor, no copy. A capsule is
/// consumed: it cannot be imported twice.
///
/// `op` names the operation in errors about unsupported dtypes or devices.
pub fn import(obj: &Bound<'_, PyAny>, op: &str) -> PyResult<Tensor> {
    let (capsule, came_from) = match obj.cast::<PyCapsule>() {
        Ok(capsule) => (capsule.clone(), "got a capsule"),
        Err(_) => {
            let made = obj.call_method0("__dlpack__").map_err(|e| {
                PyTypeError::new_err(format!(
                    "{op}: expected a tensor supporting DLPack (__dlpack__), got {}: {e}",
                    obj.get_type()
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                ))
            })?;
            let capsule = made.cast_into::<PyCapsule>().map_err(|_| {
                PyTypeError::new_err(format!("{op}: __dlpack__() did not return a capsule"))
            })?;
            (capsule, "__dlpack__() returned a capsule")
        }
    };
    // SAFETY: checked to be a capsule; the name check makes the pointer a DLManagedTensor.
    let managed = unsafe {
        let raw = capsule.as_ptr();
        if ffi::PyCapsule_IsValid(raw, DLTENSOR.as_ptr()) != 1 {
            return Err(PyTypeError::new_err(format!(
                "{op}: {came_from} that is not an unused 'dltensor'"
            )));
        }
        let ptr = ffi::PyCapsule_GetPointer(raw, DLTENSOR.as_ptr()) as *mut DLManagedTensor;
        // Renaming marks the capsule consumed, so its destructor leaves the tensor to us.
        if ffi::PyCapsule_SetName(raw, USED_DLTENSOR.as_ptr()) != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Imported(ptr)
    };
    // SAFETY: a valid DLManagedTensor by the DLPack contract, alive while `managed` is.
    let t = unsafe { &(*managed.0).dl_tensor };
    let ndim = usize::try_from(t.ndim).unwrap_or(0);
    // SAFETY: DLPack guarantees `shape` (and `strides` when non-null) hold `ndim` entries.
    let shape: Vec<usize> = (0..ndim)
        .map(|i| unsafe { *t.shape.add(i) } as usize)
        .collect();
    let dtype = match (t.dtype.code, t.dtype.bits, t.dtype.lanes) {
        (KDL_FLOAT, 32, 1) => DType::F32,
        (KDL_FLOAT, 64, 1) => DType::F64,
        _ => {
            return Err(to_py(Error::dtype(
                op,
                format!(
                    "input of shape {shape:?} has unsupported dtype {}; ai3 computes in float32 and float64",
                    dtype_name(t.dtype)
                ),
            )))
        }
    };
    let device = match t.device.device_type {
        KDL_CPU => Device::Cpu,
        KDL_CUDA => Device::Cuda(t.device.device_id),
        other => {
            return Err(to_py(Error::device(
                op,
                format!("DLPack device type {other} is not supported"),
            )))
        }
    };
    let strides: Vec<isize> = if t.strides.is_null() {
        contiguous_strides(&shape)
    } else {
        (0..ndim)
            .map(|i| unsafe { *t.strides.add(i) } as isize)
            .collect()
    };
    // SAFETY: byte_offset is within the producer's allocation by contract.
    let data = unsafe { (t.data as *mut u8).add(t.byte_offset as usize) };
    // SAFETY: the producer's memory stays valid while `managed` lives inside the tensor.
    unsafe { Tensor::from_raw_parts(data, dtype, shape, strides, device, Box::new(managed)) }
        .map_err(to_py)
}

struct ExportCtx {
    _tensor: Tensor,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

unsafe extern "C" fn delete_export(managed: *mut DLManagedTensor) {
    // SAFETY: both boxes were leaked by `export` and are freed exactly once here.
    unsafe {
        drop(Box::from_raw((*managed).manager_ctx as *mut ExportCtx));
        drop(Box::from_raw(managed));
    }
}

unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: only a capsule nobody consumed still carries the "dltensor" name.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, DLTENSOR.as_ptr()) == 1 {
            let ptr = ffi::PyCapsule_GetPointer(capsule, DLTENSOR.as_ptr()) as *mut DLManagedTensor;
            if !ptr.is_null() {
                delete_export(ptr);
            }
        } else {
            // Consumed: the consumer owns the tensor now. Clear any error IsValid set.
            ffi::PyErr_Clear();
        }
    }
}

/// Exports a tensor as a `"dltensor"` capsule; `torch.from_dlpack` takes it without a copy.
pub fn export<'py>(py: Python<'py>, mut tensor: Tensor) -> PyResult<Bound<'py, PyAny>> {
    let code_bits = match tensor.dtype() {
        DType::F32 => 32,
        DType::F64 => 64,
    };
    let device = match tensor.device() {
        Device::Cpu => DLDevice {
            device_type: KDL_CPU,
            device_id: 0,
        },
        Device::Cuda(i) => DLDevice {
            device_type: KDL_CUDA,
            device_id: i,
        },
    };
    let data = tensor.data_ptr_mut() as *mut c_void;
    let mut ctx = Box::new(ExportCtx {
        shape: tensor.shape().iter().map(|&d| d as i64).collect(),
        strides: tensor.strides().iter().map(|&s| s as i64).collect(),
        _tensor: tensor,
    });
    let managed = Box::new(DLManagedTensor {
        dl_tensor: DLTensor {
            data,
            device,
            ndim: ctx.shape.len() as i32,
            dtype: DLDataType {
                code: KDL_FLOAT,
                bits: code_bits,
                lanes: 1,
            },
            shape: ctx.shape.as_mut_ptr(),
            strides: ctx.strides.as_mut_ptr(),
            byte_offset: 0,
        },
        manager_ctx: std::ptr::null_mut(),
        deleter: Some(delete_export),
    });
    let managed = Box::into_raw(managed);
    // SAFETY: `managed` is a fresh allocation; the ctx box moves into it.
    unsafe {
        (*managed).manager_ctx = Box::into_raw(ctx) as *mut c_void;
        let capsule = ffi::PyCapsule_New(
            managed as *mut c_void,
            DLTENSOR.as_ptr(),
            Some(capsule_destructor),
        );
        if capsule.is_null() {
            delete_export(managed);
            return Err(PyErr::fetch(py));
        }
        Ok(Bound::from_owned_ptr(py, capsule))
    }
}
