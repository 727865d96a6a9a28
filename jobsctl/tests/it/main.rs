//! End-to-end tests of `jobsctl`: the real binary over real stores and transports.

mod bulk;
mod cli;
mod config;
mod help;
mod pg;
mod publish;
mod standing;
mod transports;
