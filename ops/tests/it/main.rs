//! End-to-end tests of the library: the worker runtime on real stores and transports, the
//! worker process and its examples, the console. (`jobsctl`'s are in `jobsctl/tests`.)

mod book;
mod cleanup;
mod console;
mod crash;
mod grouped;
mod listen;
mod model;
mod module;
mod oversized;
mod pg;
mod postgres;
mod process;
mod sqlite;
mod stop;
mod temp;
mod vercel;
mod worker_process;
