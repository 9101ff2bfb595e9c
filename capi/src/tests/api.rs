// The C API on simulated cards: allocation, free, stats, every error path, bad pointers, and
// eight threads. The library is process-wide, so the tests take turns.
use crate::*;
use std::ffi::{c_void, CStr, CString};
use std::sync::Mutex;

pub(super) static TURN: Mutex<()> = Mutex::new(());
pub(super) const MIB: usize = 1 << 20;

pub(super) fn error() -> String {
    // SAFETY: cupool_last_error returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(cupool_last_error()) }
        .to_string_lossy()
        .into_owned()
}

pub(super) fn init(config: &str) -> CupoolStatus {
    let c = CString::new(config).unwrap();
    // SAFETY: a NUL-terminated string.
    unsafe { cupool_init(c.as_ptr()) }
}

pub(super) fn alloc(device: i32, stream: u64, size: usize) -> (*mut c_void, usize) {
    let mut actual = 0usize;
    // SAFETY: `actual` is a writable size_t.
    let p = unsafe { cupool_alloc(device, stream, size, &mut actual) };
    (p, actual)
}

pub(super) fn stats(device: i32) -> String {
    // Other threads may move the statistics between the two calls: a JSON that grew past the
    // buffer was truncated, so ask again (it fits once nothing grows it in between).
    let mut buf = Vec::new();
    for _ in 0..1000 {
        // SAFETY: a null buffer asks for the length; then a buffer of that length plus the NUL.
        let n = unsafe { cupool_stats_json(device, std::ptr::null_mut(), 0) };
        assert!(n > 0, "{}", error());
        buf = vec![0u8; n + 1];
        // SAFETY: `buf` has n + 1 writable bytes.
        let m = unsafe { cupool_stats_json(device, buf.as_mut_ptr().cast(), buf.len()) };
        assert!(m > 0, "{}", error());
        if m <= n {
            break;
        }
    }
    CStr::from_bytes_until_nul(&buf)
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

pub(super) fn stat(json: &str, key: &str) -> u64 {
    let at = json
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("{key} in {json}"));
    json[at + key.len() + 3..]
        .split([',', '}'])
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn allocate_free_and_report() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(cupool_api_version(), CUPOOL_API_VERSION);
    assert_eq!(
        init("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=1 CUPOOL_SIM_DEVICES=2 GGML_POOL=vmm"),
        CupoolStatus::Ok,
        "{}",
        error()
    );
    assert_eq!(cupool_device_count(), 2);
    let (a, actual) = alloc(0, 7, 3 * MIB + 1);
    assert!(!a.is_null(), "{}", error());
    assert!(actual > 3 * MIB);
    let (b, _) = alloc(1, 0, MIB);
    assert!(!b.is_null());
    let s = stats(0);
    assert_eq!(
        stat(&s, "allocated_bytes.all.current"),
        (3 * MIB + 1) as u64
    );
    assert!(stat(&s, "reserved_bytes.all.current") >= 3 * MIB as u64);
    assert_eq!(stat(&stats(-1), "allocation.all.allocated"), 2);
    assert_eq!(
        cupool_free(0, 7, a, 3 * MIB + 1),
        CupoolStatus::Ok,
        "{}",
        error()
    );
    assert_eq!(cupool_free(1, 0, b, MIB), CupoolStatus::Ok);
    let mut released = 0usize;
    // SAFETY: `released` is a writable size_t.
    let purged = unsafe { cupool_trim(0, &mut released) };
    assert_eq!(purged, CupoolStatus::Ok);
    assert!(released >= 3 * MIB, "{released}");
    assert_eq!(stat(&stats(0), "reserved_bytes.all.current"), 0);
    assert_eq!(cupool_reset_peaks(-1), CupoolStatus::Ok);
    assert_eq!(stat(&stats(0), "allocated_bytes.all.peak"), 0);
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok, "{}", error());
}

#[test]
fn every_error_path_is_reported_and_changes_nothing() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    // Not open.
    assert!(alloc(0, 0, 64).0.is_null());
    assert!(error().contains("cupool_init"), "{}", error());
    assert_eq!(
        cupool_free(0, 0, 0x1000 as *mut c_void, 64),
        CupoolStatus::NotInitialized
    );
    // Bad configurations name what is accepted.
    for (bad, says) in [
        ("GGML_POOL=bogus", "vmm, legacy, managed"),
        ("GGML_POOL", "NAME=VALUE"),
        ("GGML_POLL=vmm", "accepted names"),
        ("CUPOOL_DEVICE=tpu", "cuda, sim, auto"),
        ("CUPOOL_SIM_GIB=-1", "GiB"),
        ("CUPOOL_SIM_DEVICES=0", "1 to 64"),
        (
            "CUPOOL_AUTO_HEADROOM=lots",
            "ubatch, inf, or a number of MiB",
        ),
    ] {
        assert_eq!(init(bad), CupoolStatus::InvalidArgument, "{bad}");
        assert!(error().contains(says), "{bad}: {}", error());
    }
    assert_eq!(
        init("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=0.25 GGML_POOL=legacy"),
        CupoolStatus::Ok,
        "{}",
        error()
    );
    assert_eq!(
        init("CUPOOL_DEVICE=sim"),
        CupoolStatus::InvalidArgument,
        "a second init is refused"
    );
    // Bad device.
    assert!(alloc(3, 0, 64).0.is_null());
    assert!(error().contains("device 3 does not exist"), "{}", error());
    // Out of memory: null, with the pool's report.
    assert!(alloc(0, 0, 1 << 30).0.is_null());
    assert!(error().contains("out of device memory"), "{}", error());
    // Bad pointers: foreign, wrong stream, wrong size, double free.
    let (p, _) = alloc(0, 0, 1000);
    assert!(!p.is_null());
    let before = stats(0);
    assert_eq!(
        cupool_free(0, 0, 0xdead_0000 as *mut c_void, 1000),
        CupoolStatus::UnknownPointer
    );
    assert!(error().contains("not handed out"), "{}", error());
    assert_eq!(cupool_free(0, 9, p, 1000), CupoolStatus::UnknownPointer);
    assert_eq!(cupool_free(0, 0, p, 999), CupoolStatus::SizeMismatch);
    assert!(
        error().contains("allocated with 1000 bytes (1280 usable) but freed with 999"),
        "{}",
        error()
    );
    assert_eq!(stats(0), before, "refused frees changed nothing");
    // Shutdown is refused while the block is live: its memory must stay valid.
    assert_eq!(cupool_shutdown(), CupoolStatus::InvalidArgument);
    assert!(error().contains("still live"), "{}", error());
    assert_eq!(cupool_free(0, 0, p, 1000), CupoolStatus::Ok);
    assert_eq!(error(), "", "a success clears the error text");
    assert_eq!(
        cupool_free(0, 0, p, 1000),
        CupoolStatus::UnknownPointer,
        "double free"
    );
    assert_eq!(stat(&stats(0), "allocation.all.freed"), 1);
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok);
}

#[test]
fn eight_threads_through_the_torch_entry_points() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(
        init("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=4"),
        CupoolStatus::Ok,
        "{}",
        error()
    );
    std::thread::scope(|s| {
        for t in 0..8usize {
            s.spawn(move || {
                // Threads 0-3 share stream 0; 4-7 have their own.
                let stream = if t < 4 {
                    std::ptr::null_mut()
                } else {
                    (0x100 * t) as *mut c_void
                };
                let mut live = Vec::new();
                for i in 0..2000usize {
                    let size = 256 + (i * 7919 + t * 104729) % (256 << 10);
                    let p = cupool_torch_alloc(size, 0, stream);
                    assert!(!p.is_null(), "{}", error());
                    live.push((p, size));
                    if i % 3 != 0 {
                        let (p, size) = live.swap_remove(i % live.len());
                        cupool_torch_free(p, size, 0, stream);
                        assert_eq!(error(), "", "free refused");
                    }
                }
                for (p, size) in live {
                    cupool_torch_free(p, size, 0, stream);
                }
            });
        }
    });
    let s = stats(0);
    assert_eq!(stat(&s, "allocated_bytes.all.current"), 0, "{s}");
    assert_eq!(stat(&s, "allocation.all.allocated"), 16_000);
    assert_eq!(stat(&s, "allocation.all.freed"), 16_000);
    assert_eq!(stat(&s, "cupool.pools"), 5);
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok, "{}", error());
}

#[test]
fn records_a_trace_the_replay_reads() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(init("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=1"), CupoolStatus::Ok);
    let before = alloc(0, 0, MIB);
    let dir = std::env::temp_dir().join(format!("cupool-record-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = CString::new(dir.join("t.jsonl").to_str().unwrap()).unwrap();
    // SAFETY: NUL-terminated strings and a writable u64 below.
    unsafe {
        assert_eq!(cupool_record_start(path.as_ptr()), CupoolStatus::Ok);
        assert_eq!(
            cupool_record_start(path.as_ptr()),
            CupoolStatus::InvalidArgument
        );
        assert!(error().contains("already being recorded"), "{}", error());
        let phase = CString::new("chunk \"0\"").unwrap();
        assert_eq!(cupool_phase_begin(phase.as_ptr()), CupoolStatus::Ok);
        assert_eq!(
            cupool_phase_begin(std::ptr::null()),
            CupoolStatus::InvalidArgument
        );
    }
    let a = alloc(0, 0, 3 * MIB);
    let b = alloc(0, 7, 512);
    assert_eq!(cupool_free(0, 0, a.0, 3 * MIB), CupoolStatus::Ok);
    assert_eq!(cupool_phase_end(1), CupoolStatus::Ok);
    assert_eq!(cupool_free(0, 0, before.0, MIB), CupoolStatus::Ok);
    let mut n = 0u64;
    // SAFETY: a writable u64.
    assert_eq!(unsafe { cupool_record_stop(&mut n) }, CupoolStatus::Ok);
    assert_eq!(n, 2);
    // SAFETY: as above.
    let again = unsafe { cupool_record_stop(&mut n) };
    assert_eq!(again, CupoolStatus::InvalidArgument);
    assert_eq!(cupool_free(0, 7, b.0, 512), CupoolStatus::Ok);
    let text = std::fs::read_to_string(dir.join("t.jsonl")).unwrap();
    let events: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        events,
        [
            r#"{"op":"phase_begin","name":"chunk \"0\""}"#,
            r#"{"op":"alloc","id":0,"size":3145728,"stream":0}"#,
            r#"{"op":"alloc","id":1,"size":512,"stream":1}"#,
            r#"{"op":"free","id":0}"#,
            r#"{"op":"phase_end","name":"chunk \"0\"","prefill":true}"#,
        ]
    );
    let bad = CString::new(dir.join("no/such/dir/t.jsonl").to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated string.
    let refused = unsafe { cupool_record_start(bad.as_ptr()) };
    assert_eq!(refused, CupoolStatus::InvalidArgument);
    assert!(
        error().contains("cannot create the trace file"),
        "{}",
        error()
    );
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn out_of_memory_trims_the_other_streams_pools_and_retries() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(
        init("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=1 GGML_POOL=vmm"),
        CupoolStatus::Ok
    );
    let a = alloc(0, 1, 600 * MIB);
    assert!(!a.0.is_null(), "{}", error());
    assert_eq!(cupool_free(0, 1, a.0, 600 * MIB), CupoolStatus::Ok);
    // Stream 1's pool keeps its 600 MiB mapped; stream 2 needs them.
    let b = alloc(0, 2, 600 * MIB);
    assert!(!b.0.is_null(), "{}", error());
    let s = stats(0);
    assert!(
        stat(&s, "reserved_bytes.all.current") < 700 * MIB as u64,
        "{s}"
    );
    assert!(stat(&s, "cupool.purged_bytes") >= 600 * MIB as u64, "{s}");
    // With nothing idle anywhere, the failure is the pool's report.
    assert!(alloc(0, 3, 600 * MIB).0.is_null());
    assert!(error().contains("out of device memory"), "{}", error());
    assert_eq!(cupool_free(0, 2, b.0, 600 * MIB), CupoolStatus::Ok);
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok);
}

fn releases(device: i32) -> u64 {
    let mut n = u64::MAX;
    // SAFETY: `n` is a writable uint64_t.
    let status = unsafe { cupool_releases(device, &mut n) };
    assert_eq!(status, CupoolStatus::Ok, "{}", error());
    n
}

#[test]
fn the_release_count_moves_whenever_memory_goes_back_and_only_then() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(
        init("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=1 CUPOOL_SIM_DEVICES=2 GGML_POOL=legacy"),
        CupoolStatus::Ok,
        "{}",
        error()
    );
    assert_eq!(releases(0), 0);
    // A free keeps the buffer cached: a graph that captured it may still replay it.
    let a = alloc(0, 1, 600 * MIB);
    assert_eq!(cupool_free(0, 1, a.0, 600 * MIB), CupoolStatus::Ok);
    assert_eq!(releases(0), 0);
    // Another stream's allocation only fits after the trim before the retry: the count moves.
    let b = alloc(0, 2, 600 * MIB);
    assert!(!b.0.is_null(), "{}", error());
    let after_retry = releases(0);
    assert!(after_retry >= 1, "{after_retry}");
    assert_eq!(releases(1), 0, "the other device returned nothing");
    assert_eq!(cupool_free(0, 2, b.0, 600 * MIB), CupoolStatus::Ok);
    let mut released = 0usize;
    // SAFETY: `released` is a writable size_t.
    assert_eq!(unsafe { cupool_trim(0, &mut released) }, CupoolStatus::Ok);
    assert!(released > 0);
    assert!(releases(0) > after_retry);
    // Bad arguments are refused with what is accepted.
    let mut n = 0u64;
    // SAFETY: `n` is a writable uint64_t; the device is out of range.
    let status = unsafe { cupool_releases(2, &mut n) };
    assert_eq!(status, CupoolStatus::InvalidArgument);
    assert!(error().contains("device 2 does not exist"), "{}", error());
    // SAFETY: a null count is refused before it is written.
    let status = unsafe { cupool_releases(0, std::ptr::null_mut()) };
    assert_eq!(status, CupoolStatus::InvalidArgument);
    assert!(error().contains("uint64_t"), "{}", error());
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok);
}

#[test]
fn the_limit_bounds_every_device_s_pools_together_and_loses_nothing() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(
        init("CUPOOL_DEVICE=sim CUPOOL_LIMIT_MIB=0"),
        CupoolStatus::InvalidArgument
    );
    assert!(
        error().contains("accepted values are off, or a number of MiB"),
        "{}",
        error()
    );
    for pool in ["vmm", "legacy"] {
        assert_eq!(
            init(&format!(
                "CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=4 GGML_POOL={pool} CUPOOL_LIMIT_MIB=64"
            )),
            CupoolStatus::Ok,
            "{}",
            error()
        );
        // Random requests on three streams of one device: whatever succeeds, the pools together
        // never hold more than the limit, and a refusal is the pool's out-of-memory report.
        let mut live: Vec<(u64, *mut c_void, usize)> = Vec::new();
        let (mut x, mut refused) = (0x9e37_79b9_7f4a_7c15u64, 0);
        for _ in 0..400 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x % 3 == 0 && !live.is_empty() {
                let (s, p, n) = live.swap_remove((x >> 8) as usize % live.len());
                assert_eq!(cupool_free(0, s, p, n), CupoolStatus::Ok, "{}", error());
            } else {
                let (stream, size) = (1 + (x >> 20) % 3, ((x >> 24) as usize % (24 * MIB)) + 1);
                let (p, _) = alloc(0, stream, size);
                if p.is_null() {
                    refused += 1;
                    assert!(error().contains("out of device memory"), "{}", error());
                } else {
                    live.push((stream, p, size));
                }
            }
            let s = stats(0);
            assert!(
                stat(&s, "reserved_bytes.all.current") <= 64 * MIB as u64,
                "{pool}: {s}"
            );
        }
        assert!(refused > 0, "{pool}: the sequence never reached the limit");
        for (s, p, n) in live.drain(..) {
            assert_eq!(cupool_free(0, s, p, n), CupoolStatus::Ok, "{}", error());
        }
        // Nothing was lost to the refusals: one stream gets nearly the whole limit back.
        let (p, _) = alloc(0, 9, 60 * MIB);
        assert!(!p.is_null(), "{pool}: {}", error());
        assert_eq!(cupool_free(0, 9, p, 60 * MIB), CupoolStatus::Ok);
        assert_eq!(cupool_shutdown(), CupoolStatus::Ok);
    }
}

/// Peaks restart only when the user asks, as PyTorch's: an ubatch boundary restarts the pools'
/// own high-water marks (per-ubatch accounting) but not the peaks the statistics report.
#[test]
fn peaks_survive_ubatch_boundaries_and_restart_only_on_request() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(
        init("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=1 GGML_POOL=legacy CUPOOL_PURGE=always"),
        CupoolStatus::Ok,
        "{}",
        error()
    );
    let (a, _) = alloc(0, 0, 8 * MIB);
    assert!(!a.is_null(), "{}", error());
    assert_eq!(cupool_free(0, 0, a, 8 * MIB), CupoolStatus::Ok);
    let before = stats(0);
    let mut released = 0usize;
    // SAFETY: `released` is a writable size_t.
    let ended = unsafe { cupool_ubatch_end(0, &mut released) };
    assert_eq!(ended, CupoolStatus::Ok);
    assert!(
        released >= 8 * MIB,
        "`always` returned the 8 MiB block: {released}"
    );
    let after = stats(0);
    for key in ["allocated_bytes.all.peak", "reserved_bytes.all.peak"] {
        assert!(stat(&before, key) >= 8 * MIB as u64, "{key}: {before}");
        assert_eq!(
            stat(&after, key),
            stat(&before, key),
            "{key} after the boundary"
        );
    }
    assert_eq!(stat(&after, "reserved_bytes.all.current"), 0);
    // A smaller block after the boundary leaves the peaks where they were...
    let (b, _) = alloc(0, 0, MIB);
    assert_eq!(
        stat(&stats(0), "allocated_bytes.all.peak"),
        stat(&before, "allocated_bytes.all.peak")
    );
    // ...until the user resets them: then they are what is held now.
    assert_eq!(cupool_reset_peaks(0), CupoolStatus::Ok);
    let now = stats(0);
    assert_eq!(
        stat(&now, "allocated_bytes.all.peak"),
        stat(&now, "allocated_bytes.all.current")
    );
    assert_eq!(
        stat(&now, "reserved_bytes.all.peak"),
        stat(&now, "reserved_bytes.all.current")
    );
    assert_eq!(cupool_free(0, 0, b, MIB), CupoolStatus::Ok);
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok, "{}", error());
}
