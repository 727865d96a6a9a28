//! Integration tests of the worker runtime, on the memory queue and store with a manual clock.

mod alerts;
mod cleanup;
mod dead_letters;
mod grouped;
mod harness;
mod liveness;
mod model;
mod retry;
mod throttle;
mod worker;
