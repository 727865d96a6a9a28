//! End-to-end tests of `jobsctl`: the real binary over real stores and transports.

mod bulk;
mod cli;
mod config;
mod help;
mod one_config;
#[path = "../../../ops/tests/it/pg.rs"]
mod pg;
#[path = "../../../ops/tests/it/process.rs"]
mod process;
mod publish;
mod standing;
#[path = "../../../ops/tests/it/temp.rs"]
mod temp;
mod transports;
mod unreadable;
