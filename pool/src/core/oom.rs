//! The out-of-memory report every pool gives: the request, the pool's state, the device's, the
//! cause and one line of advice in the pool's own terms (layers above add theirs).

use crate::driver::{Driver, MemInfo};
use crate::error::OomReport;
use crate::kind::PoolKind;
use crate::stats::PoolStats;

pub(super) fn report(
    driver: &dyn Driver,
    kind: PoolKind,
    requested: usize,
    stats: &PoolStats,
    stranded: usize,
    cause: String,
) -> OomReport {
    let device: Option<MemInfo> = driver.mem_info().ok();
    let suggestion = if stranded > 0 {
        format!(
            "{:.1} MiB of this pool's cache is too small for the request: purge it after a synchronize (repro-prefill --purge auto; in the library Purge::SmallerThan or Purge::KeepFor, or LegacyConfig::flush_and_retry)",
            stranded as f64 / (1u64 << 20) as f64
        )
    } else if kind == PoolKind::Managed {
        "managed memory is kept within the device's free memory, counting every managed allocation on the device; allow oversubscription explicitly only if you accept paging (and the risk of hanging the GPU)".to_string()
    } else {
        "the device has no room for this request: release memory held elsewhere on the device, or opt in to serving such requests from managed memory (GGML_CUDA_ALLOC_FALLBACK_MANAGED=1)".to_string()
    };
    OomReport {
        requested,
        pool: kind,
        live: stats.live_bytes,
        reserved: stats.reserved_bytes,
        cached: stats.cached_bytes,
        stranded,
        device,
        cause,
        suggestion,
    }
}
