//! Flash-attention launches: the kernel choice (tensor cores where the device, head shape and
//! addresses allow), the CUDA-core and tensor-core kernels, the tensor-core instantiations
//! compiled on first use, and the split combine.

use super::compile::{compile_fa_mma, fa_mma_entry};
use super::{KernelError, Kernels};
use crate::cpu::FaParams;
use crate::fa::{self, MmaConfig};
use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};

/// The device buffers of one flash-attention call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaPtrs {
    /// Q, f32 `[n_tokens][n_head][D_K]`.
    pub q: u64,
    /// K rows, f16.
    pub k: u64,
    /// V rows, f16 (K's address when V is a view of K).
    pub v: u64,
    /// The output, f32 `[n_tokens][n_head][D_V]`.
    pub dst: u64,
    /// `dst_tmp`: the splits' partial outputs (0 without splits).
    pub dst_tmp: u64,
    /// `dst_tmp_meta`: the splits' (max, sum) pairs (0 without splits).
    pub dst_meta: u64,
}

/// Which flash-attention kernel runs a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaKernel {
    /// `fattn` in fattn.cu: any head shape up to 576/512, any device, any strides.
    CudaCores,
    /// `fattn_mma.cu`: tensor cores, compute capability 8.0 and later, the head shapes of
    /// [`fa::MMA_SHAPES`], 16-byte aligned K/V rows.
    TensorCores(MmaConfig),
}

impl Kernels {
    /// The kernel [`Kernels::flash_attn`] picks for a call: tensor cores where the device, the
    /// head shape, the strides and the addresses allow, the CUDA-core kernel otherwise.
    pub fn fa_kernel(&self, p: &FaParams, b: &FaPtrs) -> FaKernel {
        let FaPtrs { q, k, v, dst, .. } = *b;
        let Some(cfg) = fa::mma_config(p.d_k, p.d_v) else {
            return FaKernel::CudaCores;
        };
        // cp.async moves 16 bytes: K/V rows and heads start on 8-half boundaries; Q and the
        // output move as float pairs.
        let strides = [p.k_row, p.k_head, p.v_row, p.v_head];
        let aligned = strides.iter().all(|s| s % 8 == 0)
            && k % 16 == 0
            && v % 16 == 0
            && q % 8 == 0
            && dst % 8 == 0;
        let v_in_k = Self::v_in_k(p, k, v);
        if self.cc_major < 8 || !aligned || cfg.shared_bytes(p.d_k, p.d_v, v_in_k) > self.max_shared
        {
            return FaKernel::CudaCores;
        }
        FaKernel::TensorCores(cfg)
    }

    fn v_in_k(p: &FaParams, k: u64, v: u64) -> bool {
        k == v && p.k_row == p.v_row && p.k_head == p.v_head && p.d_v <= p.d_k
    }

    /// Flash attention (and the combine when split), on the kernel [`Kernels::fa_kernel`] picks.
    pub fn flash_attn(&self, p: &FaParams, b: &FaPtrs) -> Result<(), KernelError> {
        self.flash_attn_with(self.fa_kernel(p, b), p, b)
    }

    /// Flash attention on a chosen kernel (tests and benchmarks compare them); the error says
    /// when the kernel cannot run this call.
    pub fn flash_attn_with(
        &self,
        kernel: FaKernel,
        p: &FaParams,
        b: &FaPtrs,
    ) -> Result<(), KernelError> {
        if p.parallel_blocks > 1 && (b.dst_tmp == 0 || b.dst_meta == 0) {
            return Err(KernelError::Unsupported(format!(
                "{} splits without dst_tmp or dst_tmp_meta: split-KV needs both buffers (fa::scratch sizes them)",
                p.parallel_blocks
            )));
        }
        if p.d_k > fa::MAX_D_K
            || p.d_v > fa::MAX_D_V
            || p.n_head_kv == 0
            || p.n_head % p.n_head_kv != 0
            || p.parallel_blocks == 0
        {
            return Err(KernelError::Unsupported(format!(
                "D_K {} D_V {} heads {}/{} splits {}: head dims up to {}/{}, whole KV groups, at least one split",
                p.d_k, p.d_v, p.n_head, p.n_head_kv, p.parallel_blocks, fa::MAX_D_K, fa::MAX_D_V
            )));
        }
        match kernel {
            FaKernel::CudaCores => self.fattn_simt(p, b)?,
            FaKernel::TensorCores(cfg) => self.fattn_mma(cfg, p, b)?,
        }
        if p.parallel_blocks > 1 {
            let rows = (p.n_tokens * p.n_head) as i32;
            let dv = p.d_v as i32;
            let pb = p.parallel_blocks as i32;
            let cfg = LaunchConfig {
                grid_dim: (rows as u32, 1, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut l = self.stream.launch_builder(&self.fattn_combine);
            l.arg(&b.dst_tmp)
                .arg(&b.dst_meta)
                .arg(&b.dst)
                .arg(&rows)
                .arg(&dv)
                .arg(&pb);
            // SAFETY: partials written above; dst holds rows*d_v floats.
            unsafe { l.launch(cfg) }?;
        }
        Ok(())
    }

    fn fattn_simt(&self, p: &FaParams, b: &FaPtrs) -> Result<(), KernelError> {
        let cfg = LaunchConfig {
            grid_dim: (
                p.n_tokens.div_ceil(fa::QUERIES_PER_BLOCK) as u32,
                p.n_head as u32,
                p.parallel_blocks as u32,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: fa::shared_bytes(p.d_k, p.d_v) as u32,
        };
        let ints = [
            p.n_tokens,
            p.n_head,
            p.n_head_kv,
            p.d_k,
            p.d_v,
            p.n_kv,
            p.pos0,
        ]
        .map(|v| v as i32);
        self.launch_fa(&self.fattn, cfg, b, &ints, p)
    }

    /// Launches a flash-attention entry point with its arguments in the order both kernels take
    /// them: the six buffers, the kernel's integer shape arguments, the K/V strides, the scale
    /// and the split count.
    fn launch_fa(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        ptrs: &FaPtrs,
        ints: &[i32],
        p: &FaParams,
    ) -> Result<(), KernelError> {
        let strides = [p.k_row, p.k_head, p.v_row, p.v_head].map(|v| v as i64);
        let pb = p.parallel_blocks as i32;
        let mut b = self.stream.launch_builder(f);
        for ptr in [
            &ptrs.q,
            &ptrs.k,
            &ptrs.v,
            &ptrs.dst,
            &ptrs.dst_tmp,
            &ptrs.dst_meta,
        ] {
            b.arg(ptr);
        }
        for i in ints {
            b.arg(i);
        }
        for s in &strides {
            b.arg(s);
        }
        b.arg(&p.scale).arg(&pb);
        // SAFETY: q, k, v, dst and the split buffers are sized for these parameters by the caller
        // and `fa::scratch`; the tensor-core kernel's alignment is checked by `fa_kernel`.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// The tensor-core entry point of a shape, compiled and loaded on first use.
    fn fa_mma_function(
        &self,
        d_k: usize,
        d_v: usize,
        cfg: MmaConfig,
    ) -> Result<CudaFunction, KernelError> {
        let mut cache = self
            .fa_mma
            .lock()
            .map_err(|_| KernelError::Compile("the kernel cache was poisoned by a panic".into()))?;
        if let Some(f) = cache.get(&(d_k, d_v, cfg)) {
            return Ok(f.clone());
        }
        let ptx = compile_fa_mma(self.arch, d_k, d_v, cfg)?;
        let f = self
            .ctx
            .load_module(ptx)?
            .load_function(&fa_mma_entry(d_k, d_v))?;
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            cfg.shared_bytes(d_k, d_v, false).min(self.max_shared) as i32,
        )?;
        cache.insert((d_k, d_v, cfg), f.clone());
        Ok(f)
    }

    fn fattn_mma(&self, cfg: MmaConfig, p: &FaParams, b: &FaPtrs) -> Result<(), KernelError> {
        if self.cc_major < 8 || fa::mma_config(p.d_k, p.d_v).is_none() {
            return Err(KernelError::Unsupported(format!(
                "tensor-core flash attention for D_K {} D_V {} on compute capability {}.x: it needs 8.0 or later and one of the head shapes {:?}",
                p.d_k,
                p.d_v,
                self.cc_major,
                fa::MMA_SHAPES.iter().map(|&(k, v, _)| (k, v)).collect::<Vec<_>>()
            )));
        }
        let shared = cfg.shared_bytes(p.d_k, p.d_v, Self::v_in_k(p, b.k, b.v));
        if shared > self.max_shared {
            return Err(KernelError::Unsupported(format!(
                "tensor-core flash attention for D_K {} D_V {} needs {shared} bytes of shared memory; the device allows {}",
                p.d_k, p.d_v, self.max_shared
            )));
        }
        let f = self.fa_mma_function(p.d_k, p.d_v, cfg)?;
        let rows = p.n_tokens * (p.n_head / p.n_head_kv);
        let launch = LaunchConfig {
            grid_dim: (
                rows.div_ceil(cfg.rows_per_block()) as u32,
                p.n_head_kv as u32,
                p.parallel_blocks as u32,
            ),
            block_dim: ((fa::MMA_WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        let ints = [p.n_tokens, p.n_head, p.n_head_kv, p.n_kv, p.pos0].map(|v| v as i32);
        self.launch_fa(&f, launch, b, &ints, p)
    }
}
