//! No maths: every allocation happens, in the same order and size as a real run.

use super::{Executor, ExecutorKind, FaBuffers};
use crate::error::RuntimeError;
use cupool_kernels::args::{GemmArgs, KvStore, NormArgs};
use cupool_kernels::cpu::FaParams;
use cupool_profiles::Weights;

/// See the module docs.
#[derive(Debug, Default)]
pub struct DryRun;

impl Executor for DryRun {
    fn kind(&self) -> ExecutorKind {
        ExecutorKind::DryRun
    }
    fn sync(&mut self) -> Result<(), RuntimeError> {
        Ok(())
    }
    fn zero(&mut self, _: u64, _: usize) -> Result<(), RuntimeError> {
        Ok(())
    }
    fn fill_ones_f16(&mut self, _: u64, _: usize) -> Result<(), RuntimeError> {
        Ok(())
    }
    fn init_weights(
        &mut self,
        _: u64,
        _: usize,
        _: u32,
        _: f32,
        _: Weights,
    ) -> Result<(), RuntimeError> {
        Ok(())
    }
    fn upload_tokens(&mut self, _: u64, _: &[i32]) -> Result<(), RuntimeError> {
        Ok(())
    }
    fn embed(&mut self, _: u64, _: u64, _: usize, _: usize) -> Result<(), RuntimeError> {
        Ok(())
    }
    fn rms_norm(&mut self, _: &NormArgs) -> Result<(), RuntimeError> {
        Ok(())
    }
    fn matmul(&mut self, _: &GemmArgs, _: u64) -> Result<(), RuntimeError> {
        Ok(())
    }
    fn swiglu(&mut self, _: u64, _: u64, _: usize) -> Result<(), RuntimeError> {
        Ok(())
    }
    fn store_kv(&mut self, _: &KvStore) -> Result<(), RuntimeError> {
        Ok(())
    }
    fn dequantize_q8_0(&mut self, _: u64, _: u64, _: usize, _: usize) -> Result<(), RuntimeError> {
        Ok(())
    }
    fn flash_attn(&mut self, _: &FaParams, _: &FaBuffers) -> Result<(), RuntimeError> {
        Ok(())
    }
    fn read_f32(&mut self, _: u64, _: usize) -> Result<Vec<f32>, RuntimeError> {
        Err(RuntimeError::Invalid(
            "the dry-run executor computes nothing: use the cpu or cuda executor".into(),
        ))
    }
}
