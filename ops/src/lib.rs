//! The library half of `jobsctl`: the composition root a downstream binary calls (or copies)
//! to build its ports from configuration, exactly as `jobsctl` does.

pub mod compose;
pub mod notify;
pub mod process;
pub mod standing;
