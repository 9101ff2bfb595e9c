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

    /// The most bytes the op holds at once, each request rounded up to a multiple of `align`
    /// (a power of two): its held buffers, and over them the largest inner buffer or nested
    /// step (they run one after another, each returning what it took).
    pub fn high_water(&self, align: usize) -> usize {
        let round = |b: usize| b.next_multiple_of(align.max(1));
        let held: usize = self.held.iter().map(|r| round(r.bytes)).sum();
        let inner = self.inner.iter().map(|r| round(r.bytes)).max().unwrap_or(0);
        let nested = self
            .nested
            .iter()
            .map(|n| n.high_water(align))
            .max()
            .unwrap_or(0);
        held + inner.max(nested)
    }

    /// How many sizes [`OpCall::request_bytes`] lists, without listing them.
    pub fn request_count(&self) -> usize {
        self.held.len()
            + usize::from(!self.inner.is_empty())
            + self.nested.iter().map(OpCall::request_count).sum::<usize>()
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
