//! The reference maths on the simulated device: its addresses are host memory.

use super::{DeviceBuffers, Executor, ExecutorKind, Scratch, Ubatch};
use crate::error::RuntimeError;
use crate::model::ModelShape;
use cupool_kernels::cpu::{self, FaParams};
use cupool_kernels::KvType;
use half::f16;

/// See the module docs.
#[derive(Debug)]
pub struct CpuExecutor {
    m: ModelShape,
    kv: KvType,
    bufs: Option<DeviceBuffers>,
}

impl CpuExecutor {
    /// An executor for `m` with a `kv` cache. Only valid on host-addressable (simulated) memory.
    pub fn new(m: ModelShape, kv: KvType) -> Self {
        Self { m, kv, bufs: None }
    }

    fn bufs(&self) -> Result<DeviceBuffers, RuntimeError> {
        self.bufs
            .ok_or_else(|| RuntimeError::Invalid("executor used before init".into()))
    }
}

/// A view of `len` values of `T` at device address `addr`.
///
/// # Safety
/// `addr` must be host memory of the simulated device, live and at least `len * size_of::<T>()`
/// bytes, aligned for `T`, and no other live slice may overlap it mutably.
unsafe fn view<'a, T>(addr: u64, len: usize) -> &'a mut [T] {
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut T, len) }
}

fn init_weights(addr: u64, n: usize, seed: u32, fan_in: usize) {
    // SAFETY: a weights region of the startup buffer, `n` halves long, nothing else borrows it.
    let w = unsafe { view::<f16>(addr, n) };
    cpu::init_weights(w, seed, 1.0 / (fan_in as f32).sqrt());
}

impl Executor for CpuExecutor {
    fn kind(&self) -> ExecutorKind {
        ExecutorKind::Cpu
    }

    fn init(&mut self, b: &DeviceBuffers) -> Result<(), RuntimeError> {
        let m = &self.m;
        let (e, w) = (m.n_embd, b.weights);
        for off in [b.wl.norm1, b.wl.norm2] {
            // SAFETY: the norm regions hold n_embd halves.
            unsafe { view::<f16>(w + off as u64, e) }.fill(f16::ONE);
        }
        init_weights(w + b.wl.wq as u64, e * m.q_dim(), 11, e);
        init_weights(w + b.wl.wk as u64, e * m.kv_dim_k(), 12, e);
        if !m.v_is_k {
            init_weights(w + b.wl.wv as u64, e * m.kv_dim_v(), 13, e);
        }
        init_weights(w + b.wl.wo as u64, m.out_dim() * e, 14, m.out_dim());
        init_weights(w + b.wl.w1 as u64, e * m.n_ff, 15, e);
        init_weights(w + b.wl.w2 as u64, m.n_ff * e, 16, m.n_ff);
        self.bufs = Some(*b);
        Ok(())
    }

    fn begin_ubatch(&mut self, ub: &Ubatch) -> Result<(), RuntimeError> {
        let b = self.bufs()?;
        // SAFETY: compute-buffer regions sized for the largest ubatch; disjoint.
        let (tok, x) = unsafe {
            (
                view::<i32>(b.compute + b.cl.tokens as u64, ub.n_tokens),
                view::<f32>(b.compute + b.cl.x as u64, ub.n_tokens * self.m.n_embd),
            )
        };
        tok.copy_from_slice(ub.tokens);
        cpu::embed(tok, x, self.m.n_embd);
        Ok(())
    }

    fn pre_attention(&mut self, layer: usize, ub: &Ubatch) -> Result<(), RuntimeError> {
        let (b, m, u) = (self.bufs()?, &self.m, ub.n_tokens);
        let c = |off: usize| b.compute + off as u64;
        let w = |off: usize| b.weights + off as u64;
        // SAFETY: disjoint regions of the compute and weights buffers, sized for this ubatch.
        unsafe {
            let x = view::<f32>(c(b.cl.x), u * m.n_embd);
            let xn = view::<f32>(c(b.cl.xn), u * m.n_embd);
            cpu::rms_norm(x, view::<f16>(w(b.wl.norm1), m.n_embd), xn, m.n_embd, 1e-6);
            cpu::matmul(
                xn,
                view::<f16>(w(b.wl.wq), m.n_embd * m.q_dim()),
                view::<f32>(c(b.cl.q), u * m.q_dim()),
                u,
                m.q_dim(),
                m.n_embd,
                false,
            );
            let k_new = view::<f32>(c(b.cl.k_new), u * m.kv_dim_k());
            cpu::matmul(
                xn,
                view::<f16>(w(b.wl.wk), m.n_embd * m.kv_dim_k()),
                k_new,
                u,
                m.kv_dim_k(),
                m.n_embd,
                false,
            );
            store_rows(
                self.kv,
                k_new,
                b.kv + b.kvl.k(layer) as u64,
                b.kvl.k_row_bytes,
                ub.pos0,
            );
            if !m.v_is_k {
                let v_new = view::<f32>(c(b.cl.v_new), u * m.kv_dim_v());
                cpu::matmul(
                    xn,
                    view::<f16>(w(b.wl.wv), m.n_embd * m.kv_dim_v()),
                    v_new,
                    u,
                    m.kv_dim_v(),
                    m.n_embd,
                    false,
                );
                store_rows(
                    self.kv,
                    v_new,
                    b.kv + b.kvl.v(layer) as u64,
                    b.kvl.v_row_bytes,
                    ub.pos0,
                );
            }
        }
        Ok(())
    }

    fn attention(&mut self, layer: usize, ub: &Ubatch, s: &Scratch) -> Result<(), RuntimeError> {
        let (b, m) = (self.bufs()?, &self.m);
        let p = fa_params(m, ub, s.fa.parallel_blocks);
        let kv_k = b.kv + b.kvl.k(layer) as u64;
        let kv_v = b.kv + b.kvl.v(layer) as u64;
        // SAFETY: cache rows [0, n_kv) exist (n_kv <= n_ctx); scratch buffers were sized by
        // `fa::scratch` for this call; compute regions are disjoint from both.
        unsafe {
            let (k, v): (&[f16], &[f16]) = match self.kv {
                KvType::F16 => {
                    let k = view::<f16>(kv_k, ub.n_kv * m.kv_dim_k());
                    let v = if m.v_is_k {
                        &*k
                    } else {
                        &*view::<f16>(kv_v, ub.n_kv * m.kv_dim_v())
                    };
                    (k, v)
                }
                KvType::Q8_0 => {
                    let kb = s.k_f16.as_ref().ok_or_else(|| {
                        RuntimeError::Invalid("q8_0 K without K_f16 scratch".into())
                    })?;
                    let k = view::<f16>(kb.ptr(), kb.len());
                    cpu::dequantize_q8_0(view::<u8>(kv_k, ub.n_kv * b.kvl.k_row_bytes), k);
                    let v: &[f16] = if m.v_is_k {
                        &*k
                    } else {
                        let vb = s.v_f16.as_ref().ok_or_else(|| {
                            RuntimeError::Invalid("q8_0 V without V_f16 scratch".into())
                        })?;
                        let v = view::<f16>(vb.ptr(), vb.len());
                        cpu::dequantize_q8_0(view::<u8>(kv_v, ub.n_kv * b.kvl.v_row_bytes), v);
                        v
                    };
                    (k, v)
                }
            };
            let q = view::<f32>(b.compute + b.cl.q as u64, ub.n_tokens * m.q_dim());
            let dst = view::<f32>(b.compute + b.cl.attn as u64, ub.n_tokens * m.out_dim());
            let tmp = s
                .dst_tmp
                .as_ref()
                .map_or(&mut [][..], |t| view::<f32>(t.ptr(), t.len()));
            let meta = s
                .dst_meta
                .as_ref()
                .map_or(&mut [][..], |t| view::<[f32; 2]>(t.ptr(), t.len()));
            cpu::flash_attn(&p, q, k, v, dst, tmp, meta);
        }
        Ok(())
    }

    fn post_attention(&mut self, _layer: usize, ub: &Ubatch) -> Result<(), RuntimeError> {
        let (b, m, u) = (self.bufs()?, &self.m, ub.n_tokens);
        let c = |off: usize| b.compute + off as u64;
        let w = |off: usize| b.weights + off as u64;
        // SAFETY: disjoint regions of the compute and weights buffers, sized for this ubatch.
        unsafe {
            let x = view::<f32>(c(b.cl.x), u * m.n_embd);
            let xn = view::<f32>(c(b.cl.xn), u * m.n_embd);
            let attn = view::<f32>(c(b.cl.attn), u * m.out_dim());
            cpu::matmul(
                attn,
                view::<f16>(w(b.wl.wo), m.out_dim() * m.n_embd),
                x,
                u,
                m.n_embd,
                m.out_dim(),
                true,
            );
            cpu::rms_norm(x, view::<f16>(w(b.wl.norm2), m.n_embd), xn, m.n_embd, 1e-6);
            let ff = view::<f32>(c(b.cl.ff), u * m.n_ff);
            cpu::matmul(
                xn,
                view::<f16>(w(b.wl.w1), m.n_embd * m.n_ff),
                ff,
                u,
                m.n_ff,
                m.n_embd,
                false,
            );
            cpu::silu(ff);
            cpu::matmul(
                ff,
                view::<f16>(w(b.wl.w2), m.n_ff * m.n_embd),
                x,
                u,
                m.n_embd,
                m.n_ff,
                true,
            );
        }
        Ok(())
    }

    fn end_ubatch(&mut self, _: &Ubatch) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn hidden(&self, n_tokens: usize) -> Result<Vec<f32>, RuntimeError> {
        let b = self.bufs()?;
        // SAFETY: the hidden-state region; read only.
        Ok(unsafe { view::<f32>(b.compute + b.cl.x as u64, n_tokens * self.m.n_embd) }.to_vec())
    }
}

/// Writes `rows` (f32, row after row) into the cache at position `pos0`.
///
/// # Safety
/// The cache must hold at least `pos0 + rows` rows of `row_bytes` at `cache`.
unsafe fn store_rows(kv: KvType, rows: &[f32], cache: u64, row_bytes: usize, pos0: usize) {
    let n = rows.len();
    let at = cache + (pos0 * row_bytes) as u64;
    // SAFETY: per the function contract.
    unsafe {
        match kv {
            KvType::F16 => cpu::store_f16(rows, view::<f16>(at, n)),
            KvType::Q8_0 => cpu::quantize_q8_0(
                rows,
                view::<u8>(
                    at,
                    n / cupool_kernels::QK8_0 * cupool_kernels::Q8_0_BLOCK_BYTES,
                ),
            ),
        }
    }
}

/// The kernel parameters of one call.
pub(crate) fn fa_params(m: &ModelShape, ub: &Ubatch, parallel_blocks: usize) -> FaParams {
    let (k_row, k_head) = (m.kv_dim_k(), m.head_dim_k);
    let (v_row, v_head) = if m.v_is_k {
        (m.kv_dim_k(), m.head_dim_k)
    } else {
        (m.kv_dim_v(), m.head_dim_v)
    };
    FaParams {
        n_tokens: ub.n_tokens,
        n_head: m.n_head,
        n_head_kv: m.n_head_kv,
        d_k: m.head_dim_k,
        d_v: m.head_dim_v,
        n_kv: ub.n_kv,
        pos0: ub.pos0,
        k_row,
        k_head,
        v_row,
        v_head,
        scale: 1.0 / (m.head_dim_k as f32).sqrt(),
        parallel_blocks,
    }
}
