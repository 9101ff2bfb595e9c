//! Launches of the cache kernels (`quant.cu`): new K/V rows into an f16 or q8_0 cache, and a
//! q8_0 cache back to f16 for flash attention.

use super::{grid, KernelError, Kernels};
use crate::args::KvStore;
use crate::KvType;
use cudarc::driver::PushKernelArg;

impl Kernels {
    /// New K or V rows into the cache, as its type stores them.
    pub fn store_kv(&self, s: &KvStore) -> Result<(), KernelError> {
        match s.kv {
            KvType::F16 => self.store_f16(s.src, s.cache, s.rows, s.row_len, s.pos0),
            KvType::Q8_0 => self.quantize_q8_0(s.src, s.cache, s.rows, s.row_len, s.pos0),
        }
    }

    /// f32 rows into q8_0 rows `[row0, row0 + n_rows)` of `dst`.
    pub fn quantize_q8_0(
        &self,
        src: u64,
        dst: u64,
        n_rows: usize,
        row_len: usize,
        row0: usize,
    ) -> Result<(), KernelError> {
        let blocks = n_rows * row_len / crate::QK8_0;
        let (n, rl, r0) = (n_rows as i64, row_len as i64, row0 as i64);
        let mut b = self.stream.launch_builder(&self.quantize_q8_0);
        b.arg(&src).arg(&dst).arg(&n).arg(&rl).arg(&r0);
        // SAFETY: src holds n_rows*row_len floats; dst holds at least row0+n_rows q8_0 rows.
        unsafe { b.launch(grid(blocks * 32, 256)) }?;
        Ok(())
    }

    /// f32 rows into f16 rows `[row0, row0 + n_rows)` of `dst`.
    pub fn store_f16(
        &self,
        src: u64,
        dst: u64,
        n_rows: usize,
        row_len: usize,
        row0: usize,
    ) -> Result<(), KernelError> {
        let (n, rl, r0) = (n_rows as i64, row_len as i64, row0 as i64);
        let mut b = self.stream.launch_builder(&self.store_f16);
        b.arg(&src).arg(&dst).arg(&n).arg(&rl).arg(&r0);
        // SAFETY: as above, for f16 rows.
        unsafe { b.launch(grid(n_rows * row_len, 256)) }?;
        Ok(())
    }

    /// q8_0 rows `[0, n_rows)` into f16.
    pub fn dequantize_q8_0(
        &self,
        src: u64,
        dst: u64,
        n_rows: usize,
        row_len: usize,
    ) -> Result<(), KernelError> {
        let (n, rl) = (n_rows as i64, row_len as i64);
        let mut b = self.stream.launch_builder(&self.dequantize_q8_0);
        b.arg(&src).arg(&dst).arg(&n).arg(&rl);
        // SAFETY: src holds n_rows q8_0 rows; dst n_rows*row_len halves.
        unsafe { b.launch(grid(n_rows * row_len, 256)) }?;
        Ok(())
    }
}
