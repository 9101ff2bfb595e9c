// Tags, sleep and wake through the C API on a simulated card (its addresses are host memory,
// so the tests write and read the blocks).
use super::api::{error, init, stat, stats, TURN};
use crate::*;
use std::ffi::{c_void, CStr, CString};

const MIB: usize = 1 << 20;

fn set_tag(tag: Option<&str>) -> CupoolStatus {
    let c = tag.map(|t| CString::new(t).unwrap());
    // SAFETY: null or a NUL-terminated string.
    unsafe { cupool_set_tag(c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr())) }
}

fn tag_now() -> String {
    // SAFETY: cupool_tag returns a NUL-terminated string valid for the process's life.
    unsafe { CStr::from_ptr(cupool_tag()) }
        .to_string_lossy()
        .into_owned()
}

fn sleep(tag: &str, offload: bool) -> Result<usize, (CupoolStatus, String)> {
    let c = CString::new(tag).unwrap();
    let mut released = 0usize;
    // SAFETY: a NUL-terminated string and a writable size_t.
    let s = unsafe { cupool_sleep(0, c.as_ptr(), offload as i32, &mut released) };
    if s == CupoolStatus::Ok {
        Ok(released)
    } else {
        Err((s, error()))
    }
}

fn wake(tag: &str) -> Result<usize, (CupoolStatus, String)> {
    let c = CString::new(tag).unwrap();
    let mut mapped = 0usize;
    // SAFETY: a NUL-terminated string and a writable size_t.
    let s = unsafe { cupool_wake(-1, c.as_ptr(), &mut mapped) };
    if s == CupoolStatus::Ok {
        Ok(mapped)
    } else {
        Err((s, error()))
    }
}

fn used() -> usize {
    let lib = crate::state::lib().unwrap();
    lib.registry.driver(0).unwrap().mem_info().unwrap().used()
}

fn fill(p: *mut c_void, n: usize, seed: u8) {
    // SAFETY: `p` is a live block of at least `n` bytes of a backed simulated card.
    let s = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), n) };
    s.iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = seed ^ (i % 253) as u8);
}

fn holds(p: *mut c_void, n: usize, seed: u8) -> bool {
    // SAFETY: as in `fill`, read only.
    let s = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) };
    s.iter()
        .enumerate()
        .all(|(i, &x)| x == seed ^ (i % 253) as u8)
}

#[test]
fn a_tag_sleeps_alone_keeps_its_addresses_and_wakes_with_its_bytes() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(
        init("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=1 GGML_POOL=vmm"),
        CupoolStatus::Ok
    );
    let base = used();
    assert_eq!(set_tag(Some("weights")), CupoolStatus::Ok);
    assert_eq!(tag_now(), "weights");
    let sizes = [3 * MIB + 5, 7 * MIB, 100];
    let weights: Vec<*mut c_void> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let (p, _) = super::api::alloc(0, 0, n);
            assert!(!p.is_null(), "{}", error());
            fill(p, n, i as u8);
            p
        })
        .collect();
    assert_eq!(set_tag(None), CupoolStatus::Ok);
    assert_eq!(tag_now(), "");
    let (kv, _) = super::api::alloc(0, 0, 5 * MIB);
    assert!(!kv.is_null());
    fill(kv, 5 * MIB, 99);
    let before = used();

    let released = sleep("weights", true).unwrap();
    assert!(released >= sizes.iter().sum::<usize>(), "{released}");
    assert_eq!(used(), before - released, "exactly the tag's memory went");
    assert!(holds(kv, 5 * MIB, 99), "the untagged memory is untouched");
    let mut asleep = 0usize;
    let w = CString::new("weights").unwrap();
    // SAFETY: a NUL-terminated string and a writable size_t.
    let s = unsafe { cupool_asleep_bytes(0, w.as_ptr(), &mut asleep) };
    assert_eq!(s, CupoolStatus::Ok);
    assert_eq!(asleep, released);
    assert_eq!(
        stat(&stats(0), "cupool.asleep_bytes.current"),
        released as u64
    );

    // Asleep: allocations under the tag fail and say why; untagged ones go on; a free of the
    // tag's block under no tag is taken.
    assert_eq!(set_tag(Some("weights")), CupoolStatus::Ok);
    let (p, _) = super::api::alloc(0, 0, MIB);
    assert!(p.is_null());
    assert!(error().contains("asleep"), "{}", error());
    assert_eq!(set_tag(None), CupoolStatus::Ok);
    let (q, _) = super::api::alloc(0, 0, MIB);
    assert!(!q.is_null());
    assert_eq!(cupool_free(0, 0, q, MIB), CupoolStatus::Ok);
    assert_eq!(cupool_free(0, 0, weights[2], 100), CupoolStatus::Ok);

    let mapped = wake("weights").unwrap();
    assert_eq!(mapped, released);
    for (i, &p) in weights.iter().enumerate().take(2) {
        assert!(
            holds(p, sizes[i], i as u8),
            "block {i} restored at its address"
        );
    }
    assert_eq!(
        wake("weights").unwrap(),
        0,
        "waking what is awake does nothing"
    );
    assert_eq!(set_tag(Some("weights")), CupoolStatus::Ok);
    let (p, _) = super::api::alloc(0, 0, MIB);
    assert!(!p.is_null(), "{}", error());
    assert_eq!(set_tag(None), CupoolStatus::Ok);
    for (&p, &n) in weights.iter().zip(&sizes).take(2) {
        assert_eq!(cupool_free(0, 0, p, n), CupoolStatus::Ok);
    }
    assert_eq!(cupool_free(0, 0, p, MIB), CupoolStatus::Ok);
    assert_eq!(cupool_free(0, 0, kv, 5 * MIB), CupoolStatus::Ok);
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok);
    let _ = base;
}

#[test]
fn bad_tags_and_pools_that_cannot_sleep_are_refused_with_the_reason() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(
        init("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=1 GGML_POOL=legacy"),
        CupoolStatus::Ok
    );
    let (s, e) = sleep("never-named-tag", false).unwrap_err();
    assert_eq!(s, CupoolStatus::InvalidArgument);
    assert!(
        e.contains("never-named-tag") && e.contains("cupool_set_tag"),
        "{e}"
    );
    assert_eq!(
        set_tag(Some(&"x".repeat(65))),
        CupoolStatus::InvalidArgument
    );
    assert!(error().contains("1 to 64 bytes"), "{}", error());
    assert_eq!(set_tag(Some("a\nb")), CupoolStatus::InvalidArgument);
    assert_eq!(tag_now(), "", "a refused tag changes nothing");

    assert_eq!(set_tag(Some("kv_cache")), CupoolStatus::Ok);
    let (p, _) = super::api::alloc(0, 0, MIB);
    assert!(!p.is_null());
    let (s, e) = sleep("kv_cache", true).unwrap_err();
    assert_eq!(s, CupoolStatus::InvalidArgument);
    assert!(
        e.contains("cannot sleep") && e.contains("GGML_POOL=vmm") && e.contains("kv_cache"),
        "{e}"
    );
    assert_eq!(
        cupool_free(0, 0, p, MIB),
        CupoolStatus::Ok,
        "nothing was lost"
    );
    assert_eq!(set_tag(None), CupoolStatus::Ok);
    // SAFETY: a NUL-terminated string; a null out-pointer is refused.
    let s = unsafe { cupool_asleep_bytes(0, c"kv_cache".as_ptr(), std::ptr::null_mut()) };
    assert_eq!(s, CupoolStatus::InvalidArgument);
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok);
}
