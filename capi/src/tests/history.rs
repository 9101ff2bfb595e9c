// The memory history and the snapshot in PyTorch's format, on simulated cards: the ring's
// bound, every segment tiled by its blocks, the live blocks and their frames, and a replay of
// the history backwards from the snapshot as PyTorch's viewer does it (every block inside a
// segment at every step, every segment event matching a segment), for each kind of segment.
use super::api::{alloc, error, init, MIB, TURN};
use crate::history::{self, Action};
use crate::*;
use serde_json::Value;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CString};

fn snapshot(device: i32) -> Value {
    // SAFETY: a null buffer asks for the length; then a buffer of that length plus the NUL.
    let n = unsafe { cupool_memory_snapshot_json(device, std::ptr::null_mut(), 0) };
    assert!(n > 0, "{}", error());
    let mut buf = vec![0u8; n + 1];
    // SAFETY: `buf` has n + 1 writable bytes.
    let m = unsafe { cupool_memory_snapshot_json(device, buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(m, n, "nothing changed between the two calls");
    serde_json::from_slice(&buf[..n])
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&buf)))
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// (address, size, stream) of a segment.
type Seg = (u64, u64, u64);

/// The segments of `device`, and its live blocks: address → size.
fn state(snap: &Value, device: u64) -> (Vec<Seg>, HashMap<u64, u64>) {
    let (mut segs, mut blocks) = (Vec::new(), HashMap::new());
    for s in snap["segments"].as_array().unwrap() {
        if u(&s["device"]) != device {
            continue;
        }
        let (addr, total) = (u(&s["address"]), u(&s["total_size"]));
        segs.push((addr, total, u(&s["stream"])));
        // PyTorch's tools take each block's address as the sum of the sizes before it, and
        // assert that the sizes add up to the segment's.
        let mut at = addr;
        let (mut allocated, mut requested) = (0, 0);
        for b in s["blocks"].as_array().unwrap() {
            assert_eq!(u(&b["address"]), at, "blocks tile the segment: {s}");
            let size = u(&b["size"]);
            assert!(size > 0 && u(&b["requested_size"]) <= size, "{b}");
            assert!(b["frames"].is_array());
            if b["state"] == "active_allocated" {
                blocks.insert(at, u(&b["requested_size"]));
                allocated += size;
                requested += u(&b["requested_size"]);
            } else {
                assert_eq!(b["state"], "inactive");
            }
            at += size;
        }
        assert_eq!(at, addr + total, "blocks cover the segment: {s}");
        assert_eq!(u(&s["allocated_size"]), allocated);
        assert_eq!(u(&s["active_size"]), allocated);
        assert_eq!(u(&s["requested_size"]), requested);
        for key in ["segment_type", "segment_pool_id", "is_expandable", "frames"] {
            assert!(!s[key].is_null(), "{key} in {s}");
        }
    }
    (segs, blocks)
}

/// Replays `device`'s trace backwards from the snapshot, as PyTorch's viewer draws the
/// allocator's state at each event; panics where the viewer would fail. Returns the actions.
fn replay(snap: &Value, device: u64) -> Vec<String> {
    let (mut segs, mut blocks) = state(snap, device);
    let trace = snap["device_traces"][device as usize]
        .as_array()
        .unwrap()
        .clone();
    let inside =
        |segs: &[Seg], a: u64, n: u64| segs.iter().any(|&(s, size, _)| s <= a && a + n <= s + size);
    for (i, e) in trace.iter().enumerate().rev() {
        let action = e["action"].as_str().unwrap();
        if action == "oom" {
            assert!(
                e.get("device_free").is_some() && e.get("addr").is_none(),
                "{e}"
            );
            continue;
        }
        let (addr, size, stream) = (u(&e["addr"]), u(&e["size"]), u(&e["stream"]));
        assert!(u(&e["time_us"]) > 0 && e["frames"].is_array(), "{e}");
        match action {
            "alloc" => {
                blocks.remove(&addr);
            }
            "free_requested" => {
                // The viewer joins it with the completion right after it.
                let next = &trace[i + 1];
                assert_eq!(
                    (next["action"].as_str(), u(&next["addr"])),
                    (Some("free_completed"), addr)
                );
            }
            "free_completed" => {
                blocks.insert(addr, size);
            }
            "segment_free" => segs.push((addr, size, stream)),
            "segment_alloc" => {
                let at = segs
                    .iter()
                    .position(|s| s.0 == addr)
                    .unwrap_or_else(|| panic!("no segment at {addr:#x}: {e}"));
                segs.remove(at);
            }
            "segment_unmap" => {
                segs.push((addr, size, stream));
                segs.sort_unstable();
                let mut joined: Vec<Seg> = Vec::new();
                for s in segs.drain(..) {
                    match joined.last_mut() {
                        Some(p) if p.0 + p.1 == s.0 && p.2 == s.2 => p.1 += s.1,
                        _ => joined.push(s),
                    }
                }
                segs = joined;
            }
            "segment_map" => {
                let at = segs
                    .iter()
                    .position(|&(s, n, _)| s <= addr && addr + size <= s + n)
                    .unwrap_or_else(|| panic!("a mapping outside every segment: {e}"));
                let (s, n, st) = segs.remove(at);
                if addr > s {
                    segs.push((s, addr - s, st));
                }
                if addr + size < s + n {
                    segs.push((addr + size, s + n - addr - size, st));
                }
            }
            other => panic!("unknown action {other}"),
        }
        for (&a, &n) in &blocks {
            assert!(
                inside(&segs, a, n),
                "block {a:#x} outside every segment before event {i} ({e})"
            );
        }
    }
    trace
        .iter()
        .map(|e| e["action"].as_str().unwrap().to_owned())
        .collect()
}

fn named(size: usize, name: &str) -> *mut c_void {
    let n = CString::new(name).unwrap();
    // SAFETY: `n` is a NUL-terminated string; `actual` may be null.
    let p = unsafe { cupool_alloc_named(0, 0, size, std::ptr::null_mut(), n.as_ptr()) };
    assert!(!p.is_null(), "{}", error());
    p
}

#[test]
fn the_ring_keeps_the_last_events_and_forgets_them_when_turned_off() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    // A test that failed before may have left the history on.
    assert_eq!(cupool_memory_history(0, 0), CupoolStatus::Ok);
    assert_eq!(cupool_memory_history(1, 3), CupoolStatus::Ok);
    for i in 0..5u64 {
        history::alloc(1, 0, 0x1000 * i, 10, None);
    }
    let kept: Vec<u64> = history::entries(1).iter().map(|e| e.addr).collect();
    assert_eq!(kept, vec![0x2000, 0x3000, 0x4000]);
    assert!(
        history::entries(0).is_empty(),
        "each device has its own ring"
    );
    // A free's two events go in together; a smaller bound on a running history drops the oldest.
    history::free(1, 0, 0x4000, 10);
    assert_eq!(cupool_memory_history(1, 2), CupoolStatus::Ok);
    let actions: Vec<Action> = history::entries(1).iter().map(|e| e.action).collect();
    assert_eq!(actions, vec![Action::FreeRequested, Action::FreeCompleted]);
    assert_eq!(cupool_memory_history(0, 0), CupoolStatus::Ok);
    assert!(history::entries(1).is_empty());
    history::alloc(1, 0, 0x5000, 10, None);
    assert!(history::entries(1).is_empty(), "nothing is kept while off");
    assert_eq!(cupool_memory_history(1, 0), CupoolStatus::InvalidArgument);
    assert!(error().contains("max_entries is 0"), "{}", error());
}

#[test]
fn a_vmm_snapshot_shows_mapped_segments_live_blocks_and_a_history_that_replays() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    // A test that failed before may have left the history on.
    assert_eq!(cupool_memory_history(0, 0), CupoolStatus::Ok);
    assert_eq!(cupool_memory_history(1, u64::MAX), CupoolStatus::Ok);
    assert_eq!(
        init("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=1 CUPOOL_SIM_DEVICES=2 GGML_POOL=vmm"),
        CupoolStatus::Ok,
        "{}",
        error()
    );
    let (a, _) = alloc(0, 0, 3 * MIB + 1);
    let b = named(4096, "attn \"out\"");
    let (c, _) = alloc(0, 7, 5 * MIB);
    let (d, _) = alloc(1, 0, MIB);
    assert_eq!(cupool_free(0, 0, a, 3 * MIB + 1), CupoolStatus::Ok);
    let snap = snapshot(-1);
    assert_eq!(snap["device_traces"].as_array().unwrap().len(), 2);
    let (segs, blocks) = state(&snap, 0);
    assert!(snap["segments"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["is_expandable"] == true));
    let mut live: Vec<(u64, u64)> = blocks.into_iter().collect();
    live.sort_unstable();
    let mut want = vec![(b as u64, 4096), (c as u64, 5 * MIB as u64)];
    want.sort_unstable();
    assert_eq!(live, want, "the live blocks, with the sizes asked for");
    assert!(
        segs.iter().any(|s| s.2 == 7),
        "stream 7's segment is stream 7's: {segs:?}"
    );
    // The named block carries its name as a frame (escaped), in the trace and in its block.
    let text = snap.to_string();
    assert!(
        text.contains(r#"{"filename":"cupool","line":0,"name":"attn \"out\""}"#),
        "{text}"
    );
    let actions = replay(&snap, 0);
    for a in ["alloc", "free_requested", "free_completed", "segment_map"] {
        assert!(actions.iter().any(|x| x == a), "{a} in {actions:?}");
    }
    assert_eq!(replay(&snap, 1).iter().filter(|a| *a == "alloc").count(), 1);
    // One device's snapshot: its segments only, and the other device's trace empty.
    let one = snapshot(1);
    assert!(one["segments"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["device"] == 1));
    assert!(one["device_traces"][0].as_array().unwrap().is_empty());
    // Trimmed: the freed block's pages go back, as segment_unmap events the replay matches.
    for (dev, stream, p, n) in [(0, 0, b, 4096), (0, 7, c, 5 * MIB), (1, 0, d, MIB)] {
        assert_eq!(cupool_free(dev, stream, p, n), CupoolStatus::Ok);
    }
    let mut released = 0usize;
    // SAFETY: `released` is a writable size_t.
    assert_eq!(unsafe { cupool_trim(0, &mut released) }, CupoolStatus::Ok);
    let snap = snapshot(0);
    assert!(replay(&snap, 0).iter().any(|a| a == "segment_unmap"));
    assert!(state(&snap, 0).1.is_empty());
    assert_eq!(cupool_memory_history(0, 0), CupoolStatus::Ok);
    let off = snapshot(0);
    assert!(
        off["device_traces"][0].as_array().unwrap().is_empty(),
        "forgotten when turned off"
    );
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok, "{}", error());
}

#[test]
fn a_legacy_snapshot_shows_device_allocations_and_out_of_memory() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    // A test that failed before may have left the history on.
    assert_eq!(cupool_memory_history(0, 0), CupoolStatus::Ok);
    assert_eq!(
        init("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=0.25 GGML_POOL=legacy"),
        CupoolStatus::Ok,
        "{}",
        error()
    );
    // Allocated before the history: in the snapshot's state, not in its trace.
    let (early, _) = alloc(0, 0, 2 * MIB);
    assert_eq!(cupool_memory_history(1, 1000), CupoolStatus::Ok);
    let (a, _) = alloc(0, 0, 3 * MIB);
    assert!(alloc(0, 0, 1 << 30).0.is_null(), "out of memory");
    let snap = snapshot(0);
    let segs = snap["segments"].as_array().unwrap();
    assert!(
        segs.len() >= 2 && segs.iter().all(|s| s["is_expandable"] == false),
        "{snap}"
    );
    assert_eq!(state(&snap, 0).1.len(), 2);
    let actions = replay(&snap, 0);
    assert_eq!(
        actions.iter().filter(|a| *a == "alloc").count(),
        1,
        "{actions:?}"
    );
    assert!(actions.iter().any(|a| a == "segment_alloc"), "{actions:?}");
    let oom = snap["device_traces"][0]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["action"] == "oom")
        .expect("an oom event");
    assert_eq!(u(&oom["size"]), 1 << 30);
    assert!(u(&oom["device_free"]) <= 256 * MIB as u64);
    for (p, n) in [(early, 2 * MIB), (a, 3 * MIB)] {
        assert_eq!(cupool_free(0, 0, p, n), CupoolStatus::Ok);
    }
    let mut released = 0usize;
    // SAFETY: `released` is a writable size_t.
    assert_eq!(unsafe { cupool_trim(0, &mut released) }, CupoolStatus::Ok);
    let snap = snapshot(0);
    assert!(
        snap["segments"].as_array().unwrap().is_empty(),
        "trimmed: {snap}"
    );
    assert!(replay(&snap, 0).iter().any(|a| a == "segment_free"));
    assert_eq!(cupool_memory_history(0, 0), CupoolStatus::Ok);
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok, "{}", error());
}

#[test]
fn snapshot_errors_say_what_is_wrong_and_a_short_buffer_asks_for_more() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    // A test that failed before may have left the history on.
    assert_eq!(cupool_memory_history(0, 0), CupoolStatus::Ok);
    // SAFETY: a null buffer asks for the length.
    let n = unsafe { cupool_memory_snapshot_json(-1, std::ptr::null_mut(), 0) };
    assert_eq!(n, 0);
    assert!(error().contains("cupool_init"), "{}", error());
    assert_eq!(
        init("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=0.25"),
        CupoolStatus::Ok
    );
    // SAFETY: a null buffer asks for the length.
    let n = unsafe { cupool_memory_snapshot_json(2, std::ptr::null_mut(), 0) };
    assert_eq!(n, 0);
    assert!(error().contains("device 2 does not exist"), "{}", error());
    let mut small = [0x55u8; 8];
    // SAFETY: `small` has 8 writable bytes.
    let n =
        unsafe { cupool_memory_snapshot_json(0, small.as_mut_ptr().cast::<c_char>(), small.len()) };
    assert!(n >= small.len(), "the full length: {n}");
    assert_eq!(&small, b"{\"segme\0", "a NUL-terminated prefix");
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok);
}
