//! `rdmabench history` through the binary, on the host: a series with a step on new
//! firmware found and named, export for Otava, plots, and the store's promises (a writer
//! killed mid-write loses nothing committed; other documents and newer stores refused by
//! name). Run documents are made from the committed baseline with scaled figures.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_rdmabench");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn history(store: &Path, args: &[&str]) -> Output {
    Command::new(BIN).arg("history").args(args).arg("--store").arg(store).output().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Run `i` of a history: the baseline's figures wobbling by under 1 %, and from run
/// `step_at` on, bandwidth 10 % lower on firmware 2.0. Step tolerances dropped, so
/// `--tolerance` (5 %) judges.
fn run_doc(dir: &Path, i: usize, step_at: usize) -> PathBuf {
    let base = std::fs::read_to_string(format!("{ROOT}/results/baseline-rxe.json")).unwrap();
    let mut d: serde_json::Value = serde_json::from_str(&base).unwrap();
    let slow = i >= step_at;
    d["environment"]["nic"]["firmware"] = (if slow { "2.0" } else { "1.0" }).into();
    d["environment"]["kernel"] = "6.1.0-57-amd64".into();
    d["finished_unix_s"] = (1_796_688_000.0 + i as f64 * 3600.0).into();
    let wobble = [0.004, -0.006, 0.002, -0.003, 0.007, -0.001, 0.005, -0.008, 0.0, 0.003][i % 10];
    for step in d["steps"].as_array_mut().unwrap() {
        step.as_object_mut().unwrap().remove("tolerance");
        for size in step["stats"].as_array_mut().unwrap() {
            for (metric, st) in size["metrics"].as_object_mut().unwrap() {
                let f = (1.0 + wobble) * if slow && metric == "gbps" { 0.9 } else { 1.0 };
                for k in ["median", "min", "max"] {
                    st[k] = (st[k].as_f64().unwrap() * f).into();
                }
                for v in st["values"].as_array_mut().unwrap() {
                    *v = (v.as_f64().unwrap() * f).into();
                }
            }
        }
    }
    let path = dir.join(format!("run{i:02}.json"));
    std::fs::write(&path, serde_json::to_string(&d).unwrap()).unwrap();
    path
}

fn fill(store: &Path, dir: &Path, runs: usize, step_at: usize) {
    for i in 0..runs {
        let doc = run_doc(dir, i, step_at);
        let o = history(store, &["add", doc.to_str().unwrap(), "--label", &format!("c{i}")]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
}

#[test]
fn a_step_on_new_firmware_fails_the_check_and_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("h.sqlite");
    fill(&store, dir.path(), 36, 30);

    let list = history(&store, &["list"]);
    assert_eq!(list.status.code(), Some(0), "{}", text(&list));
    assert!(text(&list).contains("36 runs"), "{}", text(&list));

    let json = dir.path().join("check.json");
    let check = history(&store, &["check", "--json", json.to_str().unwrap()]);
    let out = text(&check);
    assert_eq!(check.status.code(), Some(1), "{out}");
    assert!(out.contains("REGRESSED  regression write bandwidth 64 KiB 65536 B gbps"), "{out}");
    assert!(out.contains("change at run 31 (c30)") && out.contains("firmware 1.0 -> 2.0"), "{out}");
    assert!(out.contains("steady     regression write latency"), "latency did not move: {out}");
    let reports: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let regressed: Vec<&serde_json::Value> =
        reports.as_array().unwrap().iter().filter(|r| r["regressed"] == true).collect();
    assert_eq!(regressed.len(), 2, "gbps of the bandwidth and the message-rate steps: {reports:#}");

    // Only the bandwidth series, and a tolerance wider than the step: the change is
    // still shown, and fails nothing.
    let wide = history(&store, &["check", "--metric", "gbps", "--tolerance", "15%"]);
    assert_eq!(wide.status.code(), Some(0), "{}", text(&wide));
    assert!(text(&wide).contains("within tolerance"), "{}", text(&wide));

    // Judged over every repeat (the documents keep 5 a step): the same step, the same run.
    let repeats = history(&store, &["check", "--figure", "repeats", "--metric", "gbps"]);
    assert_eq!(repeats.status.code(), Some(1), "{}", text(&repeats));
    assert!(text(&repeats).contains("change at run 31 (c30)"), "{}", text(&repeats));

    let show = history(&store, &["show", "--metric", "gbps", "--step", "write bandwidth 64 KiB"]);
    assert!(text(&show).contains("firmware 1.0 -> 2.0"), "{}", text(&show));

    let csv = history(&store, &["export", "--csv"]);
    let csv = String::from_utf8(csv.stdout).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 37, "a header and one row per run");
    assert!(lines[0].starts_with("time,run,label,firmware,driver,kernel,rdmabench,"), "{}", lines[0]);
    assert!(lines[1].starts_with("2026-12-08 00:00:00 +0000,1,c0,1.0,"), "{}", lines[1]);

    let svg_dir = dir.path().join("plots/");
    let plot = history(&store, &["plot", "-o", svg_dir.to_str().unwrap()]);
    assert_eq!(plot.status.code(), Some(0), "{}", text(&plot));
    let files: Vec<_> = std::fs::read_dir(&svg_dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 10, "one SVG per series");
    let marked = files.iter().filter(|f| std::fs::read_to_string(f).unwrap().contains("stroke-dasharray")).count();
    assert!(marked >= 2, "the change points are marked");
}

#[test]
fn runs_of_another_setup_are_a_series_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("h.sqlite");
    fill(&store, dir.path(), 30, 30);
    for i in 30..36 {
        let doc = run_doc(dir.path(), i, 30);
        let o = history(&store, &["add", doc.to_str().unwrap(), "--setup", "another rack"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    let check = history(&store, &["check"]);
    assert_eq!(check.status.code(), Some(0), "the slower runs are another setup's: {}", text(&check));
    let csv = history(&store, &["export", "--csv"]);
    assert_eq!(csv.status.code(), Some(2));
    assert!(text(&csv).contains("2 setups") && text(&csv).contains("--setup"), "{}", text(&csv));
}

#[test]
fn other_documents_and_newer_stores_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("h.sqlite");
    let other = dir.path().join("other.json");
    std::fs::write(&other, r#"{"schema": "someone/else", "schema_version": 1}"#).unwrap();
    let o = history(&store, &["add", other.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("\"someone/else\"") && text(&o).contains("rdmabench/run"), "{}", text(&o));

    fill(&store, dir.path(), 1, 99);
    let conn = rusqlite::Connection::open(&store).unwrap();
    let version: String =
        conn.query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| r.get(0)).unwrap();
    assert_eq!(version, "1", "the store says which schema it holds");
    conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'", []).unwrap();
    drop(conn);
    let o = history(&store, &["list"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("newer rdmabench (history schema version 2"), "{}", text(&o));

    let not_a_store = dir.path().join("notes.txt");
    std::fs::write(&not_a_store, "hello").unwrap();
    let o = history(&not_a_store, &["list"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("not an rdmabench history"), "{}", text(&o));
}

#[test]
fn a_writer_killed_mid_write_loses_nothing_committed() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("h.sqlite");
    fill(&store, dir.path(), 3, 99);
    let doc = run_doc(dir.path(), 3, 99);
    let stderr = dir.path().join("stderr");
    let mut child = Command::new(BIN)
        .args(["history", "add", doc.to_str().unwrap(), "--store"])
        .arg(&store)
        .env("RDMABENCH_FAULT", "stall:history-write")
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    // Killed once it stands inside its transaction: the run's row written, its points not.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !std::fs::read_to_string(&stderr).unwrap().contains("stands still at history-write") {
        assert!(std::time::Instant::now() < deadline, "the writer never reached its fault point");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();

    let list = history(&store, &["list"]);
    assert_eq!(list.status.code(), Some(0), "{}", text(&list));
    assert!(text(&list).contains(" 3 runs"), "the three committed runs, not the killed one: {}", text(&list));
    let conn = rusqlite::Connection::open(&store).unwrap();
    let orphans: i64 = conn
        .query_row("SELECT count(*) FROM runs WHERE id NOT IN (SELECT run_id FROM points)", [], |r| r.get(0))
        .unwrap();
    assert_eq!(orphans, 0, "no run without its points");
    drop(conn);
    let o = history(&store, &["add", doc.to_str().unwrap()]);
    assert!(text(&o).contains("added run 4"), "the store takes the next run: {}", text(&o));
}

/// The server binaries of Debian's `postgresql` package (lab/setup.sh installs it).
fn postgres_bin() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.map(|e| e.unwrap().path().join("bin")).filter(|p| p.join("postgres").exists()).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs.pop().expect("PostgreSQL's server is not installed: run lab/setup.sh's lab_install_packages (postgresql)")
}

/// A PostgreSQL server of its own in `dir`, on a free port, trusting local connections;
/// run as the `postgres` user when this test runs as root (the server refuses root).
struct Postgres {
    child: std::process::Child,
    url: String,
}

impl Postgres {
    fn start(dir: &Path) -> Postgres {
        let bin = postgres_bin();
        let root = unsafe { libc::geteuid() } == 0;
        let as_owner = |program: &Path| {
            if root {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(program);
                c
            } else {
                Command::new(program)
            }
        };
        let data = dir.join("pgdata");
        std::fs::create_dir(&data).unwrap();
        if root {
            assert!(Command::new("chown").args(["-R", "postgres:postgres"]).arg(dir).status().unwrap().success());
        }
        let init = as_owner(&bin.join("initdb"))
            .args(["-D", data.to_str().unwrap(), "-U", "postgres", "--auth=trust", "--no-sync"])
            .output()
            .unwrap();
        assert!(init.status.success(), "initdb: {}", text(&init));
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = as_owner(&bin.join("postgres"))
            .args(["-D", data.to_str().unwrap(), "-p", &port.to_string(), "-k", dir.to_str().unwrap()])
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "PostgreSQL did not start within 60 s");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Postgres { child, url: format!("postgres://postgres@127.0.0.1:{port}/postgres") }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // SIGTERM: a smart shutdown (runuser passes it on).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

#[test]
fn a_postgresql_store_keeps_the_same_history() {
    let dir = tempfile::tempdir().unwrap();
    let pg = Postgres::start(dir.path());
    let store = Path::new(&pg.url);
    let docs = tempfile::tempdir().unwrap();
    fill(store, docs.path(), 36, 30);
    let list = history(store, &["list"]);
    assert_eq!(list.status.code(), Some(0), "{}", text(&list));
    assert!(text(&list).contains("36 runs"), "{}", text(&list));
    let check = history(store, &["check"]);
    let out = text(&check);
    assert_eq!(check.status.code(), Some(1), "{out}");
    assert!(out.contains("change at run 31 (c30)") && out.contains("firmware 1.0 -> 2.0"), "{out}");
    // The SQLite file and the database say the same, series by series.
    let file = docs.path().join("h.sqlite");
    fill(&file, docs.path(), 36, 30);
    assert_eq!(text(&history(&file, &["check"])), out, "one schema, one judgement");
    let shown = history(Path::new(&pg.url.replace("postgres@", "postgres:secret@")), &["list"]);
    assert!(!text(&shown).contains("secret"), "a password is never printed: {}", text(&shown));
}
