//! `jobs-bench`: throughput of softcrum-jobs next to a baseline measured in the same run.
//!
//! Run through `cargo xtask bench <name>` (a release build). Each benchmark prints its figures,
//! the baseline's and the ratio; nothing here asserts a timing.

mod cleanup;
mod consume;
mod fairness;
mod pgqueue;
mod ratelimit;
mod soak;
mod support;
mod vercel;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("consume") => consume::run(),
        Some("ratelimit") => ratelimit::run(),
        Some("vercel") => vercel::run(),
        Some("pg-queue") => pgqueue::run(args.get(1).map(String::as_str)),
        Some("fairness") => fairness::run(),
        Some("soak") => soak::run(),
        Some("cleanup") => cleanup::run(),
        _ => {
            eprintln!(
                "usage: jobs-bench consume|ratelimit|vercel|pg-queue [jobs]|fairness|soak|cleanup

environment: \
                 DATABASE_URL, JOBS_BENCH_JOBS (default 10000) for consume; REDIS_URL, \
                 JOBS_BENCH_ACQUISITIONS (default 20000) and JOBS_BENCH_CALLERS (default 1,16,64) \
                 for ratelimit; JOBS_BENCH_MESSAGES \
                 (default 2000) for vercel, on Vercel's emulator from .venv; DATABASE_URL, \
                 JOBS_BENCH_PG_QUEUE_JOBS (default 100000, or the argument) and JOBS_BENCH_ROUNDS \
                 (default 3) for pg-queue; \
                 DATABASE_URL, JOBS_BENCH_FAIR_BACKLOGS (default 10000,100000) for fairness; \
                 JOBS_BENCH_SOAK_SECONDS (default 180) and JOBS_BENCH_SOAK_URL (default a \
                 private cluster) for soak; \
                 DATABASE_URL, JOBS_BENCH_CLEANUP_CLAIMS (default 10000000) for cleanup; \
                 JOBS_BENCH_RUNTIME=current_thread for any on tokio's current-thread runtime"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
