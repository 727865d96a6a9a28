//! The journal of a bulk dead-letter run: the snapshot of the ids it acts on, then one line
//! per letter settled, then a closing line. A run that finds an open journal for the same
//! action, store and filter resumes it.
//!
//! JSON Lines, appended and flushed one line at a time, so an interruption loses at most the
//! line being written (a torn last line is ignored on resume, and that letter is done again,
//! which is harmless: replay and discard are idempotent).

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use jobs_core::DeadLetterId;
use serde::{Deserialize, Serialize};

/// The first line: what the run acts on.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Header {
    /// `replay` or `discard`.
    pub(crate) action: String,
    /// The filter, as the operator gave it (for people reading the file).
    pub(crate) filter: String,
    /// The snapshot, in id order.
    pub(crate) ids: Vec<i64>,
    /// When the run started (Unix ms).
    pub(crate) started_at_ms: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum Line {
    Settled { id: i64, result: String },
    Finished { finished: bool },
}

/// An open journal.
pub(crate) struct Journal {
    path: PathBuf,
    file: File,
    /// The snapshot.
    pub(crate) header: Header,
    /// The ids settled by earlier runs.
    pub(crate) settled: BTreeSet<DeadLetterId>,
}

/// The journal's file name for `key` (action, store and filter): stable across runs and
/// builds (FNV-1a), and revealing nothing of the store URL.
pub(crate) fn path_for(dir: &Path, action: &str, key: &str) -> PathBuf {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    dir.join(format!("{action}-{hash:016x}.jsonl"))
}

impl Journal {
    /// The unfinished journal at `path`, if there is one.
    pub(crate) fn open_unfinished(path: &Path) -> Result<Option<Journal>> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let mut lines = text.lines();
        let Some(Ok(header)) = lines.next().map(serde_json::from_str::<Header>) else {
            // Empty, or torn while the snapshot was written: nothing was settled.
            return Ok(None);
        };
        let mut settled = BTreeSet::new();
        for line in lines {
            match serde_json::from_str::<Line>(line) {
                Ok(Line::Settled { id, .. }) => {
                    settled.insert(DeadLetterId(id));
                }
                Ok(Line::Finished { .. }) => return Ok(None),
                Err(_) => continue,
            }
        }
        let mut file = OpenOptions::new()
            .append(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        if !text.ends_with('\n') {
            // End the torn line so the next one parses.
            writeln!(file)?;
        }
        Ok(Some(Journal {
            path: path.to_owned(),
            file,
            header,
            settled,
        }))
    }

    /// Starts a journal at `path` with `header`, replacing a finished one.
    pub(crate) fn create(path: &Path, header: Header) -> Result<Journal> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let mut file =
            File::create(path).with_context(|| format!("creating {}", path.display()))?;
        writeln!(file, "{}", serde_json::to_string(&header)?)?;
        file.sync_data()?;
        Ok(Journal {
            path: path.to_owned(),
            file,
            header,
            settled: BTreeSet::new(),
        })
    }

    /// The ids of the snapshot not settled yet, in order.
    pub(crate) fn remaining(&self) -> Vec<DeadLetterId> {
        self.header
            .ids
            .iter()
            .map(|&id| DeadLetterId(id))
            .filter(|id| !self.settled.contains(id))
            .collect()
    }

    /// Records that `id` is settled with `result`: a re-run will not act on it again.
    pub(crate) fn settle(&mut self, id: DeadLetterId, result: &str) -> Result<()> {
        let line = serde_json::to_string(&Line::Settled {
            id: id.0,
            result: result.to_owned(),
        })?;
        writeln!(self.file, "{line}")
            .and_then(|()| self.file.flush())
            .with_context(|| format!("writing {}", self.path.display()))?;
        self.settled.insert(id);
        Ok(())
    }

    /// Closes the run: the next identical command takes a new snapshot.
    pub(crate) fn finish(mut self) -> Result<()> {
        let line = serde_json::to_string(&Line::Finished { finished: true })?;
        writeln!(self.file, "{line}")?;
        self.file.sync_data()?;
        Ok(())
    }

    /// Where it is.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_journal_resumes_where_it_stopped_and_a_torn_line_is_redone() {
        let dir = std::env::temp_dir().join(format!("jobs-journal-{}", std::process::id()));
        let path = path_for(&dir, "replay", "sqlite://x|queue=a");
        assert_eq!(path, path_for(&dir, "replay", "sqlite://x|queue=a"));
        assert_ne!(path, path_for(&dir, "replay", "sqlite://x|queue=b"));
        let header = Header {
            action: "replay".into(),
            filter: "queue=a".into(),
            ids: vec![1, 2, 3, 4],
            started_at_ms: 0,
        };
        let mut journal = Journal::create(&path, header).expect("create");
        journal.settle(DeadLetterId(1), "replayed").expect("settle");
        journal.settle(DeadLetterId(2), "replayed").expect("settle");
        drop(journal);
        let mut file = OpenOptions::new().append(true).open(&path).expect("open");
        write!(file, "{{\"id\":3,\"res").expect("a torn line");
        drop(file);

        let journal = Journal::open_unfinished(&path)
            .expect("read")
            .expect("unfinished");
        assert_eq!(journal.remaining(), [DeadLetterId(3), DeadLetterId(4)]);
        journal.finish().expect("finish");
        assert!(
            Journal::open_unfinished(&path).expect("read").is_none(),
            "a finished journal is not resumed"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
