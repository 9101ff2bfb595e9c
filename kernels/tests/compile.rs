//! Compiles every CUDA source with NVRTC: catches kernel compile errors without a GPU.
//! CI puts the PyPI NVRTC on the library path; without it the test says so and passes.
use cupool_kernels::cuda::{compile, nvrtc_available, sources};

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
        "silu",
        "init_weights",
    ] {
        assert!(
            all.contains(&format!(".entry {entry}(")),
            "{entry} missing from the PTX"
        );
    }
}
