//! The worst-case graph llama.cpp reserves its compute buffers with (`llama_context::sched_reserve`:
//! a full ubatch of `n_ubatch` tokens, every one an output, the KV cache at its full padded
//! length), built as mainline 0c1e5709's `llm_build_llama` (`src/models/llama.cpp`),
//! `llm_build_phi3` (`src/models/phi3.cpp`) and qwen3moe's graph (`src/models/qwen3moe.cpp`:
//! llama's attention with an RMS norm over each Q and K head before RoPE, the experts of
//! `moe.rs` for the FFN) build it with flash attention: the same tensors, sources in the same
//! order and the same `ggml_build_forward_expand` calls (the embedding, then per layer Q, V and
//! K, the two cache writes and attention, the experts' two; the rest reached from the logits),
//! so that the nodes come in the engine's order.
//!
//! Placement: the token embedding's row lookup stays on the CPU (its weights are there and
//! CUDA declines to offload GET_ROWS); each layer's weights and cache on its device, the output
//! layer's on the output device; each layer's attention norm pinned to the layer's device
//! (`graph_get_cb`'s "norm" with every layer offloaded).

use super::cgraph::{Ctx, Home, Op, Ty};
use super::Version;
use crate::model::{Arch, EngineModel};
use crate::sweep::KV_PADDING;
use cupool_kernels::KvType;

/// Where the layers run.
pub(crate) struct Placement {
    /// CUDA devices.
    pub n_gpus: usize,
    /// The device of each repeating layer.
    pub layer_dev: Vec<usize>,
    /// The device of the output layer.
    pub output_dev: usize,
}

struct B<'a> {
    c: Ctx,
    v: Version,
    m: &'a EngineModel,
    kv: KvType,
    n: usize,
    n_kv: usize,
}

const W: Ty = Ty::F16; // weights' type: only their device matters here

impl B<'_> {
    fn weight(&mut self, dev: usize, ne: [usize; 4]) -> usize {
        self.c.new_tensor(Home::Weight(dev), W, ne)
    }

    /// `build_norm` (RMS, with a weight); the plain norm pinned to `dev` for a layer's norms.
    fn norm(&mut self, x: usize, dev: usize, pin: bool) -> usize {
        let e = self.m.n_embd;
        let r = self.c.unary(Op::RmsNorm, x, &[x]);
        if pin {
            self.c.t[r].backend = Some(dev);
        }
        let w = self.weight(dev, [e, 1, 1, 1]);
        self.c.unary(Op::Mul, r, &[r, w])
    }

    fn mm(&mut self, dev: usize, rows: usize, x: usize) -> usize {
        let cols = self.c.t[x].ne[0];
        let w = self.weight(dev, [cols, rows, 1, 1]);
        self.c.mul_mat(w, x)
    }

    /// qwen3moe's `build_norm` of each Q or K head: an RMS norm (named "norm", so pinned to
    /// the layer's device) and a weight of one head.
    fn head_norm(&mut self, x: usize, dev: usize) -> usize {
        let r = self.c.unary(Op::RmsNorm, x, &[x]);
        self.c.t[r].backend = Some(dev);
        let w = self.weight(dev, [self.m.head_dim, 1, 1, 1]);
        self.c.unary(Op::Mul, r, &[r, w])
    }

    /// `llama_mul_mat_hadamard` of a contiguous `x` by the rotation `rot` (`nrot` square).
    fn hadamard(&mut self, x: usize, rot: usize, nrot: usize) -> usize {
        let ne = self.c.t[x].ne;
        let all = ne.iter().product::<usize>();
        let r = self.c.reshape(x, [nrot, all / nrot, 1, 1]);
        let y = self.c.mul_mat(rot, r);
        self.c.reshape(y, ne)
    }

    /// The flash-attention node: f32 `[head, heads, tokens]`, plus (the copies in the buffer,
    /// a quantized cache) the f16 copies of K and V over the whole cache, each 128-aligned.
    fn flash_attn(&mut self, q: usize, k: usize, vv: usize, mask: usize) -> usize {
        let (hd, nh) = (self.m.head_dim, self.m.n_head);
        let fa = self.c.op(
            Op::FlashAttn,
            Ty::F32,
            [hd, nh, self.n, 1],
            &[q, k, vv, mask],
        );
        if self.v == Version::D99724f2 && self.kv != KvType::F16 {
            let one = self.n_kv * self.m.kv_dim() * 2;
            let out = self.c.t[fa].nbytes().div_ceil(128) * 128;
            self.c.t[fa].alloc_size = Some(out + one.div_ceil(128) * 128 + one);
        }
        fa
    }
}

/// The reserve graph of a dense llama or phi3 model, or of a qwen3moe model.
pub(crate) fn build(
    v: Version,
    m: &EngineModel,
    kv: KvType,
    n_ctx: usize,
    n_ubatch: usize,
    p: &Placement,
) -> Ctx {
    let n = n_ubatch;
    let n_kv = n_ctx.div_ceil(KV_PADDING) * KV_PADDING;
    let mut b = B {
        c: Ctx::default(),
        v,
        m,
        kv,
        n,
        n_kv,
    };
    let (e, hd, nh, nkv) = (m.n_embd, m.head_dim, m.n_head, m.n_head_kv);
    let cpu = p.n_gpus;
    // build_inp_embd: the row lookup on the CPU, the unused embeddings input beside it
    let tok = b.c.input(Ty::I32, [n, 1, 1, 1]);
    let tok_embd = b.c.new_tensor(Home::Weight(cpu), W, [e, m.n_vocab, 1, 1]);
    let embd = b.c.op(Op::GetRows, Ty::F32, [e, n, 1, 1], &[tok_embd, tok]);
    b.c.expand(embd);
    let inp_embd = b.c.input(Ty::F32, [e, n, 1, 1]);
    b.c.expand(inp_embd);
    let pos = b.c.input(Ty::I32, [n, 1, 1, 1]);
    let k_idxs = b.c.input(Ty::I64, [n, 1, 1, 1]);
    let v_idxs = b.c.input(Ty::I64, [n, 1, 1, 1]);
    let mask = b.c.input(Ty::F16, [n_kv, n, 1, 1]);
    // A quantized cache with heads of a multiple of 64 is rotated (`attn_rot_k`, `attn_rot_v`):
    // K by the largest power of two dividing a head, V by 64.
    let rot = kv != KvType::F16 && hd % 64 == 0;
    let k_nrot = 1 << hd.trailing_zeros();
    let k_rot = rot.then(|| b.c.input(Ty::F32, [k_nrot, k_nrot, 1, 1]));
    let v_rot = rot.then(|| b.c.input(Ty::F32, [64, 64, 1, 1]));
    let out_ids = b.c.input(Ty::I32, [n, 1, 1, 1]);
    let mut inp_l = embd;
    for (il, &dev) in p.layer_dev.iter().enumerate() {
        let inp_sa = inp_l;
        let cur = b.norm(inp_l, dev, true);
        let (q, k, vc) = match m.arch {
            Arch::Phi3 => {
                let (qd, kd) = (m.q_dim(), m.kv_dim());
                let qkv = b.mm(dev, qd + 2 * kd, cur);
                let rs = b.c.t[qkv].nb[1];
                // Q, K and V as views of the fused result (their offsets do not matter to
                // the allocator, which never places a view)
                let view = |b: &mut B, heads: usize| {
                    b.c.view(Op::View, qkv, [hd, heads, n, 1], [4, hd * 4, rs, rs * n])
                };
                let qv = view(&mut b, nh);
                let kv_ = view(&mut b, nkv);
                let vv = view(&mut b, nkv);
                let q = b.c.unary(Op::Rope, qv, &[qv, pos]);
                let k = b.c.unary(Op::Rope, kv_, &[kv_, pos]);
                let q = b.c.unary(Op::Scale, q, &[q]);
                (q, k, vv)
            }
            _ => {
                let q = b.mm(dev, m.q_dim(), cur);
                let q = b.c.reshape(q, [hd, nh, n, 1]);
                let k = b.mm(dev, m.kv_dim(), cur);
                let k = b.c.reshape(k, [hd, nkv, n, 1]);
                let vc = b.mm(dev, m.kv_dim(), cur);
                let vc = b.c.reshape(vc, [hd, nkv, n, 1]);
                let (q, k) = match m.arch {
                    Arch::Qwen3Moe => (b.head_norm(q, dev), b.head_norm(k, dev)),
                    _ => (q, k),
                };
                let q = b.c.unary(Op::Rope, q, &[q, pos]);
                let k = b.c.unary(Op::Rope, k, &[k, pos]);
                (q, k, vc)
            }
        };
        let (q, k, vc) = match (k_rot, v_rot) {
            (Some(kr), Some(vr)) => (
                b.hadamard(q, kr, k_nrot),
                b.hadamard(k, kr, k_nrot),
                b.hadamard(vc, vr, 64),
            ),
            _ => (q, k, vc),
        };
        b.c.expand(q);
        b.c.expand(vc);
        b.c.expand(k);
        // the cache writes: rows of K and V set into views of the cache
        let kcache =
            b.c.new_tensor(Home::Cache(dev), Ty::F16, [m.kv_dim(), n_kv, 1, 1]);
        let vcache =
            b.c.new_tensor(Home::Cache(dev), Ty::F16, [m.kv_dim(), n_kv, 1, 1]);
        for (cache, x, idx) in [(kcache, k, k_idxs), (vcache, vc, v_idxs)] {
            let nb2 = b.c.t[x].nb[2];
            let x2 = b.c.view(
                Op::View,
                x,
                [m.kv_dim(), n, 1, 1],
                [4, nb2, nb2 * n, nb2 * n],
            );
            let set = b.c.view(
                Op::SetRows,
                cache,
                [m.kv_dim(), n_kv, 1, 1],
                b.c.t[cache].nb,
            );
            b.c.t[set].src = vec![cache, x2, idx];
            b.c.expand(set);
        }
        let kview = b.c.view(
            Op::View,
            kcache,
            [hd, nkv, n_kv, 1],
            [2, hd * 2, hd * nkv * 2, 0],
        );
        let vview = b.c.view(
            Op::View,
            vcache,
            [hd, nkv, n_kv, 1],
            [2, hd * 2, hd * nkv * 2, 0],
        );
        // build_attn_mha
        let qnb = b.c.t[q].nb;
        let q4 = b.c.view(Op::View, q, [hd, nh, n, 1], qnb);
        let qp = b.c.permute_0213(q4);
        let kp = b.c.permute_0213(kview);
        let vp = b.c.permute_0213(vview);
        let fa = b.flash_attn(qp, kp, vp, mask);
        let mut cur = b.c.reshape(fa, [m.q_dim(), n, 1, 1]);
        b.c.expand(cur);
        if let Some(vr) = v_rot {
            cur = b.hadamard(cur, vr, 64);
        }
        let mut cur = b.mm(dev, e, cur);
        let mut res = inp_sa;
        if il + 1 == p.layer_dev.len() {
            cur = b.c.op(Op::GetRows, Ty::F32, [e, n, 1, 1], &[cur, out_ids]);
            res = b.c.op(Op::GetRows, Ty::F32, [e, n, 1, 1], &[res, out_ids]);
        }
        let ffn_inp = b.c.unary(Op::Add, cur, &[cur, res]);
        let cur = b.norm(ffn_inp, dev, true);
        let ffn = match (m.arch, m.moe) {
            (_, Some(moe)) => super::moe::ffn(&mut b.c, moe, dev, cur),
            (Arch::Phi3, None) => {
                let up = b.mm(dev, 2 * m.n_ff, cur);
                let glu = b.c.op(Op::Glu, Ty::F32, [m.n_ff, n, 1, 1], &[up]);
                b.mm(dev, e, glu)
            }
            (_, None) => {
                let up = b.mm(dev, m.n_ff, cur);
                let gate = b.mm(dev, m.n_ff, cur);
                let glu = b.c.unary(Op::Glu, gate, &[gate, up]);
                b.mm(dev, e, glu)
            }
        };
        inp_l = match m.arch {
            Arch::Phi3 => b.c.unary(Op::Add, ffn_inp, &[ffn_inp, ffn]),
            _ => b.c.unary(Op::Add, ffn, &[ffn, ffn_inp]),
        };
    }
    let norm = b.norm(inp_l, p.output_dev, false);
    b.c.t[norm].output = true;
    let logits = b.mm(p.output_dev, m.n_vocab, norm);
    b.c.t[logits].output = true;
    b.c.expand(logits);
    b.c
}
