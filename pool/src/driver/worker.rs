//! Which threads make driver calls on a pool's behalf beside the allocating thread (a VMM
//! pool's worker, `upstream/vmm/ahead.rs`): a timed driver counts their calls apart
//! (`timed.rs`), since nobody waits for them.

thread_local! {
    static ON_WORKER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks the calling thread as a pool's worker, for as long as it lives.
pub fn mark_worker() {
    ON_WORKER.with(|w| w.set(true));
}

/// Whether the calling thread is a pool's worker.
pub fn on_worker() -> bool {
    ON_WORKER.try_with(|w| w.get()).unwrap_or(false)
}
