//! Device allocations in whole driver pages: the simulated card can take them as the CUDA
//! driver does (`SimConfig::malloc_page`), and a card limited by `LimitedDriver` counts what the
//! driver underneath takes, so the planner, the simulated card and a limited GPU agree.
use cupool_pool::driver::limit::LimitedDriver;
use cupool_pool::driver::sim::{SimConfig, SimDevice};
use cupool_pool::driver::{Driver, ErrorCode};
use std::sync::Arc;

const MIB: usize = 1 << 20;

fn card(mib: usize, page: usize) -> Arc<SimDevice> {
    let mut c = SimConfig::gib(0.0).backed(false).malloc_page(page);
    c.capacity = mib * MIB;
    Arc::new(SimDevice::new(c).unwrap())
}

#[test]
fn an_allocation_takes_whole_pages_and_gives_them_back() {
    let dev = card(8, 2 * MIB);
    assert_eq!(dev.malloc_page(), 2 * MIB);
    let a = dev.malloc(1).unwrap();
    let b = dev.malloc(2 * MIB + 1).unwrap();
    assert_eq!(dev.ledger().device_bytes, 6 * MIB);
    assert_eq!(dev.mem_info().unwrap().free, 2 * MIB);
    // 2 MiB are free, but 2 MiB and a byte take two pages.
    let e = dev.malloc(2 * MIB + 1).unwrap_err();
    assert_eq!(e.code, ErrorCode::OutOfMemory);
    assert!(e.to_string().contains("in whole pages"), "{e}");
    dev.free(b).unwrap();
    dev.free(a).unwrap();
    assert_eq!(dev.ledger().device_bytes, 0);
}

#[test]
fn without_pages_an_allocation_takes_its_bytes() {
    let dev = card(8, 0);
    let a = dev.malloc(MIB + 1).unwrap();
    assert_eq!(dev.ledger().device_bytes, MIB + 1);
    dev.free(a).unwrap();
}

#[test]
fn a_limited_card_counts_the_pages_the_driver_takes() {
    let limited = LimitedDriver::new(card(64, 2 * MIB), 4 * MIB);
    let a = limited.malloc(MIB).unwrap();
    assert_eq!(limited.used(), 2 * MIB);
    let b = limited.malloc(MIB).unwrap();
    assert_eq!(limited.used(), 4 * MIB);
    assert!(limited.malloc(1).is_err(), "the limit is full of pages");
    limited.free(a).unwrap();
    limited.free(b).unwrap();
    assert_eq!(limited.used(), 0);
}

#[test]
fn a_page_that_is_no_power_of_two_is_refused() {
    let mut c = SimConfig::gib(1.0).malloc_page(3 * MIB);
    assert!(SimDevice::new(c.clone()).is_err());
    c.malloc_page = 1 << 31;
    assert!(SimDevice::new(c).is_err());
}
