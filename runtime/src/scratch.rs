//! One flash-attention call's scratch, taken from the pool in ggml's order and returned in
//! reverse when dropped. The buffer types are [`cupool_kernels::fa`]'s, the same ones its byte
//! sizes (and so the planner and the purge policy) are computed from.

use crate::executor::DevSlice;
use cupool_kernels::fa::{FaScratch, KvHalf, Meta, Partial};
use cupool_pool::adaptors::label;
use cupool_pool::{Pool, PoolBuffer, PoolError};
use std::sync::Arc;

/// See the module docs.
#[derive(Debug)]
pub struct Scratch {
    /// The sizes.
    pub fa: FaScratch,
    /// `K_f16`.
    pub k_f16: Option<PoolBuffer<KvHalf>>,
    /// `V_f16`.
    pub v_f16: Option<PoolBuffer<KvHalf>>,
    /// `dst_tmp`.
    pub dst_tmp: Option<PoolBuffer<Partial>>,
    /// `dst_tmp_meta`.
    pub dst_meta: Option<PoolBuffer<Meta>>,
}

/// Takes `n` elements named `name` (ggml's name for the buffer, which a recorded trace carries).
fn take<T>(
    pool: &Arc<dyn Pool>,
    name: &'static str,
    n: usize,
) -> Result<Option<PoolBuffer<T>>, PoolError> {
    if n == 0 {
        Ok(None)
    } else {
        label::with(name, || PoolBuffer::alloc(pool, n).map(Some))
    }
}

impl Scratch {
    /// Takes the scratch of `fa` from `pool`. On failure whatever was taken goes back.
    pub fn take(pool: &Arc<dyn Pool>, fa: FaScratch) -> Result<Self, PoolError> {
        let mut s = Scratch {
            fa,
            k_f16: None,
            v_f16: None,
            dst_tmp: None,
            dst_meta: None,
        };
        s.k_f16 = take(pool, "K_f16", fa.k_f16)?;
        s.v_f16 = take(pool, "V_f16", fa.v_f16)?;
        s.dst_tmp = take(pool, "dst_tmp", fa.dst_tmp)?;
        s.dst_meta = take(pool, "dst_tmp_meta", fa.dst_meta)?;
        Ok(s)
    }

    /// A buffer as a device range (empty when not taken).
    pub fn slice<T>(b: &Option<PoolBuffer<T>>) -> DevSlice {
        b.as_ref().map_or(DevSlice::default(), |b| DevSlice {
            ptr: b.ptr(),
            len: b.len(),
        })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Reverse order, as ggml's destructors run.
        drop(self.dst_meta.take());
        drop(self.dst_tmp.take());
        drop(self.v_f16.take());
        drop(self.k_f16.take());
    }
}
