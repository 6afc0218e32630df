//! GPU utilisation from NVML (`libnvidia-ml.so.1`, installed with the driver), for the run
//! timeline (`crate::timeline`). Loaded at run time like the rest of CUDA: a machine without it
//! simply has no utilisation figure.
//!
//! The NVML device is found by the CUDA device's PCI bus id, because CUDA ordinals and NVML indices
//! differ under `CUDA_VISIBLE_DEVICES`.

use anyhow::{anyhow, Result};
use std::ffi::{c_char, c_int, c_uint, c_void, CString};

type NvmlDevice = *mut c_void;

/// `nvmlUtilization_t`: percentages over NVML's last sample period.
#[repr(C)]
#[derive(Default)]
struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

type InitFn = unsafe extern "C" fn() -> c_int;
type ByPciFn = unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> c_int;
type UtilFn = unsafe extern "C" fn(NvmlDevice, *mut Utilization) -> c_int;
/// `nvmlDeviceGetClockInfo(device, type, *mhz)` and `nvmlDeviceGetMaxClockInfo` (same signature).
type ClockFn = unsafe extern "C" fn(NvmlDevice, c_uint, *mut c_uint) -> c_int;
/// `nvmlDeviceGetPowerUsage(device, *milliwatts)` and `nvmlDeviceGetEnforcedPowerLimit`.
type PowerFn = unsafe extern "C" fn(NvmlDevice, *mut c_uint) -> c_int;
/// `NVML_CLOCK_SM`.
const CLOCK_SM: c_uint = 1;

/// An open NVML device handle.
pub struct Nvml {
    _lib: libloading::Library,
    device: NvmlDevice,
    utilization: UtilFn,
    /// Clock and power queries (benchmarks only; absent from old drivers).
    clock: Option<(ClockFn, ClockFn)>,
    power: Option<(PowerFn, PowerFn)>,
}

// SAFETY: NVML is thread-safe (documented: "all NVML functions are thread-safe"); the handle is
// an opaque pointer NVML owns for the life of the library, which `Nvml` keeps loaded.
unsafe impl Send for Nvml {}

impl Nvml {
    /// Opens the NVML device of the GPU at PCI bus id `pci_bus_id` (as CUDA prints it,
    /// `0000:19:00.0`).
    pub fn open(pci_bus_id: &str) -> Result<Nvml> {
        // SAFETY: loading the driver's NVML library runs its initialisers, which have no
        // preconditions.
        let lib = unsafe { libloading::Library::new("libnvidia-ml.so.1") }
            .map_err(|e| anyhow!("libnvidia-ml.so.1: {e}"))?;
        // SAFETY: the symbol types are NVML's documented C signatures.
        let (init, by_pci, utilization) = unsafe {
            let init: InitFn = *lib
                .get::<InitFn>(b"nvmlInit_v2\0")
                .map_err(|e| anyhow!("nvmlInit_v2: {e}"))?;
            let by_pci: ByPciFn = *lib
                .get::<ByPciFn>(b"nvmlDeviceGetHandleByPciBusId_v2\0")
                .map_err(|e| anyhow!("nvmlDeviceGetHandleByPciBusId_v2: {e}"))?;
            let util: UtilFn = *lib
                .get::<UtilFn>(b"nvmlDeviceGetUtilizationRates\0")
                .map_err(|e| anyhow!("nvmlDeviceGetUtilizationRates: {e}"))?;
            (init, by_pci, util)
        };
        // SAFETY: as above; optional symbols.
        let (clock, power) = unsafe {
            let f = |name: &[u8]| lib.get::<ClockFn>(name).ok().map(|s| *s);
            let g = |name: &[u8]| lib.get::<PowerFn>(name).ok().map(|s| *s);
            (
                f(b"nvmlDeviceGetClockInfo\0").zip(f(b"nvmlDeviceGetMaxClockInfo\0")),
                g(b"nvmlDeviceGetPowerUsage\0").zip(g(b"nvmlDeviceGetEnforcedPowerLimit\0")),
            )
        };
        // SAFETY: plain C calls with valid out-pointers.
        let rc = unsafe { init() };
        if rc != 0 {
            return Err(anyhow!("nvmlInit_v2 returned {rc}"));
        }
        let id = CString::new(pci_bus_id).map_err(|_| anyhow!("PCI bus id contains a NUL"))?;
        let mut device: NvmlDevice = std::ptr::null_mut();
        // SAFETY: `id` is a NUL-terminated string and `device` a valid out-pointer.
        let rc = unsafe { by_pci(id.as_ptr(), &mut device) };
        if rc != 0 {
            return Err(anyhow!(
                "NVML has no device at PCI bus id {pci_bus_id} (error {rc})"
            ));
        }
        Ok(Nvml {
            _lib: lib,
            device,
            utilization,
            clock,
            power,
        })
    }

    /// The fraction (0..1) of NVML's last sample period in which a kernel ran on the device.
    pub fn gpu_busy(&self) -> Option<f64> {
        let mut u = Utilization::default();
        // SAFETY: `device` came from NVML and `u` is a valid out-pointer.
        let rc = unsafe { (self.utilization)(self.device, &mut u) };
        (rc == 0).then(|| f64::from(u.gpu.min(100)) / 100.0)
    }

    /// The device's NVML handle for CUDA device `ordinal`.
    pub fn for_ordinal(ordinal: usize) -> Result<Nvml> {
        Nvml::open(&pci_bus_id(ordinal)?)
    }

    /// (current, maximum) SM clock in MHz.
    pub fn sm_clock_mhz(&self) -> Option<(u32, u32)> {
        let (cur, max) = self.clock?;
        let (mut c, mut m) = (0, 0);
        // SAFETY: `device` came from NVML; valid out-pointers.
        let ok = unsafe {
            cur(self.device, CLOCK_SM, &mut c) == 0 && max(self.device, CLOCK_SM, &mut m) == 0
        };
        ok.then_some((c, m))
    }

    /// (current draw, enforced limit) in watts.
    pub fn power_w(&self) -> Option<(f64, f64)> {
        let (usage, limit) = self.power?;
        let (mut u, mut l) = (0, 0);
        // SAFETY: `device` came from NVML; valid out-pointers.
        let ok = unsafe { usage(self.device, &mut u) == 0 && limit(self.device, &mut l) == 0 };
        ok.then(|| (f64::from(u) / 1e3, f64::from(l) / 1e3))
    }
}

/// The PCI bus id of CUDA device `ordinal` (`0000:19:00.0`).
fn pci_bus_id(ordinal: usize) -> Result<String> {
    use cudarc::driver::{result, sys};
    let dev =
        result::device::get(ordinal as c_int).map_err(|e| anyhow!("device {ordinal}: {e}"))?;
    let mut buf = [0 as c_char; 32];
    // SAFETY: `buf` holds `len` bytes and the driver writes a NUL-terminated string into it.
    let rc = unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as c_int, dev) };
    if rc != sys::CUresult::CUDA_SUCCESS {
        return Err(anyhow!("cuDeviceGetPCIBusId: {rc:?}"));
    }
    // SAFETY: NUL-terminated by the driver (checked success above).
    Ok(unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

/// Feeds the timeline with this device's utilisation for the rest of the process, when NVML is
/// there (else the timeline shows no GPU figure, and says nothing more: it is a diagnostic).
pub fn start_timeline_sampler(ordinal: usize) {
    match Nvml::for_ordinal(ordinal) {
        Ok(nvml) => crate::timeline::start_gpu_sampler(move || nvml.gpu_busy()),
        Err(e) => tracing::debug!("no GPU utilisation for the timeline: {e:#}"),
    }
}
