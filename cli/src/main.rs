//! `repro-prefill`: reproduces the long-context prefill OOM and shows each fix.
//!
//! This file is the entry point only: it rewrites llama.cpp's spellings ([`llama_args`]),
//! parses the arguments ([`cli`]), sets up the log and hands the subcommand to its file in
//! [`cmd`].

#[macro_use]
mod stdout;
mod cli;
mod cmd;
mod estimate;
mod llama_args;
mod output;
mod plot;
mod scenario;
mod values;

use clap::Parser;
use cli::{Cli, Command};
use std::io::IsTerminal;
use std::process::ExitCode;

/// Installs the log; returns whether `RUST_LOG` chose its filter. A comparison (`summarize`)
/// keeps each configuration's budget warning out of the default log and says it once after
/// the table (`budget_summary`).
fn init_logging(quiet: bool, summarize: bool) -> bool {
    let default = match (quiet, summarize) {
        (true, _) => "error",
        (false, true) => "warn,cupool_runtime::budget=error",
        (false, false) => "warn",
    };
    let from_env = tracing_subscriber::EnvFilter::try_from_default_env().ok();
    let user = from_env.is_some();
    let filter = from_env.unwrap_or_else(|| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
    user
}

fn main() -> ExitCode {
    let args = match llama_args::rewrite(std::env::args_os()) {
        Ok(a) => a,
        Err(e) => return cmd::usage(e),
    };
    let cli = Cli::parse_from(args);
    match cli.command {
        Some(Command::Run(a)) => cmd::run::run(a),
        None => cmd::run::run(cli.run),
        Some(Command::Plan(a)) => cmd::plan::plan(a),
        Some(Command::Replay(a)) => cmd::replay::replay(a),
        Some(Command::Predict(a)) => cmd::predict::predict(a),
    }
}
