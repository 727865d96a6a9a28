//! A SQLite file per test, removed when the test ends. `jobsctl`'s tests use this file too
//! (by path).

use std::path::PathBuf;

/// A SQLite file path unique to this test, removed at the end.
pub(crate) struct TempDb(pub(crate) PathBuf);

impl TempDb {
    pub(crate) fn new(name: &str) -> Self {
        let package = env!("CARGO_PKG_NAME");
        let file = format!("{package}-{name}-{}.db", std::process::id());
        let path = std::env::temp_dir().join(file);
        let _ = std::fs::remove_file(&path);
        TempDb(path)
    }

    /// Its `DATABASE_URL`.
    pub(crate) fn url(&self) -> String {
        format!("sqlite://{}", self.0.display())
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
