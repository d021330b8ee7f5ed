//! An all-pairs fleet (`rdmabench fleet`) as Kubernetes objects: one pod per node (required
//! anti-affinity on the host name), each running `rdmabench fleet` with its index from its
//! controller, `--peers` from the headless Service's names and every device it was given;
//! wrapped for the gang scheduler the cluster has (`gang::Gang`).

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::JobSpec;
use serde_json::{Value, json};

use super::gang::{Gang, MEMBER};
use super::manifest::{self, JobParams};
use crate::fleet::schedule::{Directions, Plan};

/// What an all-pairs fleet's Job is asked for, beyond a pair's parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct AllPairs {
    pub pods: u32,
    pub gang: Gang,
    /// Kueue's LocalQueue (kueue, jobset) or Volcano's queue (volcano).
    pub queue: Option<String>,
    pub directions: Directions,
    pub max_pairs_per_round: Option<u32>,
    /// `--measure` and `--threshold` NAME=VALUEs over the fleet workload.
    pub over: crate::fleet::config::Overrides,
}

impl AllPairs {
    pub fn plan(&self) -> Plan {
        Plan { nodes: self.pods, directions: self.directions, max_pairs_per_round: self.max_pairs_per_round }
    }
}

/// How long every node waits for the others to join: pods of a gang start within seconds,
/// but a node's image may still be pulled.
pub const JOIN_TIMEOUT_S: u32 = 900;

/// Each step's allowance in the Job's default deadline: a step of the shipped workload
/// (three 8.2 GiB bandwidth repeats and three latency runs) takes 0.5-2.5 s on 100-400
/// Gb/s NICs; 60 s leaves room for a slow cluster without letting a stuck fleet run for days.
pub const STEP_ALLOWANCE_S: u64 = 60;

/// The deadline a fleet gets unless `--deadline` says: the join, then every step's allowance.
pub fn default_deadline_s(a: &AllPairs) -> i64 {
    (u64::from(JOIN_TIMEOUT_S) + a.plan().step_count() as u64 * STEP_ALLOWANCE_S) as i64
}

/// The pod's script: validate what the plugin gave, then be node `i` of the fleet. Node
/// 0's verdict is its exit code (1: a bad node, link or flaky pair) and its termination
/// message; every node's log carries its rows (`RDMABENCH_PAIR`, `RDMABENCH_SERVED`) for
/// `summarize`. `INDEX_VAR` is the gang's index variable. Each process may register half
/// of what the memory limit leaves beyond the headroom: a node serves a partner in the
/// same process that measures its own pair.
const SCRIPT: &str = r#"set -u
term=${RDMABENCH_TERMINATION_LOG:-/dev/termination-log}
budget="$(( (RDMABENCH_MEMORY_LIMIT_MIB - RDMABENCH_MEMORY_HEADROOM_MIB) / 2 ))M"
i=${INDEX_VAR}
rdmabench validate --profile "$RDMABENCH_PROFILE" $RDMABENCH_VALIDATE_ARGS
rc=$?
if [ $rc -ne 0 ]; then
  echo "node $i on $(hostname): validate --profile $RDMABENCH_PROFILE failed (exit $rc)" | tee "$term"; exit $rc
fi
exec rdmabench fleet --index "$i" --pods "$RDMABENCH_PODS" --peers "$RDMABENCH_PEERS" -d "$RDMABENCH_DEVICES" \
  -p "$RDMABENCH_PORT" --connect-timeout "$RDMABENCH_JOIN_TIMEOUT" --max-memory "$budget" \
  --workload "$RDMABENCH_WORKLOADS/fleet/all-pairs.toml" --termination-log "$term" $RDMABENCH_FLEET_ARGS
"#;

/// The label every pod of the fleet carries, whichever controller made it: the Service
/// and the anti-affinity select on it.
fn selector(p: &JobParams) -> BTreeMap<String, String> {
    BTreeMap::from([("rdmabench/fleet".to_string(), p.name.clone())])
}

/// `rdmabench fleet`'s arguments beyond those every node shares.
fn fleet_args(a: &AllPairs) -> String {
    let mut args = vec![format!("--directions {}", directions_name(a.directions))];
    if let Some(m) = a.max_pairs_per_round {
        args.push(format!("--max-pairs-per-round {m}"));
    }
    if !a.over.is_empty() {
        args.push(a.over.flags());
    }
    args.join(" ")
}

pub fn directions_name(d: Directions) -> &'static str {
    match d {
        Directions::One => "one",
        Directions::Both => "both",
    }
}

fn template(p: &JobParams, a: &AllPairs) -> k8s_openapi::api::core::v1::PodTemplateSpec {
    let script = SCRIPT.replace("INDEX_VAR", a.gang.index_env());
    let env = vec![
        manifest::env("RDMABENCH_PODS", a.pods.to_string()),
        manifest::env("RDMABENCH_PEERS", a.gang.peers(&p.name)),
        manifest::env("RDMABENCH_JOIN_TIMEOUT", JOIN_TIMEOUT_S.to_string()),
        manifest::env("RDMABENCH_FLEET_ARGS", fleet_args(a)),
    ];
    let container = manifest::pod_container(p, &script, env);
    let mut labels = BTreeMap::new();
    if a.gang == Gang::Ack {
        // ACK's kube-scheduler makes a PodGroup of the pods with these labels and binds
        // none until min-available of them fit.
        labels.insert("pod-group.scheduling.sigs.k8s.io/name".to_string(), p.name.clone());
        labels.insert("pod-group.scheduling.sigs.k8s.io/min-available".to_string(), a.pods.to_string());
    }
    // The Job controller names an Indexed Job's pods under a subdomain; Volcano's svc
    // plugin and JobSet set it themselves.
    let subdomain = a.gang.own_service().then(|| p.name.clone());
    let mut t = manifest::pod_template(p, container, labels, selector(p), subdomain);
    if a.gang == Gang::Volcano {
        // A Volcano Job has no deadline of its own: the pods carry it.
        let spec = t.spec.as_mut().expect("a template has a spec");
        spec.active_deadline_seconds = Some(p.deadline_s);
        spec.scheduler_name = Some("volcano".into());
    }
    t
}

/// The Indexed Job of N pods every variant but Volcano's runs: each index runs to its end
/// (a failed node does not stop node 0's verdict), and the Job fails if any index failed.
fn job_spec(p: &JobParams, a: &AllPairs) -> JobSpec {
    let n = a.pods as i32;
    JobSpec {
        completion_mode: Some("Indexed".into()),
        completions: Some(n),
        parallelism: Some(n),
        backoff_limit_per_index: Some(0),
        max_failed_indexes: Some(n),
        active_deadline_seconds: Some(p.deadline_s),
        pod_failure_policy: Some(manifest::failure_policy("FailIndex")),
        suspend: (a.gang == Gang::Kueue).then_some(true),
        template: template(p, a),
        ..Default::default()
    }
}

fn to_value<T: serde::Serialize>(t: &T) -> Value {
    serde_json::to_value(t).expect("a typed object serialises")
}

/// The gang's object (Job, Volcano Job or JobSet) as JSON.
pub fn workload_object(p: &JobParams, a: &AllPairs) -> Value {
    let mut meta = manifest::metadata(p);
    let queue_label = |meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        if let Some(q) = &a.queue {
            meta.labels.get_or_insert_default().insert("kueue.x-k8s.io/queue-name".into(), q.clone());
        }
    };
    match a.gang {
        Gang::None | Gang::Ack | Gang::Kueue => {
            queue_label(&mut meta);
            let job =
                k8s_openapi::api::batch::v1::Job { metadata: meta, spec: Some(job_spec(p, a)), ..Default::default() };
            to_value(&job)
        }
        Gang::Jobset => {
            queue_label(&mut meta);
            let mut job = to_value(&job_spec(p, a));
            // The JobSet suspends its Job itself when Kueue holds it.
            job.as_object_mut().expect("an object").remove("suspend");
            let mut spec = json!({
                "network": {"enableDNSHostnames": true, "publishNotReadyAddresses": true},
                // One Job: the fleet fails with it, and is not restarted.
                "failurePolicy": {"maxRestarts": 0},
                "successPolicy": {"operator": "All"},
                "replicatedJobs": [{"name": MEMBER, "replicas": 1, "template": {"spec": job}}],
            });
            if a.queue.is_some() {
                spec["suspend"] = json!(true);
            }
            json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": to_value(&meta), "spec": spec})
        }
        Gang::Volcano => {
            let n = a.pods;
            let mut spec = json!({
                "schedulerName": "volcano",
                "minAvailable": n,
                // Every node must succeed: a failed pod fails the Job once all have ended,
                // after node 0 gave its verdict.
                "minSuccess": n,
                "maxRetry": 3,
                // The index as VC_TASK_INDEX (env), host names under a headless Service
                // published before the pods are ready (svc).
                "plugins": {"env": [], "svc": ["--publish-not-ready-addresses=true"]},
                // An evicted pod is not the fabric's fault: the fleet runs again, whole.
                "policies": [{"event": "PodEvicted", "action": "RestartJob"}],
                "tasks": [{"name": MEMBER, "replicas": n, "template": to_value(&template(p, a))}],
            });
            if let Some(q) = &a.queue {
                spec["queue"] = json!(q);
            }
            json!({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": to_value(&meta), "spec": spec})
        }
    }
}

/// The `kubectl wait` target of node 0's pod: Volcano names its pods, the Job controller
/// labels them with their index.
pub fn node_0_pod(name: &str, gang: Gang) -> String {
    match gang {
        Gang::Volcano => format!("pod/{}", gang.hostname(name, "0")),
        _ => format!("pod -l rdmabench/fleet={name},batch.kubernetes.io/job-completion-index=0"),
    }
}

/// The `--threshold`s the pods judge with, for `summarize` to judge the same way.
fn summarize_thresholds(a: &AllPairs) -> String {
    a.over.thresholds.iter().map(|(k, v)| format!(" --threshold {k}={v}")).collect()
}

/// The multi-document YAML: the Service (where the gang does not make its own), then the
/// gang's object, under a header that says how to run it and read the verdict.
pub fn render(p: &JobParams, a: &AllPairs) -> String {
    let object = serde_norway::to_string(&workload_object(p, a)).expect("JSON serialises as YAML");
    let service = if a.gang.own_service() {
        let svc = manifest::headless_service(p, selector(p));
        format!("{}---\n", serde_norway::to_string(&svc).expect("a Service serialises"))
    } else {
        String::new()
    };
    let plan = a.plan();
    let node_0 = node_0_pod(&p.name, a.gang);
    let header = format!(
        "# rdmabench {version} all-pairs fleet of {n} nodes: {platform} {mode} ({summary}), {nics} NIC(s) per pod, \
         gang {gang}.\n\
         # {steps} steps ({directions} direction(s)); deadline {deadline} s. Needs {min}.\n\
         # Generated by `rdmabench k8s render`. The pods take the control channel's token from Secret {secret}; \
         create it once\n# per namespace: kubectl create secret generic {secret} --from-literal=token=$(head -c 32 \
         /dev/urandom | base64)\n\
         # Run: kubectl apply -f THIS; then, once the pods exist, wait for node 0's verdict:\n\
         # kubectl wait {node_0} --for=jsonpath='{{.status.containerStatuses[0].state.terminated.reason}}' \
         --timeout={deadline}s\n\
         # Verdict: node 0's termination message and exit code; every node's rows:\n\
         # kubectl logs -l rdmabench/fleet={name} --tail=-1 --max-log-requests={n} | rdmabench summarize --fleet \
         all-pairs --pods {n} --directions {directions}{judged} --out verdict -\n",
        version = env!("CARGO_PKG_VERSION"),
        n = a.pods,
        platform = super::platform::platform_name(p.mode.platform),
        mode = p.mode.name,
        summary = p.mode.summary,
        nics = p.nics,
        gang = a.gang.name(),
        steps = plan.step_count(),
        directions = directions_name(a.directions),
        deadline = p.deadline_s,
        min = a.gang.min_kubernetes(),
        secret = p.token_secret,
        name = p.name,
        judged = summarize_thresholds(a),
    );
    format!("{header}{service}{object}")
}

/// The pod template inside a rendered Job, Volcano Job or JobSet (as JSON).
#[cfg(test)]
pub fn pod_template_of(doc: &Value) -> &Value {
    match doc["kind"].as_str().unwrap_or_default() {
        "JobSet" => &doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"],
        _ if doc["apiVersion"] == "batch.volcano.sh/v1alpha1" => &doc["spec"]["tasks"][0]["template"],
        _ => &doc["spec"]["template"],
    }
}

#[cfg(test)]
mod tests {
    use super::super::platform::Platform;
    use super::super::{RenderRequest, committed, plan};
    use super::*;

    fn fleet(platform: Platform, mode: &str, gang: Gang) -> RenderRequest {
        let mut r = committed().into_iter().next().unwrap().1;
        r.platform = platform;
        r.mode = mode.into();
        // VKE's NIC-counted modes take two; a whole-node mode takes the one resource.
        r.nics = if platform == Platform::Vke && mode != "shared-host" { 2 } else { 1 };
        r.all_pairs = Some(AllPairs {
            pods: 6,
            gang,
            queue: matches!(gang, Gang::Kueue).then(|| "q".to_string()),
            directions: Directions::Both,
            max_pairs_per_round: Some(2),
            over: crate::fleet::config::Overrides {
                measure: vec![("bw_iterations".into(), 500.0)],
                thresholds: vec![("max_flaky_pairs".into(), 1.0)],
            },
        });
        r.name = Some("fl".into());
        r
    }

    /// The documents of a rendering, as JSON.
    fn docs(r: &RenderRequest) -> Vec<Value> {
        let (p, _) = plan(r).unwrap();
        manifest::render(&p).split("\n---\n").map(|d| serde_norway::from_str::<Value>(d).unwrap()).collect()
    }

    fn env_of(container: &Value, name: &str) -> String {
        let e = container["env"].as_array().unwrap().iter().find(|e| e["name"] == name);
        e.unwrap_or_else(|| panic!("no {name}"))["value"].as_str().unwrap().to_string()
    }

    #[test]
    fn every_gang_runs_one_fleet_node_per_host_with_its_index_and_peers() {
        for (platform, mode, gang) in [
            (Platform::Vke, "exclusive", Gang::None),
            (Platform::Vke, "shared", Gang::Volcano),
            (Platform::Vke, "shared-multi", Gang::Kueue),
            (Platform::Vke, "shared-host", Gang::Jobset),
            (Platform::Ack, "shared-podnet", Gang::Ack),
        ] {
            let d = docs(&fleet(platform, mode, gang));
            assert_eq!(d.len(), if gang.own_service() { 2 } else { 1 }, "{gang:?}");
            let object = d.last().unwrap();
            let t = pod_template_of(object);
            let c = &t["spec"]["containers"][0];
            let script = c["command"][2].as_str().unwrap();
            assert!(script.contains(&format!("i=${{{}}}", gang.index_env())), "{gang:?}: {script}");
            assert!(script.contains("exec rdmabench fleet --index \"$i\""), "{script}");
            // The workload the image copies from workloads/ (lab/image, the Dockerfile).
            assert!(script.contains("\"$RDMABENCH_WORKLOADS/fleet/all-pairs.toml\""), "{script}");
            let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/workloads/fleet/all-pairs.toml");
            assert!(std::path::Path::new(shipped).exists());
            assert_eq!(env_of(c, "RDMABENCH_PEERS"), gang.peers("fl"));
            assert_eq!(env_of(c, "RDMABENCH_PODS"), "6");
            let args = env_of(c, "RDMABENCH_FLEET_ARGS");
            assert_eq!(
                args,
                "--directions both --max-pairs-per-round 2 --measure bw_iterations=500 --threshold max_flaky_pairs=1"
            );
            // One pod per node: required anti-affinity on the host name, on the fleet's label.
            let anti = &t["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
            assert_eq!(anti["topologyKey"], "kubernetes.io/hostname");
            assert_eq!(anti["labelSelector"]["matchLabels"]["rdmabench/fleet"], "fl");
            assert_eq!(t["metadata"]["labels"]["rdmabench/fleet"], "fl");
            if gang.own_service() {
                assert_eq!(d[0]["spec"]["selector"]["rdmabench/fleet"], "fl");
                assert_eq!(d[0]["spec"]["publishNotReadyAddresses"], true);
                assert_eq!(t["spec"]["subdomain"], "fl");
            }
        }
    }

    #[test]
    fn each_gang_asks_its_scheduler_for_all_or_nothing() {
        let d = docs(&fleet(Platform::Vke, "exclusive", Gang::Volcano));
        let vc = &d[0];
        assert_eq!((vc["spec"]["minAvailable"].as_u64(), vc["spec"]["minSuccess"].as_u64()), (Some(6), Some(6)));
        assert_eq!(vc["spec"]["schedulerName"], "volcano");
        assert_eq!(vc["spec"]["tasks"][0]["replicas"], 6);
        assert_eq!(vc["spec"]["plugins"]["svc"][0], "--publish-not-ready-addresses=true");
        assert!(vc["spec"]["plugins"]["env"].is_array());
        assert!(vc["spec"]["tasks"][0]["template"]["spec"]["activeDeadlineSeconds"].as_i64().unwrap() > 0);

        let d = docs(&fleet(Platform::Vke, "exclusive", Gang::Kueue));
        assert_eq!(d[1]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "q");
        assert_eq!(d[1]["spec"]["suspend"], true);

        let d = docs(&fleet(Platform::Vke, "exclusive", Gang::Jobset));
        let js = &d[0];
        assert_eq!(js["apiVersion"], "jobset.x-k8s.io/v1alpha2");
        assert_eq!(js["spec"]["network"]["enableDNSHostnames"], true);
        assert_eq!(js["spec"]["network"]["publishNotReadyAddresses"], true);
        let job = &js["spec"]["replicatedJobs"][0];
        assert_eq!((job["replicas"].as_u64(), job["template"]["spec"]["completions"].as_u64()), (Some(1), Some(6)));

        let d = docs(&fleet(Platform::Ack, "exclusive", Gang::Ack));
        let labels = &d[1]["spec"]["template"]["metadata"]["labels"];
        assert_eq!(labels["pod-group.scheduling.sigs.k8s.io/name"], "fl");
        assert_eq!(labels["pod-group.scheduling.sigs.k8s.io/min-available"], "6");
        assert!(d[1]["spec"].get("suspend").is_none(), "only Kueue suspends");
    }

    #[test]
    fn every_index_runs_to_its_end_and_any_failure_fails_the_job() {
        let d = docs(&fleet(Platform::Vke, "exclusive", Gang::None));
        let spec = &d[1]["spec"];
        assert_eq!(spec["completionMode"], "Indexed");
        assert_eq!((spec["completions"].as_u64(), spec["parallelism"].as_u64()), (Some(6), Some(6)));
        assert_eq!((spec["backoffLimitPerIndex"].as_u64(), spec["maxFailedIndexes"].as_u64()), (Some(0), Some(6)));
        let rules = spec["podFailurePolicy"]["rules"].as_array().unwrap();
        assert_eq!(rules[0]["action"], "FailIndex");
        assert_eq!(rules[0]["onExitCodes"]["values"], serde_json::json!([1, 2, 3, 4]));
        assert!(spec.get("successPolicy").is_none(), "a fleet needs every node");
    }

    #[test]
    fn the_headers_summarize_judges_with_the_pods_thresholds() {
        let r = fleet(Platform::Vke, "exclusive", Gang::None);
        let (p, _) = plan(&r).unwrap();
        let text = manifest::render(&p);
        let line = text.lines().find(|l| l.contains("| rdmabench summarize")).unwrap();
        assert!(
            line.ends_with(
                "summarize --fleet all-pairs --pods 6 --directions both --threshold max_flaky_pairs=1 --out verdict -"
            ),
            "{line}"
        );
        assert!(!line.contains("--measure"), "summarize takes no measurement: {line}");
    }

    #[test]
    fn memory_and_the_deadline_come_from_the_fleet_workload_and_plan() {
        let r = fleet(Platform::Vke, "exclusive", Gang::None);
        let (p, _) = plan(&r).unwrap();
        // The shipped workload's larger phase: 4 QPs of 1 MiB buffers, on each of the pod's NICs.
        let one = [crate::report::pairs::Phase::Bandwidth, crate::report::pairs::Phase::Latency]
            .map(|ph| {
                crate::link::memory_need(
                    &crate::fleet::config::FleetFile::parse(crate::fleet::config::SHIPPED, "f")
                        .unwrap()
                        .measure
                        .spec(ph),
                )
            })
            .into_iter()
            .max()
            .unwrap();
        assert_eq!(p.registered_memory, one * u64::from(r.nics));
        // --measure bw_size shrinks it: a quarter of the buffer, a quarter of the memory.
        let mut small = r.clone();
        small.all_pairs.as_mut().unwrap().over.measure.push(("bw_size".into(), 262144.0));
        assert_eq!(plan(&small).unwrap().0.registered_memory * 4, p.registered_memory);
        let a = r.all_pairs.as_ref().unwrap();
        assert_eq!(p.deadline_s, (JOIN_TIMEOUT_S as u64 + a.plan().step_count() as u64 * STEP_ALLOWANCE_S) as i64);
        let mut given = r.clone();
        given.deadline_s = Some(99);
        assert_eq!(plan(&given).unwrap().0.deadline_s, 99);
    }

    #[test]
    fn what_a_fleet_cannot_combine_is_refused_with_the_fix() {
        let refused = |f: &dyn Fn(&mut RenderRequest)| {
            let mut r = fleet(Platform::Vke, "exclusive", Gang::None);
            f(&mut r);
            plan(&r).unwrap_err().to_string()
        };
        let e = refused(&|r| r.all_pairs.as_mut().unwrap().gang = Gang::Kueue);
        assert!(e.contains("--gang kueue needs --queue"), "{e}");
        let e = refused(&|r| r.all_pairs.as_mut().unwrap().queue = Some("q".into()));
        assert!(e.contains("--queue applies to --gang kueue, jobset"), "{e}");
        let e = refused(&|r| r.all_pairs.as_mut().unwrap().gang = Gang::Ack);
        assert!(e.contains("ACK's kube-scheduler only"), "{e}");
        let e = refused(&|r| r.workload = Some("smoke".into()));
        assert!(e.contains("--threshold NAME=VALUE"), "{e}");
        let e = refused(&|r| r.params = vec![("min_write_gbps".into(), 1.0)]);
        assert!(e.contains("--param min_write_gbps") && e.contains("max_flaky_pairs"), "{e}");
        let e = refused(&|r| r.all_pairs.as_mut().unwrap().over.thresholds = vec![("node_min_ratio".into(), 3.0)]);
        assert!(e.contains("(0, 1]"), "{e}");
        let e = refused(&|r| r.all_pairs.as_mut().unwrap().over.measure = vec![("bw_qps".into(), 65.0)]);
        assert!(e.contains("use 1 to 64 QPs") && e.contains("--measure bw_qps=65"), "{e}");
        let e = refused(&|r| r.all_pairs.as_mut().unwrap().pods = 1);
        assert!(e.contains("needs 2 to 1024 nodes"), "{e}");
        let e = refused(&|r| {
            let a = r.all_pairs.as_mut().unwrap();
            (a.gang, a.pods) = (Gang::Jobset, 1024);
            r.name = Some("a".repeat(52));
        });
        assert!(e.contains("is 64 characters") && e.contains("at most 51 characters"), "{e}");
        let e = refused(&|r| r.port = 65535 - 5);
        assert!(e.contains("barrier on port + N") && e.contains("1..=65529"), "{e}");
    }
}
