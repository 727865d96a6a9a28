//! End-to-end tests of the composition: the real `jobsctl` binary, and the worker runtime on
//! real stores.

mod book;
mod bulk;
mod cleanup;
mod cli;
mod config;
mod console;
mod crash;
mod grouped;
mod help;
mod model;
mod pg;
mod postgres;
mod publish;
mod sqlite;
mod transports;
mod vercel;
mod worker_process;
