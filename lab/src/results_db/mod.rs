//! The results database: SQLite (WAL, versioned migrations) with runs, their cells, one result
//! per repetition, device leases and quarantines. Every result is committed as it is recorded, so
//! a lab killed mid-run loses nothing it finished; the run is then `interrupted` and can be
//! resumed.

mod devices;
mod pages;
mod processes;
mod prune;
mod runs;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior, params};

pub use devices::LeaseHolder;
pub use pages::RecordFilter;
pub use processes::{holder_alive, host_name, process_alive};
pub use prune::Pruned;
pub use runs::{ResultCounts, RunInfo, status_counts};

/// How long a writer waits for another process's transaction.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The schema, one migration per entry; `PRAGMA user_version` counts those applied.
const MIGRATIONS: &[&str] = &[
    // 1: runs, cells, results, leases, quarantined devices.
    "CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        matrix_name TEXT NOT NULL,
        matrix_file TEXT NOT NULL,
        matrix_toml TEXT NOT NULL,
        baseline TEXT,
        repetitions INTEGER NOT NULL,
        cells_total INTEGER NOT NULL,
        state TEXT NOT NULL,
        host TEXT NOT NULL,
        pid INTEGER,
        created_at TEXT NOT NULL,
        finished_at TEXT
    );
    CREATE TABLE cells (
        run_id TEXT NOT NULL REFERENCES runs(id),
        idx INTEGER NOT NULL,
        key TEXT NOT NULL,
        cell TEXT NOT NULL,
        PRIMARY KEY (run_id, idx)
    );
    CREATE TABLE results (
        run_id TEXT NOT NULL REFERENCES runs(id),
        cell_idx INTEGER NOT NULL,
        repetition INTEGER NOT NULL,
        status TEXT NOT NULL,
        reason TEXT,
        record TEXT NOT NULL,
        created_at TEXT NOT NULL,
        PRIMARY KEY (run_id, cell_idx, repetition)
    );
    CREATE INDEX results_by_status ON results (run_id, status);
    CREATE TABLE leases (
        device TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        acquired_at TEXT NOT NULL
    );
    CREATE TABLE quarantine (
        device TEXT PRIMARY KEY,
        reason TEXT NOT NULL,
        since TEXT NOT NULL
    );",
    // 2: devices registered with the daemon, which matrices over HTTP name.
    "CREATE TABLE devices (
        name TEXT PRIMARY KEY,
        definition TEXT NOT NULL,
        registered_at TEXT NOT NULL
    );",
    // 3: when the process in `runs.pid` took the run (created or resumed it): a process that
    // started later is not that process, but one that reused its PID (after a reboot, say).
    "ALTER TABLE runs ADD COLUMN claimed_at TEXT;",
    // 4: runs a daemon queued and has not started yet: a daemon that starts again queues them
    // again (a run it had started is interrupted, and resumed by hand).
    "ALTER TABLE runs ADD COLUMN queued INTEGER NOT NULL DEFAULT 0;",
    // 5: a row may stand for several repetitions of its cell, from its own on: a cancel's MISS
    // rows, one per run of repetitions that never ran, rather than one each.
    "ALTER TABLE results ADD COLUMN span INTEGER NOT NULL DEFAULT 1;",
    // 6: fleet runs: a run may be shard K/N of a fleet run (several boxes, one matrix), carries
    // its matrix's hash (what the shards share), and the box it ran on.
    "ALTER TABLE runs ADD COLUMN matrix_hash TEXT;
    ALTER TABLE runs ADD COLUMN fleet TEXT;
    ALTER TABLE runs ADD COLUMN shard TEXT;
    ALTER TABLE runs ADD COLUMN box TEXT;
    CREATE INDEX runs_by_fleet ON runs (fleet, shard);",
];

/// Errors of the results database.
#[derive(Debug, thiserror::Error)]
pub enum ResultsDbError {
    /// SQLite failed.
    #[error("results database {}: {source}", path.display())]
    Sqlite {
        /// The database file.
        path: PathBuf,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// The database file cannot be created.
    #[error("creating the results database {}: {source}", path.display())]
    Create {
        /// The file.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The folder for the database cannot be made.
    #[error("results database folder {}: {source}", path.display())]
    Folder {
        /// The folder.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// No such run.
    #[error("no run {0} in the results database (`driverlab lab list` lists them)")]
    NoRun(String),
    /// A stored value does not parse (a newer driverlab wrote it, or the file was edited).
    #[error("run {run}: stored {what} does not parse: {reason}")]
    Corrupt {
        /// The run.
        run: String,
        /// What did not parse (the matrix, the cells).
        what: &'static str,
        /// What went wrong, in words.
        reason: String,
    },
    /// A database whose fleet runs cannot be merged into this one.
    #[error("results database {}: not merged: {conflict}", file.display())]
    FleetConflict {
        /// The database that was to be merged.
        file: PathBuf,
        /// What conflicts.
        conflict: String,
    },
    /// The database was written by a newer driverlab.
    #[error("results database {}: schema version {found}, this driverlab knows up to {known}", path.display())]
    TooNew {
        /// The database file.
        path: PathBuf,
        /// Its version.
        found: i64,
        /// Records the database already had.
        known: usize,
    },
}

/// A run's state.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    strum::Display,
    strum::EnumString,
    strum::IntoStaticStr,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum RunState {
    /// Its lab process is working on it.
    Running,
    /// Every repetition has a result.
    Done,
    /// Its lab process went away before it finished: `driverlab lab resume` finishes it.
    Interrupted,
    /// Stopped on request; what did not run is MISS.
    Cancelled,
}

impl rusqlite::types::ToSql for RunState {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(<&'static str>::from(self).into())
    }
}

impl rusqlite::types::FromSql for RunState {
    fn column_result(value: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        value.as_str()?.parse().map_err(|e| rusqlite::types::FromSqlError::Other(Box::new(e)))
    }
}

/// The results database.
pub struct ResultsDb {
    pub(super) conn: Connection,
    path: PathBuf,
}

/// The default database: `$DRIVERLAB_DB`, else `driverlab/lab.db` in the user's data folder
/// (`~/.local/share` on Linux).
pub fn default_path() -> PathBuf {
    if let Some(path) = std::env::var_os("DRIVERLAB_DB") {
        return PathBuf::from(path);
    }
    dirs::data_dir().unwrap_or_else(std::env::temp_dir).join("driverlab").join("lab.db")
}

impl ResultsDb {
    /// Opens (creating it and its folder if need be) the database at `path` and brings its schema
    /// up to date.
    pub fn open(path: &Path) -> Result<ResultsDb, ResultsDbError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|source| ResultsDbError::Folder { path: dir.to_path_buf(), source })?;
        }
        let sql = |source| ResultsDbError::Sqlite { path: path.to_path_buf(), source };
        // A new database is private (0600); SQLite gives its WAL and shared-memory files the
        // same mode.
        if !path.exists() {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|source| ResultsDbError::Create { path: path.to_path_buf(), source })?;
        }
        let mut conn = Connection::open(path).map_err(sql)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(sql)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(sql)?;
        conn.pragma_update(None, "synchronous", "NORMAL").map_err(sql)?;
        conn.pragma_update(None, "foreign_keys", "ON").map_err(sql)?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(sql)?;
        if version as usize > MIGRATIONS.len() {
            return Err(ResultsDbError::TooNew { path: path.to_path_buf(), found: version, known: MIGRATIONS.len() });
        }
        for (i, migration) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Exclusive).map_err(sql)?;
            tx.execute_batch(migration).map_err(sql)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64).map_err(sql)?;
            tx.commit().map_err(sql)?;
        }
        Ok(ResultsDb { conn, path: path.to_path_buf() })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where a run's artifacts (serial logs) go: `artifacts/RUN` next to the database.
    pub fn artifacts(&self, run: &str) -> PathBuf {
        self.path.parent().unwrap_or(Path::new(".")).join("artifacts").join(run)
    }

    /// A mapper of SQLite's errors to this database's.
    pub(super) fn sql(&self) -> impl Fn(rusqlite::Error) -> ResultsDbError + use<> {
        let path = self.path.clone();
        move |source| ResultsDbError::Sqlite { path: path.clone(), source }
    }

    /// Writes a consistent copy of the whole database to `to` (which must not exist), while
    /// runs go on writing: what another box merges with [`ResultsDb::import`].
    pub fn snapshot(&self, to: &Path) -> Result<(), ResultsDbError> {
        self.conn.execute("VACUUM INTO ?1", params![to.display().to_string()]).map_err(self.sql())?;
        Ok(())
    }

    /// Merges every run of the database at `other` that this one lacks, with its cells and
    /// results; results already here are kept. A fleet run's shard that another run here
    /// already is, or a shard whose matrix differs from its fleet run's here, is refused and
    /// nothing is merged. Returns (runs added, results added).
    pub fn import(&mut self, other: &Path) -> Result<(usize, usize), ResultsDbError> {
        let source = ResultsDb::open(other)?;
        drop(source);
        let sql = self.sql();
        let tx = self.conn.transaction().map_err(&sql)?;
        tx.execute("ATTACH DATABASE ?1 AS other", params![other.display().to_string()]).map_err(&sql)?;
        let refused = fleet_conflict(&tx).map_err(&sql)?;
        if let Some(conflict) = refused {
            drop(tx);
            self.conn.execute("DETACH DATABASE other", []).map_err(self.sql())?;
            return Err(ResultsDbError::FleetConflict { file: other.to_path_buf(), conflict });
        }
        let runs = tx
            .execute(
                "INSERT OR IGNORE INTO runs (id, matrix_name, matrix_file, matrix_toml, baseline, repetitions,
                        cells_total, state, host, pid, created_at, finished_at, matrix_hash, fleet, shard, box)
                 SELECT id, matrix_name, matrix_file, matrix_toml, baseline, repetitions,
                        cells_total, CASE state WHEN 'running' THEN 'interrupted' ELSE state END, host, pid,
                        created_at, finished_at, matrix_hash, fleet, shard, box FROM other.runs",
                [],
            )
            .map_err(&sql)?;
        tx.execute("INSERT OR IGNORE INTO cells SELECT * FROM other.cells", []).map_err(&sql)?;
        let repetitions = |tx: &rusqlite::Transaction<'_>| -> Result<usize, ResultsDbError> {
            let n: i64 = tx.query_row("SELECT COALESCE(SUM(span), 0) FROM results", [], |r| r.get(0)).map_err(&sql)?;
            Ok(usize::try_from(n).unwrap_or(0))
        };
        let before = repetitions(&tx)?;
        tx.execute("INSERT OR IGNORE INTO results SELECT * FROM other.results", []).map_err(&sql)?;
        let results = repetitions(&tx)? - before;
        tx.commit().map_err(&sql)?;
        self.conn.execute("DETACH DATABASE other", []).map_err(self.sql())?;
        Ok((runs, results))
    }
}

/// Why the attached database `other` cannot be merged into this one: a run of it that is a
/// shard another run is (here or in it), or is of a fleet run whose matrix differs.
fn fleet_conflict(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<Option<String>> {
    use rusqlite::OptionalExtension;
    let same_shard = tx
        .query_row(
            "SELECT o.id, o.fleet, o.shard, r.id FROM other.runs o
             JOIN (SELECT id, fleet, shard FROM main.runs UNION ALL SELECT id, fleet, shard FROM other.runs) r
               ON r.fleet = o.fleet AND r.shard = o.shard AND r.id != o.id
             WHERE o.fleet IS NOT NULL AND NOT EXISTS (SELECT 1 FROM main.runs m WHERE m.id = o.id) LIMIT 1",
            [],
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get::<_, String>(3)?)),
        )
        .optional()?;
    if let Some((run, fleet, shard, taken_by)) = same_shard {
        return Ok(Some(format!(
            "its run {run} is shard {shard} of fleet run {fleet}, which run {taken_by} already is: \
             one database per shard (a shard run again on another box is that box's database alone)"
        )));
    }
    let other_matrix = tx
        .query_row(
            "SELECT o.id, o.fleet, o.matrix_hash, r.id, r.matrix_hash FROM other.runs o
             JOIN main.runs r ON r.fleet = o.fleet AND r.matrix_hash IS NOT o.matrix_hash
             WHERE o.fleet IS NOT NULL LIMIT 1",
            [],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<String>>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, Option<String>>(4)?,
                ))
            },
        )
        .optional()?;
    Ok(other_matrix.map(|(run, fleet, hash, here, here_hash)| {
        format!(
            "its run {run} is of fleet run {fleet} with matrix {}, and run {here} of that fleet run here has matrix {}: \
             the shards of one fleet run are of one matrix",
            hash.unwrap_or_default(),
            here_hash.unwrap_or_default()
        )
    }))
}
