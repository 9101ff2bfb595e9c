//! The kernel sources and their NVRTC compilation, cached per process by (architecture, source).

use super::KernelError;
use crate::fa::MmaConfig;
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions, Ptx};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

const COMMON: &str = include_str!("common.cuh");

/// The kernel sources: (module name, full source with the shared header).
pub fn sources() -> Vec<(&'static str, String)> {
    [
        ("quant", include_str!("quant.cu")),
        ("fattn", include_str!("fattn.cu")),
        ("layer", include_str!("layer.cu")),
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
        include_str!("fattn_mma.cu"),
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
