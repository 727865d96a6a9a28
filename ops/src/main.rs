//! `jobsctl`: the operator's command line of softcrum-jobs, and its reference composition
//! root: the one place where adapters are chosen and wired to the library crates.

mod demo;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Operate softcrum-jobs: run the demo, and (as the library grows) publish, inspect and
/// replay jobs.
#[derive(Debug, Parser)]
#[command(name = "jobsctl", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Publish jobs for a few tenants through the embedded defaults, consume them, and print
    /// what happened. Needs nothing but this binary.
    ///
    /// Example: jobsctl demo
    Demo,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Demo => demo::run(&mut std::io::stdout().lock()).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
