//! A SQLite file per test, removed when the test ends.

use std::path::PathBuf;

/// A SQLite file path unique to this test, removed at the end.
pub(crate) struct TempDb(pub(crate) PathBuf);

impl TempDb {
    pub(crate) fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("jobs-ops-{name}-{}.db", std::process::id()));
        let _ = std::fs::remove_file(&path);
        TempDb(path)
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.0.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}
