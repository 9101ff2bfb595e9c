//! What each device's pools hold from the driver, for the memory snapshot: a driver that wraps
//! the device's and notes every range with memory behind it, with the stream and tag of the
//! pool that asked for it. Device allocations (and managed ones) are PyTorch's segments;
//! mapped VMM ranges are its expandable segments, adjacent ones of one stream and tag shown as
//! one, as PyTorch's viewer joins them. With the history on, each change is an event too.
//!
//! The pools see no stream: libcupool names the pool that is calling into its pool on this
//! thread (`on_stream`) where memory may be created (an allocation, a pool's build); a mapping
//! belongs to the reservation it lies in, whoever maps it (a wake). These are driver calls, far
//! off the hot path: one lock each is nothing beside them.

use crate::history::{self, Action};
use cupool_pool::driver::forward::Forward;
use cupool_pool::driver::{DevicePtr, Driver, DriverError, PhysHandle};
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Arc;

thread_local! {
    /// The stream and tag of the pool this thread is calling into.
    static AT: Cell<(u64, u32)> = const { Cell::new((0, 0)) };
}

/// Runs `f` with the driver calls it makes attributed to `stream` × `tag`.
#[inline]
pub(crate) fn on_stream<T>(stream: u64, tag: u32, f: impl FnOnce() -> T) -> T {
    struct Restore((u64, u32));
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = AT.try_with(|a| a.set(self.0));
        }
    }
    let _restore = Restore(AT.try_with(|a| a.replace((stream, tag))).unwrap_or((0, 0)));
    f()
}

fn current() -> (u64, u32) {
    AT.try_with(Cell::get).unwrap_or((0, 0))
}

/// A range the device's pools hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    pub addr: u64,
    pub size: usize,
    pub stream: u64,
    pub tag: u32,
    /// Mapped VMM memory (PyTorch's expandable segments), not a device allocation.
    pub expandable: bool,
}

#[derive(Default)]
struct Ranges {
    /// Address → (bytes, stream, tag), for each kind of range.
    mallocs: BTreeMap<u64, (usize, u64, u32)>,
    reservations: BTreeMap<u64, (usize, u64, u32)>,
    maps: BTreeMap<u64, (usize, u64, u32)>,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Tracked {
    inner: Arc<dyn Driver>,
    /// The library's number for the device.
    device: usize,
    ranges: Mutex<Ranges>,
}

impl std::fmt::Debug for Ranges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ranges")
            .field("mallocs", &self.mallocs.len())
            .field("maps", &self.maps.len())
            .finish_non_exhaustive()
    }
}

impl Tracked {
    pub(crate) fn new(inner: Arc<dyn Driver>, device: usize) -> Self {
        Self {
            inner,
            device,
            ranges: Mutex::new(Ranges::default()),
        }
    }

    /// Every range held now, by address; adjacent mapped ranges of one stream and tag joined.
    pub(crate) fn segments(&self) -> Vec<Segment> {
        let r = self.ranges.lock();
        let mut out: Vec<Segment> = r
            .mallocs
            .iter()
            .map(|(&addr, &(size, stream, tag))| Segment {
                addr,
                size,
                stream,
                tag,
                expandable: false,
            })
            .collect();
        let mut mapped: Vec<Segment> = Vec::new();
        for (&addr, &(size, stream, tag)) in &r.maps {
            match mapped.last_mut() {
                Some(m) if m.addr + m.size as u64 == addr && (m.stream, m.tag) == (stream, tag) => {
                    m.size += size;
                }
                _ => mapped.push(Segment {
                    addr,
                    size,
                    stream,
                    tag,
                    expandable: true,
                }),
            }
        }
        out.extend(mapped);
        out.sort_by_key(|s| s.addr);
        out
    }

    fn added(&self, kind: Action, addr: u64, size: usize, (stream, tag): (u64, u32)) {
        history::segment(self.device, kind, addr, size, stream, tag);
    }

    /// The stream and tag of the reservation `at` lies in (this thread's pool's if none).
    fn owner_of(r: &Ranges, at: u64) -> (u64, u32) {
        r.reservations
            .range(..=at)
            .next_back()
            .filter(|(&base, &(size, _, _))| at < base + size as u64)
            .map_or_else(current, |(_, &(_, stream, tag))| (stream, tag))
    }

    fn malloced(&self, p: DevicePtr, bytes: usize) {
        let at = current();
        let mut r = self.ranges.lock();
        r.mallocs.insert(p, (bytes, at.0, at.1));
        self.added(Action::SegmentAlloc, p, bytes, at);
    }

    fn freed(&self, p: DevicePtr) {
        let mut r = self.ranges.lock();
        if let Some((bytes, stream, tag)) = r.mallocs.remove(&p) {
            self.added(Action::SegmentFree, p, bytes, (stream, tag));
        }
    }

    fn mapped(&self, at: DevicePtr, bytes: usize) {
        let mut r = self.ranges.lock();
        let owner = Self::owner_of(&r, at);
        r.maps.insert(at, (bytes, owner.0, owner.1));
        self.added(Action::SegmentMap, at, bytes, owner);
    }

    fn unmapped(&self, at: DevicePtr, bytes: usize) {
        let mut r = self.ranges.lock();
        let owner = r
            .maps
            .remove(&at)
            .map_or_else(|| Self::owner_of(&r, at), |(_, s, t)| (s, t));
        self.added(Action::SegmentUnmap, at, bytes, owner);
    }
}

impl Forward for Tracked {
    fn inner(&self) -> &dyn Driver {
        self.inner.as_ref()
    }

    fn malloc(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        let p = self.inner.malloc(bytes)?;
        self.malloced(p, bytes);
        Ok(p)
    }

    fn free(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        self.inner.free(ptr)?;
        self.freed(ptr);
        Ok(())
    }

    fn malloc_managed(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        let p = self.inner.malloc_managed(bytes)?;
        self.malloced(p, bytes);
        Ok(p)
    }

    fn free_managed(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        self.inner.free_managed(ptr)?;
        self.freed(ptr);
        Ok(())
    }

    fn reserve(&self, bytes: usize, hint: DevicePtr) -> Result<DevicePtr, DriverError> {
        let base = self.inner.reserve(bytes, hint)?;
        let (stream, tag) = current();
        self.ranges
            .lock()
            .reservations
            .insert(base, (bytes, stream, tag));
        Ok(base)
    }

    fn release_reservation(&self, base: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.inner.release_reservation(base, bytes)?;
        self.ranges.lock().reservations.remove(&base);
        Ok(())
    }

    fn map(&self, at: DevicePtr, bytes: usize) -> Result<PhysHandle, DriverError> {
        let h = self.inner.map(at, bytes)?;
        self.mapped(at, bytes);
        Ok(h)
    }

    fn unmap(&self, at: DevicePtr, bytes: usize, handle: PhysHandle) -> Result<(), DriverError> {
        self.inner.unmap(at, bytes, handle)?;
        self.unmapped(at, bytes);
        Ok(())
    }

    fn alias(
        &self,
        from: DevicePtr,
        to: DevicePtr,
        bytes: usize,
        handle: PhysHandle,
    ) -> Result<(), DriverError> {
        self.inner.alias(from, to, bytes, handle)?;
        // The memory serves `to` from now on; `from` is a stale mapping the pool drops later
        // (`unalias`), which a snapshot does not show.
        self.unmapped(from, bytes);
        self.mapped(to, bytes);
        Ok(())
    }
}
