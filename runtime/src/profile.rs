//! The engine profiles a run can take (the `cupool-profiles` crate, re-exported: the run's
//! settings name them), and [`EngineKind`], the run's choice between them and cupool's own
//! engine.

pub use crate::engine_kind::EngineKind;
pub use cupool_profiles::{
    ik_llama, llama, sweep_step, trace_events, Arch, Device, EngineModel, Mla, Moe, OpCall, OpKind,
    Profile, ProfileError, Request, Setup, SweepStep, UbatchShape, Weights, KV_PADDING,
};
