//! The CUDA kernels: sources, NVRTC compilation, and launches.
//!
//! Sources are compiled once per context ([`Kernels::load`]); the tensor-core flash attention
//! is a template compiled per head shape on first use (most models use one). Every launch takes
//! raw device addresses, so pool buffers ([`cupool_pool::PoolBuffer`] pushes its pointer) and
//! plain allocations are passed alike.

use crate::cpu::FaParams;
use crate::fa::{self, MmaConfig};
use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaStream, DriverError, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions, Ptx};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

const COMMON: &str = include_str!("cuda/common.cuh");

/// The kernel sources: (module name, full source with the shared header).
pub fn sources() -> Vec<(&'static str, String)> {
    [
        ("quant", include_str!("cuda/quant.cu")),
        ("fattn", include_str!("cuda/fattn.cu")),
        ("layer", include_str!("cuda/layer.cu")),
    ]
    .into_iter()
    .map(|(n, s)| (n, format!("{COMMON}\n{s}")))
    .collect()
}

/// The tensor-core flash attention for one head shape and configuration: the template and the
/// one entry point `fattn_mma_<d_k>_<d_v>` it is instantiated as.
pub fn fa_mma_source(d_k: usize, d_v: usize, cfg: MmaConfig) -> String {
    format!(
        "{COMMON}\n{}\nFA_MMA_ENTRY({d_k}, {d_v}, {}, {}, {})\n",
        include_str!("cuda/fattn_mma.cu"),
        cfg.m_tiles,
        cfg.col_warps,
        cfg.keys_per_tile
    )
}

/// The entry point's name in [`fa_mma_source`].
pub fn fa_mma_entry(d_k: usize, d_v: usize) -> String {
    format!("fattn_mma_{d_k}_{d_v}")
}

/// Compiles one tensor-core flash-attention instantiation for `arch` (`compute_80` or later).
pub fn compile_fa_mma(
    arch: &'static str,
    d_k: usize,
    d_v: usize,
    cfg: MmaConfig,
) -> Result<Ptx, KernelError> {
    compile_one(&fa_mma_entry(d_k, d_v), fa_mma_source(d_k, d_v, cfg), arch)
}

/// Compiled sources, by (architecture, source): NVRTC takes about a second for all of them,
/// and a process that builds several runtimes (a comparison, a benchmark) needs it once.
static PTX_CACHE: OnceLock<Mutex<HashMap<(&'static str, String), Ptx>>> = OnceLock::new();

fn compile_one(name: &str, src: String, arch: &'static str) -> Result<Ptx, KernelError> {
    let cache = PTX_CACHE.get_or_init(Default::default);
    let key = (arch, src);
    if let Some(p) = cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
        return Ok(p);
    }
    let opts = CompileOptions {
        arch: Some(arch),
        options: vec!["--std=c++17".into()],
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(key.1.clone(), opts)
        .map_err(|e: CompileError| KernelError::Compile(format!("{name}: {e:?}")))?;
    if let Ok(mut c) = cache.lock() {
        c.insert(key, ptx.clone());
    }
    Ok(ptx)
}

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

/// Whether NVRTC can be loaded on this machine.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to open the shared library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles every source for `arch` (e.g. `compute_90`); the error names the source.
pub fn compile(arch: &'static str) -> Result<Vec<(&'static str, Ptx)>, KernelError> {
    sources()
        .into_iter()
        .map(|(name, src)| compile_one(&format!("{name}.cu"), src, arch).map(|p| (name, p)))
        .collect()
}

/// Why kernels could not be loaded or launched.
#[derive(Debug)]
pub enum KernelError {
    /// NVRTC is missing or rejected a source.
    Compile(String),
    /// The driver failed.
    Driver(DriverError),
    /// Shapes the kernels do not support.
    Unsupported(String),
}

impl std::fmt::Display for KernelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KernelError::Compile(s) => write!(f, "kernel compilation failed: {s}"),
            KernelError::Driver(e) => write!(f, "kernel launch failed: {e}"),
            KernelError::Unsupported(s) => write!(f, "unsupported kernel shape: {s}"),
        }
    }
}

impl std::error::Error for KernelError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            KernelError::Driver(e) => Some(e),
            _ => None,
        }
    }
}

impl From<DriverError> for KernelError {
    fn from(e: DriverError) -> Self {
        KernelError::Driver(e)
    }
}

/// The loaded kernels of one context.
#[derive(Debug)]
pub struct Kernels {
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    arch: &'static str,
    /// Compute capability major version (tensor-core kernels need 8).
    cc_major: i32,
    /// The most dynamic shared memory a block may opt in to.
    max_shared: usize,
    /// Tensor-core flash attention, compiled on first use per (D_K, D_V, configuration).
    fa_mma: Mutex<HashMap<(usize, usize, MmaConfig), CudaFunction>>,
    quantize_q8_0: CudaFunction,
    store_f16: CudaFunction,
    dequantize_q8_0: CudaFunction,
    fattn: CudaFunction,
    fattn_combine: CudaFunction,
    embed: CudaFunction,
    rms_norm: CudaFunction,
    matmul: CudaFunction,
    swiglu: CudaFunction,
    init_weights: CudaFunction,
    init_weights_q8_0: CudaFunction,
}

fn grid(n: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((n as u64).div_ceil(threads as u64).max(1) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Kernels {
    /// Compiles the sources for the context's compute capability and loads them.
    pub fn load(ctx: &Arc<CudaContext>, stream: Arc<CudaStream>) -> Result<Self, KernelError> {
        if !nvrtc_available() {
            return Err(KernelError::Compile("libnvrtc could not be loaded".into()));
        }
        let (major, minor) = ctx.compute_capability()?;
        let arch: &'static str = match (major, minor) {
            (9, _) => "compute_90",
            (8, 9) => "compute_89",
            (8, 6) => "compute_86",
            (8, _) => "compute_80",
            (10, _) => "compute_100",
            (12, _) => "compute_120",
            _ => "compute_75",
        };
        let mut modules = std::collections::HashMap::new();
        for (name, ptx) in compile(arch)? {
            modules.insert(name, ctx.load_module(ptx)?);
        }
        let f = |m: &str, name: &str| modules[m].load_function(name);
        let fattn = f("fattn", "fattn")?;
        let max_smem = crate::fa::shared_bytes(crate::fa::MAX_D_K, crate::fa::MAX_D_V) as i32;
        fattn.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            max_smem,
        )?;
        let max_shared = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
        Ok(Self {
            ctx: ctx.clone(),
            arch,
            cc_major: major,
            max_shared: max_shared.max(0) as usize,
            fa_mma: Mutex::new(HashMap::new()),
            quantize_q8_0: f("quant", "quantize_q8_0")?,
            store_f16: f("quant", "store_f16")?,
            dequantize_q8_0: f("quant", "dequantize_q8_0")?,
            fattn,
            fattn_combine: f("fattn", "fattn_combine")?,
            embed: f("layer", "embed")?,
            rms_norm: f("layer", "rms_norm")?,
            matmul: f("layer", "matmul")?,
            swiglu: f("layer", "swiglu")?,
            init_weights: f("layer", "init_weights")?,
            init_weights_q8_0: f("layer", "init_weights_q8_0")?,
            stream,
        })
    }

    /// The stream every launch goes to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
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
        if p.d_k > crate::fa::MAX_D_K
            || p.d_v > crate::fa::MAX_D_V
            || p.n_head_kv == 0
            || p.n_head % p.n_head_kv != 0
            || p.parallel_blocks == 0
        {
            return Err(KernelError::Unsupported(format!(
                "D_K {} D_V {} heads {}/{} splits {}: head dims up to {}/{}, whole KV groups, at least one split",
                p.d_k, p.d_v, p.n_head, p.n_head_kv, p.parallel_blocks, crate::fa::MAX_D_K, crate::fa::MAX_D_V
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
                p.n_tokens.div_ceil(crate::fa::QUERIES_PER_BLOCK) as u32,
                p.n_head as u32,
                p.parallel_blocks as u32,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: crate::fa::shared_bytes(p.d_k, p.d_v) as u32,
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

    /// Token embeddings into `x`.
    pub fn embed(
        &self,
        tokens: u64,
        x: u64,
        n_tokens: usize,
        n_embd: usize,
    ) -> Result<(), KernelError> {
        let (n, e) = (n_tokens as i32, n_embd as i32);
        let mut b = self.stream.launch_builder(&self.embed);
        b.arg(&tokens).arg(&x).arg(&n).arg(&e);
        // SAFETY: tokens holds n_tokens ints, x n_tokens*n_embd floats.
        unsafe { b.launch(grid(n_tokens * n_embd, 256)) }?;
        Ok(())
    }

    /// RMSNorm of `rows` rows of `n`.
    pub fn rms_norm(
        &self,
        x: u64,
        w: u64,
        y: u64,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> Result<(), KernelError> {
        let nn = n as i32;
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.rms_norm);
        b.arg(&x).arg(&w).arg(&y).arg(&nn).arg(&eps);
        // SAFETY: x, y hold rows*n floats; w n halves.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// y (+)= x . w.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &self,
        x: u64,
        w: u64,
        y: u64,
        m: usize,
        n: usize,
        k: usize,
        accumulate: bool,
    ) -> Result<(), KernelError> {
        let (mm, nn, kk, acc) = (m as i32, n as i32, k as i32, accumulate as i32);
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(64) as u32, m.div_ceil(64) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.matmul);
        b.arg(&x)
            .arg(&w)
            .arg(&y)
            .arg(&mm)
            .arg(&nn)
            .arg(&kk)
            .arg(&acc);
        // SAFETY: x holds m*k floats, w k*n halves, y m*n floats.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// up = silu(gate) · up over `n` floats.
    pub fn swiglu(&self, up: u64, gate: u64, n: usize) -> Result<(), KernelError> {
        let nn = n as i64;
        let mut b = self.stream.launch_builder(&self.swiglu);
        b.arg(&up).arg(&gate).arg(&nn);
        // SAFETY: up and gate hold n floats each.
        unsafe { b.launch(grid(n, 256)) }?;
        Ok(())
    }

    /// Deterministic weights into `n` halves.
    pub fn init_weights(&self, w: u64, n: usize, seed: u32, scale: f32) -> Result<(), KernelError> {
        let nn = n as i64;
        let mut b = self.stream.launch_builder(&self.init_weights);
        b.arg(&w).arg(&nn).arg(&seed).arg(&scale);
        // SAFETY: w holds n halves.
        unsafe { b.launch(grid(n, 256)) }?;
        Ok(())
    }

    /// The same weights as q8_0 blocks: `n` values (a multiple of 32) into `n / 32` blocks.
    pub fn init_weights_q8_0(
        &self,
        w: u64,
        n: usize,
        seed: u32,
        scale: f32,
    ) -> Result<(), KernelError> {
        let nn = n as i64;
        let mut b = self.stream.launch_builder(&self.init_weights_q8_0);
        b.arg(&w).arg(&nn).arg(&seed).arg(&scale);
        // SAFETY: w holds n / 32 q8_0 blocks; one warp per block.
        unsafe { b.launch(grid(n, 256)) }?;
        Ok(())
    }
}
