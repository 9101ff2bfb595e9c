//! The schedule of `llama-sweep-bench -n 1` (the benchmark of the 12 GiB-card prefill that runs
//! out in ggml's legacy pool, docs/llama-cpp.md): at step `k` a one-token decode over the `k`
//! ubatches already in the cache (then removed again), then the next prefill ubatch. With flash attention the engine pads the KV length it attends to to 256.

/// The KV padding of llama.cpp with flash attention (the runtime's own, one constant).
pub const KV_PADDING: usize = cupool_kernels::fa::KV_PAD;

/// What step `k` of a sweep runs (each with one output row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SweepStep {
    /// The decode's padded KV length.
    pub decode_n_kv: usize,
    /// The prefill ubatch's tokens.
    pub prefill_tokens: usize,
    /// The prefill ubatch's padded KV length.
    pub prefill_n_kv: usize,
}

/// Step `k` of a sweep with ubatches of `ubatch` tokens.
pub fn sweep_step(k: usize, ubatch: usize) -> SweepStep {
    let pad = |n: usize| n.div_ceil(KV_PADDING) * KV_PADDING;
    SweepStep {
        decode_n_kv: pad(k * ubatch + 1),
        prefill_tokens: ubatch,
        prefill_n_kv: pad((k + 1) * ubatch),
    }
}
