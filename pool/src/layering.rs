//! libcupool's layering of a pool: the settings where libcupool (and with it the ggml shim,
//! which loads it) differs from the library's defaults, for the traffic of a framework or an
//! engine rather than for one caller that knows its sizes.
//!
//! libcupool applies them to every setting its user leaves unset; the planner applies them to
//! an engine profile's pool, so that it plans the pool the engine gets under `GGML_POOL`.

use crate::config::PoolConfig;
use crate::kind::PoolKind;

/// The VMM pool's rounding of large requests unless configured: the 2 MiB granule. A
/// framework's tensors are replaced by slightly larger ones (a KV cache concatenated every
/// chunk); with ggml's 128 bytes the holes they leave are just too small (docs/pytorch.md).
pub const ROUND_LARGE: usize = 2 << 20;

/// The VMM pool's size classes unless configured: small (up to 1 MiB) and large requests in
/// address ranges of their own, so small tensors do not pin the holes large ones leave
/// (docs/pytorch.md).
pub const SIZE_CLASSES: [usize; 1] = [1 << 20];

/// Which of libcupool's defaults apply: those whose setting the user left unset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layering {
    /// `CUPOOL_VMM_ROUND_LARGE` is unset: [`ROUND_LARGE`].
    pub round_large: bool,
    /// `CUPOOL_SIZE_CLASSES` is unset: [`SIZE_CLASSES`] for the VMM pool.
    pub size_classes: bool,
}

impl Default for Layering {
    /// Every default applies: nothing is set.
    fn default() -> Self {
        Self {
            round_large: true,
            size_classes: true,
        }
    }
}

impl Layering {
    /// The defaults whose variables `is_set` does not name.
    pub fn unless_set(is_set: impl Fn(&str) -> bool) -> Self {
        Self {
            round_large: !is_set("CUPOOL_VMM_ROUND_LARGE"),
            size_classes: !is_set("CUPOOL_SIZE_CLASSES"),
        }
    }

    /// Sets the defaults that apply on `c`. Size classes follow the kind: they are the VMM
    /// pool's (and an unset kind's, which is the VMM pool wherever the device has VMM); a
    /// legacy pool keeps ggml's one list of buffers.
    pub fn apply(self, c: &mut PoolConfig) {
        if self.round_large {
            c.vmm.large_rounding = ROUND_LARGE;
        }
        if self.size_classes && matches!(c.kind, None | Some(PoolKind::Vmm)) {
            c.size_classes = SIZE_CLASSES.to_vec();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_follow_the_kind_and_set_values_stay() {
        let mut vmm = PoolConfig::default().kind(PoolKind::Vmm);
        Layering::default().apply(&mut vmm);
        assert_eq!(vmm.size_classes, SIZE_CLASSES);
        assert_eq!(vmm.vmm.large_rounding, ROUND_LARGE);

        let mut legacy = PoolConfig::default().kind(PoolKind::Legacy);
        Layering::default().apply(&mut legacy);
        assert!(legacy.size_classes.is_empty());

        let mut set = PoolConfig::default().kind(PoolKind::Vmm);
        set.size_classes = vec![4096];
        set.vmm.large_rounding = 1 << 12;
        let only_classes_set = Layering::unless_set(|n| n == "CUPOOL_SIZE_CLASSES");
        only_classes_set.apply(&mut set);
        assert_eq!(set.size_classes, [4096]);
        assert_eq!(set.vmm.large_rounding, ROUND_LARGE);
    }
}
