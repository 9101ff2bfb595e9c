//! The reference maths on the simulated device, whose addresses are host memory.
//!
//! Every range a kernel touches is checked first: it must lie inside memory the simulated
//! device holds, and a range a kernel writes must not overlap any other range of the same
//! call. Only then does it become a slice, so a wrong address is an error, never undefined
//! behaviour.

use super::{Executor, ExecutorKind, FaBuffers};
use crate::error::RuntimeError;
use cupool_kernels::args::{GemmArgs, KvStore, NormArgs};
use cupool_kernels::cpu::{self, FaParams};
use cupool_kernels::fa::{KvHalf, Meta, Partial};
use cupool_kernels::KvType;
use cupool_pool::driver::sim::SimDevice;
use cupool_profiles::Weights;
use half::f16;
use std::mem::size_of;
use std::sync::Arc;

/// See the module docs.
#[derive(Debug)]
pub struct CpuExecutor {
    device: Arc<SimDevice>,
}

impl CpuExecutor {
    /// An executor on `device`, which must be backed by host memory.
    pub fn new(device: Arc<SimDevice>) -> Result<Self, RuntimeError> {
        if !device.config().backed {
            return Err(RuntimeError::Invalid(
                "the cpu executor needs a simulated device backed by host memory".into(),
            ));
        }
        Ok(Self { device })
    }
}

/// The ranges of one kernel call, checked before any becomes a slice.
struct Call<'d> {
    device: &'d SimDevice,
    claimed: Vec<(u64, u64, bool)>,
}

impl<'d> Call<'d> {
    fn new(device: &'d SimDevice) -> Self {
        Self {
            device,
            claimed: Vec::new(),
        }
    }

    fn claim<T>(&mut self, at: u64, len: usize, write: bool) -> Result<(), RuntimeError> {
        let bytes = len
            .checked_mul(size_of::<T>())
            .ok_or_else(|| RuntimeError::Invalid(format!("{len} elements overflow")))?;
        if len == 0 {
            return Ok(());
        }
        if at % std::mem::align_of::<T>() as u64 != 0 || !self.device.contains(at, bytes) {
            return Err(RuntimeError::Invalid(format!(
                "{bytes} bytes at {at:#x} are not live, aligned device memory"
            )));
        }
        let end = at + bytes as u64;
        for &(s, e, w) in &self.claimed {
            if (write || w) && at < e && s < end {
                return Err(RuntimeError::Invalid(format!(
                    "{bytes} bytes at {at:#x} overlap another buffer of the same kernel"
                )));
            }
        }
        self.claimed.push((at, end, write));
        Ok(())
    }

    /// A range the kernel reads.
    fn input<T>(&mut self, at: u64, len: usize) -> Result<&'d [T], RuntimeError> {
        self.claim::<T>(at, len, false)?;
        if len == 0 {
            return Ok(&[]);
        }
        // SAFETY: the range is live host memory of the device, aligned for T (checked in
        // `claim`), and no range of this call that is written overlaps it.
        Ok(unsafe { std::slice::from_raw_parts(at as *const T, len) })
    }

    /// A range the kernel writes.
    fn output<T>(&mut self, at: u64, len: usize) -> Result<&'d mut [T], RuntimeError> {
        self.claim::<T>(at, len, true)?;
        if len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: as in `input`, and no other range of this call overlaps it at all.
        Ok(unsafe { std::slice::from_raw_parts_mut(at as *mut T, len) })
    }
}

impl Executor for CpuExecutor {
    fn kind(&self) -> ExecutorKind {
        ExecutorKind::Cpu
    }

    fn sync(&mut self) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn zero(&mut self, at: u64, bytes: usize) -> Result<(), RuntimeError> {
        Call::new(&self.device).output::<u8>(at, bytes)?.fill(0);
        Ok(())
    }

    fn fill_ones_f16(&mut self, at: u64, n: usize) -> Result<(), RuntimeError> {
        Call::new(&self.device).output::<f16>(at, n)?.fill(f16::ONE);
        Ok(())
    }

    fn init_weights(
        &mut self,
        at: u64,
        n: usize,
        seed: u32,
        scale: f32,
        wt: Weights,
    ) -> Result<(), RuntimeError> {
        let mut c = Call::new(&self.device);
        match wt {
            Weights::F16 => cpu::init_weights(c.output::<f16>(at, n)?, seed, scale),
            Weights::Q8_0 => {
                cpu::init_weights_q8_0(c.output::<u8>(at, wt.row_bytes(n))?, seed, scale)
            }
        }
        Ok(())
    }

    fn upload_tokens(&mut self, at: u64, tokens: &[i32]) -> Result<(), RuntimeError> {
        Call::new(&self.device)
            .output::<i32>(at, tokens.len())?
            .copy_from_slice(tokens);
        Ok(())
    }

    fn embed(
        &mut self,
        tokens: u64,
        x: u64,
        n_tokens: usize,
        n_embd: usize,
    ) -> Result<(), RuntimeError> {
        let mut c = Call::new(&self.device);
        let t = c.input::<i32>(tokens, n_tokens)?;
        cpu::embed(t, c.output::<f32>(x, n_tokens * n_embd)?, n_embd);
        Ok(())
    }

    fn rms_norm(&mut self, a: &NormArgs) -> Result<(), RuntimeError> {
        let (rows, n) = (a.rows, a.n);
        let mut c = Call::new(&self.device);
        let (x, w) = (c.input::<f32>(a.x, rows * n)?, c.input::<f16>(a.w, n)?);
        cpu::rms_norm(x, w, c.output::<f32>(a.y, rows * n)?, n, a.eps);
        Ok(())
    }

    fn matmul(&mut self, g: &GemmArgs, _x_f16: u64) -> Result<(), RuntimeError> {
        let (m, n, k) = (g.m, g.n, g.k);
        let mut c = Call::new(&self.device);
        let (x, w) = (c.input::<f32>(g.x, m * k)?, c.input::<f16>(g.w, k * n)?);
        cpu::matmul(x, w, c.output::<f32>(g.y, m * n)?, m, n, k, g.accumulate);
        Ok(())
    }

    fn swiglu(&mut self, up: u64, gate: u64, n: usize) -> Result<(), RuntimeError> {
        let mut c = Call::new(&self.device);
        let gate = c.input::<f32>(gate, n)?;
        cpu::swiglu(c.output::<f32>(up, n)?, gate);
        Ok(())
    }

    fn store_kv(&mut self, s: &KvStore) -> Result<(), RuntimeError> {
        let (kv, n) = (s.kv, s.rows * s.row_len);
        let mut c = Call::new(&self.device);
        let src = c.input::<f32>(s.src, n)?;
        match kv {
            KvType::F16 => cpu::store_f16(src, c.output::<f16>(s.dst(), n)?),
            KvType::Q8_0 => {
                let bytes = s.rows * kv.row_bytes(s.row_len);
                cpu::quantize_q8_0(src, c.output::<u8>(s.dst(), bytes)?)
            }
        }
        Ok(())
    }

    fn dequantize_q8_0(
        &mut self,
        src: u64,
        dst: u64,
        rows: usize,
        row_len: usize,
    ) -> Result<(), RuntimeError> {
        let mut c = Call::new(&self.device);
        let src = c.input::<u8>(src, rows * KvType::Q8_0.row_bytes(row_len))?;
        cpu::dequantize_q8_0(src, c.output::<KvHalf>(dst, rows * row_len)?);
        Ok(())
    }

    fn flash_attn(&mut self, p: &FaParams, b: &FaBuffers) -> Result<(), RuntimeError> {
        let mut c = Call::new(&self.device);
        let q = c.input::<f32>(b.q, p.n_tokens * p.n_head * p.d_k)?;
        let k = c.input::<KvHalf>(b.k, p.n_kv * p.k_row)?;
        let v = if b.v == b.k {
            k
        } else {
            c.input::<KvHalf>(b.v, p.n_kv * p.v_row)?
        };
        let dst = c.output::<f32>(b.dst, p.n_tokens * p.n_head * p.d_v)?;
        let tmp = c.output::<Partial>(b.tmp.ptr, b.tmp.len)?;
        let meta = c.output::<Meta>(b.meta.ptr, b.meta.len)?;
        cpu::flash_attn(p, q, k, v, dst, tmp, meta);
        Ok(())
    }

    fn read_f32(&mut self, at: u64, n: usize) -> Result<Vec<f32>, RuntimeError> {
        Ok(Call::new(&self.device).input::<f32>(at, n)?.to_vec())
    }
}
