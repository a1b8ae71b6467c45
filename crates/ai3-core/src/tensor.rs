//! The tensor type: dtype, shape, strides, device and storage that is either
//! owned (64-byte aligned) or borrowed from another framework without a copy.

use std::any::Any;
use std::fmt;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};

use ai3_kernels::alloc::{try_zeroed_vec, KernelError, Zeroable};

use crate::buffers::{Buffer, Pool};
use crate::dtype::{DType, Device, Element};
use crate::error::{Error, Result};

/// Alignment of owned buffers, a cache line and one AVX-512 register.
pub const ALIGNMENT: usize = 64;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Block([u8; ALIGNMENT]);

// SAFETY: a plain array of bytes; zero bytes are a valid value.
unsafe impl Zeroable for Block {}

/// Freed owned buffers, for the next (see [`crate::buffers`]).
static BUFFERS: Pool<Block> = Pool::new();

/// Whether [`Tensor::unfilled`] fills its memory with NaN.
static POISON_UNFILLED: AtomicBool = AtomicBool::new(cfg!(debug_assertions));

/// From now on, [`Tensor::unfilled`] fills what it allocates with NaN (every
/// byte 0xFF) when `on`, else leaves it as the allocator gave it. For test
/// suites: outputs and arenas are unfilled, so with this on, any element a
/// kernel leaves unwritten shows as NaN in a comparison. On by default in
/// debug builds; the Python test suite turns it on in release builds too.
pub fn poison_unfilled(on: bool) {
    POISON_UNFILLED.store(on, Ordering::Relaxed);
}

/// Memory behind a tensor.
enum Storage {
    /// A buffer ai3 allocated, 64-byte aligned: zeroed, or written whole by
    /// the kernel it was made for (see [`Tensor::unfilled`]); kept for reuse
    /// when dropped.
    Owned(Buffer<Block>),
    /// Memory owned by someone else (a DLPack producer such as torch), kept
    /// alive by `owner` until this storage is dropped.
    Borrowed {
        /// First byte of the tensor's data (after any byte offset).
        ptr: *mut u8,
        /// Bytes reachable from `ptr` that the tensor may touch.
        len: usize,
        /// Dropping it releases the producer's memory; never read.
        #[allow(dead_code)]
        owner: Box<dyn Any + Send + Sync>,
    },
}

// SAFETY: owned storage is a plain Vec; borrowed storage is a pointer the
// producer handed over with the promise (DLPack's contract) that it stays
// valid until `owner` is dropped, and every mutable access goes through
// `&mut Tensor`, so Rust's aliasing rules still hold for ai3's own accesses.
unsafe impl Send for Storage {}
unsafe impl Sync for Storage {}

impl Storage {
    /// Zeroed, 64-byte aligned memory of at least `bytes`, or the
    /// allocator's refusal.
    fn owned_zeroed(bytes: usize) -> std::result::Result<Self, KernelError> {
        // Fresh memory, zero already: a kept buffer would need a pass to zero.
        let zeroed = |len: usize| {
            let blocks: Vec<Block> = try_zeroed_vec(len, "tensor")?;
            let mut blocks = std::mem::ManuallyDrop::new(blocks);
            let (ptr, len, cap) = (blocks.as_mut_ptr(), blocks.len(), blocks.capacity());
            // SAFETY: the same allocation, as values of a type with the same layout.
            Ok(unsafe { Vec::from_raw_parts(ptr.cast::<MaybeUninit<Block>>(), len, cap) })
        };
        Ok(Storage::Owned(
            BUFFERS.fresh(bytes.div_ceil(ALIGNMENT), zeroed)?,
        ))
    }

    /// 64-byte aligned memory of at least `bytes`, not zeroed: its contents
    /// are whatever the allocator had there, or every byte 0xFF (a NaN in f32
    /// and f64) while [`poison_unfilled`] is on.
    fn owned_unfilled(bytes: usize) -> std::result::Result<Self, KernelError> {
        let fresh = |blocks: usize| {
            let mut v = Vec::new();
            v.try_reserve_exact(blocks)
                .map_err(|_| KernelError::Alloc {
                    what: "tensor",
                    bytes: blocks.saturating_mul(ALIGNMENT),
                })?;
            // SAFETY: MaybeUninit needs no initialisation; the capacity was reserved.
            unsafe { v.set_len(blocks) };
            Ok(v)
        };
        let mut buffer = BUFFERS.take(bytes.div_ceil(ALIGNMENT), fresh)?;
        if POISON_UNFILLED.load(Ordering::Relaxed) {
            buffer
                .as_mut_slice()
                .fill(MaybeUninit::new(Block([0xFF; ALIGNMENT])));
        }
        Ok(Storage::Owned(buffer))
    }

    fn as_ptr(&self) -> *const u8 {
        match self {
            Storage::Owned(v) => v.as_slice().as_ptr() as *const u8,
            Storage::Borrowed { ptr, .. } => *ptr,
        }
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            Storage::Owned(v) => v.as_mut_slice().as_mut_ptr() as *mut u8,
            Storage::Borrowed { ptr, .. } => *ptr,
        }
    }

    fn len(&self) -> usize {
        match self {
            Storage::Owned(v) => v.as_slice().len() * ALIGNMENT,
            Storage::Borrowed { len, .. } => *len,
        }
    }
}

/// An n-dimensional array of f32 or f64.
///
/// Strides are in elements, as in PyTorch. Kernels need contiguous row-major
/// data; [`Tensor::to_contiguous`] gives an owned contiguous copy (the
/// executor makes one only for inputs that are not contiguous already).
pub struct Tensor {
    dtype: DType,
    shape: Vec<usize>,
    strides: Vec<isize>,
    device: Device,
    storage: Storage,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .field("device", &self.device)
            .field("borrowed", &self.is_borrowed())
            .finish()
    }
}

/// Row-major strides of `shape`, in elements. They saturate rather than
/// overflow, which only a shape with an empty dimension and a huge product
/// of the others can reach, and such a tensor has no element to address.
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut strides = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(isize::try_from(d.max(1)).unwrap_or(isize::MAX));
    }
    strides
}

/// The number of elements of `shape`, or `None` when it overflows `usize`.
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// Bytes of a contiguous `dtype` tensor of `shape`, or a [`Error::Shape`]
/// (naming `op`) when that overflows what one allocation may hold.
pub fn checked_bytes(op: &str, dtype: DType, shape: &[usize]) -> Result<usize> {
    checked_numel(shape)
        .and_then(|n| n.checked_mul(dtype.size()))
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| {
            Error::shape(
                op,
                format!(
                    "a {dtype} tensor of shape {} needs more bytes than a 64-bit size can count",
                    shape_str(shape)
                ),
            )
        })
}

/// Formats a shape the way PyTorch prints it: `[2, 3, 4]`.
pub fn shape_str(shape: &[usize]) -> String {
    format!("{shape:?}")
}

impl Tensor {
    /// A new owned, zero-filled, contiguous tensor on the CPU.
    ///
    /// A size that overflows is an [`Error::Shape`], memory the system
    /// refuses an [`Error::OutOfMemory`] naming the bytes; both name the
    /// operation `"tensor"` (callers that know which operation allocates
    /// relabel it with [`Error::with_op`]). Never aborts.
    ///
    /// ```
    /// use ai3_core::{DType, Error, Tensor};
    /// assert_eq!(Tensor::zeros(DType::F32, &[2, 3]).unwrap().numel(), 6);
    /// let huge = Tensor::zeros(DType::F32, &[1 << 20, 1 << 20, 1 << 10]);
    /// assert!(matches!(huge, Err(Error::OutOfMemory { .. })), "4 PB");
    /// let overflow = Tensor::zeros(DType::F32, &[1 << 31, 1 << 31]);
    /// assert!(matches!(overflow, Err(Error::Shape { .. })), "2^64 bytes");
    /// ```
    pub fn zeros(dtype: DType, shape: &[usize]) -> Result<Self> {
        Self::owned(dtype, shape, Storage::owned_zeroed)
    }

    /// A new owned CPU tensor for a kernel to write whole, not zeroed
    /// (zeroing a layer's output that its kernel then overwrites costs as
    /// much as a pass of a cheap layer). Its elements are unspecified until
    /// written: only for outputs that every kernel writes in full, the
    /// contract the graph's reused arena already relies on. Debug builds fill
    /// it with NaN (see [`poison_unfilled`]), so a test catches an element
    /// left unwritten.
    pub fn unfilled(dtype: DType, shape: &[usize]) -> Result<Self> {
        Self::owned(dtype, shape, Storage::owned_unfilled)
    }

    /// A new owned contiguous CPU tensor whose storage `alloc` makes.
    fn owned(
        dtype: DType,
        shape: &[usize],
        alloc: fn(usize) -> std::result::Result<Storage, KernelError>,
    ) -> Result<Self> {
        let bytes = checked_bytes("tensor", dtype, shape)?;
        let storage = alloc(bytes).map_err(|e| Self::alloc_error(dtype, shape, e))?;
        Ok(Tensor {
            dtype,
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            device: Device::Cpu,
            storage,
        })
    }

    fn alloc_error(dtype: DType, shape: &[usize], e: KernelError) -> Error {
        match e {
            KernelError::Alloc { bytes, .. } => Error::out_of_memory(
                "tensor",
                &format!("a {dtype} tensor of shape {}", shape_str(shape)),
                bytes,
                "",
            ),
            other => Error::from_kernel("tensor", &format!("shape {}", shape_str(shape)), other),
        }
    }

    /// A new owned CPU tensor holding a copy of `data`.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize]) -> Result<Self> {
        if checked_numel(shape) != Some(data.len()) {
            return Err(Error::shape(
                "tensor",
                format!(
                    "{} elements do not fill shape {}",
                    data.len(),
                    shape_str(shape)
                ),
            ));
        }
        let mut t = Tensor::zeros(T::DTYPE, shape)?;
        t.as_mut_slice::<T>()?.copy_from_slice(data);
        Ok(t)
    }

    /// Wraps memory owned by another framework without copying it.
    ///
    /// # Safety
    /// `ptr` must point to memory of `dtype` elements that is valid for reads
    /// and writes at every offset `sum(index[i] * strides[i])` for indices
    /// within `shape`, on `device`, for as long as `owner` is alive, and no one
    /// else may write it while this tensor is in use.
    pub unsafe fn from_raw_parts(
        ptr: *mut u8,
        dtype: DType,
        shape: Vec<usize>,
        strides: Vec<isize>,
        device: Device,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Result<Self> {
        if shape.len() != strides.len() {
            return Err(Error::internal(
                "tensor",
                format!(
                    "shape {} and strides {strides:?} differ in rank",
                    shape_str(&shape)
                ),
            ));
        }
        if strides.iter().any(|&s| s < 0) {
            return Err(Error::invalid(
                "tensor",
                format!("negative strides {strides:?} are not supported"),
            ));
        }
        // A producer may describe more elements than memory can hold (a
        // broadcast view with stride 0): their count and span must still fit.
        let overflow = || {
            Error::shape(
                "tensor",
                format!(
                    "shape {} with strides {strides:?} has more elements than a 64-bit size can count",
                    shape_str(&shape)
                ),
            )
        };
        let numel = checked_numel(&shape).ok_or_else(overflow)?;
        let span = if numel == 0 {
            0
        } else {
            shape
                .iter()
                .zip(&strides)
                .try_fold(1usize, |acc, (&d, &s)| {
                    (d - 1).checked_mul(s as usize)?.checked_add(acc)
                })
                .ok_or_else(overflow)?
        };
        let len = span.checked_mul(dtype.size()).ok_or_else(overflow)?;
        Ok(Tensor {
            dtype,
            shape,
            strides,
            device,
            storage: Storage::Borrowed { ptr, len, owner },
        })
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// Strides in elements.
    pub fn strides(&self) -> &[isize] {
        &self.strides
    }
    /// Device.
    pub fn device(&self) -> Device {
        self.device
    }
    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// Whether the memory belongs to another framework.
    pub fn is_borrowed(&self) -> bool {
        matches!(self.storage, Storage::Borrowed { .. })
    }
    /// Address of the first element (what DLPack and `data_ptr()` report).
    pub fn data_ptr(&self) -> *const u8 {
        self.storage.as_ptr()
    }
    /// Mutable address of the first element.
    pub fn data_ptr_mut(&mut self) -> *mut u8 {
        self.storage.as_mut_ptr()
    }

    /// Whether elements are laid out row-major without gaps. Dimensions of
    /// size 1 may have any stride, as in PyTorch.
    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        let mut expected = 1isize;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d as isize;
        }
        true
    }

    /// Whether a 4-D tensor's elements are laid out channels last (NHWC,
    /// PyTorch's `torch.channels_last`) without gaps: strides `(h * w * c,
    /// 1, w * c, c)`, dimensions of size 1 with any stride. A tensor may be
    /// both this and contiguous (one channel, or a 1x1 plane).
    pub fn is_channels_last(&self) -> bool {
        if self.rank() != 4 {
            return false;
        }
        let mut expected = 1isize;
        for d in [1, 3, 2, 0] {
            let (n, s) = (self.shape[d], self.strides[d]);
            if n != 1 && s != expected {
                return false;
            }
            expected *= n as isize;
        }
        true
    }

    /// The same data with its dimensions reordered: dimension `i` of the
    /// result is dimension `order[i]` of `self` (a view, as PyTorch's
    /// `permute`; no element moves). An `order` that is not a permutation of
    /// the dimensions is an internal error.
    pub fn permuted(self, order: &[usize]) -> Result<Self> {
        let mut seen = vec![false; self.rank()];
        let valid = order.len() == self.rank()
            && order
                .iter()
                .all(|&d| d < seen.len() && !std::mem::replace(&mut seen[d], true));
        if !valid {
            return Err(Error::internal(
                "tensor",
                format!(
                    "{order:?} does not reorder the dimensions of shape {}",
                    shape_str(&self.shape)
                ),
            ));
        }
        Ok(Tensor {
            shape: order.iter().map(|&d| self.shape[d]).collect(),
            strides: order.iter().map(|&d| self.strides[d]).collect(),
            ..self
        })
    }

    fn check_typed<T: Element>(&self) -> Result<()> {
        if self.dtype != T::DTYPE {
            return Err(Error::internal(
                "tensor",
                format!("read as {} but holds {}", T::DTYPE, self.dtype),
            ));
        }
        if !self.is_contiguous() {
            return Err(Error::internal(
                "tensor",
                "slice view of a non-contiguous tensor",
            ));
        }
        if self.device != Device::Cpu {
            return Err(Error::device(
                "tensor",
                format!("host view of a tensor on {}", self.device),
            ));
        }
        if self.numel() * T::DTYPE.size() > self.storage.len() {
            return Err(Error::internal("tensor", "storage smaller than the shape"));
        }
        Ok(())
    }

    /// The elements as a slice (contiguous CPU tensors of dtype `T` only).
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        self.check_typed::<T>()?;
        let n = self.numel();
        if n == 0 {
            return Ok(&[]);
        }
        // SAFETY: checked dtype, contiguity and length above; the storage
        // (owned, or borrowed under `from_raw_parts`' contract) lives as long as `self`.
        Ok(unsafe { std::slice::from_raw_parts(self.storage.as_ptr() as *const T, n) })
    }

    /// The elements as a mutable slice (contiguous CPU tensors of dtype `T` only).
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        self.check_typed::<T>()?;
        let n = self.numel();
        if n == 0 {
            return Ok(&mut []);
        }
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.storage.as_mut_ptr() as *mut T, n) })
    }

    /// The same data under another shape with as many elements (contiguous tensors only).
    pub fn reshape(self, shape: &[usize]) -> Result<Self> {
        if checked_numel(shape) != Some(self.numel()) {
            return Err(Error::shape(
                "reshape",
                format!(
                    "cannot view {} as {}",
                    shape_str(&self.shape),
                    shape_str(shape)
                ),
            ));
        }
        if !self.is_contiguous() {
            return self.to_contiguous()?.reshape(shape);
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            ..self
        })
    }

    /// An owned contiguous copy of a CPU tensor, following its strides.
    pub fn to_contiguous(&self) -> Result<Tensor> {
        match self.dtype {
            DType::F32 => self.gather::<f32>(),
            DType::F64 => self.gather::<f64>(),
        }
    }

    /// Converts to `dtype`, copying; returns an owned contiguous tensor.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        let src = if self.is_contiguous() {
            None
        } else {
            Some(self.to_contiguous()?)
        };
        let src = src.as_ref().unwrap_or(self);
        let mut out = Tensor::zeros(dtype, &self.shape)?;
        match (src.dtype, dtype) {
            (DType::F32, DType::F32) => out.as_mut_slice()?.copy_from_slice(src.as_slice::<f32>()?),
            (DType::F64, DType::F64) => out.as_mut_slice()?.copy_from_slice(src.as_slice::<f64>()?),
            (DType::F32, DType::F64) => {
                for (o, &i) in out
                    .as_mut_slice::<f64>()?
                    .iter_mut()
                    .zip(src.as_slice::<f32>()?)
                {
                    *o = i as f64;
                }
            }
            (DType::F64, DType::F32) => {
                for (o, &i) in out
                    .as_mut_slice::<f32>()?
                    .iter_mut()
                    .zip(src.as_slice::<f64>()?)
                {
                    *o = i as f32;
                }
            }
        }
        Ok(out)
    }

    fn gather<T: Element>(&self) -> Result<Tensor> {
        if self.device != Device::Cpu {
            return Err(Error::device(
                "tensor",
                format!("cannot copy a tensor on {} on the host", self.device),
            ));
        }
        let mut out = Tensor::zeros(self.dtype, &self.shape)?;
        let numel = self.numel();
        if numel == 0 {
            return Ok(out);
        }
        let base = self.storage.as_ptr() as *const T;
        let dst = out.as_mut_slice::<T>()?;
        let rank = self.shape.len();
        let mut index = vec![0usize; rank];
        let mut offset = 0isize;
        for d in dst.iter_mut() {
            // SAFETY: `offset` is a valid index by `from_raw_parts`' contract.
            *d = unsafe { *base.offset(offset) };
            for ax in (0..rank).rev() {
                index[ax] += 1;
                offset += self.strides[ax];
                if index[ax] < self.shape[ax] {
                    break;
                }
                offset -= self.strides[ax] * self.shape[ax] as isize;
                index[ax] = 0;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unfilled_tensors_are_aligned_and_poisoned_in_debug_builds() {
        for (dtype, shape) in [
            (DType::F32, vec![3usize, 5]),
            (DType::F64, vec![7]),
            (DType::F32, vec![0, 4]),
        ] {
            let t = Tensor::unfilled(dtype, &shape).unwrap();
            assert_eq!(t.shape(), &shape[..]);
            assert!(t.is_contiguous());
            assert_eq!(t.data_ptr() as usize % ALIGNMENT, 0);
            if POISON_UNFILLED.load(Ordering::Relaxed) {
                match dtype {
                    DType::F32 => assert!(t.as_slice::<f32>().unwrap().iter().all(|v| v.is_nan())),
                    _ => assert!(t.as_slice::<f64>().unwrap().iter().all(|v| v.is_nan())),
                }
            }
        }
        let huge = Tensor::unfilled(DType::F32, &[1 << 20, 1 << 20, 1 << 10]);
        assert!(matches!(huge, Err(Error::OutOfMemory { .. })), "4 PB");
    }

    #[test]
    fn owned_buffers_are_aligned_and_zeroed() {
        let t = Tensor::zeros(DType::F32, &[3, 5]).unwrap();
        assert_eq!(t.data_ptr() as usize % ALIGNMENT, 0);
        assert!(t.as_slice::<f32>().unwrap().iter().all(|&v| v == 0.0));
        assert!(t.is_contiguous());
    }

    #[test]
    fn a_permuted_nhwc_tensor_is_channels_last_and_gathers_as_nchw() {
        // [n, h, w, c] = [1, 2, 3, 2], element value = its NHWC offset.
        let data: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let nhwc = Tensor::from_slice(&data, &[1, 2, 3, 2]).unwrap();
        assert!(
            !nhwc.is_channels_last(),
            "NHWC read as NCHW has c = 2 at stride 6"
        );
        let t = nhwc.permuted(&[0, 3, 1, 2]).unwrap();
        assert_eq!(t.shape(), &[1, 2, 2, 3]);
        assert_eq!(t.strides(), &[12, 1, 6, 2]);
        assert!(t.is_channels_last() && !t.is_contiguous());
        let c = t.to_contiguous().unwrap();
        // Channel 0 holds the even offsets, channel 1 the odd ones.
        let want: Vec<f32> = (0..6)
            .map(|q| 2.0 * q as f32)
            .chain((0..6).map(|q| 2.0 * q as f32 + 1.0))
            .collect();
        assert_eq!(c.as_slice::<f32>().unwrap(), &want[..]);
        // One channel: both layouts at once.
        let one = Tensor::zeros(DType::F32, &[2, 1, 3, 3]).unwrap();
        assert!(one.is_channels_last() && one.is_contiguous());
        assert!(!Tensor::zeros(DType::F32, &[2, 3])
            .unwrap()
            .is_channels_last());
        for bad in [&[0, 1, 2][..], &[0, 1, 2, 2], &[0, 1, 2, 4]] {
            let t = Tensor::zeros(DType::F32, &[1, 2, 3, 4]).unwrap();
            assert!(
                matches!(t.permuted(bad), Err(Error::Internal { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn strided_borrow_is_gathered_in_logical_order() {
        // A 2x3 row-major buffer viewed transposed as 3x2.
        let mut data: Vec<f64> = (0..6).map(|v| v as f64).collect();
        let ptr = data.as_mut_ptr() as *mut u8;
        let t = unsafe {
            Tensor::from_raw_parts(
                ptr,
                DType::F64,
                vec![3, 2],
                vec![1, 3],
                Device::Cpu,
                Box::new(()),
            )
        }
        .unwrap();
        assert!(!t.is_contiguous());
        let c = t.to_contiguous().unwrap();
        assert_eq!(
            c.as_slice::<f64>().unwrap(),
            &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
        );
    }

    #[test]
    fn wrong_dtype_view_is_an_error_not_a_panic() {
        let t = Tensor::zeros(DType::F64, &[2]).unwrap();
        assert!(t.as_slice::<f32>().is_err());
    }

    #[test]
    fn reshape_checks_element_count() {
        let t = Tensor::zeros(DType::F32, &[2, 3]).unwrap();
        assert!(t.reshape(&[5]).is_err());
        // (2^63 + 3) * 2 wraps around to 6.
        let t = Tensor::zeros(DType::F32, &[2, 3]).unwrap();
        assert!(t.reshape(&[(1 << 63) + 3, 2]).is_err());
        let t = Tensor::zeros(DType::F32, &[2, 3]).unwrap();
        assert_eq!(t.reshape(&[6]).unwrap().shape(), &[6]);
    }

    #[test]
    fn sizes_that_do_not_fit_are_errors_not_aborts() {
        // 2^42 f32 = 16 TB: far beyond any test machine's memory and swap.
        let err = Tensor::zeros(DType::F32, &[1 << 21, 1 << 21]).unwrap_err();
        assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("17.6 TB (17592186044416 bytes)") && msg.contains("[2097152, 2097152]"),
            "{msg}"
        );
        let err = Tensor::zeros(DType::F64, &[1 << 31, 1 << 30]).unwrap_err();
        assert!(matches!(err, Error::Shape { .. }), "{err}");
        // An empty tensor whose other dimensions multiply past usize is fine.
        let t = Tensor::zeros(DType::F32, &[0, 1 << 40, 1 << 40]).unwrap();
        assert_eq!(t.numel(), 0);
    }

    #[test]
    fn a_borrowed_view_whose_span_overflows_is_rejected() {
        let mut data = [0f32; 1];
        let ptr = data.as_mut_ptr() as *mut u8;
        let view = |shape: Vec<usize>, strides: Vec<isize>| unsafe {
            Tensor::from_raw_parts(ptr, DType::F32, shape, strides, Device::Cpu, Box::new(()))
        };
        assert!(view(vec![1 << 40, 1 << 40], vec![0, 0]).is_err());
        assert!(view(vec![1 << 40, 2], vec![0, 1 << 62]).is_err());
        // A broadcast view of one element is fine.
        assert_eq!(view(vec![1 << 20, 8], vec![0, 0]).unwrap().numel(), 8 << 20);
    }
}
