//! Where the history lives: one SQLite file (the default, bundled: nothing to install) or a
//! PostgreSQL database (`postgres://...`, for many hosts reporting to one place), with one
//! schema. A run goes in as one transaction: a writer killed halfway leaves the store as
//! it was. The schema's version is in the store (`meta`): a newer rdmabench reads an older
//! store (migrating it), an older one refuses a newer store by name.

use super::model::{NewRun, PointRow, RunRow};
use crate::error::{Error, Result};

/// What the store's `meta` table says it is.
pub const STORE_SCHEMA: &str = "rdmabench/history";
/// Version 1: meta, runs, points.
pub const STORE_VERSION: u32 = 1;

/// The tables, in SQL both engines take (`$n` parameters, REAL and BIGINT, TEXT).
pub(crate) const CREATE: &[&str] = &[
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE runs (
        id BIGINT PRIMARY KEY,
        added_unix_s DOUBLE PRECISION NOT NULL,
        finished_unix_s DOUBLE PRECISION NOT NULL,
        label TEXT NOT NULL,
        workload TEXT NOT NULL,
        setup TEXT NOT NULL,
        host TEXT NOT NULL,
        tool_version TEXT NOT NULL,
        firmware TEXT NOT NULL,
        driver TEXT NOT NULL,
        kernel TEXT NOT NULL,
        verdict TEXT NOT NULL,
        document TEXT NOT NULL)",
    "CREATE TABLE points (
        run_id BIGINT NOT NULL REFERENCES runs(id),
        step TEXT NOT NULL,
        rail TEXT NOT NULL,
        size BIGINT NOT NULL,
        metric TEXT NOT NULL,
        median DOUBLE PRECISION NOT NULL,
        min DOUBLE PRECISION NOT NULL,
        max DOUBLE PRECISION NOT NULL,
        repeats BIGINT NOT NULL,
        repeat_values TEXT NOT NULL,
        tolerance_pct DOUBLE PRECISION,
        PRIMARY KEY (run_id, step, rail, size, metric))",
];

pub(crate) const INSERT_RUN: &str = "INSERT INTO runs (id, added_unix_s, finished_unix_s, label, workload, setup, host, \
     tool_version, firmware, driver, kernel, verdict, document) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, \
     $11, $12, $13)";
pub(crate) const INSERT_POINT: &str = "INSERT INTO points (run_id, step, rail, size, metric, median, min, max, repeats, \
     repeat_values, tolerance_pct) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)";
pub(crate) const SELECT_RUNS: &str = "SELECT id, added_unix_s, finished_unix_s, label, workload, setup, host, tool_version, \
     firmware, driver, kernel, verdict FROM runs ORDER BY id";
pub(crate) const SELECT_POINTS: &str = "SELECT run_id, step, rail, size, metric, median, min, max, repeats, \
     repeat_values, tolerance_pct FROM points ORDER BY run_id";

/// A point's repeats as stored: a JSON array of numbers.
pub(crate) fn values_text(values: &[f64]) -> String {
    serde_json::to_string(values).expect("numbers serialise")
}

/// A point's repeats read back; a malformed list reads as none (the median still stands).
pub(crate) fn values_of(text: &str) -> Vec<f64> {
    serde_json::from_str(text).unwrap_or_default()
}

/// A history store, whichever engine holds it.
pub trait Store {
    /// Adds a run and its points in one transaction; returns the run's number.
    fn add(&mut self, run: &NewRun) -> Result<i64>;
    /// Every run, oldest first.
    fn runs(&mut self) -> Result<Vec<RunRow>>;
    /// Every point, by run.
    fn points(&mut self) -> Result<Vec<PointRow>>;
    /// The run document stored with run `id`.
    fn document(&mut self, id: i64) -> Result<Option<String>>;
    /// Where it is, for messages.
    fn name(&self) -> String;
}

/// Opens (creating when absent) the store at `location`: a `postgres://` or
/// `postgresql://` URL, or a file path (SQLite).
pub fn open(location: &str) -> Result<Box<dyn Store>> {
    if location.starts_with("postgres://") || location.starts_with("postgresql://") {
        return Ok(Box::new(super::postgres::PgStore::open(location)?));
    }
    Ok(Box::new(SqliteStore::open(location)?))
}

/// Checks what a store's `meta` table says it is: an rdmabench history of a version this
/// rdmabench reads, or a clear refusal.
pub(crate) fn check_meta(name: &str, schema: Option<String>, version: Option<String>) -> Result<()> {
    match (schema.as_deref(), version) {
        (Some(STORE_SCHEMA), Some(v)) => {
            let v: u32 = v.parse().map_err(|_| {
                Error::Usage(format!("{name}: its schema version {v:?} is not a number; is it an rdmabench history?"))
            })?;
            if v > STORE_VERSION {
                return Err(Error::Usage(format!(
                    "{name} was written by a newer rdmabench (history schema version {v}; this one reads versions 1 to \
                     {STORE_VERSION}): use that rdmabench or a newer one"
                )));
            }
            Ok(())
        }
        (other, _) => Err(Error::Usage(format!(
            "{name} is not an rdmabench history (its meta table names {other:?}, not {STORE_SCHEMA:?}); give \
             --store a new file or an rdmabench history"
        ))),
    }
}

fn sql_error(name: &str, what: &str) -> impl Fn(rusqlite::Error) -> Error {
    let at = format!("{name}: {what}");
    move |e| Error::Environment(format!("{at}: {e}"))
}

/// The SQLite engine: one file, written under a transaction with a journal, so a process
/// killed mid-write leaves the last committed state.
pub struct SqliteStore {
    path: String,
    conn: rusqlite::Connection,
}

impl SqliteStore {
    pub fn open(path: &str) -> Result<SqliteStore> {
        let fresh = !std::path::Path::new(path).exists();
        let conn = rusqlite::Connection::open(path).map_err(sql_error(path, "cannot open the history"))?;
        // Another writer (a parallel CI job on the same cache) waits its turn.
        conn.busy_timeout(std::time::Duration::from_secs(30)).map_err(sql_error(path, "busy timeout"))?;
        let mut store = SqliteStore { path: path.to_string(), conn };
        let has_meta: bool = store
            .conn
            .query_row("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'", [], |r| {
                r.get::<_, i64>(0)
            })
            .map(|n| n > 0)
            .map_err(|e| Error::Usage(format!("{path} is not an rdmabench history (not an SQLite database: {e})")))?;
        if !has_meta {
            let tables: i64 = store
                .conn
                .query_row("SELECT count(*) FROM sqlite_master WHERE type = 'table'", [], |r| r.get(0))
                .map_err(sql_error(path, "cannot read"))?;
            if tables > 0 || (!fresh && std::fs::metadata(path).is_ok_and(|m| m.len() > 0)) {
                return Err(Error::Usage(format!(
                    "{path} is not an rdmabench history (an SQLite database without its meta table); give --store a \
                     new file or an rdmabench history"
                )));
            }
            store.create()?;
        }
        let meta = |key: &str| -> Result<Option<String>> {
            store
                .conn
                .query_row("SELECT value FROM meta WHERE key = $1", [key], |r| r.get(0))
                .map(Some)
                .or_else(|e| if e == rusqlite::Error::QueryReturnedNoRows { Ok(None) } else { Err(e) })
                .map_err(sql_error(path, "cannot read its meta table"))
        };
        check_meta(path, meta("schema")?, meta("schema_version")?)?;
        Ok(store)
    }

    fn create(&mut self) -> Result<()> {
        let path = self.path.clone();
        let tx = self.conn.transaction().map_err(sql_error(&path, "cannot begin"))?;
        for sql in CREATE {
            tx.execute(sql, []).map_err(sql_error(&path, "cannot create the tables"))?;
        }
        tx.execute(
            "INSERT INTO meta (key, value) VALUES ('schema', $1), ('schema_version', $2)",
            [STORE_SCHEMA.to_string(), STORE_VERSION.to_string()],
        )
        .map_err(sql_error(&path, "cannot write its meta table"))?;
        tx.commit().map_err(sql_error(&path, "cannot commit"))
    }
}

impl Store for SqliteStore {
    fn add(&mut self, run: &NewRun) -> Result<i64> {
        let path = self.path.clone();
        let err = |what: &'static str| sql_error(&path, what);
        let tx = self.conn.transaction().map_err(err("cannot begin"))?;
        let id: i64 =
            tx.query_row("SELECT coalesce(max(id), 0) + 1 FROM runs", [], |r| r.get(0)).map_err(err("cannot read"))?;
        let r = &run.row;
        tx.execute(
            INSERT_RUN,
            rusqlite::params![
                id,
                r.added_unix_s,
                r.finished_unix_s,
                r.label,
                r.workload,
                r.setup,
                r.host,
                r.tool_version,
                r.firmware,
                r.driver,
                r.kernel,
                r.verdict,
                run.document
            ],
        )
        .map_err(err("cannot add the run"))?;
        // The lab's test of a writer killed here (RDMABENCH_FAULT=stall:history-write).
        crate::faults::stall_at(crate::faults::HISTORY_WRITE);
        {
            let mut insert = tx.prepare(INSERT_POINT).map_err(err("cannot add the points"))?;
            for p in &run.points {
                insert
                    .execute(rusqlite::params![
                        id,
                        p.step,
                        p.rail,
                        p.size,
                        p.metric,
                        p.median,
                        p.min,
                        p.max,
                        p.repeats,
                        values_text(&p.values),
                        p.tolerance_pct
                    ])
                    .map_err(err("cannot add the points"))?;
            }
        }
        tx.commit().map_err(err("cannot commit the run"))?;
        Ok(id)
    }

    fn runs(&mut self) -> Result<Vec<RunRow>> {
        let path = self.path.clone();
        let mut q = self.conn.prepare(SELECT_RUNS).map_err(sql_error(&path, "cannot read the runs"))?;
        let rows = q
            .query_map([], |r| {
                Ok(RunRow {
                    id: r.get(0)?,
                    added_unix_s: r.get(1)?,
                    finished_unix_s: r.get(2)?,
                    label: r.get(3)?,
                    workload: r.get(4)?,
                    setup: r.get(5)?,
                    host: r.get(6)?,
                    tool_version: r.get(7)?,
                    firmware: r.get(8)?,
                    driver: r.get(9)?,
                    kernel: r.get(10)?,
                    verdict: r.get(11)?,
                })
            })
            .map_err(sql_error(&path, "cannot read the runs"))?;
        rows.collect::<std::result::Result<_, _>>().map_err(sql_error(&path, "cannot read the runs"))
    }

    fn points(&mut self) -> Result<Vec<PointRow>> {
        let path = self.path.clone();
        let mut q = self.conn.prepare(SELECT_POINTS).map_err(sql_error(&path, "cannot read the points"))?;
        let rows = q
            .query_map([], |r| {
                Ok(PointRow {
                    run_id: r.get(0)?,
                    step: r.get(1)?,
                    rail: r.get(2)?,
                    size: r.get(3)?,
                    metric: r.get(4)?,
                    median: r.get(5)?,
                    min: r.get(6)?,
                    max: r.get(7)?,
                    repeats: r.get(8)?,
                    values: values_of(&r.get::<_, String>(9)?),
                    tolerance_pct: r.get(10)?,
                })
            })
            .map_err(sql_error(&path, "cannot read the points"))?;
        rows.collect::<std::result::Result<_, _>>().map_err(sql_error(&path, "cannot read the points"))
    }

    fn document(&mut self, id: i64) -> Result<Option<String>> {
        self.conn
            .query_row("SELECT document FROM runs WHERE id = $1", [id], |r| r.get(0))
            .map(Some)
            .or_else(|e| if e == rusqlite::Error::QueryReturnedNoRows { Ok(None) } else { Err(e) })
            .map_err(sql_error(&self.path, "cannot read the run"))
    }

    fn name(&self) -> String {
        self.path.clone()
    }
}
