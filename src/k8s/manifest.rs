//! The Service and Indexed Job of a pair (or fleet) test, built from k8s-openapi's typed
//! structs and serialised to YAML: never string templates, so a field name or type cannot
//! be wrong. Per platform and mode exactly what the documents require (`platform::MODES`).

use std::collections::BTreeMap;

use crate::spec::rails::RailMode;

use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement, PodFailurePolicyOnPodConditionsPattern,
    PodFailurePolicyRule, SuccessPolicy, SuccessPolicyRule,
};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, HostPathVolumeSource, PodAffinity,
    PodAffinityTerm, PodAntiAffinity, PodSpec, PodTemplateSpec, ResourceFieldSelector, ResourceRequirements,
    SeccompProfile, SecretKeySelector, SecurityContext, Service, ServicePort, ServiceSpec, Toleration, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::fleet::Topology;
use super::platform::{Mode, platform_name};

/// Where the pods of a pair run relative to each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    SameNode,
    CrossNode,
    Anywhere,
}

/// Everything a rendering needs.
#[derive(Debug, Clone)]
pub struct JobParams {
    pub mode: &'static Mode,
    pub name: String,
    pub namespace: String,
    pub image: String,
    pub workload: String,
    pub nics: u32,
    pub gpus: Option<u32>,
    pub placement: Placement,
    /// A fleet of pods instead of one pair.
    pub fleet: Option<(u32, Topology)>,
    /// An all-pairs fleet (`rdmabench fleet`, `super::all_pairs`).
    pub all_pairs: Option<super::all_pairs::AllPairs>,
    pub deadline_s: i64,
    pub port: u16,
    /// How a pod's rails share the time (RDMABENCH_RAILS).
    pub rails: RailMode,
    /// The workload's threshold parameters, as `--param NAME=VALUE`.
    pub params: Vec<(String, f64)>,
    /// Registered memory one rdmabench process of the workload takes at most (bytes).
    pub registered_memory: u64,
    /// The Secret (key `token`) holding the control channel's shared token.
    pub token_secret: String,
    /// The container's runAsUser, when stated (0: `super::check_user` refuses others).
    pub run_as_user: Option<i64>,
}

/// Memory a pod needs beyond what its processes register: the processes themselves and
/// `validate`'s test registration (64 MiB).
pub const MEMORY_HEADROOM_MIB: u64 = 256;

impl JobParams {
    /// The pod's memory request and limit, MiB: room for the serving and the measuring
    /// process (a fleet pod runs both) to register what the workload needs, plus headroom.
    pub fn memory_mib(&self) -> u64 {
        2 * self.registered_memory.div_ceil(1 << 20) + MEMORY_HEADROOM_MIB
    }
}

pub const CONTAINER: &str = "rdmabench";
/// Where the image keeps the workload files.
pub const WORKLOADS_DIR: &str = "/usr/share/rdmabench/workloads";

pub(super) fn labels(p: &JobParams) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "rdmabench".to_string()),
        ("app.kubernetes.io/instance".to_string(), p.name.clone()),
        ("rdmabench/platform".to_string(), platform_name(p.mode.platform).to_string()),
        ("rdmabench/mode".to_string(), p.mode.name.to_string()),
    ])
}

/// Pods of a Job carry this label; the Service and the affinity rules select on it.
fn pod_selector(p: &JobParams) -> BTreeMap<String, String> {
    BTreeMap::from([("batch.kubernetes.io/job-name".to_string(), p.name.clone())])
}

/// The headless Service that gives pod `i` the name `<job>-<i>.<service>`.
pub fn service(p: &JobParams) -> Service {
    headless_service(p, pod_selector(p))
}

/// A headless Service named like the Job selecting `selector`'s pods.
pub(super) fn headless_service(p: &JobParams, selector: BTreeMap<String, String>) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(p.name.clone()),
            namespace: Some(p.namespace.clone()),
            labels: Some(labels(p)),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            // The client must resolve the server before the server is Ready.
            publish_not_ready_addresses: Some(true),
            selector: Some(selector),
            ports: Some(vec![ServicePort {
                name: Some("control".into()),
                port: p.port.into(),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(super) fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), ..Default::default() }
}

/// The pod's script: validate, then serve and/or measure; the client's run document as
/// one `RDMABENCH_RESULT {...}` log line, a summary as the termination message, and the
/// exit code of the step that failed. Every rail the plugin gave is measured, rail i of
/// this pod against rail i of its peer (`RDMABENCH_DEVICES`: `all`, the devices this pod
/// can open, the ones `validate` just counted), all at once as NCCL drives them
/// (`RDMABENCH_RAILS`: `concurrent`; `sequential` isolates each rail). Pod `i` listens on `RDMABENCH_PORT + i`, so pods of
/// a hostNetwork fleet that share a node do not collide. Two knobs exist for running the
/// script outside Kubernetes (the lab runs it as three processes on one host):
/// `RDMABENCH_PEER_ADDR` (one address for every peer) and `RDMABENCH_TERMINATION_LOG`.
///
/// Each process may register half of what the pod's memory limit leaves beyond the
/// headroom (`--max-memory`, from `RDMABENCH_MEMORY_LIMIT_MIB`, the limit through the
/// downward API), and both take the shared token from `RDMABENCH_TOKEN` (the Secret).
const SCRIPT: &str = r#"set -u
term=${RDMABENCH_TERMINATION_LOG:-/dev/termination-log}
budget="$(( (RDMABENCH_MEMORY_LIMIT_MIB - RDMABENCH_MEMORY_HEADROOM_MIB) / 2 ))M"
summary() { echo "$1" > "$term"; echo "$1"; }
i=${JOB_COMPLETION_INDEX}
tmp=$(mktemp -d)
rdmabench validate --profile "$RDMABENCH_PROFILE" $RDMABENCH_VALIDATE_ARGS
rc=$?
if [ $rc -ne 0 ]; then summary "pod $i on $(hostname): validate --profile $RDMABENCH_PROFILE failed (exit $rc)"; exit $rc; fi
set -- $(rdmabench k8s role --index "$i" $RDMABENCH_ROLE_ARGS)
serve=$1; peer=$2
if [ "$serve" = yes ]; then
  if [ "$peer" = - ]; then
    rdmabench run --serve -d "$RDMABENCH_DEVICES" -p $((RDMABENCH_PORT + i)) --connect-timeout 900 \
      --max-memory "$budget"; rc=$?
    summary "pod $i served the workload (exit $rc)"; exit $rc
  fi
  rdmabench run --serve -d "$RDMABENCH_DEVICES" -p $((RDMABENCH_PORT + i)) --connect-timeout 900 \
    --max-memory "$budget" > "$tmp/serve.log" 2>&1 &
  server=$!
fi
rdmabench run "$RDMABENCH_WORKLOADS/$RDMABENCH_WORKLOAD.toml" \
  --peer "${RDMABENCH_PEER_ADDR:-$RDMABENCH_JOB-$peer.$RDMABENCH_SERVICE}" \
  -d "$RDMABENCH_DEVICES" --rails "$RDMABENCH_RAILS" -p $((RDMABENCH_PORT + peer)) --connect-timeout 900 \
  --max-memory "$budget" --json "$tmp/run.json" ${RDMABENCH_RUN_ARGS:-}
rc=$?
rdmabench k8s result --pod "$i" --peer "$peer" --exit "$rc" --run "$tmp/run.json"
if [ "$serve" = yes ]; then wait $server || { [ $rc -eq 0 ] && rc=4; }; cat "$tmp/serve.log"; fi
verdict=PASS; [ $rc -ne 0 ] && verdict=FAIL
summary "pod $i -> pod $peer: workload $RDMABENCH_WORKLOAD $verdict (exit $rc)"
exit $rc
"#;

fn container(p: &JobParams) -> Container {
    let (pods, topology) = p.fleet.unwrap_or((2, Topology::Pairs));
    let mut vars = vec![
        env("RDMABENCH_JOB", &p.name),
        env("RDMABENCH_SERVICE", &p.name),
        env("RDMABENCH_ROLE_ARGS", format!("--pods {pods} --topology {}", topology.name())),
        env("RDMABENCH_WORKLOAD", &p.workload),
        env("RDMABENCH_RAILS", p.rails.label()),
    ];
    vars.push(env(
        "RDMABENCH_RUN_ARGS",
        p.params.iter().map(|(k, v)| format!("--param {k}={v}")).collect::<Vec<_>>().join(" "),
    ));
    pod_container(p, SCRIPT, vars)
}

/// The container every rendered pod runs: the image, `script` under /bin/sh, the
/// environment every script reads (profile, validate's expectations, workloads, port,
/// devices, the memory limit through the downward API, the Secret's token) and `extra`,
/// the mode's resources (requests = limits), least privilege, /dev/shm and the mode's
/// topology file.
pub(super) fn pod_container(p: &JobParams, script: &str, extra: Vec<EnvVar>) -> Container {
    let m = p.mode;
    let quantity = if m.quantity_is_nics { p.nics } else { 1 };
    let mut resources = BTreeMap::from([
        (m.resource.to_string(), Quantity(quantity.to_string())),
        ("memory".to_string(), Quantity(format!("{}Mi", p.memory_mib()))),
    ]);
    if let Some(g) = p.gpus {
        resources.insert("nvidia.com/gpu".into(), Quantity(g.to_string()));
    }
    let mut caps = vec!["IPC_LOCK".to_string()];
    if m.sys_resource {
        caps.push("SYS_RESOURCE".into());
    }
    let mut validate_args = format!("--expect-nics {}", p.nics);
    if let Some(g) = p.gpus {
        validate_args.push_str(&format!(" --expect-gpus {g}"));
    }
    let mut mounts = vec![VolumeMount { name: "dshm".into(), mount_path: "/dev/shm".into(), ..Default::default() }];
    if m.topology_hostpath {
        mounts.push(VolumeMount {
            name: "nvidia-topologyd".into(),
            mount_path: crate::validate::sysfs::TOPOLOGY_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        });
    }
    let mut all_env = vec![
        env("RDMABENCH_PROFILE", m.profile),
        env("RDMABENCH_VALIDATE_ARGS", validate_args),
        env("RDMABENCH_WORKLOADS", WORKLOADS_DIR),
        env("RDMABENCH_PORT", p.port.to_string()),
        env("RDMABENCH_DEVICES", "all"),
        EnvVar {
            name: "RDMABENCH_MEMORY_LIMIT_MIB".into(),
            value_from: Some(EnvVarSource {
                resource_field_ref: Some(ResourceFieldSelector {
                    container_name: Some(CONTAINER.into()),
                    resource: "limits.memory".into(),
                    divisor: Some(Quantity("1Mi".into())),
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
        env("RDMABENCH_MEMORY_HEADROOM_MIB", MEMORY_HEADROOM_MIB.to_string()),
        EnvVar {
            name: crate::session::auth::TOKEN_ENV.into(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: p.token_secret.clone(),
                    key: "token".into(),
                    optional: Some(false),
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
    ];
    all_env.extend(extra);
    all_env.sort_by(|a, b| a.name.cmp(&b.name));
    Container {
        name: CONTAINER.into(),
        image: Some(p.image.clone()),
        command: Some(vec!["/bin/sh".into(), "-c".into(), script.into()]),
        env: Some(all_env),
        resources: Some(ResourceRequirements {
            requests: Some(resources.clone()),
            limits: Some(resources),
            ..Default::default()
        }),
        // Least privilege: every capability dropped but the ones registration needs
        // (IPC_LOCK; SYS_RESOURCE on ACK), no escalation, the runtime's seccomp profile.
        security_context: Some(SecurityContext {
            capabilities: Some(Capabilities { add: Some(caps), drop: Some(vec!["ALL".into()]) }),
            allow_privilege_escalation: Some(false),
            seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), ..Default::default() }),
            run_as_user: p.run_as_user,
            ..Default::default()
        }),
        volume_mounts: Some(mounts),
        termination_message_path: Some("/dev/termination-log".into()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    }
}

fn volumes(m: &Mode) -> Vec<Volume> {
    let mut v = vec![Volume {
        name: "dshm".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: m.shm_size_limit.map(|s| Quantity(s.into())),
        }),
        ..Default::default()
    }];
    if m.topology_hostpath {
        v.push(Volume {
            name: "nvidia-topologyd".into(),
            host_path: Some(HostPathVolumeSource {
                path: crate::validate::sysfs::TOPOLOGY_DIR.into(),
                // The device plugin's topology daemon makes it; a node without it is not one
                // of this mode's nodes, and the kubelet must not create an empty one.
                type_: Some("Directory".into()),
            }),
            ..Default::default()
        });
    }
    v
}

fn affinity(p: &JobParams, selector: BTreeMap<String, String>) -> Option<Affinity> {
    let term = PodAffinityTerm {
        label_selector: Some(LabelSelector { match_labels: Some(selector), ..Default::default() }),
        topology_key: "kubernetes.io/hostname".into(),
        ..Default::default()
    };
    match p.placement {
        Placement::Anywhere => None,
        Placement::CrossNode => Some(Affinity {
            pod_anti_affinity: Some(PodAntiAffinity {
                required_during_scheduling_ignored_during_execution: Some(vec![term]),
                ..Default::default()
            }),
            ..Default::default()
        }),
        // Required: the scheduler lets the first pod through (it matches its own term).
        Placement::SameNode => Some(Affinity {
            pod_affinity: Some(PodAffinity {
                required_during_scheduling_ignored_during_execution: Some(vec![term]),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

/// A pod template of `container`: the mode's network, tolerations and volumes, the
/// pods apart (or together) by `selector`, and the pod's DNS name under `subdomain` (the
/// headless Service) when the controller gives it one.
pub(super) fn pod_template(
    p: &JobParams,
    container: Container,
    mut pod_labels: BTreeMap<String, String>,
    selector: BTreeMap<String, String>,
    subdomain: Option<String>,
) -> PodTemplateSpec {
    let m = p.mode;
    let mut annotations = BTreeMap::new();
    if m.pod_networks {
        let blocks = if m.quantity_is_nics { p.nics } else { 1 };
        let list: Vec<serde_json::Value> =
            (0..blocks).map(|_| serde_json::json!({"cniConf": {"name": "rdma"}})).collect();
        annotations.insert("k8s.volcengine.com/pod-networks".to_string(), serde_json::to_string(&list).expect("json"));
    }
    pod_labels.extend(labels(p));
    pod_labels.extend(selector.clone());
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(pod_labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            subdomain,
            restart_policy: Some("Never".into()),
            host_network: m.host_network.then_some(true),
            dns_policy: m.host_network.then(|| "ClusterFirstWithHostNet".into()),
            tolerations: m
                .tolerate_all
                .then(|| vec![Toleration { operator: Some("Exists".into()), ..Default::default() }]),
            affinity: affinity(p, selector),
            containers: vec![container],
            // The pods never talk to the API server.
            automount_service_account_token: Some(false),
            volumes: Some(volumes(m)),
            ..Default::default()
        }),
    }
}

/// What a failed pod means to its Job. rdmabench's exit codes (1 check or threshold
/// failed, 2 usage, 3 no usable RDMA / environment, 4 peer lost) are not cured by a
/// retry: `action` (FailJob, or FailIndex where every index must still run to its end);
/// an evicted or preempted pod is not the fabric's fault (Ignore: it runs again).
pub(super) fn failure_policy(action: &str) -> PodFailurePolicy {
    PodFailurePolicy {
        rules: vec![
            PodFailurePolicyRule {
                action: action.into(),
                on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                    container_name: Some(CONTAINER.into()),
                    operator: "In".into(),
                    values: vec![1, 2, 3, 4],
                }),
                ..Default::default()
            },
            PodFailurePolicyRule {
                action: "Ignore".into(),
                on_pod_conditions: Some(vec![PodFailurePolicyOnPodConditionsPattern {
                    type_: "DisruptionTarget".into(),
                    status: Some("True".into()),
                }]),
                ..Default::default()
            },
        ],
    }
}

pub(super) fn metadata(p: &JobParams) -> ObjectMeta {
    ObjectMeta {
        name: Some(p.name.clone()),
        namespace: Some(p.namespace.clone()),
        labels: Some(labels(p)),
        ..Default::default()
    }
}

/// The Indexed Job: index 0 serves, index 1 measures (or the fleet's roles).
pub fn job(p: &JobParams) -> Job {
    let pods = p.fleet.map_or(2, |f| f.0) as i32;
    let template = pod_template(p, container(p), BTreeMap::new(), pod_selector(p), Some(p.name.clone()));
    Job {
        metadata: metadata(p),
        spec: Some(JobSpec {
            completion_mode: Some("Indexed".into()),
            completions: Some(pods),
            parallelism: Some(pods),
            backoff_limit: Some(0),
            active_deadline_seconds: Some(p.deadline_s),
            // A pair's outcome is the client's (index 1); a fleet needs every pod.
            success_policy: p.fleet.is_none().then(|| SuccessPolicy {
                rules: vec![SuccessPolicyRule { succeeded_indexes: Some("1".into()), ..Default::default() }],
            }),
            pod_failure_policy: Some(failure_policy("FailJob")),
            template,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The multi-document YAML: the Service, then the Job (an all-pairs fleet: its gang's objects).
pub fn render(p: &JobParams) -> String {
    if let Some(a) = &p.all_pairs {
        return super::all_pairs::render(p, a);
    }
    let svc = serde_norway::to_string(&service(p)).expect("a Service serialises");
    let job = serde_norway::to_string(&job(p)).expect("a Job serialises");
    let what = match p.fleet {
        None => "pair test".to_string(),
        Some((n, Topology::Ring)) => format!("fleet of {n} pods in a ring"),
        Some((n, Topology::Pairs)) => format!("fleet of {n} pods in pairs"),
    };
    let header = format!(
        "# rdmabench {} {what}: {} {} ({}), {} NIC(s){}, workload {}.\n# Generated by `rdmabench k8s \
         render`. The pods take the control channel's token from Secret {secret}; create it once\n# per \
         namespace: kubectl create secret generic {secret} --from-literal=token=$(head -c 32 /dev/urandom | \
         base64)\n# Apply with kubectl apply -f, read the results with\n# kubectl logs -l \
         batch.kubernetes.io/job-name={} --tail=-1 --max-log-requests={} | rdmabench summarize{} -\n",
        env!("CARGO_PKG_VERSION"),
        platform_name(p.mode.platform),
        p.mode.name,
        p.mode.summary,
        p.nics,
        p.gpus.map_or(String::new(), |g| format!(", {g} GPU(s)")),
        p.workload,
        p.name,
        p.fleet.map_or(2, |f| f.0),
        p.fleet.map_or(String::new(), |(n, t)| format!(" --pods {n} --topology {}", t.name())),
        secret = p.token_secret,
    );
    format!("{header}{svc}---\n{job}")
}
