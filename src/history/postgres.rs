//! The PostgreSQL engine: the same tables and statements as the SQLite file (see `store`),
//! for a team whose many RoCE hosts report to one database. Each `add` is one transaction.

use postgres::{Client, NoTls};

use super::model::{NewRun, PointRow, RunRow};
use super::store::{self as sql, STORE_SCHEMA, STORE_VERSION, Store, check_meta};
use crate::error::{Error, Result};

pub struct PgStore {
    /// The URL without its password, for messages.
    shown: String,
    client: Client,
}

/// `postgres://user:secret@host/db` shown as `postgres://user:***@host/db`.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    match rest.split_once('@') {
        Some((creds, host)) if creds.contains(':') => {
            let user = creds.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_string(),
    }
}

fn pg_error(name: &str, what: &str) -> impl Fn(postgres::Error) -> Error {
    let at = format!("{name}: {what}");
    move |e| Error::Environment(format!("{at}: {e}"))
}

impl PgStore {
    pub fn open(url: &str) -> Result<PgStore> {
        let shown = without_password(url);
        let client = Client::connect(url, NoTls).map_err(|e| {
            Error::Environment(format!(
                "cannot connect to the history at {shown}: {e}; check the URL (postgres://user:password@host/db) and \
                 that the server accepts this host"
            ))
        })?;
        let mut store = PgStore { shown, client };
        let name = store.shown.clone();
        let has_meta: bool = store
            .client
            .query_one("SELECT count(*) > 0 FROM information_schema.tables WHERE table_name = 'meta'", &[])
            .map_err(pg_error(&name, "cannot read"))?
            .get(0);
        if !has_meta {
            let mut tx = store.client.transaction().map_err(pg_error(&name, "cannot begin"))?;
            for s in sql::CREATE {
                tx.execute(*s, &[]).map_err(pg_error(&name, "cannot create the tables"))?;
            }
            tx.execute(
                "INSERT INTO meta (key, value) VALUES ('schema', $1), ('schema_version', $2)",
                &[&STORE_SCHEMA, &STORE_VERSION.to_string()],
            )
            .map_err(pg_error(&name, "cannot write its meta table"))?;
            tx.commit().map_err(pg_error(&name, "cannot commit"))?;
        }
        let mut meta = |key: &str| -> Result<Option<String>> {
            let rows = store
                .client
                .query("SELECT value FROM meta WHERE key = $1", &[&key])
                .map_err(pg_error(&name, "cannot read its meta table"))?;
            Ok(rows.first().map(|r| r.get(0)))
        };
        let (schema, version) = (meta("schema")?, meta("schema_version")?);
        check_meta(&name, schema, version)?;
        Ok(store)
    }
}

impl Store for PgStore {
    fn add(&mut self, run: &NewRun) -> Result<i64> {
        let name = self.shown.clone();
        let err = |what: &'static str| pg_error(&name, what);
        let mut tx = self.client.transaction().map_err(err("cannot begin"))?;
        // Two hosts adding at once: the second waits, then numbers its run after the first.
        tx.execute("LOCK TABLE runs IN EXCLUSIVE MODE", &[]).map_err(err("cannot lock the runs"))?;
        let id: i64 =
            tx.query_one("SELECT coalesce(max(id), 0) + 1 FROM runs", &[]).map_err(err("cannot read"))?.get(0);
        let r = &run.row;
        tx.execute(
            sql::INSERT_RUN,
            &[
                &id,
                &r.added_unix_s,
                &r.finished_unix_s,
                &r.label,
                &r.workload,
                &r.setup,
                &r.host,
                &r.tool_version,
                &r.firmware,
                &r.driver,
                &r.kernel,
                &r.verdict,
                &run.document,
            ],
        )
        .map_err(err("cannot add the run"))?;
        let insert = tx.prepare(sql::INSERT_POINT).map_err(err("cannot add the points"))?;
        for p in &run.points {
            let values = sql::values_text(&p.values);
            tx.execute(
                &insert,
                &[
                    &id,
                    &p.step,
                    &p.rail,
                    &p.size,
                    &p.metric,
                    &p.median,
                    &p.min,
                    &p.max,
                    &p.repeats,
                    &values,
                    &p.tolerance_pct,
                ],
            )
            .map_err(err("cannot add the points"))?;
        }
        tx.commit().map_err(err("cannot commit the run"))?;
        Ok(id)
    }

    fn runs(&mut self) -> Result<Vec<RunRow>> {
        let rows = self.client.query(sql::SELECT_RUNS, &[]).map_err(pg_error(&self.shown, "cannot read the runs"))?;
        Ok(rows
            .iter()
            .map(|r| RunRow {
                id: r.get(0),
                added_unix_s: r.get(1),
                finished_unix_s: r.get(2),
                label: r.get(3),
                workload: r.get(4),
                setup: r.get(5),
                host: r.get(6),
                tool_version: r.get(7),
                firmware: r.get(8),
                driver: r.get(9),
                kernel: r.get(10),
                verdict: r.get(11),
            })
            .collect())
    }

    fn points(&mut self) -> Result<Vec<PointRow>> {
        let rows =
            self.client.query(sql::SELECT_POINTS, &[]).map_err(pg_error(&self.shown, "cannot read the points"))?;
        Ok(rows
            .iter()
            .map(|r| PointRow {
                run_id: r.get(0),
                step: r.get(1),
                rail: r.get(2),
                size: r.get(3),
                metric: r.get(4),
                median: r.get(5),
                min: r.get(6),
                max: r.get(7),
                repeats: r.get(8),
                values: sql::values_of(r.get(9)),
                tolerance_pct: r.get(10),
            })
            .collect())
    }

    fn document(&mut self, id: i64) -> Result<Option<String>> {
        let rows = self
            .client
            .query("SELECT document FROM runs WHERE id = $1", &[&id])
            .map_err(pg_error(&self.shown, "cannot read the run"))?;
        Ok(rows.first().map(|r| r.get(0)))
    }

    fn name(&self) -> String {
        self.shown.clone()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(super::without_password("postgres://ci:s3cret@db:5432/perf"), "postgres://ci:***@db:5432/perf");
        assert_eq!(super::without_password("postgres://ci@db/perf"), "postgres://ci@db/perf");
        assert_eq!(super::without_password("postgresql:///perf?host=/run"), "postgresql:///perf?host=/run");
    }
}
