// Ranges registered with NCCL through the C API, on simulated cards: their memory stays mapped
// (a free waits for deregistration, trims and shutdown leave it, sleep is refused), and every
// misuse is refused with a message.
use super::api::{alloc, error, init, stat, stats, TURN};
use crate::*;
use std::ffi::{c_void, CString};

const MIB: usize = 1 << 20;

fn reserved(device: i32) -> u64 {
    stat(&stats(device), "reserved_bytes.all.current")
}

fn registered(device: i32) -> usize {
    let mut n = usize::MAX;
    // SAFETY: a writable size_t.
    let s = unsafe { cupool_registered_bytes(device, &mut n) };
    assert_eq!(s, CupoolStatus::Ok, "{}", error());
    n
}

fn trim(device: i32) -> usize {
    let mut released = 0;
    // SAFETY: a writable size_t.
    let s = unsafe { cupool_trim(device, &mut released) };
    assert_eq!(s, CupoolStatus::Ok, "{}", error());
    released
}

/// Under the `nccl` kind (one VMM allocation per block, released when freed, as a MemPool's
/// segments are) and the `vmm` kind: a registered block outlives its free until deregistered.
#[test]
fn a_registered_block_keeps_its_memory_until_deregistered() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    for kind in ["nccl", "vmm"] {
        assert_eq!(
            init(&format!(
                "CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=1 CUPOOL_SIM_DEVICES=2 GGML_POOL={kind}"
            )),
            CupoolStatus::Ok
        );
        let (p, n) = alloc(1, 0, 20 * MIB);
        assert!(!p.is_null(), "{kind}: {}", error());
        let (q, _) = alloc(1, 0, 4 * MIB);
        assert_eq!(cupool_register(1, p, n), CupoolStatus::Ok, "{}", error());
        assert_eq!(registered(1), n);
        assert_eq!(registered(0), 0, "registrations are per device");
        let held = reserved(1);
        assert!(held >= n as u64, "{kind}: {held}");

        // The user's free is taken, its memory stays: trims keep it, and a second free is refused.
        assert_eq!(cupool_free(1, 0, p, n), CupoolStatus::Ok, "{}", error());
        trim(1);
        assert!(
            reserved(1) >= n as u64,
            "{kind}: a trim released registered memory"
        );
        assert_eq!(cupool_free(1, 0, p, n), CupoolStatus::UnknownPointer);
        assert!(error().contains("registered"), "{}", error());
        // Its device may not sleep; the other device may.
        let t = CString::new("").unwrap();
        // SAFETY: a NUL-terminated string; null for the count.
        let s = unsafe { cupool_sleep(-1, t.as_ptr(), 0, std::ptr::null_mut()) };
        assert_eq!(s, CupoolStatus::InvalidArgument, "{kind}");
        let e = error();
        assert!(e.contains("registered") && e.contains("device 1"), "{e}");
        // Shutdown is refused: the deferred block is still live.
        assert_ne!(cupool_shutdown(), CupoolStatus::Ok);

        // With the other block gone, a trim still keeps the registered one.
        assert_eq!(
            cupool_free(1, 0, q, 4 * MIB),
            CupoolStatus::Ok,
            "{}",
            error()
        );
        trim(1);
        assert!(
            reserved(1) >= n as u64,
            "{kind}: a trim released registered memory"
        );
        // Deregistration does the free; a trim then gives the memory back.
        assert_eq!(cupool_deregister(1, p), CupoolStatus::Ok, "{}", error());
        assert_eq!(registered(1), 0);
        assert_eq!(cupool_deregister(1, p), CupoolStatus::UnknownPointer);
        trim(1);
        assert_eq!(reserved(1), 0, "{kind}: everything freed and trimmed");
        assert_eq!(cupool_shutdown(), CupoolStatus::Ok, "{}", error());
    }
}

/// Bad registrations and bad frees of a registered block are refused and change nothing; the
/// deferred free goes through at deregistration.
#[test]
fn registrations_are_checked() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(
        init("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=1 GGML_POOL=nccl"),
        CupoolStatus::Ok
    );
    let (p, n) = alloc(0, 0, 6 * MIB);
    assert!(!p.is_null(), "{}", error());
    for (device, ptr, bytes, says) in [
        (0, std::ptr::null_mut(), n, "size (> 0)"),
        (0, p, 0, "size (> 0)"),
        (5, p, n, "device"),
    ] {
        assert_ne!(cupool_register(device, ptr, bytes), CupoolStatus::Ok);
        assert!(error().contains(says), "{}", error());
    }
    // Only the start of a live block, and no further than its usable end.
    // SAFETY: an address inside the block, not dereferenced.
    let inside = unsafe { p.cast::<u8>().add(MIB) }.cast::<c_void>();
    assert_eq!(
        cupool_register(0, inside, MIB),
        CupoolStatus::UnknownPointer
    );
    assert!(error().contains("no live block"), "{}", error());
    assert_eq!(cupool_register(0, p, n + 1), CupoolStatus::InvalidArgument);
    assert!(error().contains("usable"), "{}", error());
    let (q, m) = alloc(0, 0, MIB);
    assert_eq!(cupool_free(0, 0, q, m), CupoolStatus::Ok);
    assert_eq!(
        cupool_register(0, q, m),
        CupoolStatus::UnknownPointer,
        "a freed block"
    );
    assert_eq!(registered(0), 0, "every refusal registered nothing");

    assert_eq!(cupool_register(0, p, n), CupoolStatus::Ok);
    assert_eq!(cupool_register(0, p, n), CupoolStatus::InvalidArgument);
    assert!(error().contains("registered already"), "{}", error());
    assert_eq!(cupool_deregister(0, inside), CupoolStatus::UnknownPointer);
    assert_eq!(registered(0), n);
    // A free that cupool_free would refuse is refused here too, and records nothing: another
    // size, another stream. The right free is then deferred as usual.
    assert_eq!(cupool_free(0, 0, p, n - 1), CupoolStatus::SizeMismatch);
    assert_eq!(cupool_free(0, 7, p, n), CupoolStatus::UnknownPointer);
    assert_eq!(cupool_free(0, 0, p, n), CupoolStatus::Ok, "{}", error());
    let before_deregister = reserved(0);
    assert!(before_deregister >= n as u64, "the deferred block stays");
    assert_eq!(cupool_deregister(0, p), CupoolStatus::Ok, "{}", error());
    assert!(
        reserved(0) < before_deregister,
        "the nccl kind releases a block when its deferred free is done"
    );
    assert_eq!(
        cupool_free(0, 0, p, n),
        CupoolStatus::UnknownPointer,
        "freed once"
    );
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok, "{}", error());
}
