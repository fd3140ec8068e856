//! The results database: SQLite (WAL, versioned migrations) with runs, their cells, one result
//! per repetition, device leases and quarantines. Every result is committed as it is recorded, so
//! a lab killed mid-run loses nothing it finished; the run is then `interrupted` and can be
//! resumed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::matrix::{Cell, Plan};
use crate::record::{Record, Status, now_rfc3339};

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
];

/// Errors of the results database.
#[derive(Debug, thiserror::Error)]
pub enum ResultsDbError {
    /// SQLite failed.
    #[error("results database {}: {source}", path.display())]
    Sqlite {
        /// The database file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rusqlite::Error,
    },
    /// The database file cannot be created.
    #[error("creating the results database {}: {source}", path.display())]
    Create {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The folder for the database cannot be made.
    #[error("results database folder {}: {source}", path.display())]
    Folder {
        /// The folder.
        path: PathBuf,
        /// Why.
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
        /// What.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// The database was written by a newer driverlab.
    #[error("results database {}: schema version {found}, this driverlab knows up to {known}", path.display())]
    TooNew {
        /// The database file.
        path: PathBuf,
        /// Its version.
        found: i64,
        /// Ours.
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

/// A run as the database holds it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunInfo {
    /// Its ID.
    pub id: String,
    /// The matrix's name.
    pub matrix: String,
    /// The matrix file it came from.
    pub matrix_file: String,
    /// The baseline variant.
    pub baseline: Option<String>,
    /// Repetitions per cell.
    pub repetitions: u32,
    /// Cells.
    pub cells_total: usize,
    /// Results recorded so far.
    pub results: usize,
    /// Its state (`running` with a lab process that is gone reads as `interrupted`).
    pub state: RunState,
    /// Where it ran.
    pub host: String,
    /// When it was created.
    pub created_at: String,
    /// When it finished.
    pub finished_at: Option<String>,
}

/// Who holds a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHolder {
    /// The run.
    pub run: String,
    /// Its lab process.
    pub pid: u32,
    /// Its host.
    pub host: String,
}

/// The results database.
pub struct ResultsDb {
    conn: Connection,
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

/// This host's name, for leases.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// Whether the process that took something at `since` (RFC 3339) as `pid` on `host` may still
/// hold it: always for another host (the lab cannot tell), else `pid` must exist and have started
/// no later than `since` (a process that started after it only reused the PID, as a box's
/// daemon does after a reboot).
pub fn holder_alive(host: &str, pid: u32, since: &str) -> bool {
    if host != host_name() {
        return true;
    }
    if !process_alive(pid) {
        return false;
    }
    let (Some(started), Ok(since)) = (process_started(pid), humantime::parse_rfc3339_weak(since)) else {
        return true;
    };
    // The boot time is in whole seconds: allow for it.
    started <= since + Duration::from_secs(2)
}

/// When process `pid` started: the boot time (`/proc/stat` `btime`) plus its start in clock
/// ticks (`/proc/PID/stat` field 22).
fn process_started(pid: u32) -> Option<std::time::SystemTime> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces and parentheses: the fields after it follow the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    let ticks: u64 = after.split_whitespace().nth(19)?.parse().ok()?;
    let boot: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = u64::try_from(hz).ok().filter(|&h| h > 0)?;
    Some(std::time::UNIX_EPOCH + Duration::from_secs(boot) + Duration::from_millis(ticks * 1000 / hz))
}

/// Whether process `pid` exists on this host.
pub fn process_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists; it sends nothing.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
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

    fn sql(&self) -> impl Fn(rusqlite::Error) -> ResultsDbError + use<> {
        let path = self.path.clone();
        move |source| ResultsDbError::Sqlite { path: path.clone(), source }
    }

    /// Records a new run of `plan` by this process; returns its ID.
    pub fn create_run(&mut self, plan: &Plan) -> Result<String, ResultsDbError> {
        let id = new_run_id();
        let sql = self.sql();
        let tx = self.conn.transaction().map_err(&sql)?;
        tx.execute(
            "INSERT INTO runs (id, matrix_name, matrix_file, matrix_toml, baseline, repetitions, cells_total,
                               state, host, pid, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'running', ?8, ?9, ?10)",
            params![
                id,
                plan.matrix.name,
                plan.file.display().to_string(),
                plan.text,
                plan.baseline(),
                plan.matrix.repetitions,
                plan.cells.len(),
                host_name(),
                std::process::id(),
                now_rfc3339(),
            ],
        )
        .map_err(&sql)?;
        for cell in &plan.cells {
            let json = serde_json::to_string(cell).expect("a cell always serializes");
            tx.execute(
                "INSERT INTO cells (run_id, idx, key, cell) VALUES (?1, ?2, ?3, ?4)",
                params![id, cell.index, cell.key(), json],
            )
            .map_err(&sql)?;
        }
        tx.commit().map_err(&sql)?;
        Ok(id)
    }

    /// Marks `run` as worked on by this process again (resume). Its MISS records, repetitions
    /// that should have run and did not, go: they run now.
    pub fn claim_run(&mut self, run: &str) -> Result<(), ResultsDbError> {
        let sql = self.sql();
        let tx = self.conn.transaction().map_err(&sql)?;
        tx.execute(
            "UPDATE runs SET state = 'running', pid = ?2, host = ?3, claimed_at = ?4, finished_at = NULL WHERE id = ?1",
            params![run, std::process::id(), host_name(), now_rfc3339()],
        )
        .map_err(&sql)?;
        tx.execute("DELETE FROM results WHERE run_id = ?1 AND status = 'MISS'", params![run]).map_err(&sql)?;
        tx.commit().map_err(&sql)?;
        Ok(())
    }

    /// Sets a run's final state.
    pub fn finish_run(&self, run: &str, state: RunState) -> Result<(), ResultsDbError> {
        self.conn
            .execute("UPDATE runs SET state = ?2, finished_at = ?3 WHERE id = ?1", params![run, state, now_rfc3339()])
            .map_err(self.sql())?;
        Ok(())
    }

    /// Stores one repetition's record; a record already there for the same repetition is kept
    /// (returns false), so a resumed run never duplicates one.
    pub fn record(&self, record: &Record) -> Result<bool, ResultsDbError> {
        let json = serde_json::to_string(record).expect("a record always serializes");
        let n = self
            .conn
            .execute(
                "INSERT OR IGNORE INTO results (run_id, cell_idx, repetition, status, reason, record, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    record.run,
                    record.cell.index,
                    record.repetition,
                    record.status,
                    record.reason,
                    json,
                    now_rfc3339()
                ],
            )
            .map_err(self.sql())?;
        Ok(n == 1)
    }

    /// Records `records` in one transaction (what a cancel marks MISS); returns how many were
    /// new.
    pub fn record_all(&mut self, records: &[Record]) -> Result<usize, ResultsDbError> {
        let sql = self.sql();
        let tx = self.conn.transaction().map_err(&sql)?;
        let mut fresh = 0;
        {
            let mut insert = tx
                .prepare(
                    "INSERT OR IGNORE INTO results (run_id, cell_idx, repetition, status, reason, record, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )
                .map_err(&sql)?;
            let now = now_rfc3339();
            for record in records {
                let json = serde_json::to_string(record).expect("a record always serializes");
                fresh += insert
                    .execute(params![
                        record.run,
                        record.cell.index,
                        record.repetition,
                        record.status,
                        record.reason,
                        json,
                        now
                    ])
                    .map_err(&sql)?;
            }
        }
        tx.commit().map_err(&sql)?;
        Ok(fresh)
    }

    /// A run's results counted in the database, without reading them: per cell index, and per
    /// status.
    pub fn result_counts(&self, run: &str) -> Result<ResultCounts, ResultsDbError> {
        let sql = self.sql();
        let mut per_cell = std::collections::BTreeMap::new();
        let mut stmt = self
            .conn
            .prepare("SELECT cell_idx, COUNT(*) FROM results WHERE run_id = ?1 GROUP BY cell_idx")
            .map_err(&sql)?;
        for row in stmt.query_map(params![run], |r| Ok((r.get::<_, usize>(0)?, r.get::<_, usize>(1)?))).map_err(&sql)? {
            let (cell, n) = row.map_err(&sql)?;
            per_cell.insert(cell, n);
        }
        let mut by_status = std::collections::BTreeMap::new();
        let mut stmt = self
            .conn
            .prepare("SELECT status, COUNT(*) FROM results WHERE run_id = ?1 GROUP BY status")
            .map_err(&sql)?;
        for row in
            stmt.query_map(params![run], |r| Ok((r.get::<_, Status>(0)?, r.get::<_, usize>(1)?))).map_err(&sql)?
        {
            let (status, n) = row.map_err(&sql)?;
            by_status.insert(status, n);
        }
        Ok(ResultCounts { per_cell, by_status })
    }

    fn run_row(&self, run: &str) -> Result<RunInfo, ResultsDbError> {
        let row = self
            .conn
            .query_row(
                "SELECT id, matrix_name, matrix_file, baseline, repetitions, cells_total, state, host, pid,
                        created_at, finished_at,
                        (SELECT COUNT(*) FROM results WHERE run_id = runs.id), claimed_at
                 FROM runs WHERE id = ?1",
                params![run],
                run_info,
            )
            .optional()
            .map_err(self.sql())?;
        row.ok_or_else(|| ResultsDbError::NoRun(run.to_string()))
    }

    /// One run.
    pub fn run(&self, run: &str) -> Result<RunInfo, ResultsDbError> {
        self.run_row(run)
    }

    /// Every run, newest first.
    pub fn runs(&self) -> Result<Vec<RunInfo>, ResultsDbError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT id, matrix_name, matrix_file, baseline, repetitions, cells_total, state, host, pid,
                        created_at, finished_at,
                        (SELECT COUNT(*) FROM results WHERE run_id = runs.id), claimed_at
                 FROM runs ORDER BY created_at DESC, id DESC",
            )
            .map_err(self.sql())?;
        let rows = stmt.query_map([], run_info).map_err(self.sql())?;
        rows.collect::<Result<Vec<_>, _>>().map_err(self.sql())
    }

    /// A run's matrix text, its file name and its stored cells.
    pub fn run_plan(&self, run: &str) -> Result<(String, String, Vec<Cell>), ResultsDbError> {
        let (file, toml): (String, String) = self
            .conn
            .query_row("SELECT matrix_file, matrix_toml FROM runs WHERE id = ?1", params![run], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()
            .map_err(self.sql())?
            .ok_or_else(|| ResultsDbError::NoRun(run.to_string()))?;
        let mut stmt =
            self.conn.prepare("SELECT cell FROM cells WHERE run_id = ?1 ORDER BY idx").map_err(self.sql())?;
        let cells = stmt
            .query_map(params![run], |r| r.get::<_, String>(0))
            .map_err(self.sql())?
            .collect::<Result<Vec<_>, _>>()
            .map_err(self.sql())?;
        let cells = cells
            .iter()
            .map(|json| serde_json::from_str(json))
            .collect::<Result<Vec<Cell>, _>>()
            .map_err(|e| ResultsDbError::Corrupt { run: run.to_string(), what: "cells", reason: e.to_string() })?;
        Ok((file, toml, cells))
    }

    /// Hands `run`'s records to `visit` one at a time, by cell and repetition, until it returns
    /// false: a page of a large run costs the page, not the run.
    pub fn visit_records(&self, run: &str, mut visit: impl FnMut(Record) -> bool) -> Result<(), ResultsDbError> {
        let mut stmt = self
            .conn
            .prepare("SELECT record FROM results WHERE run_id = ?1 ORDER BY cell_idx, repetition")
            .map_err(self.sql())?;
        let mut rows = stmt.query(params![run]).map_err(self.sql())?;
        while let Some(row) = rows.next().map_err(self.sql())? {
            let json: String = row.get(0).map_err(self.sql())?;
            let record = serde_json::from_str(&json).map_err(|e| ResultsDbError::Corrupt {
                run: run.to_string(),
                what: "records",
                reason: e.to_string(),
            })?;
            if !visit(record) {
                break;
            }
        }
        Ok(())
    }

    /// Every record of a run, by cell and repetition.
    pub fn records(&self, run: &str) -> Result<Vec<Record>, ResultsDbError> {
        let mut stmt = self
            .conn
            .prepare("SELECT record FROM results WHERE run_id = ?1 ORDER BY cell_idx, repetition")
            .map_err(self.sql())?;
        let rows = stmt
            .query_map(params![run], |r| r.get::<_, String>(0))
            .map_err(self.sql())?
            .collect::<Result<Vec<_>, _>>()
            .map_err(self.sql())?;
        rows.iter()
            .map(|json| serde_json::from_str(json))
            .collect::<Result<Vec<Record>, _>>()
            .map_err(|e| ResultsDbError::Corrupt { run: run.to_string(), what: "records", reason: e.to_string() })
    }

    /// The (cell index, repetition) pairs of a run that have a result.
    pub fn done(&self, run: &str) -> Result<Vec<(usize, u32)>, ResultsDbError> {
        let mut stmt =
            self.conn.prepare("SELECT cell_idx, repetition FROM results WHERE run_id = ?1").map_err(self.sql())?;
        let rows = stmt.query_map(params![run], |r| Ok((r.get(0)?, r.get(1)?))).map_err(self.sql())?;
        rows.collect::<Result<Vec<_>, _>>().map_err(self.sql())
    }

    /// Takes the exclusive lease on `device` for `run`, or says who holds it. A lease whose holder
    /// on this host is gone is taken over.
    pub fn acquire(&mut self, device: &str, run: &str) -> Result<Result<(), LeaseHolder>, ResultsDbError> {
        let sql = self.sql();
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(&sql)?;
        let holder: Option<(String, String, u32, String)> = tx
            .query_row("SELECT run_id, host, pid, acquired_at FROM leases WHERE device = ?1", params![device], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .optional()
            .map_err(&sql)?;
        let me = std::process::id();
        let host = host_name();
        if let Some((holder_run, holder_host, pid, acquired_at)) = holder {
            let ours = holder_run == run && pid == me && holder_host == host;
            let stale = !holder_alive(&holder_host, pid, &acquired_at);
            if !ours && !stale {
                return Ok(Err(LeaseHolder { run: holder_run, pid, host: holder_host }));
            }
        }
        tx.execute(
            "INSERT OR REPLACE INTO leases (device, run_id, host, pid, acquired_at) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![device, run, host, me, now_rfc3339()],
        )
        .map_err(&sql)?;
        tx.commit().map_err(&sql)?;
        Ok(Ok(()))
    }

    /// Gives a lease back.
    pub fn release(&self, device: &str, run: &str) -> Result<(), ResultsDbError> {
        self.conn
            .execute(
                "DELETE FROM leases WHERE device = ?1 AND run_id = ?2 AND pid = ?3",
                params![device, run, std::process::id()],
            )
            .map_err(self.sql())?;
        Ok(())
    }

    /// The leases held now: device, holder. A lease whose holder on this host is gone (the
    /// next [`ResultsDb::acquire`] takes it over) is not held.
    pub fn leases(&self) -> Result<Vec<(String, LeaseHolder)>, ResultsDbError> {
        let mut stmt = self
            .conn
            .prepare("SELECT device, run_id, pid, host, acquired_at FROM leases ORDER BY device")
            .map_err(self.sql())?;
        let rows = stmt
            .query_map([], |r| {
                let holder = LeaseHolder { run: r.get(1)?, pid: r.get(2)?, host: r.get(3)? };
                let acquired_at: String = r.get(4)?;
                Ok((r.get::<_, String>(0)?, holder, acquired_at))
            })
            .map_err(self.sql())?;
        let mut held = Vec::new();
        for row in rows {
            let (device, holder, acquired_at) = row.map_err(self.sql())?;
            if holder_alive(&holder.host, holder.pid, &acquired_at) {
                held.push((device, holder));
            }
        }
        Ok(held)
    }

    /// Quarantines a host device: no run uses it until it is released.
    pub fn quarantine(&self, device: &str, reason: &str) -> Result<(), ResultsDbError> {
        self.conn
            .execute(
                "INSERT OR REPLACE INTO quarantine (device, reason, since) VALUES (?1, ?2, ?3)",
                params![device, reason, now_rfc3339()],
            )
            .map_err(self.sql())?;
        Ok(())
    }

    /// Why a device is quarantined, if it is.
    pub fn quarantined(&self, device: &str) -> Result<Option<String>, ResultsDbError> {
        self.conn
            .query_row("SELECT reason FROM quarantine WHERE device = ?1", params![device], |r| r.get(0))
            .optional()
            .map_err(self.sql())
    }

    /// Every quarantined device: device, reason, since.
    pub fn quarantine_list(&self) -> Result<Vec<(String, String, String)>, ResultsDbError> {
        let mut stmt =
            self.conn.prepare("SELECT device, reason, since FROM quarantine ORDER BY device").map_err(self.sql())?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).map_err(self.sql())?;
        rows.collect::<Result<Vec<_>, _>>().map_err(self.sql())
    }

    /// Lifts a quarantine; returns whether there was one.
    pub fn unquarantine(&self, device: &str) -> Result<bool, ResultsDbError> {
        let n = self.conn.execute("DELETE FROM quarantine WHERE device = ?1", params![device]).map_err(self.sql())?;
        Ok(n > 0)
    }

    /// Registers `device` under its name; false if that name is taken.
    pub fn register_device(&self, device: &crate::matrix::Device) -> Result<bool, ResultsDbError> {
        let json = serde_json::to_string(device).expect("a device always serializes");
        let n = self
            .conn
            .execute(
                "INSERT OR IGNORE INTO devices (name, definition, registered_at) VALUES (?1, ?2, ?3)",
                params![device.name, json, now_rfc3339()],
            )
            .map_err(self.sql())?;
        Ok(n > 0)
    }

    /// The registered devices, by name, with when each was registered.
    pub fn devices(&self) -> Result<Vec<(crate::matrix::Device, String)>, ResultsDbError> {
        let mut stmt =
            self.conn.prepare("SELECT definition, registered_at FROM devices ORDER BY name").map_err(self.sql())?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .map_err(self.sql())?
            .collect::<Result<Vec<_>, _>>()
            .map_err(self.sql())?;
        rows.into_iter()
            .map(|(json, at)| {
                serde_json::from_str(&json).map(|d| (d, at)).map_err(|e| ResultsDbError::Corrupt {
                    run: String::new(),
                    what: "devices",
                    reason: e.to_string(),
                })
            })
            .collect()
    }

    /// The registered device `name`.
    pub fn device(&self, name: &str) -> Result<Option<crate::matrix::Device>, ResultsDbError> {
        Ok(self.devices()?.into_iter().map(|(d, _)| d).find(|d| d.name == name))
    }

    /// Removes the registered device `name`; returns whether there was one.
    pub fn remove_device(&self, name: &str) -> Result<bool, ResultsDbError> {
        let n = self.conn.execute("DELETE FROM devices WHERE name = ?1", params![name]).map_err(self.sql())?;
        Ok(n > 0)
    }

    /// Writes a consistent copy of the whole database to `to` (which must not exist), while
    /// runs go on writing: what another box merges with [`ResultsDb::import`].
    pub fn snapshot(&self, to: &Path) -> Result<(), ResultsDbError> {
        self.conn.execute("VACUUM INTO ?1", params![to.display().to_string()]).map_err(self.sql())?;
        Ok(())
    }

    /// Merges every run of the database at `other` that this one lacks, with its cells and
    /// results; results already here are kept. Returns (runs added, results added).
    pub fn import(&mut self, other: &Path) -> Result<(usize, usize), ResultsDbError> {
        let source = ResultsDb::open(other)?;
        drop(source);
        let sql = self.sql();
        let tx = self.conn.transaction().map_err(&sql)?;
        tx.execute("ATTACH DATABASE ?1 AS other", params![other.display().to_string()]).map_err(&sql)?;
        let runs = tx
            .execute(
                "INSERT OR IGNORE INTO runs (id, matrix_name, matrix_file, matrix_toml, baseline, repetitions,
                        cells_total, state, host, pid, created_at, finished_at)
                 SELECT id, matrix_name, matrix_file, matrix_toml, baseline, repetitions,
                        cells_total, CASE state WHEN 'running' THEN 'interrupted' ELSE state END, host, pid,
                        created_at, finished_at FROM other.runs",
                [],
            )
            .map_err(&sql)?;
        tx.execute("INSERT OR IGNORE INTO cells SELECT * FROM other.cells", []).map_err(&sql)?;
        let results = tx.execute("INSERT OR IGNORE INTO results SELECT * FROM other.results", []).map_err(&sql)?;
        tx.commit().map_err(&sql)?;
        self.conn.execute("DETACH DATABASE other", []).map_err(self.sql())?;
        Ok((runs, results))
    }
}

fn run_info(r: &rusqlite::Row<'_>) -> rusqlite::Result<RunInfo> {
    let mut state: RunState = r.get(6)?;
    let host: String = r.get(7)?;
    let pid: Option<u32> = r.get(8)?;
    let created_at: String = r.get(9)?;
    let claimed_at: Option<String> = r.get(12)?;
    let since = claimed_at.as_deref().unwrap_or(&created_at);
    if state == RunState::Running && !pid.is_some_and(|pid| holder_alive(&host, pid, since)) {
        state = RunState::Interrupted;
    }
    Ok(RunInfo {
        id: r.get(0)?,
        matrix: r.get(1)?,
        matrix_file: r.get(2)?,
        baseline: r.get(3)?,
        repetitions: r.get(4)?,
        cells_total: r.get(5)?,
        state,
        host,
        created_at,
        finished_at: r.get(10)?,
        results: r.get(11)?,
    })
}

/// A new run ID: UTC date and time, then random hex (`20261201-153012-a3f9`).
fn new_run_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let stamp: String = now.chars().filter(char::is_ascii_digit).collect();
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher
        .write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.write_u32(std::process::id());
    format!("{}-{}-{:04x}", &stamp[..8], &stamp[8..14], hasher.finish() & 0xffff)
}

/// Counts of a run's records by status.
/// A run's results as counts ([`ResultsDb::result_counts`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResultCounts {
    /// Results per cell index.
    pub per_cell: std::collections::BTreeMap<usize, usize>,
    /// Results per status.
    pub by_status: std::collections::BTreeMap<Status, usize>,
}

impl ResultCounts {
    /// Every result.
    pub fn total(&self) -> usize {
        self.per_cell.values().sum()
    }
}

/// Counts records by status.
pub fn status_counts(records: &[Record]) -> std::collections::BTreeMap<Status, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for r in records {
        *counts.entry(r.status).or_insert(0) += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Status;

    fn plan() -> Plan {
        let text = "name = \"t\"\nrepetitions = 2\n[[device]]\nname = \"aq\"\nmodel = \"aqc100\"\n\
                    [[image]]\nname = \"probe\"\nkernel = \"probe\"\n[[variant]]\nname = \"v\"\nimage = \"probe\"\n\
                    [[workload]]\nname = \"rx\"\nkind = \"probe-rx\"\n";
        Plan::parse(Path::new("t.toml"), text).unwrap()
    }

    #[test]
    fn runs_cells_and_results_survive_reopening_and_never_duplicate() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/lab.db");
        let plan = plan();
        let run = {
            let mut store = ResultsDb::open(&path).unwrap();
            let run = store.create_run(&plan).unwrap();
            let record = crate::record::test_record(&run, &plan.cells[0], 0, Status::Pass, "ok");
            assert!(store.record(&record).unwrap());
            assert!(!store.record(&record).unwrap(), "the same repetition is kept once");
            run
        };
        let store = ResultsDb::open(&path).unwrap();
        let info = store.run(&run).unwrap();
        assert_eq!((info.cells_total, info.results, info.repetitions), (1, 1, 2));
        assert_eq!(info.state, RunState::Running, "this process still works on it");
        assert_eq!(store.done(&run).unwrap(), vec![(0, 0)]);
        let (_, toml, cells) = store.run_plan(&run).unwrap();
        assert_eq!((toml, cells), (plan.text.clone(), plan.cells.clone()));
        store.finish_run(&run, RunState::Done).unwrap();
        assert_eq!(store.runs().unwrap()[0].state, RunState::Done);
        assert!(matches!(store.run("nope"), Err(ResultsDbError::NoRun(_))));
    }

    #[test]
    fn a_run_whose_lab_is_gone_reads_as_interrupted() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = ResultsDb::open(&dir.path().join("lab.db")).unwrap();
        let run = store.create_run(&plan()).unwrap();
        store.conn.execute("UPDATE runs SET pid = 999999999 WHERE id = ?1", params![run]).unwrap();
        assert_eq!(store.run(&run).unwrap().state, RunState::Interrupted);
    }

    #[test]
    fn a_pid_reused_after_the_run_was_taken_is_not_its_lab() {
        // A box's daemon after a reboot has the PID its predecessor had: the run it finds in
        // the database, taken before this process started, is interrupted, and its lease free.
        let dir = tempfile::tempdir().unwrap();
        let mut store = ResultsDb::open(&dir.path().join("lab.db")).unwrap();
        let run = store.create_run(&plan()).unwrap();
        assert_eq!(store.run(&run).unwrap().state, RunState::Running, "taken by this process");
        assert_eq!(store.acquire("vfio=0000:63:00.0", &run).unwrap(), Ok(()));
        assert_eq!(store.leases().unwrap().len(), 1);
        let long_ago = "2020-01-01T00:00:00.000Z";
        store.conn.execute("UPDATE runs SET created_at = ?1", params![long_ago]).unwrap();
        store.conn.execute("UPDATE leases SET acquired_at = ?1", params![long_ago]).unwrap();
        assert_eq!(store.run(&run).unwrap().state, RunState::Interrupted);
        assert!(store.leases().unwrap().is_empty(), "a lease of a gone holder is not held");
        assert_eq!(store.acquire("vfio=0000:63:00.0", "run-b").unwrap(), Ok(()), "and is taken over");
        // Resuming claims the run again, from now.
        store.claim_run(&run).unwrap();
        assert_eq!(store.run(&run).unwrap().state, RunState::Running);
    }

    #[test]
    fn leases_are_exclusive_and_stale_ones_are_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lab.db");
        let mut a = ResultsDb::open(&path).unwrap();
        let mut b = ResultsDb::open(&path).unwrap();
        assert_eq!(a.acquire("vfio=0000:63:00.0", "run-a").unwrap(), Ok(()));
        assert_eq!(a.acquire("vfio=0000:63:00.0", "run-a").unwrap(), Ok(()), "re-entrant for its holder");
        let held = b.acquire("vfio=0000:63:00.0", "run-b").unwrap().unwrap_err();
        assert_eq!((held.run.as_str(), held.pid), ("run-a", std::process::id()));
        a.release("vfio=0000:63:00.0", "run-a").unwrap();
        assert_eq!(b.acquire("vfio=0000:63:00.0", "run-b").unwrap(), Ok(()));
        // A holder that died.
        b.conn.execute("UPDATE leases SET pid = 999999999", []).unwrap();
        assert_eq!(a.acquire("vfio=0000:63:00.0", "run-a").unwrap(), Ok(()));
        assert_eq!(a.leases().unwrap()[0].1.run, "run-a");
    }

    #[test]
    fn parallel_workers_never_hold_a_device_together() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lab.db");
        ResultsDb::open(&path).unwrap();
        let holders = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        let turns = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for worker in 0..4 {
                let (path, holders, most, turns) = (&path, &holders, &most, &turns);
                scope.spawn(move || {
                    // Each worker is its own connection, as separate lab processes would be.
                    let mut store = ResultsDb::open(path).unwrap();
                    let run = format!("run-{worker}");
                    for _ in 0..5 {
                        while store.acquire("vfio=0000:63:00.0", &run).unwrap().is_err() {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(2));
                        holders.fetch_sub(1, Ordering::SeqCst);
                        turns.fetch_add(1, Ordering::SeqCst);
                        store.release("vfio=0000:63:00.0", &run).unwrap();
                    }
                });
            }
        });
        assert_eq!((most.load(Ordering::SeqCst), turns.load(Ordering::SeqCst)), (1, 20));
    }

    #[test]
    fn quarantine_and_import() {
        let dir = tempfile::tempdir().unwrap();
        let mut here = ResultsDb::open(&dir.path().join("here.db")).unwrap();
        here.quarantine("vfio=0000:63:00.0", "no link after reset").unwrap();
        assert_eq!(here.quarantined("vfio=0000:63:00.0").unwrap().as_deref(), Some("no link after reset"));
        assert!(here.unquarantine("vfio=0000:63:00.0").unwrap());
        assert_eq!(here.quarantined("vfio=0000:63:00.0").unwrap(), None);

        let there_path = dir.path().join("there.db");
        let mut there = ResultsDb::open(&there_path).unwrap();
        let plan = plan();
        let run = there.create_run(&plan).unwrap();
        there.record(&crate::record::test_record(&run, &plan.cells[0], 0, Status::Pass, "ok")).unwrap();
        drop(there);
        assert_eq!(here.import(&there_path).unwrap(), (1, 1));
        assert_eq!(here.import(&there_path).unwrap(), (0, 0), "idempotent");
        assert_eq!(here.records(&run).unwrap().len(), 1);
    }
}
