//! Kubernetes acceptance Jobs: the platform modes' requirements (`platform`), the typed
//! Service + Indexed Job (`manifest`), who measures whom in a fleet (`fleet`), and the
//! summary of a fleet's results (`summarize`).

pub mod all_pairs;
pub mod fleet;
pub mod gang;
pub mod manifest;
pub mod platform;
pub mod summarize;

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::spec::rails::RailMode;
use all_pairs::AllPairs;
use fleet::Topology;
use gang::Gang;
use manifest::{JobParams, Placement};
use platform::Platform;

/// The workloads the image ships (in `manifest::WORKLOADS_DIR`).
pub const SHIPPED_WORKLOADS: &[&str] = &["smoke", "acceptance", "sweep", "regression"];

/// The NICs a pod of a whole-node mode (vke shared-host, ack shared-*) is assumed to see
/// when `--machine-nics` does not say: a GPU node's eight rails.
pub const WHOLE_NODE_NICS: u32 = 8;

/// The image `render` uses unless told otherwise: what lab/image and the Dockerfile build.
pub const DEFAULT_IMAGE: &str = concat!("rdmabench:", env!("CARGO_PKG_VERSION"));

/// What `rdmabench k8s render` was asked, before checking.
#[derive(Debug, Clone)]
pub struct RenderRequest {
    pub platform: Platform,
    pub mode: String,
    pub nics: u32,
    pub gpus: Option<u32>,
    pub machine_nics: Option<u32>,
    pub image: String,
    /// A pair workload the image ships (None: acceptance); an all-pairs fleet runs the fleet workload.
    pub workload: Option<String>,
    pub namespace: String,
    pub name: Option<String>,
    pub placement: Placement,
    pub fleet: Option<(u32, Topology)>,
    /// An all-pairs fleet (`rdmabench fleet`) instead of a pair or a ring/pairs fleet.
    pub all_pairs: Option<AllPairs>,
    /// activeDeadlineSeconds (None: 1800 s for a pair, the plan's length for an all-pairs fleet).
    pub deadline_s: Option<i64>,
    pub port: u16,
    /// How a pod's rails share the time (RDMABENCH_RAILS).
    pub rails: RailMode,
    /// `--param NAME=VALUE` for the workload's thresholds, passed to the pods' `run`.
    pub params: Vec<(String, f64)>,
    /// The Secret holding the shared token (key `token`).
    pub token_secret: String,
    /// `--run-as-user`: the container's runAsUser (only 0 is accepted: see `check_user`).
    pub run_as_user: Option<i64>,
}

/// The Secret the Jobs take the token from unless told otherwise.
pub const DEFAULT_TOKEN_SECRET: &str = "rdmabench-token";

/// The text of a workload the image ships (the same files: `Dockerfile` copies workloads/).
fn shipped_text(name: &str) -> Option<&'static str> {
    match name {
        "smoke" => Some(include_str!("../../workloads/smoke.toml")),
        "acceptance" => Some(include_str!("../../workloads/acceptance.toml")),
        "sweep" => Some(include_str!("../../workloads/sweep.toml")),
        "regression" => Some(include_str!("../../workloads/regression.toml")),
        _ => None,
    }
}

/// The `[params]` a workload's text declares.
fn declared_params(text: &str) -> Vec<String> {
    toml::from_str::<toml::Value>(text)
        .ok()
        .and_then(|v| v.get("params").and_then(|p| p.as_table()).map(|t| t.keys().cloned().collect()))
        .unwrap_or_default()
}

/// The workload a pair Job runs unless `--workload` says.
pub const DEFAULT_WORKLOAD: &str = "acceptance";
/// A pair Job's deadline unless `--deadline` says.
pub const DEFAULT_DEADLINE_S: i64 = 1800;
/// What an all-pairs fleet's pods run (`WORKLOADS_DIR/fleet/all-pairs.toml`).
pub const FLEET_WORKLOAD: &str = "fleet/all-pairs";

/// A pair workload's memory need, declared parameters and the user's: it must be one the
/// image ships, and the parameters its own (the pods would fail on them at run time).
fn pair_workload(
    r: &RenderRequest,
    name: &str,
    mode: &platform::Mode,
) -> Result<(u64, Vec<String>, BTreeMap<String, f64>)> {
    if !SHIPPED_WORKLOADS.contains(&name) {
        return Err(Error::Usage(format!(
            "--workload {name:?}: the image ships {}; a workload of your own needs an image that contains it",
            SHIPPED_WORKLOADS.join(", ")
        )));
    }
    let text = shipped_text(name).expect("every shipped workload has its text");
    let user: BTreeMap<String, f64> = r.params.iter().cloned().collect();
    let workload = crate::workload::file::parse(text, &format!("{name}.toml"), &user)?;
    // What one rdmabench process registers at most: the largest step's need on every rail.
    let need = workload
        .steps
        .iter()
        .filter_map(|s| match &s.kind {
            crate::workload::file::StepKind::Measure(m) => Some(crate::link::memory_need(&m.spec)),
            _ => None,
        })
        .max()
        .unwrap_or(0)
        .saturating_mul(pod_rails(r, mode) as u64);
    Ok((need, declared_params(text), user))
}

/// The rails a pod measures: every device it can open (`-d all`), which in a mode that
/// shows every NIC of the node is the node's count, not the request.
fn pod_rails(r: &RenderRequest, mode: &platform::Mode) -> u32 {
    if mode.whole_node { r.machine_nics.unwrap_or(WHOLE_NODE_NICS) } else { r.nics }.max(1)
}

/// What one node of the fleet registers at most: its larger phase on every rail.
fn fleet_memory(r: &RenderRequest, a: &AllPairs, mode: &platform::Mode) -> Result<u64> {
    let file = crate::fleet::config::FleetFile::parse_with(
        crate::fleet::config::SHIPPED,
        crate::fleet::config::SHIPPED_NAME,
        &a.over,
    )
    .map_err(Error::Usage)?;
    let need = [crate::report::pairs::Phase::Bandwidth, crate::report::pairs::Phase::Latency]
        .map(|phase| crate::link::memory_need(&file.measure.spec(phase)))
        .into_iter()
        .max()
        .unwrap_or(0);
    Ok(need.saturating_mul(pod_rails(r, mode) as u64))
}

/// What an all-pairs request may not combine, each refused with the fix.
fn check_all_pairs(r: &RenderRequest, a: &AllPairs) -> Result<()> {
    let refuse = |m: String| Err(Error::Usage(m));
    // The plan every node will check: the fleet's size and pairs per round.
    a.plan().check().map_err(Error::Usage)?;
    if r.fleet.is_some() {
        return refuse("--fleet all-pairs and --topology: choose one kind of fleet".into());
    }
    if r.workload.is_some() {
        return refuse(
            "--workload names a pair workload; an all-pairs fleet runs the fleet workload (fleet/all-pairs.toml): \
             set its measurement with --measure NAME=VALUE and its thresholds with --threshold NAME=VALUE"
                .into(),
        );
    }
    if let Some((k, _)) = r.params.first() {
        return refuse(format!(
            "--param {k}: a pair workload's parameter; an all-pairs fleet's thresholds are set with --threshold \
             NAME=VALUE ({})",
            crate::fleet::config::threshold_keys().keys().cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    if a.gang == Gang::Ack && r.platform != Platform::Ack {
        return refuse(format!(
            "--gang ack: the pod-group.scheduling.sigs.k8s.io labels are read by ACK's kube-scheduler only; on {} \
             use --gang volcano, kueue or jobset (whichever the cluster runs), or none",
            platform::platform_name(r.platform)
        ));
    }
    match (&a.queue, a.gang) {
        (None, Gang::Kueue) => refuse("--gang kueue needs --queue NAME: the LocalQueue that admits the Job".into()),
        (Some(_), Gang::None | Gang::Ack) => refuse(format!(
            "--queue applies to --gang kueue, jobset (Kueue's LocalQueue) and volcano (a Volcano queue), not {}",
            a.gang.name()
        )),
        (Some(q), _) if !dns_label(q) => {
            refuse(format!("--queue {q:?}: a queue's name is lowercase letters, digits and '-', at most 63"))
        }
        _ => Ok(()),
    }
}

fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The generated sections of `k8s-jobs/README.md`: (begin marker, end marker, text).
pub fn readme_sections() -> Vec<(&'static str, &'static str, String)> {
    vec![
        ("<!-- modes:begin -->\n", "<!-- modes:end -->", readme_table()),
        ("<!-- defaults:begin -->\n", "<!-- defaults:end -->", defaults_table()),
    ]
}

/// The per-platform defaults of a rendered Job's thresholds, as k8s-jobs/README.md shows them.
pub fn defaults_table() -> String {
    let mut t = String::from("| platform | parameter | default | what it bounds |\n|---|---|---|---|\n");
    for p in [Platform::Vke, Platform::Ack] {
        for (k, v, what) in platform::default_params(p) {
            t.push_str(&format!("| {} | `{k}` | {v} | {what} |\n", platform::platform_name(p)));
        }
    }
    t
}

/// Checks a request against the documents' rules; returns the parameters and warnings.
pub fn plan(r: &RenderRequest) -> Result<(JobParams, Vec<String>)> {
    let mode = platform::find(r.platform, &r.mode).map_err(Error::Usage)?;
    let mut warnings = Vec::new();
    if let Some(w) = platform::check_nics(mode, r.nics, r.machine_nics).map_err(Error::Usage)? {
        warnings.push(w);
    }
    let (workload_name, registered_memory, declared, user) = match &r.all_pairs {
        None => {
            let name = r.workload.clone().unwrap_or_else(|| DEFAULT_WORKLOAD.into());
            let (need, declared, user) = pair_workload(r, &name, mode)?;
            (name, need, declared, user)
        }
        Some(a) => {
            check_all_pairs(r, a)?;
            (FLEET_WORKLOAD.into(), fleet_memory(r, a, mode)?, Vec::new(), BTreeMap::new())
        }
    };
    let secret_ok = !r.token_secret.is_empty()
        && r.token_secret.len() <= 253
        && r.token_secret.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
    if !secret_ok {
        return Err(Error::Usage(format!(
            "--token-secret {:?}: a Secret's name is lowercase letters, digits, '-' and '.'",
            r.token_secret
        )));
    }
    // The platform's defaults for the parameters the workload declares, then the user's.
    let mut params: Vec<(String, f64)> = platform::default_params(r.platform)
        .iter()
        .filter(|(k, _, _)| declared.iter().any(|d| d == k) && !user.contains_key(*k))
        .map(|(k, v, _)| (k.to_string(), *v))
        .collect();
    params.extend(r.params.iter().cloned());
    if let Some((pods, topology)) = r.fleet {
        fleet::check(pods, topology).map_err(Error::Usage)?;
    }
    let name =
        r.name.clone().unwrap_or_else(|| format!("rdmabench-{}-{}", platform::platform_name(r.platform), r.mode));
    // Pod hostnames are `<name>-<index>`: a DNS label of at most 63 characters.
    let ok = !name.is_empty()
        && name.len() <= 52
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if !ok {
        return Err(Error::Usage(format!(
            "--name {name:?}: use lowercase letters, digits and '-', at most 52 characters (pod hostnames add \
             -INDEX and must stay a 63-character DNS label)"
        )));
    }
    let deadline_s = match (r.deadline_s, &r.all_pairs) {
        (Some(d), _) if d <= 0 => return Err(Error::Usage("--deadline must be at least 1 second".into())),
        (Some(d), _) => d,
        (None, Some(a)) => all_pairs::default_deadline_s(a),
        (None, None) => DEFAULT_DEADLINE_S,
    };
    // Pod i listens on port + i; an all-pairs fleet's barrier on port + N.
    let pods = r.all_pairs.as_ref().map_or(r.fleet.map_or(2, |f| f.0), |a| a.pods);
    let ports = if r.all_pairs.is_some() { pods + 1 } else { pods };
    if r.port == 0 || u32::from(r.port) + ports - 1 > u32::from(u16::MAX) {
        return Err(Error::Usage(format!(
            "--port {}: pod i listens on port + i{}, so it must lie in 1..={} for {pods} pods",
            r.port,
            if r.all_pairs.is_some() { " and node 0's barrier on port + N" } else { "" },
            u32::from(u16::MAX) + 1 - ports
        )));
    }
    if let Some(a) = &r.all_pairs {
        let last = a.gang.hostname(&name, &(a.pods - 1).to_string());
        if last.len() > 63 {
            return Err(Error::Usage(format!(
                "--name {name:?}: with --gang {} the last pod's host name {last:?} is {} characters; a DNS label \
                 holds 63: use a name of at most {} characters",
                a.gang.name(),
                last.len(),
                name.len() - (last.len() - 63)
            )));
        }
    }
    if r.placement == Placement::SameNode && r.fleet.is_some() {
        return Err(Error::Usage("--same-node applies to a pair; a fleet spreads its pods over nodes".into()));
    }
    check_user(r.run_as_user, mode, registered_memory)?;
    Ok((
        JobParams {
            mode,
            name,
            namespace: r.namespace.clone(),
            image: r.image.clone(),
            workload: workload_name,
            nics: r.nics,
            gpus: r.gpus,
            placement: r.placement,
            fleet: r.fleet,
            all_pairs: r.all_pairs.clone(),
            deadline_s,
            port: r.port,
            rails: r.rails,
            params,
            registered_memory,
            token_secret: r.token_secret.clone(),
            run_as_user: r.run_as_user,
        },
        warnings,
    ))
}

/// A non-root user is refused, with why: Kubernetes gives a non-root container's added
/// capabilities no effect (it sets no ambient ones, so exec clears them), so
/// IPC_LOCK would not lift the node's locked-memory limit and every mode's profile, as its
/// platform's document requires IPC_LOCK, fails the pod in `validate`.
fn check_user(uid: Option<i64>, mode: &platform::Mode, registered_memory: u64) -> Result<()> {
    match uid {
        None | Some(0) => Ok(()),
        Some(uid) if uid < 0 => Err(Error::Usage(format!("--run-as-user {uid}: a user ID is 0 or more"))),
        Some(uid) => Err(Error::Usage(format!(
            "--run-as-user {uid}: a non-root container's securityContext.capabilities.add has no effect (Kubernetes \
             sets no ambient capabilities, so the kernel clears the added ones when the container's non-root \
             process is exec'd), so IPC_LOCK would not lift the node's locked-memory limit \
             (64 KiB before Linux 5.16, 8 MiB after; this Job registers up to {} per process) and `validate \
             --profile {}` fails on cap-ipc-lock, which the {} document requires. Leave --run-as-user out: the \
             pod runs as root with every other capability dropped, no privilege escalation and seccomp \
             RuntimeDefault (docs: k8s-jobs/README.md, Least privilege); --run-as-user 0 states root for a \
             policy that wants it explicit",
            crate::verbs::memlock::human_bytes(registered_memory),
            mode.profile,
            platform::platform_name(mode.platform).to_uppercase()
        ))),
    }
}

/// The request behind each committed manifest under `k8s-jobs/`: every platform mode as
/// a pair with the defaults, and one ring fleet.
pub fn committed() -> Vec<(String, RenderRequest)> {
    let base = |platform, mode: &str, nics| RenderRequest {
        platform,
        mode: mode.into(),
        nics,
        gpus: None,
        machine_nics: None,
        image: DEFAULT_IMAGE.into(),
        workload: None,
        namespace: "default".into(),
        name: None,
        placement: Placement::CrossNode,
        fleet: None,
        all_pairs: None,
        deadline_s: None,
        rails: RailMode::Concurrent,
        port: 18515,
        params: Vec::new(),
        token_secret: DEFAULT_TOKEN_SECRET.into(),
        run_as_user: None,
    };
    let mut v: Vec<(String, RenderRequest)> = platform::MODES
        .iter()
        .map(|m| {
            let nics = if m.platform == Platform::Vke && m.quantity_is_nics { 2 } else { 1 };
            let dir = platform::platform_name(m.platform);
            (format!("{dir}/{}.yaml", m.name), base(m.platform, m.name, nics))
        })
        .collect();
    let mut ring = base(Platform::Vke, "shared", 1);
    ring.fleet = Some((4, Topology::Ring));
    ring.name = Some("rdmabench-vke-fleet".into());
    v.push(("vke/fleet-ring-4.yaml".into(), ring));
    // An all-pairs fleet of 8 nodes for each gang, on the mode its platform schedules it in.
    for gang in [Gang::None, Gang::Volcano, Gang::Kueue, Gang::Jobset, Gang::Ack] {
        let (platform, mode, nics) =
            if gang == Gang::Ack { (Platform::Ack, "exclusive", 1) } else { (Platform::Vke, "exclusive", 2) };
        let mut r = base(platform, mode, nics);
        r.all_pairs = Some(example_fleet(8, gang));
        r.name = Some(format!("rdmabench-fleet-{}", gang.name()));
        v.push((format!("fleet/all-pairs-8-{}.yaml", gang.name()), r));
    }
    v
}

/// An all-pairs fleet of `pods` nodes with `gang`'s defaults (Kueue's queue: `rdma-acceptance`).
fn example_fleet(pods: u32, gang: Gang) -> AllPairs {
    AllPairs {
        pods,
        gang,
        queue: (gang == Gang::Kueue).then(|| "rdma-acceptance".to_string()),
        directions: crate::fleet::schedule::Directions::One,
        max_pairs_per_round: None,
        over: crate::fleet::config::Overrides::default(),
    }
}

/// Every platform mode as an all-pairs fleet of `pods` nodes under every gang: what
/// lab/test schema-checks beyond the committed manifests (`k8s render-variants`).
pub fn every_fleet_variant(pods: u32) -> Vec<(String, RenderRequest)> {
    let pair = committed().into_iter().next().expect("a committed pair").1;
    let mut v = Vec::new();
    for m in platform::MODES {
        for gang in [Gang::None, Gang::Volcano, Gang::Kueue, Gang::Jobset, Gang::Ack] {
            if gang == Gang::Ack && m.platform != Platform::Ack {
                continue;
            }
            let mut r = pair.clone();
            r.platform = m.platform;
            r.mode = m.name.into();
            r.nics = if m.platform == Platform::Vke && m.quantity_is_nics { 2 } else { 1 };
            r.all_pairs = Some(example_fleet(pods, gang));
            r.name = Some(format!("fleet-{}-{}-{}", platform::platform_name(m.platform), m.name, gang.name()));
            v.push((format!("{}-{}-{}.yaml", platform::platform_name(m.platform), m.name, gang.name()), r));
        }
    }
    v
}

/// The table of `k8s-jobs/README.md` (between its `modes` markers): one row per committed
/// manifest, from the same rows the manifests are built from.
pub fn readme_table() -> String {
    use crate::validate::profiles::{self, GidFamily, NicCount, Sharing};
    let mut t = String::from(
        "| file | platform mode | resource (requests = limits) | network | `validate --profile` checks |\n\
         |---|---|---|---|---|\n",
    );
    for (path, req) in committed() {
        let (p, _) = plan(&req).expect("committed requests are valid");
        let m = p.mode;
        let prof = profiles::by_name(m.profile).expect("every mode has a profile");
        let quantity = if m.quantity_is_nics { p.nics } else { 1 };
        let network = match (m.host_network, m.pod_networks) {
            (true, _) => "hostNetwork".to_string(),
            (false, true) => format!("pod-networks: {} rdma block(s)", if m.whole_node { 1 } else { p.nics }),
            (false, false) => "pod network".to_string(),
        };
        let mut checks = vec![match prof.nics {
            NicCount::Requested => format!("exactly {} NIC(s)", p.nics),
            NicCount::WholeNode => "every NIC of the node".to_string(),
        }];
        checks.push(
            match prof.family {
                GidFamily::Ipv4 => "IPv4 RoCE v2 GID",
                GidFamily::Ipv6 => "global IPv6 RoCE v2 GID",
                GidFamily::Any => "a RoCE v2 GID",
            }
            .into(),
        );
        match prof.sharing {
            Sharing::Exclusive => checks.push("distinct physical NICs, not shared with the peer".into()),
            Sharing::Shared => checks.push("shared virtual NICs".into()),
            Sharing::HostIpvlan => checks.push("IPVLAN sub-interfaces".into()),
            Sharing::Any => {}
        }
        checks.push(if prof.needs_sys_resource { "IPC_LOCK + SYS_RESOURCE" } else { "IPC_LOCK" }.into());
        checks.push("memlock, /dev/shm, NUMA".into());
        if prof.topology_file {
            checks.push("topology file".into());
        }
        let what = match (p.fleet, &p.all_pairs) {
            (_, Some(a)) => format!(
                "{}-node all-pairs fleet, gang {}, on {} {}",
                a.pods,
                a.gang.name(),
                platform::platform_name(m.platform),
                m.name
            ),
            (None, None) => format!("{} {}: {}", platform::platform_name(m.platform), m.name, m.summary),
            (Some((n, t)), None) => {
                format!("{n}-pod {} fleet on {} {}", t.name(), platform::platform_name(m.platform), m.name)
            }
        };
        t.push_str(&format!(
            "| [{path}]({path}) | {what} | `{}: {quantity}` | {network} | `{}`: {} |\n",
            m.resource,
            m.profile,
            checks.join("; ")
        ));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn yaml_docs(text: &str) -> Vec<Value> {
        text.split("\n---\n").map(|d| serde_norway::from_str::<Value>(d).unwrap()).collect()
    }

    fn request(platform: Platform, mode: &str, nics: u32) -> RenderRequest {
        let mut r = committed().into_iter().next().unwrap().1;
        r.platform = platform;
        r.mode = mode.into();
        r.nics = nics;
        r
    }

    fn rendered(r: &RenderRequest) -> (Value, Value) {
        let (p, _) = plan(r).unwrap();
        let docs = yaml_docs(&manifest::render(&p));
        assert_eq!(docs.len(), 2);
        (docs[0].clone(), docs[1].clone())
    }

    #[test]
    fn committed_manifests_are_what_render_produces() {
        let root = env!("CARGO_MANIFEST_DIR");
        for (path, req) in committed() {
            let (p, _) = plan(&req).unwrap();
            let file = format!("{root}/k8s-jobs/{path}");
            let committed = std::fs::read_to_string(&file).unwrap_or_default();
            assert!(
                committed == manifest::render(&p),
                "{file} differs from `rdmabench k8s render`: regenerate with `rdmabench k8s render-all k8s-jobs`"
            );
        }
        let readme = std::fs::read_to_string(format!("{root}/k8s-jobs/README.md")).unwrap_or_default();
        for (_, _, body) in readme_sections() {
            assert!(
                readme.contains(&body),
                "k8s-jobs/README.md's tables are stale: regenerate with `rdmabench k8s render-all k8s-jobs`"
            );
        }
    }

    #[test]
    fn a_non_root_user_is_refused_saying_why_and_root_is_stated_when_asked() {
        for (platform, mode) in [(Platform::Vke, "exclusive"), (Platform::Ack, "shared-hostnet")] {
            let mut r = request(platform, mode, 1);
            r.run_as_user = Some(1000);
            let Err(Error::Usage(why)) = plan(&r) else { panic!("{mode}: a non-root user is refused") };
            for part in ["--run-as-user 1000", "no ambient capabilities", "IPC_LOCK", "cap-ipc-lock", "per process"] {
                assert!(why.contains(part), "{part:?} in {why}");
            }
            r.run_as_user = Some(-1);
            assert!(matches!(plan(&r), Err(Error::Usage(_))));
            r.run_as_user = Some(0);
            let (_, job) = rendered(&r);
            let c = &job["spec"]["template"]["spec"]["containers"][0]["securityContext"];
            assert_eq!(c["runAsUser"], 0, "{c}");
            r.run_as_user = None;
            let (_, job) = rendered(&r);
            assert!(job["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsUser"].is_null());
        }
    }

    #[test]
    fn a_pair_job_is_indexed_with_the_clients_verdict() {
        let (svc, job) = rendered(&request(Platform::Vke, "shared-multi", 4));
        assert_eq!(svc["spec"]["clusterIP"], "None");
        assert_eq!(svc["spec"]["publishNotReadyAddresses"], true);
        let spec = &job["spec"];
        assert_eq!(spec["completionMode"], "Indexed");
        assert_eq!((spec["completions"].as_i64(), spec["parallelism"].as_i64()), (Some(2), Some(2)));
        assert_eq!(spec["backoffLimit"], 0);
        assert_eq!(spec["successPolicy"]["rules"][0]["succeededIndexes"], "1");
        assert_eq!(spec["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"], serde_json::json!([1, 2, 3, 4]));
        let pod = &spec["template"]["spec"];
        assert_eq!(pod["subdomain"], job["metadata"]["name"]);
        assert_eq!(pod["restartPolicy"], "Never");
        let c = &pod["containers"][0];
        assert_eq!(c["resources"]["limits"]["vke.volcengine.com/rdma"], "4");
        assert_eq!(c["resources"]["requests"], c["resources"]["limits"]);
        assert_eq!(c["securityContext"]["capabilities"]["add"], serde_json::json!(["IPC_LOCK"]));
        let blocks: Value = serde_json::from_str(
            spec["template"]["metadata"]["annotations"]["k8s.volcengine.com/pod-networks"].as_str().unwrap(),
        )
        .unwrap();
        assert_eq!(blocks.as_array().unwrap().len(), 4);
        assert_eq!(pod["volumes"][1]["hostPath"]["type"], "Directory");
        assert_eq!(c["volumeMounts"][1]["readOnly"], true);
        assert!(pod["affinity"]["podAntiAffinity"].is_object(), "cross-node by default");
    }

    /// Least privilege in every committed manifest (every platform mode and the fleet).
    #[test]
    fn every_rendered_pod_has_least_privilege_a_memory_budget_and_the_token() {
        for (path, r) in committed() {
            let (p, _) = plan(&r).unwrap();
            let docs = yaml_docs(&manifest::render(&p));
            let job = docs.last().unwrap();
            let pod = &all_pairs::pod_template_of(job)["spec"];
            let c = &pod["containers"][0];
            let sc = &c["securityContext"];
            let mut add = vec!["IPC_LOCK"];
            if p.mode.sys_resource {
                add.push("SYS_RESOURCE");
            }
            assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]), "{path}");
            assert_eq!(sc["capabilities"]["add"], serde_json::json!(add), "{path}");
            assert_eq!(sc["allowPrivilegeEscalation"], false, "{path}");
            assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{path}");
            assert!(sc.get("privileged").is_none_or(|v| v == false), "{path}");
            assert_eq!(pod["automountServiceAccountToken"], false, "{path}");
            let mem = c["resources"]["limits"]["memory"].as_str().unwrap();
            assert_eq!(c["resources"]["requests"]["memory"], mem, "{path}");
            let mib: u64 = mem.trim_end_matches("Mi").parse().unwrap();
            assert!(mib >= manifest::MEMORY_HEADROOM_MIB + 2 * (p.registered_memory >> 20), "{path}: {mem}");
            assert!(p.registered_memory > 0, "{path}");
            for v in pod["volumes"].as_array().unwrap() {
                if let Some(h) = v.get("hostPath") {
                    assert_eq!(h["type"], "Directory", "{path}");
                }
            }
            let env = |name: &str| c["env"].as_array().unwrap().iter().find(|e| e["name"] == name).cloned().unwrap();
            let token = env("RDMABENCH_TOKEN");
            assert_eq!(token["valueFrom"]["secretKeyRef"]["name"], DEFAULT_TOKEN_SECRET, "{path}");
            assert_eq!(token["valueFrom"]["secretKeyRef"]["key"], "token", "{path}");
            let limit = env("RDMABENCH_MEMORY_LIMIT_MIB");
            assert_eq!(limit["valueFrom"]["resourceFieldRef"]["resource"], "limits.memory", "{path}");
            assert_eq!(limit["valueFrom"]["resourceFieldRef"]["divisor"], "1Mi", "{path}: the script reads MiB");
            let script = c["command"][2].as_str().unwrap();
            // A pair's pod serves (two ways) and runs; a fleet node is one process.
            let processes = if p.all_pairs.is_some() { 1 } else { 3 };
            assert_eq!(script.matches("--max-memory \"$budget\"").count(), processes, "{path}");
        }
    }

    #[test]
    fn the_workloads_need_sizes_the_pods_memory() {
        let mut r = request(Platform::Vke, "exclusive", 1);
        r.workload = Some("smoke".into());
        let small = plan(&r).unwrap().0;
        r.workload = Some("sweep".into());
        let sweep = plan(&r).unwrap().0;
        r.nics = 4;
        let four = plan(&r).unwrap().0;
        // smoke's validated 64 KiB bandwidth step cycles over a slot per message in flight
        // (128 x 64 KiB per region); the sweep's largest step is 8 MiB messages, one per region.
        assert_eq!(small.registered_memory, 2 * 128 * (64 << 10));
        assert_eq!(sweep.registered_memory, 2 * (8 << 20));
        assert_eq!(four.registered_memory, 4 * sweep.registered_memory, "every rail registers its own");
        assert!(four.memory_mib() > sweep.memory_mib());
        r.token_secret = "Not A Name".into();
        assert_eq!(plan(&r).unwrap_err().exit_code(), 2);
    }

    /// A whole-node mode's pod measures every NIC of its node whatever it requested, so its
    /// memory is sized for the node's NICs (found by the lab's pods under crun: a shared-host
    /// pod on a 2-NIC node was refused 2 x 16 MiB with a limit sized for one rail).
    #[test]
    fn a_whole_node_pod_is_sized_for_every_nic_of_the_node() {
        let mut r = request(Platform::Vke, "shared-host", 1);
        r.workload = Some("smoke".into());
        let per_rail = 2 * 128 * (64 << 10);
        assert_eq!(plan(&r).unwrap().0.registered_memory, u64::from(WHOLE_NODE_NICS) * per_rail);
        r.machine_nics = Some(2);
        assert_eq!(plan(&r).unwrap().0.registered_memory, 2 * per_rail);
        let mut ack = request(Platform::Ack, "shared-hostnet", 1);
        ack.workload = Some("smoke".into());
        assert_eq!(plan(&ack).unwrap().0.registered_memory, u64::from(WHOLE_NODE_NICS) * per_rail);
    }

    #[test]
    fn the_pod_script_is_valid_posix_shell() {
        let (_, job) = rendered(&request(Platform::Vke, "exclusive", 8));
        let c = &job["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["command"][0], "/bin/sh");
        let script = c["command"][2].as_str().unwrap();
        // dash: the strictest /bin/sh a runtime image is likely to have.
        let out = std::process::Command::new("dash").args(["-n", "-c", script]).output().expect("run dash");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let env: Vec<&str> = c["env"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
        for var in script
            .split("$RDMABENCH_")
            .skip(1)
            .map(|v| v.split(|c: char| !c.is_ascii_uppercase() && c != '_').next().unwrap())
        {
            assert!(env.contains(&format!("RDMABENCH_{var}").as_str()), "the script reads RDMABENCH_{var}, not in env");
        }
    }

    /// No Docker engine runs where the tests run, so the image is checked for what the
    /// Jobs rely on: every COPY source exists and the workloads land where pods read them.
    #[test]
    fn the_dockerfile_ships_what_the_jobs_use() {
        let root = env!("CARGO_MANIFEST_DIR");
        let text = std::fs::read_to_string(format!("{root}/Dockerfile")).unwrap();
        let copies: Vec<Vec<&str>> = text
            .lines()
            .filter(|l| l.starts_with("COPY ") && !l.contains("--from="))
            .map(|l| l.split_whitespace().skip(1).collect())
            .collect();
        for c in &copies {
            for src in &c[..c.len() - 1] {
                assert!(std::path::Path::new(&format!("{root}/{src}")).exists(), "COPY {src}: no such path");
            }
        }
        assert!(
            copies.iter().any(|c| c == &["workloads", manifest::WORKLOADS_DIR]),
            "workloads at {}",
            manifest::WORKLOADS_DIR
        );
        assert!(text.contains("/usr/local/bin/rdmabench"), "the scripts call rdmabench from PATH");
        for generated in ["rdmabench docs man > /usr/share/man/man1/rdmabench.1", "rdmabench completions bash >"] {
            assert!(text.contains(generated), "the image installs {generated:?}");
        }
        // One package list for both builds: the Dockerfile and lab/image read image/packages.
        let packages = std::fs::read_to_string(format!("{root}/image/packages")).unwrap();
        let listed: Vec<&str> =
            packages.lines().map(|l| l.split('#').next().unwrap().trim()).filter(|l| !l.is_empty()).collect();
        for pkg in ["libibverbs1", "ibverbs-providers", "librdmacm1"] {
            assert!(listed.contains(&pkg), "runtime package {pkg} in image/packages");
            assert!(!text.contains(pkg), "the Dockerfile names {pkg} itself instead of reading image/packages");
        }
        assert!(copies.iter().any(|c| c[0] == "image/packages") && text.contains("xargs apt-get install"), "{text}");
        let lab_image = std::fs::read_to_string(format!("{root}/lab/image")).unwrap();
        assert!(lab_image.contains("image/packages") && lab_image.contains("/usr/share/rdmabench/workloads"));
        for generated in ["docs man >", "completions bash >"] {
            assert!(lab_image.contains(generated), "lab/image installs {generated:?} too");
        }
    }

    #[test]
    fn params_reach_the_pods_run_and_unknown_ones_are_refused() {
        let mut r = request(Platform::Vke, "exclusive", 2);
        r.params = vec![("min_write_gbps".into(), 180.0), ("max_write_p50_us".into(), 3.5)];
        let (_, job) = rendered(&r);
        let envs = &job["spec"]["template"]["spec"]["containers"][0]["env"];
        let run_args = envs.as_array().unwrap().iter().find(|e| e["name"] == "RDMABENCH_RUN_ARGS").unwrap();
        // The platform's defaults first (less those given), then the user's.
        assert_eq!(
            run_args["value"],
            "--param min_line_rate_pct=80 --param max_rail_spread_pct=10 --param max_write_p99_us=50 --param \
             max_read_p50_us=15 --param max_send_p50_us=10 --param min_write_gbps=180 --param max_write_p50_us=3.5"
        );
        let script = job["spec"]["template"]["spec"]["containers"][0]["command"][2].as_str().unwrap();
        assert!(script.contains("${RDMABENCH_RUN_ARGS:-}"), "the run takes them");
        assert!(script.contains("rdmabench run \"$RDMABENCH_WORKLOADS"), "{script}");
        assert!(script.matches("-d \"$RDMABENCH_DEVICES\"").count() == 3, "every run and serve on every rail");
        let devices = envs.as_array().unwrap().iter().find(|e| e["name"] == "RDMABENCH_DEVICES").unwrap();
        assert_eq!(devices["value"], "all");
        r.params = vec![("min_gbps".into(), 1.0)];
        let e = plan(&r).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.message().contains("--param min_gbps") && e.message().contains("min_write_gbps"), "{}", e.message());
        r.workload = Some("smoke".into());
        r.params = vec![("min_write_gbps".into(), 1.0)];
        assert!(plan(&r).unwrap_err().message().contains("its [params] are: none"), "smoke has no parameters");
    }

    #[test]
    fn ack_and_shared_host_follow_their_documents() {
        let (_, job) = rendered(&request(Platform::Ack, "shared-hostnet", 1));
        let pod = &job["spec"]["template"]["spec"];
        assert_eq!(pod["hostNetwork"], true);
        assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
        assert_eq!(pod["tolerations"][0]["operator"], "Exists");
        let c = &pod["containers"][0];
        assert_eq!(c["resources"]["limits"]["rdma/hca"], "1");
        assert_eq!(c["securityContext"]["capabilities"]["add"], serde_json::json!(["IPC_LOCK", "SYS_RESOURCE"]));
        assert_eq!(pod["volumes"][0]["emptyDir"]["sizeLimit"], "8Gi");
        assert!(job["spec"]["template"]["metadata"]["annotations"].is_null());
        let (_, job) = rendered(&request(Platform::Ack, "shared-podnet", 1));
        assert!(job["spec"]["template"]["spec"]["hostNetwork"].is_null());

        let (_, job) = rendered(&request(Platform::Vke, "shared-host", 1));
        let c = &job["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["resources"]["limits"]["vke.volcengine.com/rdma-host"], "1");
        let e = plan(&request(Platform::Vke, "shared-host", 2)).unwrap_err().message();
        assert!(e.contains("exactly one"), "{e}");
    }

    #[test]
    fn bad_requests_are_refused_and_rules_warned() {
        let mut r = request(Platform::Vke, "exclusive", 3);
        r.machine_nics = Some(8);
        let (_, w) = plan(&r).unwrap();
        assert!(w[0].contains("whole machine or half"), "{w:?}");
        r.workload = Some("mine".into());
        assert!(plan(&r).unwrap_err().message().contains("acceptance"));
        let mut r = request(Platform::Ack, "nope", 1);
        assert!(plan(&r).unwrap_err().message().contains("shared-hostnet"));
        r.mode = "exclusive".into();
        r.name = Some("Has_Caps".into());
        assert!(plan(&r).unwrap_err().message().contains("lowercase"));
        r.name = None;
        r.fleet = Some((3, Topology::Pairs));
        assert!(plan(&r).unwrap_err().message().contains("even"));
        r.fleet = Some((10, Topology::Ring));
        r.port = 65530;
        assert!(plan(&r).unwrap_err().message().contains("1..=65526 for 10 pods"));
    }

    #[test]
    fn a_fleet_needs_every_pod() {
        let mut r = request(Platform::Vke, "shared", 1);
        r.fleet = Some((6, Topology::Ring));
        let (_, job) = rendered(&r);
        assert_eq!(job["spec"]["completions"], 6);
        assert!(job["spec"]["successPolicy"].is_null());
        let env = job["spec"]["template"]["spec"]["containers"][0]["env"].as_array().unwrap();
        let role = env.iter().find(|e| e["name"] == "RDMABENCH_ROLE_ARGS").unwrap();
        assert_eq!(role["value"], "--pods 6 --topology ring");
    }
}
