//! A driver that measures the time spent in each of its calls.
//!
//! Wraps another driver and adds up, per primitive, how often it was called and the wall time
//! it took (failed calls included). A replay of a recorded allocation stream on a GPU through
//! it says where a pool's time goes (creating, moving and releasing memory, synchronizing)
//! without the kernels of the run that recorded it: `repro-prefill replay --device cuda`.

use super::observed::{CallObserver, Observed};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Calls and time of one primitive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CallTime {
    /// Times it was called.
    pub calls: u64,
    /// Wall time inside it, in nanoseconds.
    pub nanos: u64,
}

/// See the module docs: `TimedDriver::new(inner)` wraps `inner`.
pub type TimedDriver = Observed<Timer>;

/// The observer of a [`TimedDriver`]: calls and wall time per primitive.
#[derive(Debug, Default)]
pub struct Timer {
    times: Mutex<BTreeMap<&'static str, CallTime>>,
}

/// Calls a timing leaves out: opening the device (the CUDA context's creation, done once before
/// any pool exists) and staging host buffers are not the pool's work.
const NOT_TIMED: [&str; 2] = ["open", "host_buffer"];

/// The name a VMM pool's worker thread's maps are counted under (`upstream/vmm/ahead.rs`).
pub const AHEAD_MAP: &str = "map_ahead";

impl CallObserver for Timer {
    fn around<T>(&self, name: &'static str, call: impl FnOnce() -> T) -> T {
        if NOT_TIMED.contains(&name) {
            return call();
        }
        // A pool's worker makes pages ahead of need beside the allocating thread: its calls
        // are counted apart (`map_ahead`), and not in what the allocating threads waited for.
        let name = match name {
            "map" if super::worker::on_worker() => AHEAD_MAP,
            other => other,
        };
        let start = Instant::now();
        let out = call();
        let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let mut t = self.times.lock();
        let e = t.entry(name).or_default();
        e.calls += 1;
        e.nanos = e.nanos.saturating_add(nanos);
        out
    }
}

impl TimedDriver {
    /// `inner`, timed.
    pub fn timed(inner: std::sync::Arc<dyn super::Driver>) -> Self {
        Observed::new(inner, Timer::default())
    }

    /// Calls and time per primitive so far, by the primitive's name (`map`, `alias`, ...).
    pub fn times(&self) -> BTreeMap<&'static str, CallTime> {
        self.observer().times.lock().clone()
    }

    /// Time inside every call so far.
    pub fn total(&self) -> Duration {
        Duration::from_nanos(self.times().values().map(|t| t.nanos).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::sim::{SimConfig, SimDevice};
    use crate::driver::Driver;
    use std::sync::Arc;

    #[test]
    fn counts_each_primitive_and_passes_results_through() {
        let sim = Arc::new(SimDevice::new(SimConfig::gib(0.25)).unwrap());
        let d = TimedDriver::timed(sim.clone());
        let p = d.malloc(1 << 20).unwrap();
        d.free(p).unwrap();
        // A refused call is timed too, and its error comes back unchanged.
        let refused = d.malloc(1 << 40).unwrap_err();
        assert!(refused.is_oom(), "{refused}");
        d.synchronize_device().unwrap();
        let t = d.times();
        assert_eq!(t["malloc"].calls, 2);
        assert_eq!(t["free"].calls, 1);
        assert_eq!(t["synchronize"].calls, 1);
        assert!(!t.contains_key("map"));
        assert_eq!(
            d.total(),
            Duration::from_nanos(t.values().map(|c| c.nanos).sum())
        );
        assert_eq!(sim.mem_info().unwrap().free, d.mem_info().unwrap().free);
    }
}
