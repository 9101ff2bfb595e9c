//! `repro-prefill replay`: an allocation trace (JSON lines) through a pool on the simulated
//! device; and its table, CSV and JSON.

use super::{fail, usage};
use crate::cli::{FormatArg, ReplayArgs};
use crate::output::driver_calls;
use crate::scenario;
use cupool::pool::PoolConfig;
use cupool::trace::{self, ReplayReport};
use std::process::ExitCode;

/// Replays the trace and prints the pool's report.
pub fn replay(a: ReplayArgs) -> ExitCode {
    crate::log::init(a.quiet, false);
    let text = match std::fs::read_to_string(&a.trace) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            return usage(format!(
                "{} is not UTF-8 text: a trace is JSON lines",
                a.trace.display()
            ))
        }
        Err(e) => return fail(format!("reading {}: {e}", a.trace.display())),
    };
    let ops = match trace::parse(&text) {
        Ok(o) => o,
        Err(e) => return usage(format!("{}: {e}", a.trace.display())),
    };
    let vram = match a.vram.map(scenario::gib_bytes).transpose() {
        Ok(v) => v,
        Err(e) => return usage(e),
    };
    // The environment's settings (CUPOOL_VMM_ROUND_LARGE, ...), with the pool asked for.
    let config = match PoolConfig::from_env() {
        Ok(mut c) => {
            c.kind = Some(a.pool);
            if let Some(r) = a.round_large {
                c.vmm.large_rounding = r;
            }
            if let Some(s) = &a.size_classes {
                match cupool::pool::config::parse_size_classes(s) {
                    Ok(b) => c.size_classes = b,
                    Err(e) => return usage(e.to_string()),
                }
            }
            if let Err(e) = c.validate() {
                return usage(e.to_string());
            }
            c
        }
        Err(e) => return usage(e.to_string()),
    };
    let r = match trace::replay(&ops, &config, a.purge, vram) {
        Ok(r) => r,
        Err(e) => return usage(format!("{}: {e}", a.trace.display())),
    };
    print(&a, &r);
    ExitCode::SUCCESS
}

/// The replay's report in `--format`.
fn print(a: &ReplayArgs, r: &ReplayReport) {
    match a.format {
        FormatArg::Json => outln!("{}", serde_json::to_string_pretty(r).unwrap_or_default()),
        FormatArg::Csv => {
            outln!("pool,purge,events,peak_live_bytes,peak_reserved_bytes,end_reserved_bytes,driver_mallocs,driver_frees,driver_maps,driver_unmaps,ooms");
            outln!(
                "{},{},{},{},{},{},{},{},{},{},{}",
                r.pool,
                r.purge,
                r.events,
                r.peak_live_bytes,
                r.peak_reserved_bytes,
                r.end_reserved_bytes,
                r.driver_mallocs,
                r.driver_frees,
                r.driver_maps,
                r.driver_unmaps,
                r.ooms
            );
        }
        FormatArg::Table => {
            outln!(
                "replay of {} ({} events) through {} / purge {}",
                a.trace.display(),
                r.events,
                r.pool,
                r.purge
            );
            outln!("  peak live      {:>14} bytes", r.peak_live_bytes);
            outln!("  peak reserved  {:>14} bytes", r.peak_reserved_bytes);
            outln!("  end reserved   {:>14} bytes", r.end_reserved_bytes);
            outln!("  driver calls   {}", driver_calls(r));
            outln!("  OOMs           {}", r.ooms);
        }
    }
}
