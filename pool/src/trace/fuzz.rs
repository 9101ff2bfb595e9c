//! The trace parser's fuzz entry point (the `trace_parser` cargo-fuzz target and the committed
//! corpus replay call it): arbitrary bytes in, a panic only on a bug.

use crate::{PoolConfig, PoolKind, PurgePolicy};

/// Parses `data`, and replays whatever parses through two pools on a 256 MiB card.
pub fn parser(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(ops) = super::parse(text) else {
        return;
    };
    if ops.len() > 20_000 {
        return;
    }
    for (kind, purge) in [
        (PoolKind::Legacy, PurgePolicy::Auto),
        (PoolKind::Vmm, PurgePolicy::Always),
    ] {
        // Errors (double alloc, unknown free, ...) are fine; panics are not.
        let config = PoolConfig::default().kind(kind);
        let _ = super::replay(&ops, &config, purge, Some(256 << 20));
    }
}
