//! From a GGUF header's metadata and tensor infos to the profiles' model description
//! ([`EngineModel`]): the keys are `{arch}.block_count`, `{arch}.embedding_length`, ... as
//! llama.cpp's converter writes them.

use super::arch::GgufArch;
use super::error::GgufError;
use super::file::GgufFile;
use crate::model::{EngineModel, Mla, Moe};
use std::ops::RangeInclusive;

/// The most layers a model may have.
const MAX_LAYERS: usize = 1 << 12;
/// The most attention heads (query or KV) or experts a model may have.
const MAX_HEADS: usize = 1 << 12;
/// The widest a model dimension (embedding, FFN, head, latent rank) may be.
const MAX_WIDTH: usize = 1 << 20;
/// The largest vocabulary.
const MAX_VOCAB: usize = 1 << 24;
/// ik_llama.cpp's `-amb` in llama-cli, llama-server and llama-sweep-bench (MiB); not in the
/// file, so the presets' value.
const DEFAULT_ATTN_MAX_BATCH_MIB: usize = 256;

/// The architecture's keys of one file.
struct Keys<'a> {
    file: &'a GgufFile,
    arch: GgufArch,
}

impl Keys<'_> {
    fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.arch.name())
    }

    /// `{arch}.{name}` if present: an integer in `range`.
    fn opt(&self, name: &str, range: RangeInclusive<usize>) -> Result<Option<usize>, GgufError> {
        let key = self.key(name);
        let Some(v) = self.file.get(&key) else {
            return Ok(None);
        };
        match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
            Some(n) if range.contains(&n) => Ok(Some(n)),
            _ => Err(GgufError::metadata(
                key,
                format!(
                    "{}; accepted is an integer from {} to {}",
                    v.describe(),
                    range.start(),
                    range.end()
                ),
            )),
        }
    }

    /// `{arch}.{name}`, which must be present: an integer in `range`.
    fn req(&self, name: &str, range: RangeInclusive<usize>) -> Result<usize, GgufError> {
        self.opt(name, range.clone())?.ok_or_else(|| {
            GgufError::metadata(
                self.key(name),
                format!(
                    "absent; accepted is an integer from {} to {} (the {} mapping needs it)",
                    range.start(),
                    range.end(),
                    self.arch.name()
                ),
            )
        })
    }
}

/// The profiles' description of the file's model.
pub(crate) fn engine_model(file: &GgufFile, arch: GgufArch) -> Result<EngineModel, GgufError> {
    let k = Keys { file, arch };
    let n_layer = k.req("block_count", 1..=MAX_LAYERS)?;
    let n_embd = k.req("embedding_length", 1..=MAX_WIDTH)?;
    let n_head = k.req("attention.head_count", 1..=MAX_HEADS)?;
    let n_ff = k.req("feed_forward_length", 1..=MAX_WIDTH)?;
    let mut n_head_kv = k
        .opt("attention.head_count_kv", 1..=MAX_HEADS)?
        .unwrap_or(n_head);
    if n_head % n_head_kv != 0 {
        return Err(GgufError::metadata(
            k.key("attention.head_count_kv"),
            format!("{n_head_kv} does not divide the {n_head} query heads; accepted is a divisor"),
        ));
    }
    let (head_dim, mla) = if arch == GgufArch::Deepseek2 {
        // The latent cache is one KV "head" (files converted for MLA say 1 KV head); the
        // graph decompresses it into a K and V per query head.
        n_head_kv = n_head;
        let (head_dim, mla) = latent_attention(&k)?;
        (head_dim, Some(mla))
    } else {
        (head_dim(&k, n_embd, n_head)?, None)
    };
    let (moe, n_dense_lead, n_ff_shared) = experts(&k, n_layer)?;
    Ok(EngineModel {
        arch: arch.graph(),
        n_layer,
        n_embd,
        n_head,
        n_head_kv,
        head_dim,
        n_ff,
        n_vocab: vocab(file, &k)?,
        moe,
        n_dense_lead,
        n_ff_shared,
        mla,
    })
}

/// A head's width: `attention.key_length`, else the embedding split across the heads; V's
/// must equal it (the profiles model one head width).
fn head_dim(k: &Keys, n_embd: usize, n_head: usize) -> Result<usize, GgufError> {
    let dk = match k.opt("attention.key_length", 1..=MAX_WIDTH)? {
        Some(d) => d,
        None if n_embd % n_head == 0 => n_embd / n_head,
        None => {
            return Err(GgufError::metadata(
                k.key("attention.key_length"),
                format!(
                    "absent, and the {n_embd}-wide embedding does not split into {n_head} heads; accepted is a file that gives it"
                ),
            ))
        }
    };
    let dv = k
        .opt("attention.value_length", 1..=MAX_WIDTH)?
        .unwrap_or(dk);
    if dv != dk {
        return Err(GgufError::Unsupported(format!(
            "K heads of {dk} and V heads of {dv}: the profiles model equal K and V heads outside latent attention"
        )));
    }
    Ok(dk)
}

/// DeepSeek's latent attention: a K head's width (rotary part included) and the ranks.
/// Files converted for MLA give the latent widths in `key_length`/`value_length` and the
/// heads' in `key_length_mla`/`value_length_mla`; older files give the heads' in the former.
fn latent_attention(k: &Keys) -> Result<(usize, Mla), GgufError> {
    let (kl, vl) = match k.opt("attention.key_length_mla", 1..=MAX_WIDTH)? {
        Some(d) => (d, "attention.value_length_mla"),
        None => (
            k.req("attention.key_length", 1..=MAX_WIDTH)?,
            "attention.value_length",
        ),
    };
    let v_head = k.req(vl, 1..=MAX_WIDTH)?;
    let rope = k.req("rope.dimension_count", 1..=MAX_WIDTH)?;
    if rope >= kl {
        return Err(GgufError::metadata(
            k.key("rope.dimension_count"),
            format!("{rope}, not below the {kl}-wide K head; accepted is a rotary part narrower than the head"),
        ));
    }
    let mla = Mla {
        q_lora: k.opt("attention.q_lora_rank", 0..=MAX_WIDTH)?.unwrap_or(0),
        kv_lora: k.req("attention.kv_lora_rank", 1..=MAX_WIDTH)?,
        rope,
        v_head,
        attn_max_batch_mib: DEFAULT_ATTN_MAX_BATCH_MIB,
    };
    Ok((kl, mla))
}

/// The experts, the dense layers before them and the shared experts' width.
fn experts(k: &Keys, n_layer: usize) -> Result<(Option<Moe>, usize, usize), GgufError> {
    let n_expert = k.opt("expert_count", 0..=MAX_HEADS)?.unwrap_or(0);
    if !k.arch.has_experts() {
        if n_expert > 0 {
            return Err(GgufError::Unsupported(format!(
                "a {} file with {n_expert} experts: the profiles model {} as dense; their expert models are {}",
                k.arch.name(),
                k.arch.name(),
                [GgufArch::Qwen3Moe, GgufArch::Deepseek2].map(GgufArch::name).join(", ")
            )));
        }
        return Ok((None, 0, 0));
    }
    let n_expert = k.req("expert_count", 1..=MAX_HEADS)?;
    let moe = Moe {
        n_expert,
        n_expert_used: k.req("expert_used_count", 1..=n_expert)?,
        n_ff_exp: k.req("expert_feed_forward_length", 1..=MAX_WIDTH)?,
    };
    let lead = k
        .opt("leading_dense_block_count", 0..=n_layer)?
        .unwrap_or(0);
    let shared = match k.opt("expert_shared_feed_forward_length", 0..=MAX_WIDTH)? {
        Some(w) => w,
        None => k.opt("expert_shared_count", 0..=MAX_HEADS)?.unwrap_or(0) * moe.n_ff_exp,
    };
    Ok((Some(moe), lead, shared))
}

/// The output matrix's rows: `output.weight`'s, else the (tied) embedding's, else the
/// tokenizer's token count, else `{arch}.vocab_size`.
fn vocab(file: &GgufFile, k: &Keys) -> Result<usize, GgufError> {
    let rows = ["output.weight", "token_embd.weight"].iter().find_map(|n| {
        file.tensor(n)
            .filter(|t| t.dims.len() >= 2)
            .map(|t| (n.to_string(), t.dims[1]))
    });
    let tokens = || match file.get("tokenizer.ggml.tokens") {
        Some(super::value::Value::Array { len, .. }) => {
            Some(("tokenizer.ggml.tokens".to_string(), *len))
        }
        _ => None,
    };
    let found = rows.or_else(tokens);
    let (what, n) = match found {
        Some(f) => f,
        None => match k.opt("vocab_size", 1..=MAX_VOCAB)? {
            Some(n) => return Ok(n),
            None => {
                return Err(GgufError::metadata(
                    k.key("vocab_size"),
                    "absent, as are output.weight, token_embd.weight and tokenizer.ggml.tokens; accepted is a file with any of them",
                ))
            }
        },
    };
    usize::try_from(n)
        .ok()
        .filter(|n| (1..=MAX_VOCAB).contains(n))
        .ok_or_else(|| {
            GgufError::metadata(
                what,
                format!("a vocabulary of {n}; accepted are 1 to {MAX_VOCAB}"),
            )
        })
}
