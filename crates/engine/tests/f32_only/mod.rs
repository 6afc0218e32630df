//! A `WeightSource` that hides raw views, shared by the tests that compare the raw weight path
//! (`WeightSource::raw` → `Backend::matrix_stacked_raw`) with the f32 path every backend took
//! before it (`WeightSource::tensor` + f32 stacking).

use draftlens_engine::formats::{HostTensor, TensorInfo, WeightSource};
use std::path::Path;

pub struct F32Only<'a>(pub &'a dyn WeightSource);

impl WeightSource for F32Only<'_> {
    fn path(&self) -> &Path {
        self.0.path()
    }
    fn contains(&self, name: &str) -> bool {
        self.0.contains(name)
    }
    fn tensors(&self) -> Vec<TensorInfo> {
        self.0.tensors()
    }
    fn tensor(&self, name: &str) -> anyhow::Result<HostTensor> {
        self.0.tensor(name)
    }
}
