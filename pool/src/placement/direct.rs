//! No caching: every request is a segment of its own, released when it is freed. The managed
//! fallback serves its rare, large blocks this way.

use super::{Fit, Idle, Placement, Segment};
use crate::pool::Purge;

/// See the module docs.
#[derive(Debug, Default)]
pub struct Direct;

impl Placement for Direct {
    const RELEASES_ON_FREE: bool = true;

    fn alignment(&self) -> usize {
        256
    }

    fn take(&mut self, _size: usize) -> Option<Fit> {
        None
    }

    fn grow_request(&self, size: usize) -> usize {
        size
    }

    fn take_new(&mut self, seg: Segment, _size: usize) -> Fit {
        Fit {
            addr: seg.ptr,
            capacity: seg.len,
        }
    }

    fn give_back(&mut self, fit: Fit, _freed_at: u64) -> Option<Segment> {
        Some(Segment {
            ptr: fit.addr,
            len: fit.capacity,
            handle: 0,
        })
    }

    fn idle(&self, _what: &Purge) -> Vec<Idle> {
        Vec::new()
    }

    fn remove(&mut self, _seg: &Segment) {}

    fn stranded(&self, _size: usize) -> usize {
        0
    }

    fn segments(&self) -> Vec<Segment> {
        Vec::new()
    }
}
