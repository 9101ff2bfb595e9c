// CUPOOL_TIME_DRIVER: the driver calls a device's pools make, counted and timed in the stats.
use super::api::{alloc, error, init, stat, stats, MIB, TURN};
use crate::*;

#[test]
fn timed_driver_calls_are_in_the_stats_only_when_asked_for() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(
        init("CUPOOL_DEVICE=sim CUPOOL_TIME_DRIVER=sometimes"),
        CupoolStatus::InvalidArgument
    );
    assert!(
        error().contains("CUPOOL_TIME_DRIVER") && error().contains("on, off"),
        "{}",
        error()
    );
    for (on, config) in [
        (false, "CUPOOL_DEVICE=sim GGML_POOL=vmm"),
        (
            true,
            "CUPOOL_DEVICE=sim GGML_POOL=vmm CUPOOL_TIME_DRIVER=on",
        ),
        (
            true,
            "CUPOOL_DEVICE=sim GGML_POOL=legacy CUPOOL_TIME_DRIVER=1",
        ),
    ] {
        assert_eq!(init(config), CupoolStatus::Ok, "{}", error());
        // Three streams' pools on the device: their calls add up.
        let blocks: Vec<_> = (1..=3u64).map(|s| (s, alloc(0, s, 40 * MIB).0)).collect();
        let s = stats(0);
        let grown = stat(&s, "cupool.driver_allocations");
        assert!(grown >= 3, "{config}: {s}");
        if on {
            // Every pool growth is one timed call that creates memory (a map, or a malloc).
            let made = ["map", "malloc"]
                .iter()
                .filter(|c| s.contains(&format!("\"cupool.driver_calls.{c}\"")))
                .map(|c| stat(&s, &format!("cupool.driver_calls.{c}")))
                .sum::<u64>();
            assert!(made >= grown, "{config}: {s}");
            let each: u64 = s
                .match_indices("\"cupool.driver_ns.")
                .map(|(at, _)| {
                    let key = &s[at + 1..];
                    stat(&s, &key[..key.find('"').unwrap()])
                })
                .sum();
            assert_eq!(stat(&s, "cupool.driver_ns"), each, "{config}: {s}");
            // The same in the all-devices view.
            assert_eq!(
                stat(&stats(-1), "cupool.driver_ns"),
                stat(&stats(0), "cupool.driver_ns")
            );
        } else {
            assert!(!s.contains("cupool.driver_ns"), "{config}: {s}");
        }
        for (stream, p) in blocks {
            assert_eq!(
                cupool_free(0, stream, p, 40 * MIB),
                CupoolStatus::Ok,
                "{}",
                error()
            );
        }
        assert_eq!(cupool_shutdown(), CupoolStatus::Ok, "{}", error());
    }
}
