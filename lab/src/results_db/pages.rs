//! A run's records a page at a time, selected in SQL: by status (its column), by cell and by
//! variant (the cell's stored JSON), counted without reading one record, so that an answer's
//! cost is its page, whatever the run's size or the offset asked for.

use rusqlite::params_from_iter;

use super::{ResultsDb, ResultsDbError};
use crate::record::{Record, Status};

/// Which of a run's records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordFilter<'a> {
    /// Only this status.
    pub status: Option<Status>,
    /// Only this cell (`c01`, ...).
    pub cell: Option<&'a str>,
    /// Only this variant.
    pub variant: Option<&'a str>,
}

impl RecordFilter<'_> {
    /// The `WHERE` clause over `results r JOIN cells c` for `run` (`?1`), and its parameters.
    fn clause(&self, run: &str) -> (String, Vec<String>) {
        let mut sql = String::from("r.run_id = ?1");
        let mut values = vec![run.to_string()];
        let mut add = |condition: &str, value: String| {
            values.push(value);
            sql.push_str(&format!(" AND {condition} = ?{}", values.len()));
        };
        if let Some(status) = self.status {
            add("r.status", status.name().to_string());
        }
        if let Some(cell) = self.cell {
            add("json_extract(c.cell, '$.id')", cell.to_string());
        }
        if let Some(variant) = self.variant {
            add("json_extract(c.cell, '$.variant')", variant.to_string());
        }
        (sql, values)
    }
}

const FROM: &str = "FROM results r JOIN cells c ON c.run_id = r.run_id AND c.idx = r.cell_idx";

impl ResultsDb {
    /// How many of `run`'s records `filter` selects.
    pub fn count_records(&self, run: &str, filter: &RecordFilter<'_>) -> Result<usize, ResultsDbError> {
        let (clause, values) = filter.clause(run);
        let count: i64 = self
            .conn
            .query_row(
                &format!("SELECT COALESCE(SUM(r.span), 0) {FROM} WHERE {clause}"),
                params_from_iter(values),
                |r| r.get(0),
            )
            .map_err(self.sql())?;
        Ok(usize::try_from(count).unwrap_or(0))
    }

    /// Hands `visit` the records of `run` that `filter` selects, by cell and repetition, from the
    /// `offset`th for at most `limit`, one at a time; `visit` returns false to stop. The rows
    /// before the offset are skipped by their running count of repetitions (a window over their
    /// index), never read.
    pub fn visit_page(
        &self,
        run: &str,
        filter: &RecordFilter<'_>,
        (offset, limit): (usize, usize),
        mut visit: impl FnMut(Record) -> bool,
    ) -> Result<(), ResultsDbError> {
        let (clause, mut values) = filter.clause(run);
        let at = values.len() + 1;
        values.push(i64::try_from(offset).unwrap_or(i64::MAX).to_string());
        let sql = format!(
            "SELECT r2.record, r2.span, w.upto FROM (
                 SELECT r.rowid AS id, SUM(r.span) OVER (ORDER BY r.cell_idx, r.repetition) AS upto
                 {FROM} WHERE {clause}
             ) w JOIN results r2 ON r2.rowid = w.id
             WHERE w.upto > CAST(?{at} AS INTEGER) ORDER BY w.upto LIMIT {}",
            i64::try_from(limit).unwrap_or(i64::MAX)
        );
        let mut stmt = self.conn.prepare(&sql).map_err(self.sql())?;
        let mut rows = stmt.query(params_from_iter(values)).map_err(self.sql())?;
        let mut left = limit;
        while let Some(row) = rows.next().map_err(self.sql())? {
            let json: String = row.get(0).map_err(self.sql())?;
            let (span, upto): (u32, i64) = (row.get(1).map_err(self.sql())?, row.get(2).map_err(self.sql())?);
            // The first row may begin before the offset: its repetitions up to it are skipped.
            let first = u64::try_from(upto).unwrap_or(0).saturating_sub(u64::from(span));
            let skip = u32::try_from((offset as u64).saturating_sub(first)).unwrap_or(u32::MAX).min(span);
            let mut go = true;
            let more = super::runs::each_repetition(super::runs::parse_record(run, &json)?, span, skip, &mut |r| {
                if left == 0 {
                    return false;
                }
                left -= 1;
                go = visit(r);
                go
            });
            if !more || !go || left == 0 {
                break;
            }
        }
        Ok(())
    }
}
