//! What happens to a pool's cache at the boundary of prefill ubatches: the policy the runtime,
//! libcupool's ubatch boundary and trace replays share.

/// Purge policy at the boundary of prefill ubatches (more than one token). Decode ubatches
/// (one token) are never purged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PurgePolicy {
    /// Keep everything cached (ggml).
    Never,
    /// Synchronize, then return every cached buffer at each prefill ubatch boundary.
    Always,
    /// Return only what the next ubatch cannot reuse: the pool is asked which cached buffers
    /// best fit would hand to the requests the next ubatch is expected to make
    /// ([`Purge::KeepFor`](crate::Purge::KeepFor)), and releases the rest. It synchronizes
    /// only when there is something to release. The runtime knows the next ubatch's scratch;
    /// libcupool expects the next ubatch to ask for what the one just ended held at once.
    Auto,
}

impl PurgePolicy {
    /// Every policy, in the order of [`PurgePolicy::NAMES`].
    pub const ALL: [PurgePolicy; 3] = [PurgePolicy::Never, PurgePolicy::Always, PurgePolicy::Auto];

    /// The names accepted on the command line: [`PurgePolicy::ALL`]'s, comma-separated.
    pub const NAMES: &'static str = "never, always, auto";

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            PurgePolicy::Never => "never",
            PurgePolicy::Always => "always",
            PurgePolicy::Auto => "auto",
        }
    }

    /// Parses a name (exactly as [`PurgePolicy::name`] writes it).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|p| p.name() == s)
    }
}

/// When `auto` returns memory at a prefill boundary: only while the device's free memory is
/// below this. Returning outgrown buffers costs a driver free each (about 100 µs for a buffer of
/// tens of MiB on an H100), which is worth paying only when the memory is wanted; the default
/// waits until the device is short.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum AutoHeadroom {
    /// Twice the bytes the pool held at once in the ubatch just ended.
    #[default]
    Ubatch,
    /// A fixed number of bytes (0: never at a boundary).
    Bytes(usize),
    /// At every boundary with something to return (no laziness).
    Infinite,
}

impl AutoHeadroom {
    /// The forms [`AutoHeadroom::parse`] accepts.
    pub const FORMS: &'static str = "ubatch, inf, or a number of MiB";

    /// `ubatch`, `inf`, or a number of MiB.
    pub fn parse(v: &str) -> Option<Self> {
        match v.trim().to_ascii_lowercase().as_str() {
            "ubatch" => Some(Self::Ubatch),
            "inf" => Some(Self::Infinite),
            n => n
                .parse::<f64>()
                .ok()
                .filter(|m| m.is_finite() && *m >= 0.0 && *m <= (1u64 << 40) as f64)
                .map(|m| Self::Bytes((m * (1u64 << 20) as f64) as usize)),
        }
    }

    /// Whether a device with `free` bytes, whose pools held `peak_live` bytes at once in the
    /// ubatch just ended, is short.
    pub fn short(self, free: usize, peak_live: usize) -> bool {
        self.least_free(peak_live).is_none_or(|least| free < least)
    }

    /// The least free memory that is not short after a ubatch whose pools held `peak_live`
    /// bytes at once; `None` where every amount is ([`AutoHeadroom::Infinite`]). A dry run
    /// reads from it the least room its boundaries decided in as they did.
    pub fn least_free(self, peak_live: usize) -> Option<usize> {
        match self {
            Self::Ubatch => Some(peak_live.saturating_mul(2)),
            Self::Bytes(b) => Some(b),
            Self::Infinite => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::AutoHeadroom as Headroom;
    use super::PurgePolicy;

    #[test]
    fn the_names_are_every_policy_s() {
        let names: Vec<_> = PurgePolicy::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(names.join(", "), PurgePolicy::NAMES);
        for p in PurgePolicy::ALL {
            assert_eq!(PurgePolicy::parse(p.name()), Some(p));
        }
    }

    #[test]
    fn headroom_parses_and_decides_shortness() {
        const MIB: usize = 1 << 20;
        assert_eq!(Headroom::parse("ubatch"), Some(Headroom::Ubatch));
        assert_eq!(Headroom::parse(" INF "), Some(Headroom::Infinite));
        assert_eq!(Headroom::parse("0"), Some(Headroom::Bytes(0)));
        assert_eq!(Headroom::parse("1.5"), Some(Headroom::Bytes(3 * MIB / 2)));
        for bad in ["", "-1", "NaN", "inf MiB", "1e300", "lots"] {
            assert_eq!(Headroom::parse(bad), None, "{bad:?}");
        }
        // Twice the ubatch's working set: 300 MiB held at once wants 600 MiB free.
        assert!(Headroom::Ubatch.short(599 * MIB, 300 * MIB));
        assert!(!Headroom::Ubatch.short(600 * MIB, 300 * MIB));
        assert!(
            !Headroom::Ubatch.short(0, 0),
            "an idle ubatch is never short"
        );
        assert!(Headroom::Bytes(64 * MIB).short(63 * MIB, 0));
        assert!(!Headroom::Bytes(0).short(0, 1 << 40), "0: never short");
        assert!(Headroom::Infinite.short(usize::MAX, 0));
    }
}
