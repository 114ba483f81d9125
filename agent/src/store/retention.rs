//! Retention: delete the oldest steps (their causes, collectives, arrivals and windows go
//! with them by `ON DELETE CASCADE`) beyond an age, then beyond a size budget, and give the
//! freed pages back to the file system.

use std::time::Duration;

use rusqlite::TransactionBehavior;

use super::{error::sql, now, Store, StoreError};

/// What a retention pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// Steps deleted because they ended more than `max_age` ago.
    pub deleted_by_age: u64,
    /// Oldest steps deleted to bring the database under `max_bytes`.
    pub deleted_by_size: u64,
    /// `page_count × page_size` before and after.
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub steps_left: u64,
}

/// Size passes at most: each deletes an estimate of the steps that must go (at most
/// [`BATCH`]), so two or three are usual; the bound guards against a budget below the empty
/// schema's size. A store far over budget is brought under it over several runs.
const MAX_SIZE_PASSES: usize = 64;
/// Steps deleted per transaction.
const BATCH: u64 = 2000;

impl Store {
    /// Deletes steps that ended more than `max_age` ago, then the oldest steps until
    /// `page_count × page_size` fits `max_bytes`, then runs `incremental_vacuum` and
    /// `wal_checkpoint(TRUNCATE)` so the file shrinks.
    pub fn retention(&mut self, max_age: Duration, max_bytes: u64) -> Result<RetentionReport, StoreError> {
        self.retention_at(now(), max_age, max_bytes)
    }

    /// [`Store::retention`] with "now" given (wall seconds).
    pub fn retention_at(&mut self, now: f64, max_age: Duration, max_bytes: u64) -> Result<RetentionReport, StoreError> {
        let mut report = RetentionReport { bytes_before: self.size_bytes()?, ..Default::default() };
        let cutoff = now - max_age.as_secs_f64();
        // In batches: each is one short write transaction, so a week of steps expiring at
        // once does not hold the write lock (and grow the WAL) for the whole cascade.
        loop {
            let n = self.delete_where(&format!("DELETE FROM steps WHERE id IN (SELECT id FROM steps WHERE end < ?1 LIMIT {BATCH})"), cutoff)?;
            report.deleted_by_age += n;
            if n < BATCH {
                break;
            }
        }
        self.vacuum()?;

        for _ in 0..MAX_SIZE_PASSES {
            let used = self.used_bytes()?;
            let steps = self.count_steps()?;
            if used <= max_bytes || steps == 0 {
                break;
            }
            // Steps are roughly the same size: delete the share of them that is over budget,
            // plus one, oldest first.
            let per_step = (used / steps).max(1);
            let k = ((used - max_bytes).div_ceil(per_step) + 1).min(steps).min(BATCH);
            report.deleted_by_size += self.delete_where(
                "DELETE FROM steps WHERE id IN (SELECT id FROM steps ORDER BY begin ASC, id ASC LIMIT ?1)",
                i64::try_from(k).unwrap_or(i64::MAX),
            )?;
            self.vacuum()?;
        }

        self.checkpoint()?;
        report.bytes_after = self.size_bytes()?;
        report.steps_left = self.count_steps()?;
        if report.deleted_by_age + report.deleted_by_size > 0 {
            tracing::info!(path = %self.path.display(), ?report, "history store retention");
        }
        Ok(report)
    }

    fn delete_where(&mut self, sql_text: &str, arg: impl rusqlite::ToSql) -> Result<u64, StoreError> {
        let path = self.path.as_path();
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(sql(path, "begin retention"))?;
        let n = tx.execute(sql_text, [arg]).map_err(sql(path, "delete old steps"))?;
        tx.commit().map_err(sql(path, "commit retention"))?;
        Ok(n as u64)
    }

    /// Bytes in use: pages not on the free list.
    fn used_bytes(&self) -> Result<u64, StoreError> {
        let free: i64 = self.conn.query_row("PRAGMA freelist_count", [], |r| r.get(0)).map_err(sql(&self.path, "read freelist_count"))?;
        let page = self.page_size()?;
        Ok(self.size_bytes()?.saturating_sub(free.max(0) as u64 * page))
    }

    /// Frees the free-list pages. Each step of `PRAGMA incremental_vacuum` frees one page, so
    /// it is stepped to the end (`execute_batch` would step it once).
    fn vacuum(&self) -> Result<(), StoreError> {
        let mut st = self.conn.prepare("PRAGMA incremental_vacuum").map_err(sql(&self.path, "incremental_vacuum"))?;
        let mut rows = st.query([]).map_err(sql(&self.path, "incremental_vacuum"))?;
        while rows.next().map_err(sql(&self.path, "incremental_vacuum"))?.is_some() {}
        Ok(())
    }

    /// Copies the WAL into the database and truncates it (a no-op in memory). A reader
    /// holding an old snapshot makes it partial (busy), which the next pass finishes.
    pub(super) fn checkpoint(&self) -> Result<(), StoreError> {
        let busy: i64 = self.conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0)).map_err(sql(&self.path, "wal_checkpoint"))?;
        if busy != 0 {
            tracing::debug!(path = %self.path.display(), "wal checkpoint incomplete: a reader holds an old snapshot");
        }
        Ok(())
    }
}
