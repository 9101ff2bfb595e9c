//! Compiles every CUDA source with NVRTC: catches kernel compile errors without a GPU.
//! CI puts the PyPI NVRTC on the library path; without it the test says so and passes.
use cupool_kernels::cuda::{compile, compile_fa_mma, fa_mma_entry, nvrtc_available, sources};
use cupool_kernels::fa::{mma_candidates, MMA_SHAPES};

#[test]
fn every_kernel_source_compiles_for_hopper() {
    if !nvrtc_available() {
        eprintln!("skipped: libnvrtc not found (install nvidia-cuda-nvrtc and put its lib folder on LD_LIBRARY_PATH)");
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
    if !nvrtc_available() {
        eprintln!("skipped: libnvrtc not found");
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
