//! A run's rows: the run, its cells, one result per repetition; what is done, counted, left.

use rusqlite::{OptionalExtension, params};

use super::processes::holder_alive;
use super::{ResultsDb, ResultsDbError, RunState, host_name};
use crate::fleet::{BoxIdentity, FleetId, FleetShard, Shard};
use crate::matrix::{Cell, Plan};
use crate::record::{Record, Status, now_rfc3339};

/// The columns [`run_info`] reads, from `runs`.
const RUN_SELECT: &str = "SELECT id, matrix_name, matrix_file, baseline, repetitions, cells_total, state, host, pid,
        created_at, finished_at, (SELECT COALESCE(SUM(span), 0) FROM results WHERE run_id = runs.id), claimed_at,
        matrix_hash, fleet, shard, box
    FROM runs";

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
    /// Cells in the run's plan.
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
    /// Its matrix's hash ([`Plan::matrix_hash`]; none for runs made before fleets).
    pub matrix_hash: Option<String>,
    /// The fleet run and shard it is, if it is one.
    pub fleet: Option<FleetShard>,
    /// The box it ran on, as it saw itself ([`BoxIdentity`]); none for runs made before.
    #[serde(rename = "box")]
    pub box_identity: Option<BoxIdentity>,
}

impl ResultsDb {
    /// Records a new run of `plan` by this process; returns its ID.
    pub fn create_run(&mut self, plan: &Plan) -> Result<String, ResultsDbError> {
        self.create_run_drawing(plan, new_run_id)
    }

    /// [`Self::create_run`] with the IDs drawn by `draw`.
    pub(super) fn create_run_drawing(
        &mut self,
        plan: &Plan,
        mut draw: impl FnMut() -> String,
    ) -> Result<String, ResultsDbError> {
        let sql = self.sql();
        let tx = self.conn.transaction().map_err(&sql)?;
        // An ID is the second plus 16 random bits: runs made in one second (a burst of
        // submits) can draw the same one, so a taken ID is drawn again.
        let id = loop {
            let id = draw();
            let inserted = tx
                .execute(
                    "INSERT OR IGNORE INTO runs (id, matrix_name, matrix_file, matrix_toml, baseline, repetitions,
                                                 cells_total, state, host, pid, created_at, matrix_hash, fleet, shard)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'running', ?8, ?9, ?10, ?11, ?12, ?13)",
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
                        plan.matrix_hash(),
                        plan.share().map(|s| s.fleet.to_string()),
                        plan.share().map(|s| s.shard.to_string()),
                    ],
                )
                .map_err(&sql)?;
            if inserted == 1 {
                break id;
            }
        };
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

    /// Marks a run as waiting in a daemon's queue (or not: its worker started it).
    pub fn set_queued(&self, run: &str, queued: bool) -> Result<(), ResultsDbError> {
        self.conn.execute("UPDATE runs SET queued = ?2 WHERE id = ?1", params![run, queued]).map_err(self.sql())?;
        Ok(())
    }

    /// The runs of this host that a daemon queued and never started, whose daemon is gone
    /// (they read as interrupted), oldest first: what a daemon that starts queues again.
    pub fn orphaned_queued_runs(&self) -> Result<Vec<String>, ResultsDbError> {
        let mut stmt = self
            .conn
            .prepare("SELECT id FROM runs WHERE queued = 1 AND state = 'running' AND host = ?1 ORDER BY created_at, id")
            .map_err(self.sql())?;
        let ids = stmt
            .query_map(params![host_name()], |r| r.get::<_, String>(0))
            .map_err(self.sql())?
            .collect::<Result<Vec<_>, _>>()
            .map_err(self.sql())?;
        let mut orphans = Vec::new();
        for id in ids {
            if self.run(&id)?.state == RunState::Interrupted {
                orphans.push(id);
            }
        }
        Ok(orphans)
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

    /// Records `records` in one transaction (what a cancel marks MISS); returns how many
    /// repetitions were new. MISS records of consecutive repetitions of a cell, for the same
    /// reason, are one row standing for them all (its `span`): a cancel of a large run writes a
    /// row per cell, not per repetition.
    pub fn record_all(&mut self, records: &[Record]) -> Result<usize, ResultsDbError> {
        let sql = self.sql();
        let tx = self.conn.transaction().map_err(&sql)?;
        let mut fresh = 0;
        {
            let mut insert = tx
                .prepare(
                    "INSERT OR IGNORE INTO results (run_id, cell_idx, repetition, status, reason, record, created_at, span)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                )
                .map_err(&sql)?;
            let now = now_rfc3339();
            for (record, span) in spans(records) {
                let json = serde_json::to_string(record).expect("a record always serializes");
                let inserted = insert
                    .execute(params![
                        record.run,
                        record.cell.index,
                        record.repetition,
                        record.status,
                        record.reason,
                        json,
                        now,
                        span
                    ])
                    .map_err(&sql)?;
                fresh += inserted * span as usize;
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
            .prepare("SELECT cell_idx, SUM(span) FROM results WHERE run_id = ?1 GROUP BY cell_idx")
            .map_err(&sql)?;
        for row in stmt.query_map(params![run], |r| Ok((r.get::<_, usize>(0)?, r.get::<_, usize>(1)?))).map_err(&sql)? {
            let (cell, n) = row.map_err(&sql)?;
            per_cell.insert(cell, n);
        }
        let mut by_status = std::collections::BTreeMap::new();
        let mut stmt = self
            .conn
            .prepare("SELECT status, SUM(span) FROM results WHERE run_id = ?1 GROUP BY status")
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
            .query_row(&format!("{RUN_SELECT} WHERE id = ?1"), params![run], run_info)
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
        self.runs_page(0, usize::MAX)
    }

    /// How many runs there are.
    pub fn run_count(&self) -> Result<usize, ResultsDbError> {
        let n: i64 = self.conn.query_row("SELECT COUNT(*) FROM runs", [], |r| r.get(0)).map_err(self.sql())?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// At most `limit` runs from the `offset`th, newest first.
    pub fn runs_page(&self, offset: usize, limit: usize) -> Result<Vec<RunInfo>, ResultsDbError> {
        let mut stmt = self
            .conn
            .prepare(&format!("{RUN_SELECT} ORDER BY created_at DESC, id DESC LIMIT ?1 OFFSET ?2"))
            .map_err(self.sql())?;
        let (limit, offset) = (i64::try_from(limit).unwrap_or(i64::MAX), i64::try_from(offset).unwrap_or(i64::MAX));
        let rows = stmt.query_map(params![limit, offset], run_info).map_err(self.sql())?;
        rows.collect::<Result<Vec<_>, _>>().map_err(self.sql())
    }

    /// The runs of fleet run `fleet`, by shard.
    pub fn fleet_runs(&self, fleet: &FleetId) -> Result<Vec<RunInfo>, ResultsDbError> {
        let mut stmt =
            self.conn.prepare(&format!("{RUN_SELECT} WHERE fleet = ?1 ORDER BY shard, id")).map_err(self.sql())?;
        let rows = stmt.query_map(params![fleet.as_str()], run_info).map_err(self.sql())?;
        let mut runs = rows.collect::<Result<Vec<_>, _>>().map_err(self.sql())?;
        // A run whose shard does not parse (an edited database) is no shard.
        runs.retain(|r| r.fleet.is_some());
        runs.sort_by_key(|r| r.fleet.as_ref().map(|f| f.shard));
        Ok(runs)
    }

    /// The run that is shard `share` here, if one is.
    pub fn shard_run(&self, share: &FleetShard) -> Result<Option<RunInfo>, ResultsDbError> {
        Ok(self
            .fleet_runs(&share.fleet)?
            .into_iter()
            .find(|r| r.fleet.as_ref().is_some_and(|f| f.shard == share.shard)))
    }

    /// Stores the box `run` runs on (made at its creation, again at a resume).
    pub fn set_box(&self, run: &str, identity: &BoxIdentity) -> Result<(), ResultsDbError> {
        let json = serde_json::to_string(identity).expect("a box identity always serializes");
        self.conn.execute("UPDATE runs SET box = ?2 WHERE id = ?1", params![run, json]).map_err(self.sql())?;
        Ok(())
    }

    /// The box `run` ran on, if it was stored.
    pub fn run_box(&self, run: &str) -> Result<Option<BoxIdentity>, ResultsDbError> {
        let json: Option<String> = self
            .conn
            .query_row("SELECT box FROM runs WHERE id = ?1", params![run], |r| r.get(0))
            .optional()
            .map_err(self.sql())?
            .ok_or_else(|| ResultsDbError::NoRun(run.to_string()))?;
        json.map(|j| serde_json::from_str(&j)).transpose().map_err(|e| ResultsDbError::Corrupt {
            run: run.to_string(),
            what: "box",
            reason: e.to_string(),
        })
    }

    /// Takes what device `device`'s health check read into the box `run` runs on.
    pub fn saw_health(&self, run: &str, device: &str, health: &engines::health::Health) -> Result<(), ResultsDbError> {
        if let Some(mut identity) = self.run_box(run)? {
            identity.saw_health(device, health);
            self.set_box(run, &identity)?;
        }
        Ok(())
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
            .prepare("SELECT record, span FROM results WHERE run_id = ?1 ORDER BY cell_idx, repetition")
            .map_err(self.sql())?;
        let mut rows = stmt.query(params![run]).map_err(self.sql())?;
        while let Some(row) = rows.next().map_err(self.sql())? {
            let (json, span): (String, u32) = (row.get(0).map_err(self.sql())?, row.get(1).map_err(self.sql())?);
            let record = parse_record(run, &json)?;
            if !each_repetition(record, span, 0, &mut visit) {
                break;
            }
        }
        Ok(())
    }

    /// Every record of a run, by cell and repetition.
    pub fn records(&self, run: &str) -> Result<Vec<Record>, ResultsDbError> {
        let mut records = Vec::new();
        self.visit_records(run, |r| {
            records.push(r);
            true
        })?;
        Ok(records)
    }

    /// The (cell index, repetition) pairs of a run that have a result.
    pub fn done(&self, run: &str) -> Result<Vec<(usize, u32)>, ResultsDbError> {
        let mut stmt = self
            .conn
            .prepare("SELECT cell_idx, repetition, span FROM results WHERE run_id = ?1")
            .map_err(self.sql())?;
        let rows = stmt.query_map(params![run], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).map_err(self.sql())?;
        let rows: Vec<(usize, u32, u32)> = rows.collect::<Result<_, _>>().map_err(self.sql())?;
        Ok(rows.into_iter().flat_map(|(cell, rep, span)| (rep..rep + span.max(1)).map(move |r| (cell, r))).collect())
    }
}

/// A stored record of `run`.
pub(super) fn parse_record(run: &str, json: &str) -> Result<Record, ResultsDbError> {
    serde_json::from_str(json).map_err(|e| ResultsDbError::Corrupt {
        run: run.to_string(),
        what: "records",
        reason: e.to_string(),
    })
}

/// Hands `visit` the repetitions a row of `span` stands for, from the `skip`th: its record, then
/// copies of it for the repetitions after; false once `visit` says stop.
pub(super) fn each_repetition(record: Record, span: u32, skip: u32, visit: &mut impl FnMut(Record) -> bool) -> bool {
    for i in skip..span.max(1) {
        let mut copy = record.clone();
        copy.repetition += i;
        if !visit(copy) {
            return false;
        }
    }
    true
}

/// `records` as rows: each with how many repetitions it stands for (MISS records of
/// consecutive repetitions of a cell, for the same reason, are one row).
fn spans(records: &[Record]) -> Vec<(&Record, u32)> {
    let mut rows: Vec<(&Record, u32)> = Vec::new();
    for record in records {
        if let Some((first, span)) = rows.last_mut()
            && record.status == Status::Miss
            && first.status == Status::Miss
            && first.run == record.run
            && first.cell.index == record.cell.index
            && first.reason == record.reason
            && first.repetition + *span == record.repetition
        {
            *span += 1;
            continue;
        }
        rows.push((record, 1));
    }
    rows
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
        matrix_hash: r.get(13)?,
        fleet: fleet_shard(r.get(14)?, r.get(15)?),
        box_identity: r.get::<_, Option<String>>(16)?.and_then(|json| serde_json::from_str(&json).ok()),
    })
}

/// The fleet run and shard stored as `fleet` and `shard` (none when either is missing or does
/// not parse: such a run is not counted as a shard).
fn fleet_shard(fleet: Option<String>, shard: Option<String>) -> Option<FleetShard> {
    Some(FleetShard { fleet: fleet?.parse::<FleetId>().ok()?, shard: shard?.parse::<Shard>().ok()? })
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
