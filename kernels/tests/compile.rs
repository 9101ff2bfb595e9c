//! Compiles every CUDA source with NVRTC: catches kernel compile errors without a GPU.
//! CI puts the PyPI NVRTC on the library path. Without NVRTC the tests fail, naming what to
//! install, unless `CUPOOL_SKIP_NVRTC=1` says the developer means to skip them.
use cupool_kernels::cuda::{compile, compile_fa_mma, fa_mma_entry, nvrtc_available, sources};
use cupool_kernels::fa::{mma_candidates, MMA_SHAPES};

/// False where NVRTC loads. Without it: true (skip) only under `CUPOOL_SKIP_NVRTC=1`, else the
/// test fails, so a machine that cannot compile the kernels never passes for one that did.
fn skip_without_nvrtc() -> bool {
    if nvrtc_available() {
        return false;
    }
    let how = "libnvrtc not found: `pip install 'nvidia-cuda-nvrtc==13.0.*'` and put its lib folder \
               (site-packages/nvidia/cu13/lib) on LD_LIBRARY_PATH, or set CUPOOL_SKIP_NVRTC=1 to skip";
    assert!(
        std::env::var("CUPOOL_SKIP_NVRTC").is_ok_and(|v| v == "1"),
        "{how}"
    );
    eprintln!("skipped on request (CUPOOL_SKIP_NVRTC): {how}");
    true
}

#[test]
fn every_kernel_source_compiles_for_hopper() {
    if skip_without_nvrtc() {
        return;
    }
    let ptx = compile("compute_90").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ptx.len(), sources().len());
    let all: String = ptx.iter().map(|(_, p)| p.to_src()).collect();
    for entry in [
        "quantize_q8_0",
        "store_f16",
        "dequantize_q8_0",
        "fattn",
        "fattn_combine",
        "embed",
        "rms_norm",
        "matmul",
        "swiglu",
        "init_weights",
        "init_weights_q8_0",
    ] {
        assert!(
            all.contains(&format!(".entry {entry}(")),
            "{entry} missing from the PTX"
        );
    }
}

#[test]
fn every_tensor_core_flash_attention_shape_compiles() {
    if skip_without_nvrtc() {
        return;
    }
    for &(d_k, d_v, _) in MMA_SHAPES {
        for c in mma_candidates(d_k, d_v) {
            for arch in ["compute_80", "compute_90"] {
                let ptx = compile_fa_mma(arch, d_k, d_v, c).unwrap_or_else(|e| panic!("{e}"));
                let entry = fa_mma_entry(d_k, d_v);
                assert!(
                    ptx.to_src().contains(&format!(".entry {entry}(")),
                    "{entry} missing from the PTX"
                );
            }
        }
    }
}
