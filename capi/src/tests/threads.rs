// Threads, exit and shutdown: frees that arrive after a thread's locals are destroyed, what an
// idle thread's cache keeps after shutdown, and shutdown racing allocations, frees and writes.
use super::api::{alloc, error, init, stat, stats, MIB, TURN};
use crate::*;
use std::cell::RefCell;
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

fn open(config: &str) {
    assert_eq!(init(config), CupoolStatus::Ok, "{}", error());
}

#[test]
fn frees_from_a_thread_local_destructor_after_libcupool_s_own_return_their_blocks() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    open("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=1 GGML_POOL=legacy");
    static STATUS: AtomicI32 = AtomicI32::new(-1);
    static AFTER_TEARDOWN: AtomicBool = AtomicBool::new(false);
    // What `cupool_last_error` said after the last PyTorch free.
    static LAST_TEXT: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
    struct FreeAtExit {
        ptr: usize,
        size: usize,
        torch: bool,
    }
    // A panic anywhere (caught at the C boundary or not) is counted.
    static PANICS: AtomicUsize = AtomicUsize::new(0);
    let previous: Arc<dyn Fn(&std::panic::PanicHookInfo<'_>) + Send + Sync> =
        Arc::from(std::panic::take_hook());
    let chained = previous.clone();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        chained(info)
    }));
    impl Drop for FreeAtExit {
        fn drop(&mut self) {
            if crate::threads::cache_gone() {
                AFTER_TEARDOWN.store(true, Ordering::SeqCst);
            }
            let p = self.ptr as *mut c_void;
            if self.torch {
                cupool_torch_free(p, self.size, 0, std::ptr::null_mut());
                // SAFETY: a NUL-terminated string, static or this thread's.
                let said = unsafe { CStr::from_ptr(cupool_last_error()) };
                LAST_TEXT
                    .lock()
                    .unwrap()
                    .replace(said.to_string_lossy().into_owned());
            } else {
                STATUS.store(cupool_free(0, 0, p, self.size) as i32, Ordering::SeqCst);
            }
        }
    }
    thread_local! {
        static LATE: RefCell<Vec<FreeAtExit>> = const { RefCell::new(Vec::new()) };
    }
    std::thread::spawn(|| {
        // Touched first, so destroyed last: after libcupool's locals, which the calls below
        // create.
        LATE.with(|_| ());
        // A refused free logs an error: the log's own thread state, if it had any, would be
        // destroyed before the frees below run.
        cupool_torch_free(0x1000 as *mut c_void, 64, 0, std::ptr::null_mut());
        let (a, _) = alloc(0, 0, MIB);
        let b = cupool_torch_alloc(3 * MIB, 0, std::ptr::null_mut());
        assert!(!a.is_null() && !b.is_null(), "{}", error());
        LATE.with(|l| {
            l.borrow_mut().extend([
                FreeAtExit {
                    ptr: a as usize,
                    size: MIB,
                    torch: false,
                },
                FreeAtExit {
                    ptr: b as usize,
                    size: 3 * MIB,
                    torch: true,
                },
                // Refused and logged, during teardown.
                FreeAtExit {
                    ptr: b as usize,
                    size: 3 * MIB,
                    torch: true,
                },
            ])
        });
    })
    .join()
    .expect("the thread exits cleanly");
    let _ = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| previous(info)));
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "no panic, caught or not");
    assert!(
        AFTER_TEARDOWN.load(Ordering::SeqCst),
        "the frees ran after libcupool's thread locals were destroyed"
    );
    assert_eq!(STATUS.load(Ordering::SeqCst), CupoolStatus::Ok as i32);
    let said = LAST_TEXT.lock().unwrap().take().unwrap_or_default();
    assert!(
        said.contains("error text is gone"),
        "the refused free reads as failed, though its text could not be kept: {said:?}"
    );
    let s = stats(0);
    assert_eq!(stat(&s, "allocation.all.freed"), 2, "{s}");
    assert_eq!(stat(&s, "allocated_bytes.all.current"), 0, "{s}");
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok, "{}", error());
}

#[test]
fn shutdown_returns_what_an_idle_thread_cached() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    open("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=2 GGML_POOL=legacy");
    let driver = crate::state::current()
        .and_then(|l| l.registry.driver(0).cloned())
        .expect("device 0");
    let total = driver.mem_info().unwrap().total;
    let (cached, go_on) = (mpsc::channel(), mpsc::channel::<()>());
    let (tell, wait) = (cached.0, go_on.1);
    let idle = std::thread::spawn(move || {
        let (p, _) = alloc(0, 5, 1 << 30);
        assert!(!p.is_null(), "{}", error());
        assert_eq!(cupool_free(0, 5, p, 1 << 30), CupoolStatus::Ok);
        tell.send(()).unwrap();
        // Idle: no cupool call until the main thread has shut the library down.
        wait.recv().unwrap();
    });
    cached.1.recv().unwrap();
    assert!(
        driver.mem_info().unwrap().free <= total - (1 << 30),
        "the legacy pool keeps the freed GiB cached"
    );
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok, "{}", error());
    assert_eq!(
        driver.mem_info().unwrap().free,
        total,
        "everything went back at shutdown, while the thread that cached it idles"
    );
    go_on.0.send(()).unwrap();
    idle.join().unwrap();
}

#[test]
fn the_error_text_outlives_a_shutdown() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    open("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=1");
    assert!(alloc(7, 0, 64).0.is_null());
    let text = cupool_last_error();
    // SAFETY: a NUL-terminated string, valid until this thread's next failed call.
    let before = unsafe { CStr::from_ptr(text) }.to_owned();
    assert!(before.to_string_lossy().contains("device 7"), "{before:?}");
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok);
    assert_eq!(error(), "", "a success reads as no error");
    // SAFETY: as above: no call failed since.
    assert_eq!(unsafe { CStr::from_ptr(text) }, before.as_c_str());
}

#[test]
fn exited_threads_leave_nothing_listed() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    open("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=1");
    let before = crate::threads::threads_listed();
    // Joined, not scoped: a join waits for the thread's locals to be destroyed, the end of a
    // scope only for its closure.
    let threads: Vec<_> = (0..16u64)
        .map(|t| {
            std::thread::spawn(move || {
                let (p, _) = alloc(0, t, 4096);
                assert_eq!(cupool_free(0, t, p, 4096), CupoolStatus::Ok);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(crate::threads::threads_listed() <= before);
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok, "{}", error());
}

/// Writes `tag` over the block and reads it back: a block whose memory went back, or that
/// another thread also holds, faults or reads back another tag.
fn write_and_check(p: *mut c_void, size: usize, tag: u8) -> bool {
    // SAFETY: `p` is a live block of `size` bytes on a host-backed simulated card.
    let bytes = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), size) };
    bytes.fill(tag);
    std::thread::yield_now();
    bytes.iter().all(|&b| b == tag)
}

#[test]
fn shutdown_racing_allocations_frees_and_writes_never_returns_a_live_block() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let config = "CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=1 GGML_POOL=legacy";
    open(config);
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let (mut closed, mut refused) = (0, 0);
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let (stop, served) = (stop.clone(), served.clone());
            s.spawn(move || {
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let size = 4096 + (i * 7919 + t as usize * 104_729) % (256 << 10);
                    let stream = u64::from(t % 2);
                    let (p, _) = alloc(0, stream, size);
                    if p.is_null() {
                        assert!(error().contains("not initialised"), "{}", error());
                        continue;
                    }
                    let tag = t.wrapping_mul(31).wrapping_add(i as u8) | 1;
                    assert!(
                        write_and_check(p, size, tag),
                        "block {p:?} changed under its owner"
                    );
                    assert_eq!(
                        cupool_free(0, stream, p, size),
                        CupoolStatus::Ok,
                        "{}",
                        error()
                    );
                    served.fetch_add(1, Ordering::Relaxed);
                    // Now and then every worker is between blocks at once, so shutdowns go
                    // through as well as being refused.
                    if i % 2 == 0 {
                        std::thread::sleep(std::time::Duration::from_micros(50));
                    }
                }
            });
        }
        // Until enough shutdowns went through, each racing the workers' calls in flight (the
        // time bound only ends a run on a machine too loaded to get there).
        let start = std::time::Instant::now();
        while (closed < 100 || served.load(Ordering::Relaxed) == 0)
            && start.elapsed() < std::time::Duration::from_secs(20)
        {
            match cupool_shutdown() {
                CupoolStatus::Ok => {
                    closed += 1;
                    std::thread::yield_now();
                    open(config);
                }
                status => {
                    assert_eq!(status, CupoolStatus::InvalidArgument);
                    assert!(error().contains("still live"), "{}", error());
                    refused += 1;
                }
            }
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(closed > 0, "no shutdown went through ({refused} refused)");
    assert!(served.load(Ordering::Relaxed) > 0);
    assert_eq!(stat(&stats(0), "allocated_bytes.all.current"), 0);
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok, "{}", error());
}

#[test]
fn frees_from_other_threads_return_blocks_to_the_allocating_thread_and_keep_counts_exact() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    open("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=1");
    let before = crate::threads::threads_listed();
    let (to_freer, from_owner) = mpsc::channel::<Vec<(usize, usize)>>();
    let (freed, wait_freed) = mpsc::channel::<()>();
    let (exit, wait_exit) = mpsc::channel::<()>();
    let owner = std::thread::spawn(move || {
        let blocks: Vec<(usize, usize)> = (0..8)
            .map(|i| {
                let p = cupool_torch_alloc(4096 << (i % 3), 0, std::ptr::null_mut());
                assert!(!p.is_null(), "{}", error());
                (p as usize, 4096 << (i % 3))
            })
            .collect();
        to_freer.send(blocks.clone()).unwrap();
        wait_freed.recv().unwrap();
        // The other thread's frees went back into this thread's bins: the same addresses.
        let again: Vec<usize> = blocks
            .iter()
            .map(|&(_, size)| cupool_torch_alloc(size, 0, std::ptr::null_mut()) as usize)
            .collect();
        let mut want: Vec<usize> = blocks.iter().map(|b| b.0).collect();
        let mut got = again.clone();
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, want, "served from the bins the remote frees filled");
        // Left live for the main thread to free after this thread exits.
        to_freer
            .send(again.into_iter().zip(blocks.iter().map(|b| b.1)).collect())
            .unwrap();
        wait_exit.recv().unwrap();
    });
    let blocks = from_owner.recv().unwrap();
    let bytes: usize = blocks.iter().map(|b| b.1).sum();
    assert_eq!(stat(&stats(0), "allocated_bytes.all.current"), bytes as u64);
    for &(p, size) in &blocks {
        assert_eq!(
            cupool_free(0, 0, p as *mut c_void, size + 1),
            CupoolStatus::SizeMismatch
        );
        assert_eq!(
            cupool_free(0, 0, p as *mut c_void, size),
            CupoolStatus::Ok,
            "{}",
            error()
        );
        assert_eq!(
            cupool_free(0, 0, p as *mut c_void, size),
            CupoolStatus::UnknownPointer,
            "a second free is refused"
        );
    }
    let s = stats(0);
    assert_eq!(stat(&s, "allocated_bytes.all.current"), 0, "{s}");
    assert_eq!(stat(&s, "allocated_bytes.all.peak"), bytes as u64, "{s}");
    assert_eq!(stat(&s, "allocation.all.freed"), 8, "{s}");
    freed.send(()).unwrap();
    let again = from_owner.recv().unwrap();
    exit.send(()).unwrap();
    owner.join().unwrap();
    // The owner exited with its blocks live: they are freed here, and its state goes.
    let listed = crate::threads::threads_listed();
    assert!(listed > before);
    for (p, size) in again {
        assert_eq!(
            cupool_free(0, 0, p as *mut c_void, size),
            CupoolStatus::Ok,
            "{}",
            error()
        );
    }
    assert_eq!(crate::threads::threads_listed(), listed - 1);
    let s = stats(0);
    assert_eq!(stat(&s, "allocated_bytes.all.current"), 0, "{s}");
    assert_eq!(stat(&s, "allocation.all.allocated"), 16, "{s}");
    assert_eq!(stat(&s, "allocation.all.freed"), 16, "{s}");
    assert_eq!(
        stat(&s, "allocated_bytes.all.peak"),
        bytes as u64,
        "the peak outlives the thread: {s}"
    );
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok, "{}", error());
}

#[test]
fn live_bytes_are_exact_and_peaks_add_up_per_thread_until_a_reset() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    open("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=1");
    let a = std::thread::spawn(|| {
        let p = cupool_torch_alloc(100 << 10, 0, std::ptr::null_mut());
        cupool_torch_free(p, 100 << 10, 0, std::ptr::null_mut());
    });
    a.join().unwrap();
    let (p, _) = alloc(0, 0, 30 << 10);
    let s = stats(0);
    assert_eq!(stat(&s, "allocated_bytes.all.current"), 30 << 10, "{s}");
    assert_eq!(
        stat(&s, "allocated_bytes.all.peak"),
        130 << 10,
        "an upper bound with two threads: {s}"
    );
    assert_eq!(cupool_reset_peaks(0), CupoolStatus::Ok);
    assert_eq!(stat(&stats(0), "allocated_bytes.all.peak"), 30 << 10);
    assert_eq!(cupool_free(0, 0, p, 30 << 10), CupoolStatus::Ok);
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok, "{}", error());
}

/// What a thread keeps is live to the pool: a request of another size would make the pool
/// grow though the kept blocks' memory could serve it (8 MiB more on the MoE prefill). Over
/// random small requests on one thread, the pool grows only once the thread keeps nothing.
#[test]
fn the_pool_grows_for_a_small_request_only_once_the_thread_keeps_nothing() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    open("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=1");
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut live: Vec<(*mut c_void, usize)> = Vec::new();
    let (mut grew, mut grew_keeping) = (0, 0);
    for _ in 0..4000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if !live.is_empty() && (x % 5 < 2 || live.len() >= 24) {
            let (p, size) = live.swap_remove((x >> 8) as usize % live.len());
            assert_eq!(cupool_free(0, 0, p, size), CupoolStatus::Ok, "{}", error());
        } else {
            let size = ((x >> 20) as usize % 16 + 1) * (64 << 10);
            let before = stat(&stats(0), "reserved_bytes.all.current");
            let (p, _) = alloc(0, 0, size);
            assert!(!p.is_null(), "{}", error());
            live.push((p, size));
            let s = stats(0);
            if stat(&s, "reserved_bytes.all.current") > before {
                grew += 1;
                if stat(&s, "cupool.thread_cached_bytes.current") > 0 {
                    grew_keeping += 1;
                }
            }
        }
    }
    assert!(grew > 0, "the pool grew");
    assert_eq!(grew_keeping, 0, "of {grew} growths");
    for (p, size) in live {
        assert_eq!(cupool_free(0, 0, p, size), CupoolStatus::Ok);
    }
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok, "{}", error());
}

#[test]
fn a_thread_keeps_one_granule_where_small_and_large_blocks_share_the_range() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    // (settings, the most a thread may keep after freeing 8 MiB of small blocks)
    for (config, most) in [
        (
            "CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=1 CUPOOL_SIZE_CLASSES=none",
            2 * MIB,
        ),
        // Blocks of 4 KiB to 1 MiB share the range with larger ones.
        (
            "CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=1 CUPOOL_SIZE_CLASSES=4096",
            2 * MIB,
        ),
        ("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=1", 8 * MIB),
    ] {
        open(config);
        let blocks: Vec<_> = (0..64).map(|_| alloc(0, 0, 128 << 10).0).collect();
        assert!(blocks.iter().all(|p| !p.is_null()), "{}", error());
        for p in blocks {
            assert_eq!(cupool_free(0, 0, p, 128 << 10), CupoolStatus::Ok);
        }
        let kept = stat(&stats(0), "cupool.thread_cached_bytes.current");
        assert_eq!(
            kept as usize, most,
            "{config}: the thread keeps its bound, no more"
        );
        assert_eq!(cupool_shutdown(), CupoolStatus::Ok, "{}", error());
    }
}
