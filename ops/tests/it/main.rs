//! End-to-end tests of the composition: the real `jobsctl` binary, and the worker runtime on
//! real stores.

mod cli;
mod model;
mod pg;
mod postgres;
mod vercel;
