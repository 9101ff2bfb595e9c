//! The subcommands, one file each, with the output only it prints: [`run`] (the default),
//! [`plan`], [`replay`], [`predict`]. What more than one of them needs is here: the exit codes,
//! how an error ends the command, and the pool settings of `run` and `plan`.

pub mod plan;
pub mod predict;
mod predict_free;
pub mod replay;
mod replay_gpu;
pub mod run;

use crate::cli::RunArgs;
use cupool::pool::PoolConfig;
use std::path::Path;
use std::process::ExitCode;

/// Exit code of an error.
pub const EXIT_ERROR: u8 = 1;
/// Exit code of bad arguments.
pub const EXIT_USAGE: u8 = 2;
/// Exit code of what does not fit: a run that ran out of memory, a plan that does not fit.
pub const EXIT_OOM: u8 = 3;

/// Says `msg` as an error in the arguments; exits 2.
pub fn usage(msg: impl std::fmt::Display) -> ExitCode {
    crate::stdout::err(&format!("error: {msg}"));
    ExitCode::from(EXIT_USAGE)
}

/// Says `msg` as an error; exits 1.
pub fn fail(msg: impl std::fmt::Display) -> ExitCode {
    crate::stdout::err(&format!("error: {msg}"));
    ExitCode::from(EXIT_ERROR)
}

/// The pool settings: `--pool` and `--fallback-managed` over the environment; and whether
/// they chose a pool (else the comparison runs, each row with these settings but its kind).
pub fn pool_choice(a: &RunArgs) -> Result<(PoolConfig, bool), String> {
    let mut env = PoolConfig::from_env().map_err(|e| e.to_string())?;
    if let Some(p) = a.pool {
        env.kind = Some(p);
    }
    env.fallback_managed |= a.fallback_managed;
    let chosen = env.kind.is_some() || a.fallback_managed;
    Ok((env, chosen))
}

/// Whether a file `opt` asks to write can be written where it is named: its folder exists.
/// Checked before any work, so that a typo costs no run.
pub fn output_path(opt: &str, path: &Path) -> Result<(), String> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if dir.is_dir() {
        Ok(())
    } else {
        Err(format!(
            "{opt} {}: the folder {} does not exist: name a file in an existing folder",
            path.display(),
            dir.display()
        ))
    }
}
