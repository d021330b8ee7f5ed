//! What every lab test needs: the binary, ports, processes with deadlines, JSON checks,
//! pods' views of the devices, hosts' names, workloads, rendered Jobs and the port
//! counters. The tests import it whole (`use super::common::*`), with the std items they
//! share.

pub use std::io::Read;
pub use std::process::{Child, Command, Stdio};
pub use std::sync::atomic::{AtomicU16, Ordering};
pub use std::time::{Duration, Instant};

pub use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_rdmabench");

/// The server's address on the lab's rxe0 (lab/guest-init), or where RDMABENCH_LAB_ADDR says.
pub fn server_addr() -> String {
    std::env::var("RDMABENCH_LAB_ADDR").unwrap_or_else(|_| "10.77.0.1".into())
}

pub fn next_port() -> String {
    static NEXT: AtomicU16 = AtomicU16::new(19000);
    NEXT.fetch_add(1, Ordering::Relaxed).to_string()
}

#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub fn spawn(args: &[&str]) -> Child {
    Command::new(BIN).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start rdmabench")
}

/// How long after its stated timeout a process may take to notice and end (process and
/// rxe teardown under TCG on the slowest day seen: this lab's speed drifts 3-4x between
/// days). A bound of timeout + GRACE still tells the stated timeout from the defaults
/// (10 s, 60 s), which is what the deadline tests prove.
pub const GRACE: Duration = Duration::from_secs(4);

/// Waits for `child` at most `limit`; kills it and fails the test beyond that.
pub fn finish(mut child: Child, limit: Duration) -> Out {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stdout = String::new();
            let mut stderr = String::new();
            if let Some(mut o) = child.stdout.take() {
                o.read_to_string(&mut stdout).unwrap();
            }
            child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
            use std::os::unix::process::ExitStatusExt;
            let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
            return Out { code, stdout, stderr };
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("rdmabench did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn run(args: &[&str]) -> Out {
    finish(spawn(args), Duration::from_secs(60))
}

/// Runs a server with `server_extra` and a client of the same test with `client_extra`.
pub fn pair(test: &str, client_extra: &[&str], server_extra: &[&str]) -> (Out, Out) {
    pair_with_timeout(test, "5", client_extra, server_extra)
}

/// A pair whose sides both run with `--timeout timeout` (the lab's is 5 s).
pub fn pair_with_timeout(test: &str, timeout: &str, client_extra: &[&str], server_extra: &[&str]) -> (Out, Out) {
    let port = next_port();
    let mut sargs = vec![test, "-p", &port, "--connect-timeout", "30", "--timeout", timeout];
    sargs.extend_from_slice(server_extra);
    let server = spawn(&sargs);
    let addr = server_addr();
    let mut cargs = vec![test, "-p", &port, "--connect-timeout", "30", "--timeout", timeout];
    cargs.extend_from_slice(client_extra);
    cargs.push(&addr);
    let client = finish(spawn(&cargs), Duration::from_secs(120));
    let server = finish(server, Duration::from_secs(30));
    (client, server)
}

pub fn ok_pair(test: &str, client_extra: &[&str]) -> (Out, Out) {
    let (c, s) = pair(test, client_extra, &[]);
    assert_eq!(c.code, 0, "client failed:\n{}\n{}", c.stdout, c.stderr);
    assert_eq!(s.code, 0, "server failed:\n{}\n{}", s.stdout, s.stderr);
    (c, s)
}

pub fn schema() -> jsonschema::Validator {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/results/schema/result-v2.schema.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    jsonschema::validator_for(&v).unwrap()
}

pub fn valid_doc(text: &str) -> Value {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("invalid JSON ({e}):\n{text}"));
    let errors: Vec<String> = schema().iter_errors(&v).map(|e| format!("{e} at {}", e.instance_path())).collect();
    assert!(errors.is_empty(), "schema violations: {errors:?}");
    v
}

pub fn json_file(dir: &tempfile::TempDir, name: &str) -> String {
    dir.path().join(name).to_str().unwrap().to_string()
}

/// Reads `child`'s stdout on a thread; returns once a line contains `marker` (or after
/// `limit`, failing the test), and a handle that yields everything it printed.
pub fn await_output(child: &mut Child, marker: &'static str, limit: Duration) -> std::thread::JoinHandle<String> {
    use std::io::BufRead;
    let stdout = child.stdout.take().expect("piped stdout");
    let (seen_tx, seen_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        for line in std::io::BufReader::new(stdout).lines().map_while(|l| l.ok()) {
            if line.contains(marker) {
                let _ = seen_tx.send(());
            }
            text += &line;
            text.push('\n');
        }
        text
    });
    assert!(seen_rx.recv_timeout(limit).is_ok(), "no {marker:?} on stdout within {limit:?}");
    reader
}

/// Starts a long run, sends `signal` to one side once the run is measuring (the client
/// has printed its table header, and a moment more), and returns both outcomes with how
/// long the other side took to end after the signal. Waiting for the header, not a fixed
/// time, keeps this right on a slow day, when setting up takes seconds.
pub fn disrupt(test: &str, target_is_server: bool, signal: i32) -> (Out, Out, Duration) {
    disrupt_with(test, &[], target_is_server, signal)
}

/// [`disrupt`] with more client flags.
pub fn disrupt_with(test: &str, extra: &[&str], target_is_server: bool, signal: i32) -> (Out, Out, Duration) {
    let port = next_port();
    let addr = server_addr();
    let server = spawn(&[test, "-p", &port, "--timeout", "3"]);
    let mut args = vec![test, "-p", &port, "--timeout", "3", "-D", "60", "-s", "64"];
    args.extend_from_slice(extra);
    args.push(&addr);
    let mut client = spawn(&args);
    let client_stdout = await_output(&mut client, "#bytes", Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(500));
    let pid = if target_is_server { server.id() } else { client.id() } as i32;
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    let t = Instant::now();
    let (victim, other) = if target_is_server { (server, client) } else { (client, server) };
    let mut other = finish(other, Duration::from_secs(30));
    let waited = t.elapsed();
    if signal == libc::SIGSTOP {
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let mut victim = finish(victim, Duration::from_secs(30));
    let client_out = if target_is_server { &mut other } else { &mut victim };
    client_out.stdout = client_stdout.join().unwrap();
    (victim, other, waited)
}

/// A fake peer that accepts and then does `act` with the connection.
pub fn fake_server(act: impl FnOnce(std::net::TcpStream) + Send + 'static) -> (String, std::thread::JoinHandle<()>) {
    let l = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    let h = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        act(s);
    });
    (port, h)
}

/// A TCP connection to a local server's control port, retrying while it starts.
pub fn connect_raw(port: &str) -> std::net::TcpStream {
    for _ in 0..400 {
        if let Ok(c) = std::net::TcpStream::connect(format!("127.0.0.1:{port}")) {
            return c;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("nothing listens on port {port}");
}

/// A control frame: its length, then its JSON.
pub fn frame(json: &str) -> Vec<u8> {
    let mut f = (json.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(json.as_bytes());
    f
}

/// What a server on a node's network meets: a connection that closes at once, an HTTP
/// probe, an oversized frame header (`ff ff ff ff`), one that sends only heartbeats and one
/// that stays silent, both past the server's --timeout (`timeout`). They come at once, as
/// a scanner's would; the last two are still open when this returns, and the handle ends
/// once they have given up.
pub fn hostile_connections(port: &str, timeout: Duration) -> std::thread::JoinHandle<()> {
    use std::io::Write;
    drop(connect_raw(port));
    connect_raw(port).write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    connect_raw(port).write_all(&[0xff, 0xff, 0xff, 0xff]).unwrap();
    let mut beats = connect_raw(port);
    let silent = connect_raw(port);
    std::thread::spawn(move || {
        let t = Instant::now();
        while t.elapsed() < timeout + Duration::from_secs(2) {
            if beats.write_all(&frame(r#"{"type":"heartbeat"}"#)).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        drop(silent);
    })
}

/// Reads one control frame's JSON.
pub fn read_frame(s: &mut std::net::TcpStream) -> String {
    use std::io::Read;
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).unwrap();
    String::from_utf8(body).unwrap()
}

/// The hello a client sends for `args`, caught by a stand-in server that greets it.
pub fn captured_hello(args: &[&str]) -> String {
    use std::io::Write;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    let mut a = args.to_vec();
    a.extend(["-p", &port, "--timeout", "2", "127.0.0.1"]);
    let client = spawn(&a);
    let (mut s, _) = l.accept().unwrap();
    let greeting = format!(
        r#"{{"type":"greeting","magic":"rdmabench","version":{},"nonce":"00"}}"#,
        rdmabench::session::proto::PROTOCOL_VERSION
    );
    s.write_all(&frame(&greeting)).unwrap();
    let hello = read_frame(&mut s);
    drop(s);
    let _ = finish(client, Duration::from_secs(30));
    hello
}

/// Peak resident memory of a process, from /proc (kB).
pub fn peak_rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A workload of four steps whose third runs far longer than the tests wait.
pub fn four_step_workload(dir: &tempfile::TempDir) -> String {
    let workload = json_file(dir, "long.toml");
    std::fs::write(
        &workload,
        "name = \"long\"\n[[step]]\nname = \"latency\"\ntest = \"write-lat\"\niterations = 200\n\
         [[step]]\nname = \"bandwidth\"\ntest = \"write-bw\"\niterations = 200\n\
         [[step]]\nname = \"long latency\"\ntest = \"write-lat\"\niterations = 50000000\n\
         [[step]]\nname = \"send bandwidth\"\ntest = \"send-bw\"\n",
    )
    .unwrap();
    workload
}

/// The run document (schema-valid) and the JUnit report (parseable, a case per step) of
/// a run stopped in its third step: two steps passed, the third failed with `why`, the
/// fourth not run.
pub fn check_stopped_run_files(json: &str, junit: &str, why: &str) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/results/schema/run-v2.schema.json");
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    let errors: Vec<String> =
        jsonschema::validator_for(&schema).unwrap().iter_errors(&doc).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "schema violations: {errors:?}");
    assert_eq!(doc["verdict"], "fail");
    let steps = doc["steps"].as_array().unwrap();
    let verdicts: Vec<&str> = steps.iter().map(|s| s["verdict"].as_str().unwrap()).collect();
    assert_eq!(verdicts, ["pass", "pass", "fail", "fail"], "{doc}");
    assert!(steps[2]["error"].as_str().unwrap().contains(why), "{doc}");
    assert!(steps[3]["error"].as_str().unwrap().starts_with("not run:"), "{doc}");
    let xml = std::fs::read_to_string(junit).unwrap();
    let parsed = roxmltree::Document::parse(&xml).unwrap_or_else(|e| panic!("JUnit does not parse ({e}):\n{xml}"));
    let cases = parsed.descendants().filter(|n| n.has_tag_name("testcase")).count();
    let failures = parsed.descendants().filter(|n| n.has_tag_name("failure")).count();
    assert!(cases >= 4 && failures >= 2, "{xml}");
}

/// Starts `rdmabench run --serve` on a fresh port; returns it and the port.
pub fn serve_workload() -> (Child, String) {
    let port = next_port();
    let child = Command::new(BIN)
        .args(["run", "--serve", "-p", &port, "--connect-timeout", "30", "--timeout", "10"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the serving side");
    (child, port)
}

pub fn run_workload(workload: &str, extra: &[&str]) -> (Out, Out) {
    let (server, port) = serve_workload();
    let addr = server_addr();
    let mut args = vec!["run", workload, "--peer", &addr, "-p", &port, "--connect-timeout", "30"];
    args.extend_from_slice(extra);
    let client = finish(spawn(&args), Duration::from_secs(300));
    let server = finish(server, Duration::from_secs(60));
    (client, server)
}

pub fn workload_path(name: &str) -> String {
    format!("{}/workloads/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The Job of `k8s render ARGS` (its second document, after the Service).
pub fn rendered_job(args: &[&str]) -> Value {
    let mut all = vec!["k8s", "render"];
    all.extend_from_slice(args);
    let render = run(&all);
    assert_eq!(render.code, 0, "{}", render.stderr);
    render.stdout.split("\n---\n").map(|d| serde_norway::from_str::<Value>(d).unwrap()).nth(1).unwrap()
}

// ---- Hosts with names that are no DNS names ----

/// A UTS namespace whose kernel host name (what `uname -n` prints) is `name`: a prefix for
/// `spawn_in`, `run_in` and `pod`, as `pod_view` is.
pub fn host_named(name: &str) -> Vec<String> {
    let script = r#"printf %s "$1" > /proc/sys/kernel/hostname || exit 96; shift; exec "$@""#;
    ["unshare", "-u", "sh", "-c", script, "host-named", name].iter().map(|s| s.to_string()).collect()
}

/// The kernel's longest host name (64 bytes), with spaces and UTF-8, and how it is shown.
pub fn odd_host() -> (String, String) {
    let raw = format!("rack 7 n\u{153}ud-\u{fc}{}", "x".repeat(49));
    assert_eq!(raw.len(), 64);
    (raw, format!("rack%207%20n%C5%93ud-%C3%BC{}", "x".repeat(49)))
}

/// Where the rails' servers listen: the far end of cable 0 (any local address would do).
/// A port counter of the lab's one device, read from sysfs.
pub fn hw_counter(name: &str) -> u64 {
    let dev = std::fs::read_dir("/sys/class/infiniband").unwrap().flatten().next().expect("an RDMA device").file_name();
    let path = format!("/sys/class/infiniband/{}/ports/1/hw_counters/{name}", dev.to_str().unwrap());
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}")).trim().parse().unwrap()
}

pub fn set_huge_pages(n: u32) {
    std::fs::write("/proc/sys/vm/nr_hugepages", n.to_string()).expect("the guest runs as root");
}

/// A pod's view of the devices (what a device plugin hands a container): a mount namespace
/// whose /dev/infiniband holds only the verbs nodes of `devices` (and rdma_cm); sysfs still
/// shows every device, as in a shared-mode pod. Returns the command prefix to run under it.
pub fn pod_view(devices: &[&str]) -> Vec<String> {
    let script = r#"want=$1; shift
mkdir -p /run/podview-$$ && mount -t tmpfs podview /run/podview-$$ || exit 97
for u in /sys/class/infiniband_verbs/uverbs*; do
  case ",$want," in *",$(cat "$u/ibdev"),"*) cp -a "/dev/infiniband/$(basename "$u")" /run/podview-$$/ ;; esac
done
cp -a /dev/infiniband/rdma_cm /run/podview-$$/ 2>/dev/null
mount --bind /run/podview-$$ /dev/infiniband || exit 98
exec "$@""#;
    ["unshare", "-m", "sh", "-c", script, "pod-view", &devices.join(",")].iter().map(|s| s.to_string()).collect()
}

/// Starts rdmabench with `args` inside `view` (a command that ends by running its
/// arguments: `pod_view`, `host_named`).
pub fn spawn_in(view: &[String], args: &[&str]) -> Child {
    let mut cmd = Command::new(&view[0]);
    cmd.args(&view[1..]).arg(BIN).args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn().expect("start in the view")
}

pub fn run_in(view: &[String], args: &[&str]) -> Out {
    finish(spawn_in(view, args), Duration::from_secs(60))
}

/// Runs `tc` in the guest, failing the test if it fails.
pub fn tc(args: &[&str]) {
    let out = Command::new("tc").args(args).output().unwrap();
    assert!(out.status.success(), "tc {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Pod `i` of a rendered Job's `container`: its script with its environment, run under
/// `wrap` (a pod's device view, or nothing). What differs from a cluster: the workloads
/// are the repository's and the termination message goes to `dir`; every peer is this host.
pub fn pod(wrap: &[String], container: &Value, i: usize, base_port: &str, dir: &std::path::Path) -> Command {
    let script = container["command"][2].as_str().unwrap();
    let mut cmd = match wrap.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg("/bin/sh");
            c
        }
        None => Command::new("/bin/sh"),
    };
    cmd.args(["-c", script]);
    // As the kubelet fills them: values, the Secret's token, the memory limit in MiB.
    for e in container["env"].as_array().unwrap() {
        cmd.env(e["name"].as_str().unwrap(), super::kubelet::env_value(container, e, |_| None));
    }
    let bin_dir = std::path::Path::new(BIN).parent().unwrap().display().to_string();
    cmd.env("JOB_COMPLETION_INDEX", i.to_string())
        .env("RDMABENCH_WORKLOADS", format!("{}/workloads", env!("CARGO_MANIFEST_DIR")))
        .env("RDMABENCH_PORT", base_port)
        .env("RDMABENCH_TERMINATION_LOG", dir.join(format!("term-{i}")))
        .env("PATH", format!("{bin_dir}:{}", std::env::var("PATH").unwrap_or_default()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}
