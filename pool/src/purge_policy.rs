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
    /// The names accepted on the command line.
    pub const NAMES: &'static str = "never, always, auto";

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            PurgePolicy::Never => "never",
            PurgePolicy::Always => "always",
            PurgePolicy::Auto => "auto",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "never" => Some(PurgePolicy::Never),
            "always" => Some(PurgePolicy::Always),
            "auto" => Some(PurgePolicy::Auto),
            _ => None,
        }
    }
}
