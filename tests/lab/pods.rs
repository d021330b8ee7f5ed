//! The rendered Jobs' pods run for real: the image `lab/image` built, under an OCI runtime
//! (crun) with each pod's securityContext, memory limit and device-plugin devices
//! (`kubelet`), on two cables (`lab/run --nics 2`): node "b" (rxeb0, rxeb1, 10.90.1.1)
//! runs pod 0, node "a" (rxea0, rxea1, 10.90.0.1) pod 1.

use std::path::Path;

use super::common::*;
use super::kubelet::{self, DEFAULT_MEMLOCK, Finished, Node, PodSpec};
use super::rails::RAILS_SERVER;

const NODE_B: Node = Node { ip: RAILS_SERVER, devices: &["rxeb0", "rxeb1"] };
const NODE_A: Node = Node { ip: "10.90.0.1", devices: &["rxea0", "rxea1"] };
/// The platforms' thresholds (k8s-jobs/README.md) ask for a real NIC's speed: the lab's
/// acceptance Job gets the workload's own lab values instead, as `--param`s.
const LAB_PARAMS: &[&str] = &[
    "--param",
    "min_line_rate_pct=0.1",
    "--param",
    "max_rail_spread_pct=90",
    "--param",
    "max_write_p50_us=1000",
    "--param",
    "max_write_p99_us=10000",
    "--param",
    "max_read_p50_us=2000",
    "--param",
    "max_send_p50_us=1000",
];

/// `k8s render ARGS` as a user of this lab renders it. Unlike a cluster, a pod's rails run
/// one after another (`--rails sequential`): both pods share the guest's two vCPUs, and
/// four busy-polling latency loops at once measure the scheduler (p50 6-8 ms for 26 us
/// alone, and 10 minutes for the acceptance workload).
fn render_for_lab(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend_from_slice(&["--rails", "sequential"]);
    if args.contains(&"acceptance") {
        all.extend_from_slice(LAB_PARAMS);
    }
    let job = rendered_job(&all);
    let env = job["spec"]["template"]["spec"]["containers"][0]["env"].as_array().unwrap();
    assert!(env.iter().any(|e| e["name"] == "RDMABENCH_RAILS" && e["value"] == "sequential"), "{job}");
    job
}

/// Runs every pod of `job` at once (pod i on `nodes[i]`), as the Job controller creates
/// them, and waits for all.
fn run_job(job: &Value, nodes: &[&Node], limit: Duration) -> Vec<Finished> {
    let running = kubelet::start_all(job, nodes);
    let deadline = Instant::now() + limit;
    running.into_iter().map(|r| r.wait(deadline)).collect()
}

/// What every pod of a passing pair shows: validate passed on exactly its node's devices,
/// with CAP_IPC_LOCK over the runtime's 64 KiB memlock limit, under its memory limit.
fn check_pod(p: &Finished, node: &Node, limit: u64) {
    let log = p.log();
    assert_eq!(p.out.code, 0, "pod {}:\n{log}", p.name);
    let visible = format!("{} usable ({}) of 4 visible", node.devices.len(), node.devices.join(", "));
    assert!(log.contains(&visible), "only the pod's /dev/infiniband nodes ({visible}):\n{log}");
    assert!(log.contains("PASS  cap-ipc-lock") && log.contains("64.0 KiB (CAP_IPC_LOCK lifts it)"), "{log}");
    assert_eq!(p.memory_max, limit, "the cgroup's memory.max is the spec's limit");
    assert!(
        p.memory_peak > DEFAULT_MEMLOCK && p.memory_peak < p.memory_max,
        "peak {} of {}",
        p.memory_peak,
        p.memory_max
    );
}

/// The client's termination message and both pods' logs through `summarize`.
fn check_pair(pods: &[Finished], workload: &str, rails: usize) {
    assert_eq!(pods[1].termination_message.trim(), format!("pod 1 -> pod 0: workload {workload} PASS (exit 0)"));
    assert_eq!(pods[0].termination_message.trim(), "pod 0 served the workload (exit 0)");
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("pods.log");
    std::fs::write(&logs, pods.iter().map(Finished::log).collect::<Vec<_>>().join("\n")).unwrap();
    let s = run(&["summarize", logs.to_str().unwrap()]);
    assert_eq!(s.code, 0, "{}\n{}", s.stdout, s.stderr);
    assert!(s.stdout.contains(&format!("1 link(s), 0 failed; {rails} rail(s), 0 failed")), "{}", s.stdout);
}

/// Runs a pair Job's two pods, pod 0 on node b and pod 1 on node a, and checks that both
/// pass as a pair; returns them for the mode's own checks.
fn passing_pair(job: &Value, workload: &str, limit: Duration) -> Vec<Finished> {
    let pods = run_job(job, &[&NODE_B, &NODE_A], limit);
    let memory = kubelet::memory_limit(&job["spec"]["template"]["spec"]["containers"][0]);
    check_pod(&pods[0], &NODE_B, memory);
    check_pod(&pods[1], &NODE_A, memory);
    check_pair(&pods, workload, NODE_A.devices.len());
    pods
}

/// VKE exclusive, two NICs per pod, the acceptance workload: every rail of each pod
/// measured to its peer's, the largest buffers registered with only CAP_IPC_LOCK.
#[test]
fn lab_pods_vke_exclusive_two_nics_pass_acceptance_under_crun_with_least_privilege() {
    let job = render_for_lab(&["--platform", "vke", "--mode", "exclusive", "--nics", "2", "--workload", "acceptance"]);
    let pods = passing_pair(&job, "acceptance", Duration::from_secs(600));
    let client = pods[1].log();
    assert!(client.contains("PASS  exclusive-nic") && client.contains("topology-file"), "{client}");
    assert!(client.contains(" rail 1: rxea1") && client.contains("-> rxeb1"), "both rails, pod to pod: {client}");
}

/// VKE shared-host: the pod sees every NIC of its node (IPVLAN sub-interfaces there; a
/// veth end here, which sysfs shows the same way), and its memory limit, sized for the
/// node's two NICs, holds both rails' buffers. Rendered with root stated (`--run-as-user 0`,
/// for a policy that wants it explicit), which runs as the default does.
#[test]
fn lab_pods_vke_shared_host_sees_every_nic_of_its_node_under_crun() {
    let args = [
        "--platform",
        "vke",
        "--mode",
        "shared-host",
        "--machine-nics",
        "2",
        "--workload",
        "smoke",
        "--run-as-user",
        "0",
    ];
    let job = render_for_lab(&args);
    assert_eq!(job["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsUser"], 0);
    let pods = passing_pair(&job, "smoke", Duration::from_secs(300));
    assert!(pods[1].log().contains("PASS  ipvlan"), "{}", pods[1].log());
}

/// ACK shared rdma/hca on the node's network: hostNetwork, IPC_LOCK and SYS_RESOURCE.
#[test]
fn lab_pods_ack_shared_hostnet_passes_under_crun() {
    let args = ["--platform", "ack", "--mode", "shared-hostnet", "--machine-nics", "2", "--workload", "smoke"];
    let job = render_for_lab(&args);
    assert_eq!(job["spec"]["template"]["spec"]["hostNetwork"], true);
    let pods = passing_pair(&job, "smoke", Duration::from_secs(300));
    assert!(pods[1].log().contains("PASS  cap-sys-resource"), "{}", pods[1].log());
}

/// The same pod without IPC_LOCK: registration is refused under the 64 KiB limit, and the
/// pod says so and why.
#[test]
fn lab_pods_a_pod_without_ipc_lock_fails_with_the_memlock_error() {
    let mut job = render_for_lab(&["--platform", "vke", "--mode", "exclusive", "--nics", "2", "--workload", "smoke"]);
    let caps = &mut job["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"];
    caps["add"] = serde_json::json!([]);
    let pod = run_job(&job, &[&NODE_B], Duration::from_secs(120)).remove(0);
    let log = pod.log();
    assert_eq!(pod.out.code, 1, "validate fails the pod:\n{log}");
    assert!(log.contains("FAIL  cap-ipc-lock") && log.contains("FAIL  memlock"), "{log}");
    assert!(
        log.contains("the locked-memory limit (ulimit -l) is 64.0 KiB and this process lacks CAP_IPC_LOCK"),
        "the memlock error names the limit and the capability:\n{log}"
    );
    assert!(
        pod.termination_message.contains("validate --profile vke-exclusive failed (exit 1)"),
        "{}",
        pod.termination_message
    );
}

/// The lab's device plugins give each rendered request what a cluster's give: VKE's
/// `vke.volcengine.com/rdma: N` N NICs of the node, `rdma-host` and ACK's `rdma/hca` every
/// NIC; a pod without an RDMA resource gets no device, and one the node cannot satisfy (more
/// NICs than it has, a GPU) does not run. So a rendering that requests the wrong resource
/// or count cannot pass the pod tests above by being handed the node's NICs anyway.
#[test]
fn lab_pods_the_device_plugins_grant_what_the_pod_requests() {
    const ONE_NIC: Node = Node { ip: "10.90.0.1", devices: &["rxea0"] };
    let grant = |job: &Value, node: &Node| {
        kubelet::granted_devices(&PodSpec { job, index: 0, node, pod_ips: &[node.ip, node.ip] })
    };
    let render = |args: &str| rendered_job(&args.split(' ').collect::<Vec<_>>());
    let vke_one = render("--platform vke --mode exclusive --nics 1 --workload smoke");
    assert_eq!(grant(&vke_one, &NODE_B), Ok(vec!["rxeb0"]), "vke.volcengine.com/rdma: 1 is one NIC");
    let vke_two = render("--platform vke --mode exclusive --nics 2 --workload smoke");
    assert_eq!(grant(&vke_two, &NODE_B), Ok(vec!["rxeb0", "rxeb1"]));
    let refused = grant(&vke_two, &ONE_NIC).unwrap_err();
    assert!(refused.contains("Insufficient vke.volcengine.com/rdma"), "{refused}");
    for mode in
        ["--platform vke --mode shared-host", "--platform ack --mode shared-hostnet", "--platform ack --mode exclusive"]
    {
        let job = render(&format!("{mode} --machine-nics 2 --workload smoke"));
        assert_eq!(grant(&job, &NODE_B), Ok(vec!["rxeb0", "rxeb1"]), "{mode}: every NIC of the node");
    }
    let gpus = render("--platform vke --mode exclusive --nics 1 --gpus 1 --workload smoke");
    let refused = grant(&gpus, &NODE_B).unwrap_err();
    assert!(refused.contains("no GPU") && refused.contains("Pending"), "{refused}");
    let mut bare = vke_one.clone();
    let resources = &mut bare["spec"]["template"]["spec"]["containers"][0]["resources"];
    for side in ["limits", "requests"] {
        resources[side].as_object_mut().unwrap().remove("vke.volcengine.com/rdma");
    }
    assert_eq!(grant(&bare, &NODE_B), Ok(vec![]), "no RDMA resource, no device");
}

/// docs/validate.md's first way to validate a pod: rdmabench copied into a running pod whose
/// image lacks it (`kubectl cp`), then run in that container, where the plugin's devices,
/// the capabilities and the locked-memory limit are. The pod's own command stands in for
/// the user's workload: it removes the image's rdmabench, then waits for the copy and runs
/// it, as `kubectl exec` would.
#[test]
fn lab_pods_rdmabench_copied_into_a_running_pod_validates_what_it_was_given() {
    let mut job = render_for_lab(&["--platform", "vke", "--mode", "exclusive", "--nics", "2", "--workload", "smoke"]);
    let script = r#"set -eu
rm -f /usr/local/bin/rdmabench
if command -v rdmabench; then echo "the image still has rdmabench"; exit 96; fi
echo "no rdmabench in this image; waiting for the copy"
i=0
while [ ! -x /opt/rdmabench/rdmabench ]; do i=$((i + 1)); [ "$i" -lt 1200 ] || exit 97; sleep 0.1; done
exec /opt/rdmabench/rdmabench validate --profile vke-exclusive --expect-nics 2"#;
    let c = &mut job["spec"]["template"]["spec"]["containers"][0];
    c["command"] = serde_json::json!(["/bin/sh", "-c", script]);
    c["args"] = Value::Null;
    let pod = kubelet::start_all(&job, &[&NODE_B]).remove(0);
    pod.copy_in(Path::new(BIN), "/opt/rdmabench/rdmabench");
    let pod = pod.wait(Instant::now() + Duration::from_secs(120));
    let log = pod.log();
    assert_eq!(pod.out.code, 0, "validate passes in the pod:\n{log}");
    assert!(log.contains("no rdmabench in this image"), "{log}");
    assert!(log.contains("2 usable (rxeb0, rxeb1) of 4 visible"), "only the pod's devices:\n{log}");
    assert!(log.contains("PASS  cap-ipc-lock") && log.contains("PASS  register-memory"), "{log}");
}
