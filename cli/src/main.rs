//! `repro-prefill`: reproduces the long-context prefill OOM and shows each fix.
//!
//! This file is the entry point only: it rewrites llama.cpp's spellings ([`llama_args`]),
//! parses the arguments ([`cli`]), hands the subcommand to its file in [`cmd`] and, when it
//! ends, writes what the log still holds ([`log::flush`]).

#[macro_use]
mod stdout;
mod canvas;
mod cli;
mod cmd;
mod device;
mod estimate;
mod gguf;
mod llama_args;
mod log;
mod output;
mod plot;
mod plot_trace;
mod scenario;
mod values;

use clap::Parser;
use cli::{Cli, Command};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = match llama_args::rewrite(std::env::args_os()) {
        Ok(a) => a,
        Err(e) => return cmd::usage(e),
    };
    let cli = Cli::parse_from(args);
    let code = match cli.command {
        Some(Command::Run(a)) => cmd::run::run(a),
        None => cmd::run::run(cli.run),
        Some(Command::Plan(a)) => cmd::plan::plan(a),
        Some(Command::Replay(a)) => cmd::replay::replay(a),
        Some(Command::Predict(a)) => cmd::predict::predict(a),
    };
    log::flush();
    code
}
