//! No maths: every allocation happens, in the same order and size as a real run.

use super::{DeviceBuffers, Executor, ExecutorKind, Scratch, Ubatch};
use crate::error::RuntimeError;

/// See the module docs.
#[derive(Debug, Default)]
pub struct DryRun;

impl Executor for DryRun {
    fn kind(&self) -> ExecutorKind {
        ExecutorKind::DryRun
    }
    fn init(&mut self, _: &DeviceBuffers) -> Result<(), RuntimeError> {
        Ok(())
    }
    fn begin_ubatch(&mut self, _: &Ubatch) -> Result<(), RuntimeError> {
        Ok(())
    }
    fn pre_attention(&mut self, _: usize, _: &Ubatch) -> Result<(), RuntimeError> {
        Ok(())
    }
    fn attention(&mut self, _: usize, _: &Ubatch, _: &Scratch) -> Result<(), RuntimeError> {
        Ok(())
    }
    fn post_attention(&mut self, _: usize, _: &Ubatch) -> Result<(), RuntimeError> {
        Ok(())
    }
    fn end_ubatch(&mut self, _: &Ubatch) -> Result<(), RuntimeError> {
        Ok(())
    }
    fn hidden(&self, _: usize) -> Result<Vec<f32>, RuntimeError> {
        Err(RuntimeError::Invalid(
            "the dry-run executor computes nothing: use the cpu or cuda executor".into(),
        ))
    }
}
