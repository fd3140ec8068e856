//! Retention: the runs a database keeps. Pruning deletes the oldest ended runs past a number,
//! with their cells, results and artifacts folders; a run that is queued or running is never
//! touched, nor counted against the number. SQLite reuses the freed pages for new results (the
//! file does not shrink; `VACUUM` shrinks it).

use rusqlite::params;

use super::{ResultsDb, ResultsDbError, RunState};

/// What a prune did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pruned {
    /// The runs deleted, oldest first.
    pub runs: Vec<String>,
    /// Their results.
    pub results: usize,
    /// Bytes of their artifacts folders.
    pub artifact_bytes: u64,
}

impl ResultsDb {
    /// Deletes the ended runs (done, cancelled, interrupted) past the newest `keep` of them,
    /// oldest first, each in a transaction of its own, then its artifacts folder.
    pub fn prune(&mut self, keep: usize) -> Result<Pruned, ResultsDbError> {
        let ended: Vec<String> =
            self.runs()?.into_iter().filter(|r| r.state != RunState::Running).map(|r| r.id).collect();
        let mut pruned = Pruned::default();
        for run in ended.into_iter().skip(keep).rev() {
            pruned.results += self.delete_run(&run)?;
            let folder = self.artifacts(&run);
            pruned.artifact_bytes += folder_size(&folder);
            if let Err(e) = std::fs::remove_dir_all(&folder)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!("run {run}: its artifacts {}: {e}", folder.display());
            }
            pruned.runs.push(run);
        }
        Ok(pruned)
    }

    /// Deletes `run` with its cells and results; how many results it had.
    fn delete_run(&mut self, run: &str) -> Result<usize, ResultsDbError> {
        let sql = self.sql();
        let tx = self.conn.transaction().map_err(&sql)?;
        let results = tx.execute("DELETE FROM results WHERE run_id = ?1", params![run]).map_err(&sql)?;
        tx.execute("DELETE FROM cells WHERE run_id = ?1", params![run]).map_err(&sql)?;
        tx.execute("DELETE FROM leases WHERE run_id = ?1", params![run]).map_err(&sql)?;
        tx.execute("DELETE FROM runs WHERE id = ?1", params![run]).map_err(&sql)?;
        tx.commit().map_err(&sql)?;
        Ok(results)
    }
}

/// Bytes of the files below `dir` (0 when it is not there).
fn folder_size(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => folder_size(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}
