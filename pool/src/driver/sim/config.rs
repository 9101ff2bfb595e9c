//! How the simulated card looks, checked before a device is built.

use crate::invalid::InvalidConfig;

const GIB: f64 = (1u64 << 30) as f64;

/// The largest capacity a simulated card may have (256 TiB): far beyond any GPU, small enough
/// that no size arithmetic on it can overflow.
pub const MAX_CAPACITY: usize = 1 << 48;

/// How the simulated card looks. [`super::SimDevice::new`] checks every field.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SimConfig {
    /// Device memory in bytes (up to [`MAX_CAPACITY`]).
    pub capacity: usize,
    /// VMM granularity in bytes (a power of two from 4 KiB to 1 GiB).
    pub granularity: usize,
    /// Whether VMM (reserve and map) is supported.
    pub vmm: bool,
    /// Whether managed memory is supported.
    pub managed: bool,
    /// Host memory available to managed allocations, in bytes (up to [`MAX_CAPACITY`]).
    pub managed_capacity: usize,
    /// Device ordinal to report.
    pub ordinal: usize,
    /// Keep a log entry for every call (counts are always kept).
    pub record_calls: bool,
    /// Back addresses with host memory. Off: addresses are unique but fake (nothing can read
    /// or write them), for dry runs of cards far larger than this machine.
    pub backed: bool,
    /// Bytes of address space all live reservations may cover together; `None`: as much as
    /// the host gives. A reservation past it fails as out of memory, as a large
    /// `cuMemAddressReserve` does on a Jetson.
    pub address_space: Option<usize>,
    /// Whether a reservation is placed at its address hint when the range there is free, as
    /// `cuMemAddressReserve` does. Off: never there, as a driver free to ignore hints may.
    pub address_hints: bool,
    /// A device allocation (`cudaMalloc`) takes whole pages of this many bytes from the card,
    /// as the CUDA driver does on the H100 and H200 (2 MiB: every drop in free memory measured
    /// under llama.cpp's legacy pool was a whole number of 2 MiB pages,
    /// `data/h100-2026-11-25-mainline-oom`); 0: exactly the bytes asked for, the default. A
    /// power of two up to 1 GiB, or 0.
    pub malloc_page: usize,
}

impl SimConfig {
    /// A card of `gib` GiB with VMM and managed memory, 2 MiB granularity. A size that is not
    /// a finite number of GiB from 0 to 256 TiB is kept as given and refused by
    /// [`super::SimDevice::new`].
    pub fn gib(gib: f64) -> Self {
        let capacity = if gib.is_finite() && gib >= 0.0 && gib * GIB <= MAX_CAPACITY as f64 {
            (gib * GIB) as usize
        } else {
            usize::MAX
        };
        Self {
            capacity,
            granularity: 2 << 20,
            vmm: true,
            managed: true,
            managed_capacity: 256 << 30,
            ordinal: 0,
            record_calls: true,
            backed: true,
            address_space: None,
            address_hints: true,
            malloc_page: 0,
        }
    }

    /// Sets the pages device allocations take (see [`SimConfig::malloc_page`]).
    pub fn malloc_page(mut self, bytes: usize) -> Self {
        self.malloc_page = bytes;
        self
    }

    /// Sets whether addresses are backed by host memory.
    pub fn backed(mut self, on: bool) -> Self {
        self.backed = on;
        self
    }

    /// Sets VMM support.
    pub fn vmm(mut self, on: bool) -> Self {
        self.vmm = on;
        self
    }

    /// Sets managed-memory support.
    pub fn managed(mut self, on: bool) -> Self {
        self.managed = on;
        self
    }

    /// Sets the VMM granularity.
    pub fn granularity(mut self, bytes: usize) -> Self {
        self.granularity = bytes;
        self
    }

    /// Caps the address space live reservations may cover together.
    pub fn address_space(mut self, bytes: usize) -> Self {
        self.address_space = Some(bytes);
        self
    }

    /// Sets whether reservations honour a free address hint.
    pub fn address_hints(mut self, on: bool) -> Self {
        self.address_hints = on;
        self
    }

    /// Sets whether every call is logged.
    pub fn record_calls(mut self, on: bool) -> Self {
        self.record_calls = on;
        self
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        InvalidConfig::range("SimConfig::capacity", self.capacity, 0, MAX_CAPACITY)?;
        InvalidConfig::range(
            "SimConfig::managed_capacity",
            self.managed_capacity,
            0,
            MAX_CAPACITY,
        )?;
        let g = self.granularity;
        if !(g.is_power_of_two() && (4096..=1 << 30).contains(&g)) {
            return Err(InvalidConfig::new(
                "SimConfig::granularity",
                g,
                "a power of two from 4096 to 1073741824 bytes",
            ));
        }
        let m = self.malloc_page;
        if m != 0 && !(m.is_power_of_two() && m <= 1 << 30) {
            return Err(InvalidConfig::new(
                "SimConfig::malloc_page",
                m,
                "0 or a power of two up to 1073741824 bytes",
            ));
        }
        if let Some(b) = self.address_space {
            // At least one granule, at most a 48-bit address space.
            InvalidConfig::range("SimConfig::address_space", b, g, 1 << 48)?;
        }
        Ok(())
    }
}
