//! Whose pool traffic a run takes: cupool's own engine, or a real engine's profile.

use cupool_profiles::Profile;

/// Whose pool traffic a run takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EngineKind {
    /// cupool's runtime: the flash-attention scratch (its own split heuristic) and the GEMM workspace.
    #[default]
    Cupool,
    /// A real engine's profile: every op's requests, on a device of `cc`, for the run's weight
    /// type.
    Profile {
        /// Which engine.
        profile: Profile,
        /// Compute capability (900 for 9.0); the SM count is the run's `sms`.
        cc: u32,
    },
}

impl EngineKind {
    /// `cupool`, or the profile's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Cupool => "cupool",
            Self::Profile { profile, .. } => profile.name(),
        }
    }
}
