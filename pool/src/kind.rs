//! The pool kinds: the one list of them.
//!
//! A kind is a placement over an upstream ([`crate::pools`]). Adding one is a placement file,
//! one line in the table below and its arm in `PoolConfig::build` (an exhaustive match, so
//! the compiler asks for it); parsing, `GGML_POOL`, the error listing the names and the
//! operation-sequence checker all read this table. This module imports nothing of the crate,
//! so every layer can name a kind.

use std::fmt;

macro_rules! pool_kinds {
    ($( $(#[$doc:meta])* $kind:ident = $name:literal; )+) => {
        /// Which pool.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum PoolKind {
            $( $(#[$doc])* $kind, )+
        }

        impl PoolKind {
            /// Every kind, in the table's order.
            pub const ALL: &'static [PoolKind] = &[$(PoolKind::$kind),+];

            /// The name `GGML_POOL` uses.
            pub fn name(self) -> &'static str {
                match self { $(PoolKind::$kind => $name,)+ }
            }
        }
    };
}

pool_kinds! {
    /// Reserve address space once, map physical memory as it grows.
    Vmm = "vmm";
    /// ggml's best-fit cache of device allocations.
    Legacy = "legacy";
    /// The legacy policy on managed memory (ggml's `GGML_CUDA_POOL_USE_MANAGED`).
    Managed = "managed";
    /// PyTorch's native caching allocator, to show what it would reserve for a trace.
    Torch = "torch";
    /// No cache: each request its own device allocation, freed at once (under a caching layer
    /// such as PyTorch's `MemPool`).
    Direct = "direct";
    /// No cache: each request its own VMM allocation made as `ncclMemAlloc` makes it (one
    /// physical handle, mapped for every peer), released when freed; for a `torch.cuda.MemPool`
    /// registered with NCCL.
    Nccl = "nccl";
}

impl PoolKind {
    /// The names `GGML_POOL` accepts, comma-separated.
    pub fn names() -> String {
        Self::ALL
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Parses a `GGML_POOL` value (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        Self::ALL
            .iter()
            .copied()
            .find(|k| k.name().eq_ignore_ascii_case(s))
    }
}

impl fmt::Display for PoolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
