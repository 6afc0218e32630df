//! Kernel launches: every kernel of `kernels/*.cu` goes through [`Launch`], which launches it as a
//! programmatic dependent launch where the GPU has them (sm_90 and later).
//!
//! Why: a decode step is a few hundred short kernels, and between two of them the GPU idles while
//! the second is scheduled (~1 µs, even inside a CUDA graph: docs/benchmarks-cuda.md, "Session
//! 29"). A dependent launch lets the next kernel's blocks be scheduled while the last blocks of
//! the one ahead still run; they wait at their first statement, `dl_grid_begin` in
//! `kernels/common.cuh`, until that grid has finished and its writes are visible. So a kernel sees
//! exactly the memory it would see launched after the one ahead, and its bits are the same;
//! `tools/check_kernels.py` fails any kernel that touches memory before that wait, which is what
//! makes the attribute safe on every launch. On by default since session 31's GPU run (bit for bit
//! with launches one after the other, 1–2 % off the batch-1 decode step: docs/cuda.md, "Dependent
//! launches"); `DRAFTLENS_DEPENDENT_LAUNCH=off` launches one kernel after the other.
//!
//! The builder mirrors cudarc's `LaunchArgs` (`arg`, then `launch`), which has no launch
//! attributes: it calls `cuLaunchKernelEx` itself.

use cudarc::driver::{
    sys, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut,
    DriverError, LaunchConfig,
};
use std::ffi::c_void;
use std::sync::atomic::Ordering;

use super::CudaBackend;

/// The environment variable that turns dependent launches off (`off`).
pub const DEPENDENT_LAUNCH_ENV: &str = "DRAFTLENS_DEPENDENT_LAUNCH";

/// Whether launches on a device of `compute_capability` are dependent launches: sm_90 and later,
/// unless [`DEPENDENT_LAUNCH_ENV`] is `off`.
pub(super) fn dependent_launches(compute_capability: (i32, i32)) -> bool {
    compute_capability.0 >= 9
        && !std::env::var(DEPENDENT_LAUNCH_ENV).is_ok_and(|v| v.trim() == "off")
}

/// The most parameters a kernel of `kernels/*.cu` takes (`moe_plan_one_block`: 15), with room.
const MAX_PARAMS: usize = 24;

/// One kernel launch being assembled: its arguments in the kernel's parameter order, in arrays
/// on the stack (no allocation per launch: a decode step launches hundreds).
pub(super) struct Launch<'a> {
    stream: &'a CudaStream,
    func: &'a CudaFunction,
    dependent: bool,
    /// Where each parameter's value is, as `cuLaunchKernelEx` takes them: the caller's variable
    /// for a scalar; null for a buffer, whose address is in `addresses` at the same index (a value
    /// computed here, not a field we can borrow) and is pointed to at the launch.
    params: [*mut c_void; MAX_PARAMS],
    addresses: [u64; MAX_PARAMS],
    count: usize,
}

/// A value passed to a kernel by copy: plain numbers and the `#[repr(C)]` parameter structs of
/// the kernels. Implemented only for types whose layout matches their C counterpart.
///
/// # Safety
/// The type's bytes must be what the kernel's parameter of that type expects.
pub(super) unsafe trait KernelValue {}

macro_rules! kernel_values {
    ($($t:ty),*) => { $(unsafe impl KernelValue for $t {})* };
}
kernel_values!(i8, u8, i16, u16, i32, u32, i64, u64, f32, f64, usize, isize);

/// Something [`Launch::arg`] accepts: a scalar by reference, or a device buffer (its address).
pub(super) trait KernelArg<'a> {
    fn push(self, launch: &mut Launch<'a>);
}

impl<'a, T: KernelValue> KernelArg<'a> for &'a T {
    fn push(self, launch: &mut Launch<'a>) {
        launch.push(self as *const T as *mut c_void, 0);
    }
}

impl<'a, T> KernelArg<'a> for &'a CudaSlice<T> {
    fn push(self, launch: &mut Launch<'a>) {
        let (address, _sync) = self.device_ptr(launch.stream);
        launch.push_address(address);
    }
}

impl<'a, T> KernelArg<'a> for &'a mut CudaSlice<T> {
    fn push(self, launch: &mut Launch<'a>) {
        let (address, _sync) = self.device_ptr_mut(launch.stream);
        launch.push_address(address);
    }
}

impl<'a, T> KernelArg<'a> for &'a CudaView<'_, T> {
    fn push(self, launch: &mut Launch<'a>) {
        let (address, _sync) = self.device_ptr(launch.stream);
        launch.push_address(address);
    }
}

impl<'a, T> KernelArg<'a> for &'a mut CudaViewMut<'_, T> {
    fn push(self, launch: &mut Launch<'a>) {
        let (address, _sync) = self.device_ptr_mut(launch.stream);
        launch.push_address(address);
    }
}

impl<'a> Launch<'a> {
    pub(super) fn new(stream: &'a CudaStream, func: &'a CudaFunction, dependent: bool) -> Self {
        Launch {
            stream,
            func,
            dependent,
            params: [std::ptr::null_mut(); MAX_PARAMS],
            addresses: [0; MAX_PARAMS],
            count: 0,
        }
    }

    /// Appends the kernel's next parameter.
    pub(super) fn arg(&mut self, value: impl KernelArg<'a>) -> &mut Self {
        value.push(self);
        self
    }

    fn push_address(&mut self, address: u64) {
        self.push(std::ptr::null_mut(), address);
    }

    /// Appends a parameter (counted past `MAX_PARAMS` too, so that the launch refuses it).
    fn push(&mut self, value: *mut c_void, address: u64) {
        if let Some(slot) = self.params.get_mut(self.count) {
            *slot = value;
            self.addresses[self.count] = address;
        }
        self.count += 1;
    }

    /// Launches the kernel on the stream.
    ///
    /// # Safety
    /// The arguments must be the kernel's parameters, in order and of its types, and every buffer
    /// must hold what the kernel reads and writes at this configuration.
    pub(super) unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<(), DriverError> {
        if self.count > MAX_PARAMS {
            return Err(DriverError(sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE));
        }
        self.stream.context().bind_to_thread()?;
        // A buffer's parameter points at its address, in `self`, which stays put until the call.
        for (param, address) in self.params.iter_mut().zip(&mut self.addresses) {
            if param.is_null() {
                *param = address as *mut u64 as *mut c_void;
            }
        }
        // SAFETY: an all-zero attribute is a valid value of the C struct; both fields are set next.
        let mut attribute: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attribute.id =
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attribute.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: if self.dependent {
                &mut attribute
            } else {
                std::ptr::null_mut()
            },
            numAttrs: self.dependent as u32,
        };
        // SAFETY: the configuration and parameter pointers outlive the call; the caller vouches
        // for the parameters (above).
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                self.func.cu_function(),
                self.params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
    }
}

impl CudaBackend {
    /// A launch of `func` on the backend's stream.
    pub(super) fn launch_builder<'a>(&'a self, func: &'a CudaFunction) -> Launch<'a> {
        Launch::new(
            &self.stream,
            func,
            self.dependent_launch.load(Ordering::Relaxed),
        )
    }

    /// Turns dependent launches on or off (tests and benchmarks compare both); on is refused on a
    /// GPU without them (before sm_90), where launches stay one after the other.
    pub fn set_dependent_launches(&self, on: bool) {
        let on = on && self.info.compute_capability.0 >= 9;
        self.dependent_launch.store(on, Ordering::Relaxed);
    }

    /// Whether kernels are launched as dependent launches.
    pub fn dependent_launches(&self) -> bool {
        self.dependent_launch.load(Ordering::Relaxed)
    }
}
