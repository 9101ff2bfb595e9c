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
        (
            false,
            "CUPOOL_DEVICE=sim CUPOOL_SIM_DEVICES=2 GGML_POOL=vmm",
        ),
        (
            true,
            "CUPOOL_DEVICE=sim CUPOOL_SIM_DEVICES=2 GGML_POOL=vmm CUPOOL_TIME_DRIVER=on",
        ),
        (
            true,
            "CUPOOL_DEVICE=sim CUPOOL_SIM_DEVICES=2 GGML_POOL=legacy CUPOOL_TIME_DRIVER=1",
        ),
    ] {
        assert_eq!(init(config), CupoolStatus::Ok, "{}", error());
        // Three streams' pools on device 0 and one on device 1: each device counts its own.
        let mut blocks: Vec<_> = (1..=3u64)
            .map(|s| (0, s, alloc(0, s, 40 * MIB).0))
            .collect();
        blocks.push((1, 1, alloc(1, 1, 40 * MIB).0));
        assert!(blocks.iter().all(|b| !b.2.is_null()), "{}", error());
        for device in [0, 1] {
            let s = stats(device);
            let grown = stat(&s, "cupool.driver_allocations");
            assert!(grown >= if device == 0 { 3 } else { 1 }, "{config}: {s}");
            if !on {
                assert!(!s.contains("cupool.driver_ns"), "{config}: {s}");
                continue;
            }
            // Every pool growth is one timed call that creates memory (a map, or a malloc).
            let made: u64 = ["map", "malloc"]
                .iter()
                .filter(|c| s.contains(&format!("\"cupool.driver_calls.{c}\"")))
                .map(|c| stat(&s, &format!("cupool.driver_calls.{c}")))
                .sum();
            assert!(made >= grown, "{config}: device {device}: {s}");
            // Opening the device (its context) is not the pools' work.
            assert!(!s.contains("driver_calls.open"), "{config}: {s}");
            let each: u64 = s
                .match_indices("\"cupool.driver_ns.")
                .map(|(at, _)| {
                    let key = &s[at + 1..];
                    stat(&s, &key[..key.find('"').unwrap()])
                })
                .sum();
            assert_eq!(stat(&s, "cupool.driver_ns"), each, "{config}: {s}");
        }
        if on {
            // The all-devices view adds the two devices' calls up.
            let (all, d0, d1) = (stats(-1), stats(0), stats(1));
            for key in ["cupool.driver_calls.map", "cupool.driver_calls.malloc"] {
                if all.contains(&format!("\"{key}\"")) {
                    assert_eq!(stat(&all, key), stat(&d0, key) + stat(&d1, key), "{all}");
                }
            }
            assert!(stat(&all, "cupool.driver_ns") >= stat(&d0, "cupool.driver_ns"));
        }
        for (device, stream, p) in blocks {
            assert_eq!(
                cupool_free(device, stream, p, 40 * MIB),
                CupoolStatus::Ok,
                "{}",
                error()
            );
        }
        assert_eq!(cupool_shutdown(), CupoolStatus::Ok, "{}", error());
    }
}
