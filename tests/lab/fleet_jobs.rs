//! The rendered all-pairs fleet's pods run for real on the lab's switch (`lab/run --nodes
//! 6`): `k8s render --fleet all-pairs` as a user renders it, one pod per simulated node
//! under crun (`kubelet`), each with only its node's device (rxen<k>, 10.88.0.<10+k>), the
//! host name and index its controller gives it (an Indexed Job's or Volcano's: they
//! differ), the Service's records in /etc/hosts and the downward API. The pods' own
//! command runs: nothing here tells a pod its index or peers, so a manifest whose command
//! or index variable is wrong fails these tests.

use super::common::*;
use super::fleet::{LAB_MEASURE, LAB_THRESHOLDS, node_addr, slow_port};
use super::kubelet::{self, Finished, Node};

/// The lab's six nodes as the scheduler sees them: node k has rxen<k> at 10.88.0.<10+k>.
fn nodes(n: usize) -> Vec<Node> {
    const DEVICES: [&[&str]; 6] = [&["rxen0"], &["rxen1"], &["rxen2"], &["rxen3"], &["rxen4"], &["rxen5"]];
    (0..n).map(|k| Node { ip: node_addr(k as u32).leak(), devices: DEVICES[k] }).collect()
}

/// What these tests measure beyond the lab's measurement: these tests prove the Jobs, not
/// the fabric, so a bandwidth repeat is 50 messages a QP and a latency one 100 round trips
/// (as the fleet tests that name a slowed node measure).
const JOBS_MEASURE: &[(&str, &str)] = &[("bw_iterations", "50"), ("lat_iterations", "100")];

/// `k8s render --fleet all-pairs --pods N --gang GANG` for VKE exclusive, one NIC a pod,
/// with the lab's measurement and thresholds as `--measure` and `--threshold` (the shipped
/// workload moves 8 GiB a repeat: hours under emulation) and one pair at a time (pairs at
/// once share the guest's two vCPUs and disturb each other's latency). Returns the text
/// (its header says how to read the verdict) and the gang's workload object.
fn render_fleet(pods: usize, gang: &str, port: &str) -> (String, Value) {
    let command = format!(
        "k8s render --platform vke --mode exclusive --nics 1 --fleet all-pairs --pods {pods} --gang {gang} \
         --name rdmabench-fleet-{gang} -p {port} --max-pairs-per-round 1"
    );
    let mut args: Vec<String> = command.split_whitespace().map(str::to_string).collect();
    for (k, v) in LAB_MEASURE.iter().filter(|(k, _)| !JOBS_MEASURE.iter().any(|(m, _)| m == k)).chain(JOBS_MEASURE) {
        args.extend(["--measure".to_string(), format!("{k}={v}")]);
    }
    for (k, v) in LAB_THRESHOLDS {
        args.extend(["--threshold".to_string(), format!("{k}={v}")]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let render = run(&args);
    assert_eq!(render.code, 0, "{}", render.stderr);
    let object = render
        .stdout
        .split("\n---\n")
        .map(|d| serde_norway::from_str::<Value>(d).unwrap())
        .find(|d| d["kind"] != "Service")
        .unwrap();
    (render.stdout, object)
}

/// The effective capability set a container gets from `security`, as /proc shows it
/// (`CapEff`, 16 hex digits): the bits of linux/capability.h.
fn cap_eff(security: &Value) -> String {
    const BITS: &[(&str, u32)] = &[
        ("CAP_CHOWN", 0),
        ("CAP_DAC_OVERRIDE", 1),
        ("CAP_FOWNER", 3),
        ("CAP_FSETID", 4),
        ("CAP_KILL", 5),
        ("CAP_SETGID", 6),
        ("CAP_SETUID", 7),
        ("CAP_SETPCAP", 8),
        ("CAP_NET_BIND_SERVICE", 10),
        ("CAP_NET_ADMIN", 12),
        ("CAP_NET_RAW", 13),
        ("CAP_IPC_LOCK", 14),
        ("CAP_SYS_CHROOT", 18),
        ("CAP_SYS_ADMIN", 21),
        ("CAP_SYS_RESOURCE", 24),
        ("CAP_MKNOD", 27),
        ("CAP_AUDIT_WRITE", 29),
        ("CAP_SETFCAP", 31),
    ];
    let mask = kubelet::capabilities(security).iter().fold(0u64, |m, c| {
        let bit = BITS.iter().find(|(n, _)| n == c).unwrap_or_else(|| panic!("the bit of {c}")).1;
        m | 1 << bit
    });
    format!("{mask:016x}")
}

/// A `/proc/PID/status` field.
fn status_field<'a>(status: &'a str, key: &str) -> &'a str {
    status.lines().find_map(|l| l.strip_prefix(key)).map(str::trim).unwrap_or_else(|| panic!("no {key} in {status}"))
}

/// What the runtime applied to the pod's own process once it runs `rdmabench fleet` (the
/// status `/proc/self/status` shows it): no_new_privs, a seccomp filter (mode 2), and
/// exactly the capabilities the manifest grants, no more.
fn check_what_the_runtime_applied(pod: &kubelet::Running, security: &Value) {
    let want = cap_eff(security);
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        match pod.status() {
            Some(s) if status_field(&s, "Name:") == "rdmabench" => break s,
            s => assert!(Instant::now() < deadline, "{} never ran rdmabench fleet: {s:?}", pod.name),
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let seen = format!("{}:\n{status}\nconfig.json's process: {}", pod.name, pod.config()["process"]);
    assert_eq!(status_field(&status, "NoNewPrivs:"), "1", "{seen}");
    assert_eq!(status_field(&status, "Seccomp:"), "2", "{seen}");
    assert_eq!(status_field(&status, "CapEff:"), want, "{seen}");
    assert_eq!(status_field(&status, "CapPrm:"), want, "{seen}");
    assert_eq!(status_field(&status, "CapBnd:"), want, "{seen}");
}

/// Runs every pod of `object` at once, pod k on node k, as its controller creates them;
/// checks what the runtime applied inside each while it runs, and waits for all.
fn run_fleet(object: &Value, n: usize, limit: Duration) -> Vec<Finished> {
    let nodes = nodes(n);
    let running = kubelet::start_all(object, &nodes.iter().collect::<Vec<_>>());
    let deadline = Instant::now() + limit;
    let container = &kubelet::pod_template(object)["spec"]["containers"][0];
    // VKE exclusive grants IPC_LOCK alone (bit 14): a manifest that granted more fails here.
    assert_eq!(cap_eff(&container["securityContext"]), "0000000000004000", "{container}");
    let t = Instant::now();
    for pod in &running {
        check_what_the_runtime_applied(pod, &container["securityContext"]);
    }
    eprintln!("{n} pods validated and running rdmabench fleet after {:.1} s", t.elapsed().as_secs_f64());
    running.into_iter().map(|r| r.wait(deadline)).collect()
}

fn log(p: &Finished) -> String {
    p.log()
}

/// The header's `kubectl logs ... | rdmabench summarize ...` line run as the docs show it:
/// every pod's log piped to its stdin, in a fresh directory (`--out verdict`). Returns the
/// summary, verdict.json and the planned pairs' rows of pairs.jsonl.
fn summarize_as_documented(rendered: &str, pods: &[Finished]) -> (Out, Value, Vec<Value>) {
    let line = rendered.lines().find(|l| l.starts_with("# kubectl logs ")).expect("the header's logs line");
    let command = line.split("| rdmabench ").nth(1).expect("piped to rdmabench summarize");
    let args: Vec<&str> = command.split_whitespace().collect();
    assert_eq!(args.last(), Some(&"-"), "reads stdin: {line}");
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .args(&args)
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let logs: String = pods.iter().map(log).collect::<Vec<_>>().join("\n");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), logs.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    let out = Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    };
    let verdict = std::fs::read_to_string(dir.path().join("verdict/verdict.json"))
        .unwrap_or_else(|e| panic!("verdict.json: {e}\n{}\n{}", out.stdout, out.stderr));
    let rows = std::fs::read_to_string(dir.path().join("verdict/pairs.jsonl")).unwrap();
    let planned =
        rows.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).filter(|r| r["retest"].is_null()).collect();
    (out, serde_json::from_str(&verdict).unwrap(), planned)
}

/// What every pod of a fleet shows: validate passed on exactly its node's device, and its
/// log carries its rows.
fn check_pods(pods: &[Finished], n: usize) {
    for (k, p) in pods.iter().enumerate() {
        let log = log(p);
        assert!(
            log.contains(&format!("1 usable (rxen{k}) of 6 visible")),
            "pod {}: its node's device only:\n{log}",
            p.name
        );
        assert!(log.contains("PASS  cap-ipc-lock"), "{log}");
        if k + 1 < n {
            assert!(p.out.stdout.contains("RDMABENCH_PAIR "), "pod {} measured its pairs:\n{log}", p.name);
        }
        assert!(p.memory_peak < p.memory_max, "{}: peak {} of {}", p.name, p.memory_peak, p.memory_max);
    }
}

/// A healthy fleet of `n` pods rendered for `gang` passes: node 0 says so in its
/// termination message, every other node ends done, every pair is measured once, each node
/// is named by its pod's host name (`host_2`: pod 2's, as the gang's controller names it),
/// and `summarize` over the piped logs agrees, the servers' records joined.
fn healthy_fleet_passes(gang: &str, n: usize, port: &str, host_2: &str) {
    let (rendered, object) = render_fleet(n, gang, port);
    let t = Instant::now();
    let pods = run_fleet(&object, n, Duration::from_secs(600));
    eprintln!("{n} pods (--gang {gang}): {:.1} s", t.elapsed().as_secs_f64());
    for (k, p) in pods.iter().enumerate() {
        assert_eq!(p.out.code, 0, "pod {}:\n{}", p.name, log(p));
        let want = if k == 0 {
            format!("fleet of {n} nodes: PASS (node 0's verdict: no bad node, link or flaky pair)")
        } else {
            format!("node {k} of {n}: done (node 0 gives the fleet's verdict)")
        };
        assert_eq!(p.termination_message.trim(), want, "pod {}", p.name);
    }
    check_pods(&pods, n);
    let verdict_text: Vec<&str> = pods[0].out.stdout.lines().filter(|l| !l.starts_with("RDMABENCH_")).collect();
    eprintln!("node 0 ({}):\n{}", pods[0].name, verdict_text.join("\n"));
    let (s, verdict, rows) = summarize_as_documented(&rendered, &pods);
    assert_eq!(s.code, 0, "summarize agrees with node 0:\n{}\n{}", s.stdout, s.stderr);
    assert_eq!(verdict["verdict"], "pass", "{verdict}");
    assert_eq!(rows.len(), n * (n - 1) / 2, "every pair once: {rows:?}");
    let names: Vec<String> = pods.iter().map(|p| p.name.clone()).collect();
    assert_eq!(names[2], host_2, "the controller's host name");
    assert_eq!(verdict["labels"], serde_json::json!(names), "each node by its pod's host name: {verdict}");
    for r in &rows {
        assert!(r["peer_counters"].is_object(), "the servers' records were joined from the pipe: {r}");
    }
}

/// An Indexed Job (`--gang none`): the index in JOB_COMPLETION_INDEX, host names `JOB-k`.
#[test]
fn lab_fleet_jobs_an_indexed_job_fleet_passes_under_crun_and_summarize_agrees() {
    healthy_fleet_passes("none", 4, "18515", "rdmabench-fleet-none-2");
}

/// A JobSet (`--gang jobset`): an Indexed Job's index, JobSet's host names `JS-node-0-k`.
#[test]
fn lab_fleet_jobs_a_jobset_fleet_passes_under_crun_and_summarize_agrees() {
    healthy_fleet_passes("jobset", 3, "18700", "rdmabench-fleet-jobset-node-0-2");
}

/// A Volcano Job of five pods (`--gang volcano`: the index in VC_TASK_INDEX, host names
/// `JOB-node-k`) with node 3's port slowed: node 0's pod fails (exit 1) naming node 3 in
/// its termination message, and `summarize` over the piped logs names the same node.
#[test]
fn lab_fleet_jobs_a_volcano_fleet_names_the_node_whose_port_is_slowed() {
    let n = 5;
    let (rendered, job) = render_fleet(n, "volcano", "18600");
    assert_eq!(job["apiVersion"], "batch.volcano.sh/v1alpha1");
    let slow = slow_port(3);
    let t = Instant::now();
    let pods = run_fleet(&job, n, Duration::from_secs(600));
    drop(slow);
    eprintln!("{n} pods (Volcano Job), node 3 slowed: {:.1} s", t.elapsed().as_secs_f64());
    assert_eq!(pods[0].out.code, 1, "node 0 judges the fleet bad:\n{}", log(&pods[0]));
    let message = pods[0].termination_message.trim();
    eprintln!("node 0's termination message: {message}");
    assert!(
        message
            .starts_with(&format!("fleet of {n} nodes: FAIL (exit 1): the fleet has 1 bad node(s) [3], 0 bad link(s)")),
        "{message}"
    );
    for p in &pods[1..] {
        assert_eq!(p.out.code, 0, "pod {}:\n{}", p.name, log(p));
    }
    check_pods(&pods, n);
    let (s, verdict, _) = summarize_as_documented(&rendered, &pods);
    assert_eq!(s.code, 1, "summarize agrees with node 0:\n{}\n{}", s.stdout, s.stderr);
    let node_3 = pods[3].name.clone();
    assert_eq!(node_3, "rdmabench-fleet-volcano-node-3", "Volcano's svc plugin's host name");
    assert_eq!(verdict["bad_nodes"], serde_json::json!([node_3]), "{verdict}");
    assert_eq!(verdict["bad_links"], serde_json::json!([]), "{verdict}");
}
