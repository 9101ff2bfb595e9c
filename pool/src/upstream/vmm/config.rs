//! The VMM pool's settings.

use crate::invalid::InvalidConfig;

/// The largest reservation or growth step accepted (256 TiB).
pub(super) const MAX_BYTES: usize = 1 << 48;

/// The VMM pool's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmmConfig {
    /// Address space each reservation covers, 1 byte to 256 TiB (rounded up to the
    /// granularity); `None`: the device's total memory. It is no cap: a pool that fills one
    /// reservation makes another, and where the driver refuses this size it is halved (down to
    /// what the growth needs). ggml reserves a fixed 32 GiB once, which fails where address
    /// space is scarce (Jetson) and caps the pool on cards with more memory.
    pub reserve_bytes: Option<usize>,
    /// Smallest growth (rounded up to the granularity), 0 to 256 TiB: what a growth maps after
    /// a free.
    pub min_grow: usize,
    /// Largest amortised growth, 0 to 256 TiB: consecutive growths double from `min_grow` up
    /// to this. A single larger request still maps what it needs.
    pub max_grow: usize,
    /// The placement rounds requests above 1 MiB up to a multiple of this: a power of two,
    /// 128 bytes (ggml's rounding, the default) to 1 GiB. libcupool uses the 2 MiB granule,
    /// which suits PyTorch's traffic (`CUPOOL_VMM_ROUND_LARGE`).
    pub large_rounding: usize,
    /// Recycle free pages. Off by default (ggml's mapping: one page per growth, and a hole's
    /// pages stay where they are); libcupool turns it on for a framework's traffic. On: physical
    /// memory is created in pages of [`VmmConfig::recycle_page`] bytes, and where a block lands
    /// on address space with no memory behind it, whole free pages in holes are moved there
    /// (after one synchronize) before new memory is created,
    /// so the memory held follows what is live rather than the range's high-water mark (see
    /// `recycle.rs`).
    pub recycle: bool,
    /// With [`VmmConfig::recycle`]: the size of the pages memory is created in, rounded up to
    /// the granularity (0: one granule), 0 to 256 TiB. A block's tail takes a smaller page, and
    /// a page moves whole, to a vacant range it fits. Larger pages mean fewer driver calls per
    /// byte created or moved, smaller ones that fewer pages straddle a hole's edge and stay
    /// behind free space (`CUPOOL_VMM_RECYCLE_PAGE`, in MiB). 8 MiB by default: on the PyTorch
    /// prefill traces it cut the pages created and moved 3× against one granule, with the
    /// mapped peak no higher; 64 and 128 MiB create half as many pages for Phi-3 but drop twice
    /// as many old mappings, and took as long in the driver, timed in the prefill on an H100
    /// (docs/pytorch.md).
    pub recycle_page: usize,
    /// With [`VmmConfig::recycle`]: the percent of the pool's memory (0 to 100) that may lie
    /// free in its holes before a block that needs memory gets pages moved to it rather than
    /// created (`CUPOOL_VMM_RECYCLE_FREE`). Each move costs driver calls on the allocating
    /// thread (23–34 µs a page on an H100), which a prefill driven from Python pays in full:
    /// less means less memory and more moves. 6 by default: on the PyTorch prefill traces
    /// without lanes the mapped peak is 1.064 of the live peak for Phi-3 with 1,749 moves (1.025
    /// and 1.006 for Llama-3 and Qwen3-MoE, with none), where 2 maps 1.021 with 9,940 moves and
    /// prefills Phi-3 11% slower on an H100; with lanes ([`VmmConfig::lanes`]) no page moves on
    /// them (docs/pytorch.md).
    pub recycle_free: u32,
    /// With [`VmmConfig::recycle`]: a large block replaced by a slightly larger copy (a KV
    /// cache concatenated every chunk) gets address space of its own where its copies grow in
    /// place, mapping only what they grow by (`CUPOOL_VMM_LANES`; see
    /// [`crate::placement::lanes`]). On by default.
    pub lanes: bool,
    /// With lanes: whether the memory a growing cache's next copies will need is made ahead
    /// of need, and where: on a worker thread, inline (the same memory, for reproducible
    /// replays), or not ahead, the default (`CUPOOL_VMM_AHEAD`; see `ahead.rs`). A page made
    /// on the allocating thread costs it ~130 µs on an H100, a tenth of that on a worker. On
    /// the Phi-3 prefill on an H100 the worker took the allocating thread's driver time from
    /// 323 to 72 ms a prefill; on Llama-3 and the Qwen3 MoE its guesses missed (pages made
    /// ahead, then given back) and cost time and, on the MoE, 110 MiB
    /// (data/h100-2026-11-27-ahead): off until it guesses from what hit.
    pub ahead: super::Ahead,
}

impl Default for VmmConfig {
    fn default() -> Self {
        Self {
            reserve_bytes: None,
            min_grow: 2 << 20,
            max_grow: 64 << 20,
            large_rounding: 128,
            recycle: false,
            recycle_page: 8 << 20,
            recycle_free: 6,
            lanes: true,
            ahead: super::Ahead::Off,
        }
    }
}

impl VmmConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if let Some(b) = self.reserve_bytes {
            InvalidConfig::range("VmmConfig::reserve_bytes", b, 1, MAX_BYTES)?;
        }
        InvalidConfig::range("VmmConfig::min_grow", self.min_grow, 0, MAX_BYTES)?;
        InvalidConfig::range("VmmConfig::max_grow", self.max_grow, 0, MAX_BYTES)?;
        InvalidConfig::range("VmmConfig::recycle_page", self.recycle_page, 0, MAX_BYTES)?;
        InvalidConfig::range(
            "VmmConfig::recycle_free",
            self.recycle_free as usize,
            0,
            100,
        )?;
        if !self.large_rounding.is_power_of_two() || !(128..=1 << 30).contains(&self.large_rounding)
        {
            return Err(InvalidConfig::new(
                "VmmConfig::large_rounding",
                self.large_rounding,
                "a power of two from 128 to 1073741824",
            ));
        }
        Ok(())
    }
}
