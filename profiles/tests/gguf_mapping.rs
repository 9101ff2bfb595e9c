//! GGUF files written from the tests (a tiny writer in tests/gguf) map to the profiles' model
//! description: a file with a preset's metadata and tensors maps to that preset, its weight
//! bytes are the sum of its tensors' real sizes, and only its header region is read.
mod gguf;

use cupool_kernels::KvType;
use cupool_profiles::gguf::{GgmlType, GgufArch, GgufError, GgufModel, SUPPORTED_ARCHS};
use cupool_profiles::{Arch, Device, EngineModel, Weights};
use gguf::models::{write, Dims};
use gguf::writer::{Writer, BF16, F16, Q4_K, Q6_K, Q8_0};
use std::io::{self, Read};

/// The presets' numbers as the models' configs give them, with their parameter counts as
/// published (DeepSeek-V3's without its multi-token-prediction layer, which GGUFs leave out).
fn presets() -> Vec<(&'static str, Dims, u64)> {
    let mut qwen = Dims::dense("qwen3moe", [48, 2048, 32, 4, 128, 6144, 151936]);
    qwen.key_length = true;
    qwen.moe = Some((128, 8, 768));
    let mut ds = Dims::dense("deepseek2", [61, 7168, 128, 128, 192, 18432, 129280]);
    ds.moe = Some((256, 8, 2048));
    ds.n_dense_lead = 3;
    ds.n_shared_experts = 1;
    ds.mla = Some((1536, 512, 64, 128));
    let mut ds_mqa = ds.clone();
    ds_mqa.mla_mqa = true;
    vec![
        (
            "phi3-mini",
            Dims::dense("phi3", [32, 3072, 32, 32, 96, 8192, 32064]),
            3_821_079_552,
        ),
        (
            "llama3-8b",
            Dims::dense("llama", [32, 4096, 32, 8, 128, 14336, 128256]),
            8_030_261_248,
        ),
        ("qwen3-30b-a3b", qwen, 30_532_122_624),
        ("deepseek-v3", ds, 671_026_419_200),
        ("deepseek-v3", ds_mqa, 671_026_419_200),
    ]
}

#[test]
fn a_file_with_a_presets_metadata_maps_to_the_preset() {
    for (name, dims, params) in presets() {
        for (ty, weights) in [(F16, Weights::F16), (Q8_0, Weights::Q8_0)] {
            let w = write(&dims, ty, true);
            assert_eq!(w.elements(), params, "{name}: the test's tensor list");
            let (header, len) = w.header();
            let m = GgufModel::from_bytes(&header, len).unwrap_or_else(|e| panic!("{name}: {e}"));
            let preset = EngineModel::preset(name).unwrap();
            assert_eq!(m.to_model(), preset, "{name} ({})", dims.arch);
            assert_eq!(m.arch.name(), dims.arch);
            assert_eq!(m.weights().unwrap(), weights, "{name}");
            assert_eq!(m.weight_bytes, w.tensor_bytes(), "{name}");
            assert_eq!(m.file.data_offset, header.len() as u64);
            assert_eq!(
                m.name.as_deref(),
                Some(format!("test {}", dims.arch).as_str())
            );
            let setup = m.to_setup(KvType::F16, Device::H100_SXM).unwrap();
            assert_eq!((setup.model, setup.weights), (preset, weights));
        }
    }
}

#[test]
fn qwen3_dense_takes_its_head_width_from_key_length() {
    // Qwen3-0.6B: 16 heads of 128 over a 1024-wide embedding, tied output.
    let mut d = Dims::dense("qwen3", [28, 1024, 16, 8, 128, 3072, 151936]);
    d.key_length = true;
    d.tied = true;
    let w = write(&d, BF16, true);
    let (header, len) = w.header();
    let m = GgufModel::from_bytes(&header, len).unwrap();
    let want = EngineModel {
        arch: Arch::Llama,
        n_layer: 28,
        n_embd: 1024,
        n_head: 16,
        n_head_kv: 8,
        head_dim: 128,
        n_ff: 3072,
        n_vocab: 151936,
        moe: None,
        n_dense_lead: 0,
        n_ff_shared: 0,
        mla: None,
    };
    assert_eq!(m.to_model(), want);
    assert_eq!(m.arch, GgufArch::Qwen3);
    // The embedding is the output matrix but not a matmul weight: bf16 is still dominant.
    assert_eq!(m.weight_type, GgmlType::Bf16);
    let e = m.weights().unwrap_err().to_string();
    assert!(e.contains("bf16") && e.contains("f16 and q8_0"), "{e}");
}

#[test]
fn a_mixed_quantization_counts_each_tensors_real_size() {
    // Like a Q4_K_M file: q4_K matrices, q6_K for the output and half the down projections.
    let mut w = Writer::new();
    w.str("general.architecture", "llama");
    for (k, v) in [
        ("llama.block_count", 4),
        ("llama.embedding_length", 512),
        ("llama.feed_forward_length", 1536),
        ("llama.attention.head_count", 8),
        ("llama.attention.head_count_kv", 2),
    ] {
        w.u32(k, v);
    }
    w.tensor("token_embd.weight", &[512, 1024], Q4_K)
        .tensor("output.weight", &[512, 1024], Q6_K);
    for l in 0..4 {
        let t = |s: &str| format!("blk.{l}.{s}.weight");
        w.tensor(&t("attn_norm"), &[512], gguf::writer::F32);
        for (n, dims) in [
            ("attn_q", [512, 512]),
            ("attn_k", [512, 128]),
            ("attn_v", [512, 128]),
        ] {
            w.tensor(&t(n), &dims, Q4_K);
        }
        w.tensor(&t("attn_output"), &[512, 512], Q4_K)
            .tensor(&t("ffn_gate"), &[512, 1536], Q4_K)
            .tensor(&t("ffn_up"), &[512, 1536], Q4_K)
            .tensor(
                &t("ffn_down"),
                &[1536, 512],
                if l % 2 == 0 { Q6_K } else { Q4_K },
            );
    }
    let file = w.file();
    let m = GgufModel::from_bytes(&file, file.len() as u64).unwrap();
    assert_eq!(m.weight_type, GgmlType::Q4K);
    assert_eq!(m.weight_bytes, w.tensor_bytes());
    assert_eq!(m.to_model().n_vocab, 1024);
    assert_eq!(m.to_model().head_dim, 64);
    let e = m.weights().unwrap_err().to_string();
    assert!(e.contains("q4_K"), "{e}");
}

/// A reader that fails on any read: what follows the header region.
struct NoData;
impl Read for NoData {
    fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
        Err(io::Error::other("a tensor data byte was read"))
    }
}

#[test]
fn only_the_header_region_is_read() {
    let (_, dims, _) = presets().remove(3);
    let w = write(&dims, Q8_0, true);
    let (header, len) = w.header();
    // The header up to its last tensor info, then a reader that fails: a read of the padding
    // or of any tensor data byte is an error.
    let (infos, _) = w.unpadded();
    let f = cupool_profiles::gguf::GgufFile::from_reader(io::Cursor::new(infos).chain(NoData), len)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(f.data_offset, header.len() as u64);
    // A whole file of hundreds of GB, read through a path: a sparse file of that length.
    let path = std::env::temp_dir().join(format!("cupool-gguf-{}.gguf", std::process::id()));
    std::fs::write(&path, &header).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    if f.set_len(len).is_ok() {
        let m = GgufModel::read(&path).unwrap();
        assert_eq!(m.to_model(), EngineModel::preset("deepseek-v3").unwrap());
        assert_eq!(m.weight_bytes, w.tensor_bytes());
        assert_eq!(m.file.file_len, len);
    } else {
        eprintln!("this file system holds no sparse file of {len} bytes: skipped");
    }
    drop(f);
    std::fs::remove_file(&path).unwrap();
    let missing = GgufModel::read(&path).unwrap_err();
    assert!(matches!(missing, GgufError::Io { .. }), "{missing}");
    assert!(std::error::Error::source(&missing).is_some());
}

#[test]
fn an_unsupported_architecture_names_the_supported_ones() {
    let mut d = Dims::dense("gemma3", [2, 64, 4, 4, 16, 128, 64]);
    d.key_length = true;
    let file = write(&d, F16, true).file();
    let e = GgufModel::from_bytes(&file, file.len() as u64).unwrap_err();
    assert!(
        matches!(&e, GgufError::UnsupportedArch { arch } if arch == "gemma3"),
        "{e}"
    );
    let msg = e.to_string();
    for a in SUPPORTED_ARCHS {
        assert!(msg.contains(a), "{msg}");
    }
    assert_eq!(
        SUPPORTED_ARCHS.to_vec(),
        GgufArch::ALL.map(GgufArch::name).to_vec()
    );
}

#[test]
fn a_missing_or_bad_key_is_named() {
    let d = Dims::dense("llama", [2, 64, 4, 4, 16, 128, 64]);
    for (drop_key, bad) in [
        ("llama.block_count", None),
        ("llama.attention.head_count", None),
        ("llama.feed_forward_length", None),
        ("llama.attention.head_count_kv", Some(3u32)),
        ("llama.embedding_length", Some(0)),
    ] {
        let mut w = Writer::new();
        let full = write(&d, F16, false);
        // Copy the metadata but the key (or give it the bad value), keep the tensors.
        let bytes = full.file();
        let f = cupool_profiles::gguf::GgufFile::from_bytes(&bytes, bytes.len() as u64).unwrap();
        for (k, v) in &f.metadata {
            if k == drop_key {
                if let Some(b) = bad {
                    w.u32(k, b);
                }
                continue;
            }
            match v {
                cupool_profiles::gguf::Value::String(s) => w.str(k, s),
                v => match v.as_u64() {
                    Some(n) => w.u64(k, n),
                    None => w.f32(k, 1e-5),
                },
            };
        }
        for t in &f.tensors {
            w.tensor(&t.name, &t.dims, t.ty.id());
        }
        let file = w.file();
        let e = GgufModel::from_bytes(&file, file.len() as u64).unwrap_err();
        assert!(
            matches!(&e, GgufError::Metadata { key, .. } if key == drop_key),
            "{drop_key}: {e}"
        );
        assert!(e.to_string().contains("accepted"), "{e}");
    }
}

#[test]
fn an_unknown_type_names_its_id() {
    let mut w = Writer::new();
    w.str("general.architecture", "llama");
    w.tensor("token_embd.weight", &[32, 4], F16);
    let mut file = w.file();
    // The type field is 12 bytes before the tensor info's end (then the u64 offset).
    let at = file
        .windows(4 + 8)
        .rposition(|x| x == [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
        .unwrap();
    file[at] = 41;
    let e = GgufModel::from_bytes(&file, file.len() as u64).unwrap_err();
    assert!(matches!(&e, GgufError::UnknownType { id: 41, .. }), "{e}");
    assert!(
        e.to_string().contains("41") && e.to_string().contains("q8_0"),
        "{e}"
    );
}
