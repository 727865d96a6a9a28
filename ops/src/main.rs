//! `jobsctl`: the operator's command line of softcrum-jobs, and its reference composition
//! root: the one place where adapters are chosen and wired to the library crates.

mod demo;
mod validate;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

/// Operate softcrum-jobs: run the demo, validate envelopes, and (as the library grows)
/// migrate stores and review dead letters.
///
/// Exit codes: 0 success, 1 failure (or an invalid envelope), 2 usage error.
#[derive(Debug, Parser)]
#[command(name = "jobsctl", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the worker runtime on the embedded defaults and narrate what happens.
    ///
    /// Needs nothing but this binary: an in-memory queue and store, console alerts.
    ///
    /// Example: jobsctl demo
    Demo,
    /// Work with envelopes.
    #[command(subcommand)]
    Envelope(EnvelopeCommand),
}

#[derive(Debug, Subcommand)]
enum EnvelopeCommand {
    /// Check envelopes the way every consumer will, printing each problem with its field.
    ///
    /// Exits 0 when every envelope is valid, 1 when one is not, 2 when the input cannot be
    /// read.
    ///
    /// Examples:
    ///   jobsctl envelope validate job.json
    ///   producer | jobsctl envelope validate --lines -
    Validate {
        /// The file to read, or `-` for standard input.
        #[arg(default_value = "-")]
        file: PathBuf,
        /// Read one envelope per line (JSON Lines).
        #[arg(long)]
        lines: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Envelope(EnvelopeCommand::Validate { file, lines }) => validate(&file, lines),
        Command::Demo => finish(block_on(async {
            demo::run(&mut std::io::stdout().lock()).await
        })),
    }
}

fn validate(file: &PathBuf, lines: bool) -> ExitCode {
    let input: Box<dyn std::io::Read> = if file.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        match std::fs::File::open(file).with_context(|| format!("opening {}", file.display())) {
            Ok(f) => Box::new(f),
            Err(e) => {
                eprintln!("error: {e:#}");
                return ExitCode::from(2);
            }
        }
    };
    match validate::run(input, lines, &mut std::io::stdout().lock()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn block_on<T>(work: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(work)
}

fn finish(result: Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
