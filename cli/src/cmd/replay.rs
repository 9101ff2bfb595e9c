//! `repro-prefill replay`: an allocation trace (JSON lines, plain or gzipped) through a pool on the simulated
//! device or a GPU (`replay_gpu.rs`); and its table, CSV and JSON.

use super::replay_gpu::GpuTiming;
use super::{fail, usage};
use crate::cli::{FormatArg, ReplayArgs};
use crate::output::driver_calls;
use crate::scenario;
use cupool::pool::PoolConfig;
use cupool::trace::{self, ReplayReport};
use std::io::Read;
use std::path::Path;
use std::process::ExitCode;

/// Replays the trace and prints the pool's report.
pub fn replay(a: ReplayArgs) -> ExitCode {
    crate::log::init(a.quiet, false);
    if let Some(p) = &a.plot {
        if let Err(e) = crate::canvas::format_of(p) {
            return usage(e);
        }
    }
    let text = match read_trace(&a.trace) {
        Ok(t) => t,
        Err(Unreadable::Io(e)) => return fail(format!("reading {}: {e}", a.trace.display())),
        Err(Unreadable::Content(e)) => return usage(format!("{}: {e}", a.trace.display())),
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
            match a.recycle.as_deref() {
                Some(r) => c.vmm.recycle = r == "on",
                None if std::env::var_os("CUPOOL_VMM_RECYCLE").is_none() => c.vmm.recycle = true,
                None => {} // from_env read it
            }
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
    let (r, timing) = if a.device == "cuda" {
        match super::replay_gpu::replay(&ops, &config, a.purge, vram) {
            Ok((r, t)) => (r, Some(t)),
            Err(e) => return fail(format!("{}: {e}", a.trace.display())),
        }
    } else {
        match trace::replay(&ops, &config, a.purge, vram) {
            Ok(r) => (r, None),
            Err(e) => return usage(format!("{}: {e}", a.trace.display())),
        }
    };
    print(&a, &r, timing.as_ref());
    if let Some(p) = &a.plot {
        let name = a.trace.file_name().unwrap_or_default().to_string_lossy();
        let title = format!("replay of {name} through {} / purge {}", r.pool, r.purge);
        if let Err(e) = crate::plot_trace::write(p, &r, &title) {
            return fail(e);
        }
    }
    ExitCode::SUCCESS
}

/// Why a trace file could not be read: the file itself (exit 1), or what it holds (exit 2).
enum Unreadable {
    Io(std::io::Error),
    Content(String),
}

/// The trace's text: the file as it is, or decompressed when it is gzip (by its first bytes,
/// whatever its name), as the recorded traces are kept.
fn read_trace(path: &Path) -> Result<String, Unreadable> {
    let bytes = std::fs::read(path).map_err(Unreadable::Io)?;
    let bytes = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(&bytes[..])
            .read_to_end(&mut out)
            .map_err(|e| {
                Unreadable::Content(format!(
                    "not a readable gzip file ({e}): a trace is JSON lines, plain or gzipped"
                ))
            })?;
        out
    } else {
        bytes
    };
    String::from_utf8(bytes).map_err(|_| {
        Unreadable::Content("is not UTF-8 text: a trace is JSON lines, plain or gzipped".into())
    })
}

/// The replay's report in `--format`.
fn print(a: &ReplayArgs, r: &ReplayReport, timing: Option<&GpuTiming>) {
    match a.format {
        FormatArg::Json => {
            let mut v = serde_json::to_value(r).unwrap_or_default();
            if let (Some(t), Some(o)) = (timing, v.as_object_mut()) {
                o.insert("gpu".into(), serde_json::to_value(t).unwrap_or_default());
            }
            outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default())
        }
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
            if r.driver_remaps + r.driver_syncs > 0 {
                outln!(
                    "  recycling      {} pages moved, {} synchronizes",
                    r.driver_remaps,
                    r.driver_syncs
                );
            }
            outln!("  OOMs           {}", r.ooms);
            for l in timing.map(super::replay_gpu::lines).unwrap_or_default() {
                outln!("{l}");
            }
        }
    }
}
