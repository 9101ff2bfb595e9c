// CUPOOL_VMM_DEFER: page moves made by a worker thread, every allocation fenced on its stream.
use super::api::{alloc, error, init, stat, stats, MIB, TURN};
use crate::*;

#[test]
fn deferred_moves_serve_the_kv_pattern_and_shut_down_clean() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(
        init("CUPOOL_DEVICE=sim CUPOOL_VMM_DEFER=later"),
        CupoolStatus::InvalidArgument
    );
    assert!(
        error().contains("CUPOOL_VMM_DEFER") && error().contains("on, off"),
        "{}",
        error()
    );
    let config = "CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=2 GGML_POOL=vmm CUPOOL_VMM_DEFER=on CUPOOL_TIME_DRIVER=on CUPOOL_VMM_RECYCLE_FREE=0";
    assert_eq!(init(config), CupoolStatus::Ok, "{}", error());
    // The KV-cache pattern on two streams: each round one block is replaced by a larger one
    // while the others stay live, so the holes' pages move behind the new ones.
    let mut live: Vec<(u64, *mut std::ffi::c_void, usize)> = Vec::new();
    for i in 0..8usize {
        let stream = 1 + (i % 2) as u64;
        let (p, _) = alloc(0, stream, 40 * MIB);
        assert!(!p.is_null(), "{}", error());
        live.push((stream, p, 40 * MIB));
    }
    for round in 0..40usize {
        let i = (round * 3) % live.len();
        let (stream, old, size) = live.swap_remove(i);
        let (p, _) = alloc(0, stream, size + 4 * MIB);
        assert!(!p.is_null(), "round {round}: {}", error());
        assert_eq!(
            cupool_free(0, stream, old, size),
            CupoolStatus::Ok,
            "{}",
            error()
        );
        live.push((stream, p, size + 4 * MIB));
        if round % 10 == 9 {
            // A synchronize (a purge of nothing) lets the old mappings go: their drops queue.
            // SAFETY: a null count is allowed.
            let r = unsafe { cupool_purge(0, 1, std::ptr::null_mut()) };
            assert_eq!(r, CupoolStatus::Ok, "{}", error());
        }
    }
    let s = stats(0);
    // The moves were queued, and the allocations that followed them waited for them: on the
    // host, the simulated device having no streams.
    assert!(stat(&s, "cupool.driver_calls.alias") > 0, "{s}");
    assert!(stat(&s, "cupool.defer.host_waits") > 0, "{s}");
    assert_eq!(stat(&s, "cupool.defer.stream_waits"), 0, "{s}");
    for (stream, p, size) in live {
        assert_eq!(
            cupool_free(0, stream, p, size),
            CupoolStatus::Ok,
            "{}",
            error()
        );
    }
    // SAFETY: a null count is allowed.
    let r = unsafe { cupool_trim(0, std::ptr::null_mut()) };
    assert_eq!(r, CupoolStatus::Ok, "{}", error());
    assert_eq!(
        stat(&stats(0), "reserved_bytes.all.current"),
        0,
        "{}",
        stats(0)
    );
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok, "{}", error());
    // Without the setting, no worker and no such keys.
    let plain = "CUPOOL_DEVICE=sim GGML_POOL=vmm CUPOOL_TIME_DRIVER=on";
    assert_eq!(init(plain), CupoolStatus::Ok, "{}", error());
    let (p, _) = alloc(0, 1, 40 * MIB);
    assert!(!stats(0).contains("cupool.defer."), "{}", stats(0));
    assert_eq!(
        cupool_free(0, 1, p, 40 * MIB),
        CupoolStatus::Ok,
        "{}",
        error()
    );
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok, "{}", error());
}
