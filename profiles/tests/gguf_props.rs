//! Properties of the GGUF reader over random models: any model the writer writes maps back
//! to its shape and exact weight bytes; any strict prefix of a file is an error; random
//! mutations of a file (bytes, and counts or lengths set to extremes) never panic, and what
//! still reads has every tensor inside the file.
mod gguf;

use cupool_profiles::gguf::GgufModel;
use cupool_profiles::{Arch, EngineModel, Mla, Moe};
use gguf::models::{write, Dims};
use gguf::writer::{F16, F32, Q8_0};
use proptest::prelude::*;

const ARCHS: [&str; 5] = ["llama", "phi3", "qwen3", "qwen3moe", "deepseek2"];

/// A random small model of a supported architecture, with its matrix weights' type. Widths
/// are multiples of 32, so q8_0 rows are whole blocks.
fn model() -> impl Strategy<Value = (Dims, u32)> {
    (
        (
            0..5usize,
            1..5u64,
            1..4u64,
            1..4u64,
            1..5u64,
            1..5u64,
            1..5u64,
            1..300u64,
        ),
        (any::<bool>(), 2..9u64, 1..9u64, 1..4u64, 0..5u64, 0..3u64),
        (
            1..4u64,
            1..4u64,
            1..4u64,
            any::<bool>(),
            prop::sample::select(vec![F16, Q8_0, F32]),
        ),
    )
        .prop_map(|(a, b, c)| {
            let (arch, n_layer, n_head_kv, group, hd, e, ff, vocab) = a;
            let (tied, n_expert, used, ff_exp, lead, shared) = b;
            let (q_lora, kv_lora, v_head, mla_mqa, ty) = c;
            let arch = ARCHS[arch];
            let n_head = n_head_kv * group;
            let head_dim = 32 * hd;
            // Llama and Phi-3 files give no head width: it is the embedding over the heads.
            let n_embd = if matches!(arch, "llama" | "phi3") {
                n_head * head_dim
            } else {
                32 * e
            };
            let mut d = Dims::dense(
                arch,
                [n_layer, n_embd, n_head, n_head_kv, head_dim, 32 * ff, vocab],
            );
            d.tied = tied;
            d.key_length = arch.starts_with("qwen3");
            if matches!(arch, "qwen3moe" | "deepseek2") {
                d.moe = Some((n_expert, used.min(n_expert), 32 * ff_exp));
            }
            if arch == "deepseek2" {
                d.n_head_kv = n_head;
                // A K head of rope 32 plus a part without (at least 32).
                d.head_dim = 32 + head_dim;
                d.n_dense_lead = lead.min(n_layer);
                d.n_shared_experts = shared;
                d.mla = Some((32 * q_lora, 32 * kv_lora, 32, 32 * v_head));
                d.mla_mqa = mla_mqa;
            }
            (d, ty)
        })
}

/// The profiles' description of `d`, stated from the model's numbers.
fn expected(d: &Dims) -> EngineModel {
    let u = |x: u64| x as usize;
    EngineModel {
        arch: match d.arch {
            "phi3" => Arch::Phi3,
            "qwen3moe" => Arch::Qwen3Moe,
            _ => Arch::Llama,
        },
        n_layer: u(d.n_layer),
        n_embd: u(d.n_embd),
        n_head: u(d.n_head),
        n_head_kv: u(d.n_head_kv),
        head_dim: u(d.head_dim),
        n_ff: u(d.n_ff),
        n_vocab: u(d.n_vocab),
        moe: d.moe.map(|(n, used, ff)| Moe {
            n_expert: u(n),
            n_expert_used: u(used),
            n_ff_exp: u(ff),
        }),
        n_dense_lead: u(d.n_dense_lead),
        n_ff_shared: u(d.n_shared_experts * d.moe.map_or(0, |m| m.2)),
        mla: d.mla.map(|(q_lora, kv_lora, rope, v_head)| Mla {
            q_lora: u(q_lora),
            kv_lora: u(kv_lora),
            rope: u(rope),
            v_head: u(v_head),
            attn_max_batch_mib: 256,
        }),
    }
}

/// A mutation: a byte set, or an 8-byte field (a count, a length, a dimension or an offset,
/// wherever it starts) set to an extreme.
#[derive(Clone, Debug)]
enum Mutation {
    Byte(usize, u8),
    Field(usize, u64),
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    let extreme = prop::sample::select(vec![
        0,
        1,
        63,
        64,
        1 << 20,
        1 << 40,
        i64::MAX as u64,
        u64::MAX,
    ]);
    prop::collection::vec(
        prop_oneof![
            (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Byte(i, b)),
            (any::<usize>(), extreme).prop_map(|(i, v)| Mutation::Field(i, v)),
        ],
        1..6,
    )
}

/// Reads `bytes` as a whole file and as the start of a 1 TiB file; checks what reads.
fn read_checked(bytes: &[u8]) {
    for len in [bytes.len() as u64, 1 << 40] {
        if let Ok(m) = GgufModel::from_bytes(bytes, len) {
            for t in &m.file.tensors {
                let end = m.file.data_offset + t.offset + t.bytes;
                assert!(end <= len, "tensor {:?} ends at {end}, past {len}", t.name);
            }
            let model = m.to_model();
            assert_eq!(model.n_head % model.n_head_kv, 0);
            assert!(m.file.data_offset <= len);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn a_written_model_maps_back_to_its_shape((d, ty) in model(), tokens in any::<bool>()) {
        let w = write(&d, ty, tokens);
        let (header, len) = w.header();
        let m = GgufModel::from_bytes(&header, len).unwrap_or_else(|e| panic!("{d:?}: {e}"));
        prop_assert_eq!(m.to_model(), expected(&d));
        prop_assert_eq!(m.weight_bytes, w.tensor_bytes());
        prop_assert_eq!(m.weight_type.id(), ty);
    }

    #[test]
    fn a_strict_prefix_is_an_error((d, ty) in model(), cut in any::<prop::sample::Index>()) {
        let file = write(&d, ty, false).file();
        let n = cut.index(file.len());
        prop_assert!(GgufModel::from_bytes(&file[..n], n as u64).is_err());
    }

    #[test]
    fn mutations_never_panic((d, ty) in model(), muts in mutations(), cut in any::<prop::sample::Index>()) {
        let (mut bytes, _) = write(&d, ty, true).header();
        for m in &muts {
            match *m {
                Mutation::Byte(i, b) => {
                    let n = bytes.len();
                    bytes[i % n] = b;
                }
                Mutation::Field(i, v) => {
                    let at = i % (bytes.len() - 8);
                    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        read_checked(&bytes);
        read_checked(&bytes[..cut.index(bytes.len())]);
    }
}
