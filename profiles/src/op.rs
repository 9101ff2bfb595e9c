//! A profile's answer for one op: the buffers it takes from the pool, and in which order (see
//! the crate docs).

/// One buffer an op takes from the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// ggml's name for it where the engine gives one (`K_f16`), else the op's (`MUL_MAT`);
    /// empty where the engine runs the op inside a fused group, which names nothing.
    pub name: &'static str,
    /// Bytes asked for.
    pub bytes: usize,
}

/// A request of `bytes` named `name`.
pub(crate) fn req(name: &'static str, bytes: usize) -> Request {
    Request { name, bytes }
}

/// What an op is, for an engine that runs its own kernels between the requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// A matrix multiply (or a fused pair).
    MatMul,
    /// Flash attention: its held buffers start with `K_f16` and `V_f16` for a quantized cache.
    FlashAttention,
}

/// The pool traffic of one op (see the crate docs for the order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpCall {
    /// What the op is.
    pub kind: OpKind,
    /// Taken in order, returned in reverse at the op's end.
    pub held: Vec<Request>,
    /// Each taken and returned in turn while `held` is live.
    pub inner: Vec<Request>,
    /// Steps of the op that run after `inner` while `held` is live, each with buffers of its
    /// own (ik_llama.cpp's fused expert op: the up/gate results, then the down projection's).
    pub nested: Vec<OpCall>,
    /// How many times the op runs in a row (MLA's head chunks): 1 for most.
    pub repeat: usize,
}

impl OpCall {
    /// An op that holds `held` and takes each of `inner` in turn.
    pub fn new(kind: OpKind, held: Vec<Request>, inner: Vec<Request>) -> Self {
        Self {
            kind,
            held,
            inner,
            nested: vec![],
            repeat: 1,
        }
    }

    /// Request sizes as `Purge::KeepFor` takes them: each held one, the largest inner one,
    /// and those of the nested steps (counted together: at least what the op holds at once).
    pub fn request_bytes(&self) -> Vec<usize> {
        let mut out: Vec<usize> = self.held.iter().map(|r| r.bytes).collect();
        out.extend(self.inner.iter().map(|r| r.bytes).max());
        for n in &self.nested {
            out.extend(n.request_bytes());
        }
        out
    }
}
