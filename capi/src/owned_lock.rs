//! The lock of a thread's state (`local.rs`): its owner takes it at every call and almost never
//! finds it taken, other threads take it rarely (a remote free, statistics, a purge, shutdown).
//!
//! So it is built for the owner: taking it is one compare-and-swap, and releasing it one plain
//! store (a general mutex releases with a second atomic read-modify-write, to learn whether a
//! waiter sleeps). A thread that finds it taken spins briefly, then yields, then sleeps in short
//! naps: the holder may be inside a driver call (a pool growing), and no waiter is woken.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A value behind an owner-biased lock.
pub(crate) struct OwnedLock<T> {
    taken: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, and a guard exists only while `taken` is
// held by its thread (acquired with Acquire, released with Release): one thread at a time, with
// every write of the previous holder visible. `T: Send` lets the value move between threads.
unsafe impl<T: Send> Sync for OwnedLock<T> {}
// SAFETY: as above; the lock owns its value.
unsafe impl<T: Send> Send for OwnedLock<T> {}

impl<T> OwnedLock<T> {
    pub(crate) const fn new(value: T) -> Self {
        Self {
            taken: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock, waiting while another thread holds it.
    #[inline]
    pub(crate) fn lock(&self) -> OwnedGuard<'_, T> {
        if self
            .taken
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.wait();
        }
        OwnedGuard { lock: self }
    }

    #[cold]
    fn wait(&self) {
        let mut round = 0u32;
        loop {
            if !self.taken.load(Ordering::Relaxed)
                && self
                    .taken
                    .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
            round = round.saturating_add(1);
            match round {
                0..64 => std::hint::spin_loop(),
                64..256 => std::thread::yield_now(),
                _ => std::thread::sleep(Duration::from_micros(20)),
            }
        }
    }
}

/// The lock held; released on drop.
pub(crate) struct OwnedGuard<'a, T> {
    lock: &'a OwnedLock<T>,
}

impl<T> Deref for OwnedGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock: no other reference to the value exists.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for OwnedGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: this guard holds the lock, and `&mut self` makes this reference unique.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for OwnedGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.taken.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn threads_take_turns() {
        let l = Arc::new(OwnedLock::new(0u64));
        let ts: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        *l.lock() += 1;
                    }
                })
            })
            .collect();
        ts.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(*l.lock(), 80_000);
    }
}
