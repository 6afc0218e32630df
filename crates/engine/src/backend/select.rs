//! Which backend a command runs on, and running work there: [`BackendKind`] (what the user picked),
//! [`dispatch`] (a [`BackendJob`] on a freshly created backend, static dispatch, no trait objects)
//! and [`cuda_availability`] (what `--backend auto` and `draftlens doctor` ask).

use super::Backend;
use anyhow::Result;

/// The CUDA device the CLI runs on. It has no device flag: `CUDA_VISIBLE_DEVICES` chooses which
/// card is device 0.
pub const DEFAULT_CUDA_DEVICE: usize = 0;

/// Which backend to run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Cpu,
    Cuda,
}

impl BackendKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
        }
    }
}

/// Work that runs on whichever backend the user picked (static dispatch, no trait objects).
pub trait BackendJob {
    type Output;
    fn run<B: Backend>(self, be: B) -> Result<Self::Output>;
}

/// Run `job` on the backend `kind` (CUDA: on device `cuda_device`), or explain why that backend
/// is unavailable.
pub fn dispatch<J: BackendJob>(kind: BackendKind, cuda_device: usize, job: J) -> Result<J::Output> {
    match kind {
        BackendKind::Cpu => job.run(super::cpu::CpuBackend::new()),
        BackendKind::Cuda => dispatch_cuda(cuda_device, job),
    }
}

#[cfg(feature = "cuda")]
fn dispatch_cuda<J: BackendJob>(device: usize, job: J) -> Result<J::Output> {
    let be = {
        let _phase = crate::timeline::phase("backend init");
        super::cuda::CudaBackend::new(device)?
    };
    super::cuda::nvml::start_timeline_sampler(device);
    job.run(be)
}

#[cfg(not(feature = "cuda"))]
fn dispatch_cuda<J: BackendJob>(_device: usize, _job: J) -> Result<J::Output> {
    Err(super::BackendError::CudaUnavailable(
        "this draftlens binary was built without the `cuda` feature".into(),
    )
    .into())
}

/// `Ok(())` when device `ordinal` can be used by the CUDA backend, else why not (without the
/// "CUDA unavailable" prefix). What `--backend auto` and `draftlens doctor` ask.
pub fn cuda_availability(ordinal: usize) -> std::result::Result<(), String> {
    #[cfg(feature = "cuda")]
    return super::cuda::availability(ordinal);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        Err("this draftlens binary was built without the `cuda` feature".into())
    }
}
