//! What a kubelet and its container runtime (containerd, then an OCI runtime) make of a
//! rendered Job's pod, as far as the lab can do it for real: the image built by `lab/image`
//! unpacked as the pod's root (an overlay, as a snapshotter gives), the spec's command and
//! env (downward API, Secret and the Job controller's index filled in), capabilities,
//! no_new_privs, a RuntimeDefault seccomp profile, the memory limit as a cgroup, a
//! 64 KiB locked-memory limit (the strictest a node gives), the pod's volumes and only the
//! `/dev/infiniband` nodes its device plugin hands it for the resources it requests
//! (`granted_devices`). `crun` runs it.
//!
//! What the lab cannot give: a network namespace per pod (rxe, on Linux 6.1 and 6.12,
//! carries RDMA only in the initial one, see docs/lab.md), so every pod shares the guest's
//! network as a hostNetwork pod does; the cluster's DNS, which `/etc/hosts` stands in for.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use serde_json::json;

use super::common::*;

/// The OCI runtime that runs the pods.
const RUNTIME: &str = "crun";
/// Where the runtime keeps its state, and the pods their bundles (tmpfs in the guest).
const STATE: &str = "/run/rdmabench-pods";
/// The parent cgroup of every pod (cgroup v2, mounted by the guest's init).
const CGROUP_PARENT: &str = "rdmabench-pods";
/// containerd's RuntimeDefault profile is moby's; Debian ships the same allow-list (with
/// CRI-O's additions) in containers-common, in moby's format. Its default action answers
/// a refused call with ENOSYS, containerd's with EPERM: a pod that passes here passes there.
const SECCOMP_PROFILE: &str = "/usr/share/containers/seccomp.json";
/// What a container's processes may lock without CAP_IPC_LOCK: containerd passes on its
/// own RLIMIT_MEMLOCK. The lab takes the strictest a node gives, the kernel's default
/// before Linux 5.16; nodes with 5.16+ or systemd 251+ give 8 MiB, and GPU nodes often
/// run their runtime unlimited.
pub const DEFAULT_MEMLOCK: u64 = 64 * 1024;
/// The value of every Secret key a pod's env refers to (the control channel's token).
pub const SECRET_TOKEN: &str = "lab-token-from-the-secret-0123";
/// The capabilities containerd gives a container that neither adds nor drops any.
const DEFAULT_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// The image `lab/image` built, unpacked once per test process.
pub struct Image {
    /// `NAME:TAG`, as a Job names it (`docker load` gives the archive this name).
    pub reference: String,
    pub rootfs: PathBuf,
    /// The image config's environment (PATH), which the container's env extends.
    pub env: Vec<String>,
}

/// The image `lab/image` built and unpacked on the host (`target/image/bundle`;
/// RDMABENCH_IMAGE_DIR moves `target/image`): every pod's overlay takes its rootfs as the
/// lower layer, read from the host's share as a snapshotter's layers are read from disk.
/// (Unpacking under the guest's emulation took a minute; copying it in, 45 s.)
pub fn image() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let version = env!("CARGO_PKG_VERSION");
        let out = std::env::var("RDMABENCH_IMAGE_DIR")
            .unwrap_or_else(|_| format!("{}/target/image", env!("CARGO_MANIFEST_DIR")));
        let bundle = Path::new(&out).join("bundle");
        assert!(
            bundle.join("config.json").is_file(),
            "no unpacked image at {}: build the image with lab/image (lab/test does) before these tests",
            bundle.display()
        );
        let config: Value =
            serde_json::from_str(&std::fs::read_to_string(bundle.join("config.json")).unwrap()).unwrap();
        let env =
            config["process"]["env"].as_array().unwrap().iter().map(|e| e.as_str().unwrap().to_string()).collect();
        Image { reference: format!("rdmabench:{version}"), rootfs: bundle.join("rootfs"), env }
    })
}

/// A node of the lab as the scheduler placed a pod there: its address and the RDMA
/// devices its device plugin hands the pod.
pub struct Node {
    pub ip: &'static str,
    pub devices: &'static [&'static str],
}

/// The controller that makes a workload's pods, by the object's kind: each names its pods,
/// gives them host names under a subdomain and tells a pod its index its own way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    /// An Indexed Job (batch/v1): pods `JOB-i` under the template's subdomain, the index in
    /// `JOB_COMPLETION_INDEX` and the `batch.kubernetes.io/job-completion-index` annotation.
    IndexedJob,
    /// A Volcano Job (batch.volcano.sh/v1alpha1) with the `env` and `svc` plugins: pods
    /// `JOB-TASK-i` under the subdomain `JOB` (svc), the index in `VC_TASK_INDEX` and
    /// `VK_TASK_INDEX` (env); no completion index.
    VolcanoJob,
    /// A JobSet (jobset.x-k8s.io/v1alpha2) with `enableDNSHostnames`: its Jobs are
    /// `JOBSET-RJOB-j`, their pods `JOBSET-RJOB-j-i` under the subdomain `network.subdomain`
    /// or the JobSet's name, each an Indexed Job's pod.
    JobSet,
}

impl Controller {
    pub fn of(object: &Value) -> Controller {
        match (object["apiVersion"].as_str(), object["kind"].as_str()) {
            (Some("batch/v1"), Some("Job")) => Controller::IndexedJob,
            (Some("batch.volcano.sh/v1alpha1"), Some("Job")) => Controller::VolcanoJob,
            (Some(v), Some("JobSet")) if v.starts_with("jobset.x-k8s.io/") => Controller::JobSet,
            other => panic!("a workload the lab's controllers do not run: {other:?}"),
        }
    }
}

/// The pod template `object`'s controller stamps its pods from.
pub fn pod_template(object: &Value) -> &Value {
    match Controller::of(object) {
        Controller::IndexedJob => &object["spec"]["template"],
        Controller::VolcanoJob => {
            let tasks = object["spec"]["tasks"].as_array().unwrap();
            assert_eq!(tasks.len(), 1, "the lab runs a Volcano Job of one task");
            &tasks[0]["template"]
        }
        Controller::JobSet => {
            let jobs = object["spec"]["replicatedJobs"].as_array().unwrap();
            assert_eq!(jobs.len(), 1, "the lab runs a JobSet of one replicated Job");
            assert_eq!(jobs[0]["replicas"].as_u64().unwrap_or(1), 1, "of one Job");
            let job = &jobs[0]["template"]["spec"];
            assert_eq!(job["completionMode"], "Indexed", "a JobSet's Job is Indexed: {job}");
            &job["template"]
        }
    }
}

/// One pod of a workload (an Indexed Job, a Volcano Job or a JobSet): its index, node, and
/// the cluster around it.
pub struct PodSpec<'a> {
    pub job: &'a Value,
    pub index: usize,
    pub node: &'a Node,
    /// Every pod's IP by index: the headless Service's DNS records.
    pub pod_ips: &'a [&'a str],
}

impl PodSpec<'_> {
    fn controller(&self) -> Controller {
        Controller::of(self.job)
    }

    fn template(&self) -> &Value {
        &pod_template(self.job)["spec"]
    }

    fn container(&self) -> &Value {
        &self.template()["containers"][0]
    }

    fn host_network(&self) -> bool {
        self.template()["hostNetwork"] == true
    }

    fn job_name(&self) -> &str {
        self.job["metadata"]["name"].as_str().unwrap()
    }

    /// Pod `index`'s name, which is also its host name: `JOB-i`, `JOB-TASK-i`,
    /// `JOBSET-RJOB-0-i`.
    fn name_of(&self, index: usize) -> String {
        let job = self.job_name();
        match self.controller() {
            Controller::IndexedJob => format!("{job}-{index}"),
            Controller::VolcanoJob => {
                format!("{job}-{}-{index}", self.job["spec"]["tasks"][0]["name"].as_str().unwrap())
            }
            Controller::JobSet => {
                format!("{job}-{}-0-{index}", self.job["spec"]["replicatedJobs"][0]["name"].as_str().unwrap())
            }
        }
    }

    /// The pod's name and host name.
    pub fn name(&self) -> String {
        self.name_of(self.index)
    }

    /// The headless Service the pods' host names live under.
    fn subdomain(&self) -> String {
        match self.controller() {
            Controller::IndexedJob => self.template()["subdomain"].as_str().unwrap_or(self.job_name()).to_string(),
            // The svc plugin sets it to the Job's name (and makes that Service).
            Controller::VolcanoJob => self.job_name().to_string(),
            Controller::JobSet => {
                assert_eq!(
                    self.job["spec"]["network"]["enableDNSHostnames"], true,
                    "host names need enableDNSHostnames"
                );
                self.job["spec"]["network"]["subdomain"].as_str().unwrap_or(self.job_name()).to_string()
            }
        }
    }

    /// What the controller adds to every container's env: the pod's index, its way.
    fn controller_env(&self) -> Vec<(String, String)> {
        let i = self.index.to_string();
        match self.controller() {
            Controller::IndexedJob | Controller::JobSet => vec![("JOB_COMPLETION_INDEX".into(), i)],
            Controller::VolcanoJob => vec![("VC_TASK_INDEX".into(), i.clone()), ("VK_TASK_INDEX".into(), i)],
        }
    }

    /// A fieldRef's value (downward API).
    fn field(&self, path: &str) -> Option<String> {
        let indexed = self.controller() != Controller::VolcanoJob;
        Some(match path {
            "metadata.name" => self.name(),
            "metadata.namespace" => self.job["metadata"]["namespace"].as_str().unwrap_or("default").to_string(),
            "spec.nodeName" => format!("lab-node-{}", self.node.ip),
            "status.podIP" | "status.hostIP" => self.node.ip.to_string(),
            // Only the Job controller annotates its pods with their completion index.
            p if indexed && p.contains("job-completion-index") => self.index.to_string(),
            _ => return None,
        })
    }
}

/// The directory VKE's pods mount from the node (hostPath, type Directory), with the NCCL
/// topology file it holds on virtual machines.
pub fn node_topology_dir() {
    let dir = Path::new("/var/run/nvidia-topologyd");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("virtualTopology.xml"), "<system version=\"1\">\n</system>\n").unwrap();
}

/// A container's memory limit, bytes.
pub fn memory_limit(container: &Value) -> u64 {
    quantity_bytes(container["resources"]["limits"]["memory"].as_str().expect("a memory limit"))
}

/// A Kubernetes quantity of bytes ("416Mi", "8Gi", "1G", "512").
fn quantity_bytes(q: &str) -> u64 {
    let units = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ];
    for (suffix, mult) in units {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<u64>().unwrap_or_else(|_| panic!("quantity {q}")) * mult;
        }
    }
    q.parse().unwrap_or_else(|_| panic!("quantity {q}"))
}

/// The effective capability set of the container's root process: containerd's defaults,
/// less `drop` (ALL drops every one), plus `add`.
pub fn capabilities(security: &Value) -> Vec<String> {
    let names = |v: &Value| -> Vec<String> {
        v.as_array().map(|a| a.iter().map(|c| format!("CAP_{}", c.as_str().unwrap())).collect()).unwrap_or_default()
    };
    let drop = names(&security["capabilities"]["drop"]);
    let mut caps: Vec<String> = if drop.iter().any(|c| c == "CAP_ALL") {
        Vec::new()
    } else {
        DEFAULT_CAPS.iter().map(|c| c.to_string()).filter(|c| !drop.contains(c)).collect()
    };
    for c in names(&security["capabilities"]["add"]) {
        if !caps.contains(&c) {
            caps.push(c);
        }
    }
    caps
}

/// The RuntimeDefault profile for a container with `caps` on x86-64, in the OCI runtime
/// spec's form: moby's rules kept when their `includes` hold and their `excludes` do not,
/// as containerd and CRI-O select them.
pub fn runtime_default_seccomp(caps: &[String]) -> Value {
    let profile: Value = serde_json::from_str(
        &std::fs::read_to_string(SECCOMP_PROFILE)
            .expect("the RuntimeDefault profile (lab/setup.sh installs containers-common)"),
    )
    .unwrap();
    let arch = profile["archMap"].as_array().unwrap().iter().find(|a| a["architecture"] == "SCMP_ARCH_X86_64").unwrap();
    let mut architectures = vec![arch["architecture"].clone()];
    architectures.extend(arch["subArchitectures"].as_array().unwrap().iter().cloned());
    let has_cap = |c: &Value| caps.iter().any(|have| have == c.as_str().unwrap());
    let list = |v: &Value| v.as_array().cloned().unwrap_or_default();
    let syscalls: Vec<Value> = profile["syscalls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| {
            let inc = &s["includes"];
            let exc = &s["excludes"];
            let arch_ok = list(&inc["arches"]).is_empty() || list(&inc["arches"]).iter().any(|a| a == "amd64");
            let arch_excluded = list(&exc["arches"]).iter().any(|a| a == "amd64");
            arch_ok
                && !arch_excluded
                && list(&inc["caps"]).iter().all(has_cap)
                && !list(&exc["caps"]).iter().any(has_cap)
        })
        .map(|s| {
            let mut rule = json!({ "names": s["names"], "action": s["action"] });
            if let Some(args) = s["args"].as_array().filter(|a| !a.is_empty()) {
                rule["args"] = json!(args);
            }
            if s["errnoRet"].is_u64() {
                rule["errnoRet"] = s["errnoRet"].clone();
            }
            rule
        })
        .collect();
    json!({
        "defaultAction": profile["defaultAction"],
        "defaultErrnoRet": profile["defaultErrnoRet"],
        "architectures": architectures,
        "syscalls": syscalls,
    })
}

/// The value of env entry `e` of `container`, as the kubelet resolves it: a value, the
/// Secret's token, the memory limit in the divisor's units (rounded up), or a fieldRef
/// that `field` answers (None: the caller has no pod fields).
pub fn env_value(container: &Value, e: &Value, field: impl Fn(&str) -> Option<String>) -> String {
    if let Some(v) = e["value"].as_str() {
        return v.to_string();
    }
    let from = &e["valueFrom"];
    if from["secretKeyRef"].is_object() {
        return SECRET_TOKEN.to_string();
    }
    if let Some(resource) = from["resourceFieldRef"]["resource"].as_str() {
        assert_eq!(resource, "limits.memory", "a resource the lab fills: {e}");
        let divisor = from["resourceFieldRef"]["divisor"].as_str().map_or(1, quantity_bytes);
        return memory_limit(container).div_ceil(divisor).to_string();
    }
    from["fieldRef"]["fieldPath"]
        .as_str()
        .and_then(field)
        .unwrap_or_else(|| panic!("an env entry the lab cannot fill: {e}"))
}

/// `/etc/hosts` of the pod: localhost, the pod itself, and the headless Service's records
/// of every pod of the Job (the cluster DNS's answers, which the lab has no server for).
fn hosts_file(pod: &PodSpec) -> String {
    let service = pod.subdomain();
    let ns = pod.job["metadata"]["namespace"].as_str().unwrap_or("default");
    let mut hosts = String::from("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
    for (i, ip) in pod.pod_ips.iter().enumerate() {
        let name = pod.name_of(i);
        hosts.push_str(&format!("{ip}\t{name}.{service}.{ns}.svc.cluster.local {name}.{service} {name}\n"));
    }
    hosts
}

/// The character device numbers of `path`.
fn char_device(path: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let rdev = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).rdev();
    (libc::major(rdev) as u64, libc::minor(rdev) as u64)
}

/// How an RDMA device plugin answers a request for its resource.
#[derive(Clone, Copy)]
enum Grant {
    /// `N` gives N of the node's NICs (VKE: exclusive NICs or shared virtual ones).
    Count,
    /// Any quantity gives every device the plugin is configured with: the node's NICs.
    WholeNode,
}

/// The RDMA resources the lab's nodes advertise, and what each plugin's documents say a
/// request gets: VKE's `rdma` (N NICs), VKE's `rdma-host` (1, every NIC as a sub-interface)
/// and k8s-rdma-shared-dev-plugin's `rdma/hca` (ACK: the configured devices, whatever the
/// count). The rows are the plugins', not rdmabench's: a rendering that requests the
/// wrong resource or count gets the devices a cluster would give it.
const RDMA_RESOURCES: &[(&str, Grant)] = &[
    ("vke.volcengine.com/rdma", Grant::Count),
    ("vke.volcengine.com/rdma-host", Grant::WholeNode),
    ("rdma/hca", Grant::WholeNode),
];

/// A quantity of an extended resource: a whole number, as a string or a number.
fn whole_quantity(name: &str, q: &Value) -> Result<u64, String> {
    let text = q.as_str().map(str::to_string).unwrap_or_else(|| q.to_string());
    text.parse().map_err(|_| format!("{name}: {q} is no whole number (extended resources are counted)"))
}

/// The devices the node's plugins hand the pod for its container's extended-resource
/// requests, as the kubelet would: none without an RDMA resource. A request the lab's nodes
/// cannot satisfy (a GPU, more NICs than the node has, a resource no plugin advertises) is
/// what keeps a pod Pending on a cluster, so it fails here, loudly.
pub fn granted_devices(pod: &PodSpec) -> Result<Vec<&'static str>, String> {
    let resources = &pod.container()["resources"];
    let empty = serde_json::Map::new();
    let limits = resources["limits"].as_object().unwrap_or(&empty);
    let requests = resources["requests"].as_object().unwrap_or(&empty);
    let native = |name: &str| matches!(name, "cpu" | "memory" | "ephemeral-storage") || name.starts_with("hugepages-");
    let mut rdma = Vec::new();
    for name in limits.keys().chain(requests.keys()).filter(|n| !native(n)) {
        // The API server's rule for extended resources: no overcommit.
        let limit = limits.get(name).ok_or_else(|| format!("{name} is requested without a limit: {resources}"))?;
        let count = whole_quantity(name, limit)?;
        if let Some(request) = requests.get(name)
            && whole_quantity(name, request)? != count
        {
            return Err(format!("{name}: requests {request} differ from limits {limit} (no overcommit)"));
        }
        if name == "nvidia.com/gpu" {
            return Err(format!(
                "the lab's nodes have no GPU: a pod requesting nvidia.com/gpu: {count} stays Pending (Insufficient nvidia.com/gpu)"
            ));
        }
        let (_, grant) = RDMA_RESOURCES
            .iter()
            .find(|(r, _)| r == name)
            .ok_or_else(|| format!("no plugin on the lab's nodes advertises {name}: the pod would stay Pending"))?;
        if !rdma.iter().any(|(n, _, _)| n == name) {
            rdma.push((name.as_str(), *grant, count));
        }
    }
    let node = pod.node.devices;
    match rdma[..] {
        [] => Ok(Vec::new()),
        [(name, _, 0)] => Err(format!("{name}: 0 gives no device")),
        [(_, Grant::WholeNode, _)] => Ok(node.to_vec()),
        [(name, Grant::Count, count)] if count as usize > node.len() => {
            Err(format!("{name}: {count} on a node with {} NIC(s): Pending (Insufficient {name})", node.len()))
        }
        [(_, Grant::Count, count)] => Ok(node[..count as usize].to_vec()),
        _ => {
            let names: Vec<&str> = rdma.iter().map(|r| r.0).collect();
            Err(format!("one RDMA resource a pod, not {names:?}: {resources}"))
        }
    }
}

/// The verbs nodes of `devices` (`/sys/class/infiniband_verbs/uverbsN/ibdev` names each
/// node's device) and `rdma_cm`: what an RDMA device plugin puts in the pod's
/// `ContainerAllocateResponse`.
fn plugin_devices(devices: &[&str]) -> Vec<PathBuf> {
    let mut nodes: Vec<PathBuf> = std::fs::read_dir("/sys/class/infiniband_verbs")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let ibdev = std::fs::read_to_string(e.path().join("ibdev")).ok()?;
            devices.contains(&ibdev.trim()).then(|| Path::new("/dev/infiniband").join(e.file_name()))
        })
        .collect();
    nodes.sort();
    assert_eq!(nodes.len(), devices.len(), "a verbs node for each of {devices:?}");
    if devices.is_empty() {
        return nodes;
    }
    nodes.push("/dev/infiniband/rdma_cm".into());
    nodes
}

/// Fields that change what a pod does on a real node and that this kubelet does not carry
/// out: a Job that sets one must not pass the lab by accident, so it is refused here, loudly.
/// (A non-root user, for one, loses IPC_LOCK on exec unless the capability is ambient.)
fn refuse_what_the_lab_does_not_emulate(pod: &PodSpec) {
    let spec = pod.template();
    let containers = spec["containers"].as_array().expect("a pod has containers");
    assert_eq!(containers.len(), 1, "the lab's kubelet runs one container a pod, not {}: {spec}", containers.len());
    for field in ["initContainers", "ephemeralContainers"] {
        assert!(spec[field].is_null(), "the lab's kubelet does not run {field}: {spec}");
    }
    let c = pod.container();
    for field in ["envFrom", "workingDir", "lifecycle", "livenessProbe", "readinessProbe", "startupProbe"] {
        assert!(c[field].is_null(), "the lab's kubelet does not honour the container's {field}: {c}");
    }
    for security in [&spec["securityContext"], &c["securityContext"]] {
        // Root stated explicitly (`render --run-as-user 0`) is what the lab does anyway.
        for field in ["runAsUser", "runAsGroup"] {
            assert!(
                security[field].is_null() || security[field] == 0,
                "the lab's kubelet runs every container as root: it does not honour {field}: {security}"
            );
        }
        for field in ["runAsNonRoot", "supplementalGroups", "sysctls"] {
            assert!(
                security[field].is_null() || security[field] == false,
                "the lab's kubelet runs every container as root: it does not honour {field}: {security}"
            );
        }
    }
}

/// The OCI runtime config of the pod's one container (config.json), with its bundle's
/// files written next to it.
pub fn oci_config(pod: &PodSpec, bundle: &Path) -> Value {
    let c = pod.container();
    refuse_what_the_lab_does_not_emulate(pod);
    let image = image();
    assert_eq!(c["image"], image.reference.as_str(), "the Job names the image lab/image builds");
    let caps = capabilities(&c["securityContext"]);
    let security = &c["securityContext"];
    let seccomp = match security["seccompProfile"]["type"].as_str() {
        Some("RuntimeDefault") => Some(runtime_default_seccomp(&caps)),
        Some("Unconfined") => None,
        other => panic!("a seccomp profile the lab does not know: {other:?}"),
    };

    let mut env = image.env.clone();
    env.push(format!("HOSTNAME={}", pod.name()));
    for e in c["env"].as_array().unwrap() {
        env.push(format!("{}={}", e["name"].as_str().unwrap(), env_value(c, e, |path| pod.field(path))));
    }
    // The controller adds the pod's index to every container, each its own way.
    env.extend(pod.controller_env().into_iter().map(|(k, v)| format!("{k}={v}")));

    // Files the kubelet manages for each container.
    std::fs::write(bundle.join("hosts"), hosts_file(pod)).unwrap();
    let hostname =
        if pod.host_network() { std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap() } else { pod.name() };
    std::fs::write(bundle.join("hostname"), format!("{}\n", hostname.trim())).unwrap();
    std::fs::write(
        bundle.join("resolv.conf"),
        "search default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n",
    )
    .unwrap();
    std::fs::write(bundle.join("termination-log"), "").unwrap();
    let bind = |dest: &str, src: PathBuf, ro: bool| {
        let mut options = vec!["rbind", "rprivate"];
        if ro {
            options.push("ro");
        }
        json!({ "destination": dest, "type": "bind", "source": src, "options": options })
    };
    let mut mounts = vec![
        json!({ "destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"] }),
        json!({ "destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"] }),
        json!({ "destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"] }),
        json!({ "destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"] }),
        // Without a network namespace of its own a container cannot mount a fresh sysfs:
        // runtimes bind the host's, read-only, as for a hostNetwork pod.
        json!({ "destination": "/sys", "type": "bind", "source": "/sys", "options": ["rbind", "nosuid", "noexec", "nodev", "ro"] }),
        bind("/etc/hosts", bundle.join("hosts"), false),
        bind("/etc/hostname", bundle.join("hostname"), false),
        bind("/etc/resolv.conf", bundle.join("resolv.conf"), false),
        bind(
            c["terminationMessagePath"].as_str().unwrap_or("/dev/termination-log"),
            bundle.join("termination-log"),
            false,
        ),
    ];
    if !c["volumeMounts"].as_array().is_some_and(|m| m.iter().any(|m| m["mountPath"] == "/dev/shm")) {
        // containerd's sandbox /dev/shm.
        mounts.push(json!({ "destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"] }));
    }
    for m in c["volumeMounts"].as_array().into_iter().flatten() {
        let name = &m["name"];
        let volume = pod.template()["volumes"].as_array().unwrap().iter().find(|v| &v["name"] == name).unwrap();
        let dest = m["mountPath"].as_str().unwrap();
        let ro = m["readOnly"] == true;
        if volume["emptyDir"]["medium"] == "Memory" {
            // A memory-backed emptyDir is a tmpfs sized by its sizeLimit, else by the pod's
            // memory limit (the kubelet's SizeMemoryBackedVolumes).
            let size = volume["emptyDir"]["sizeLimit"].as_str().map_or(memory_limit(c), quantity_bytes);
            mounts.push(json!({ "destination": dest, "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777", format!("size={size}")] }));
        } else if volume["emptyDir"].is_object() {
            let dir = bundle.join(format!("volume-{}", name.as_str().unwrap()));
            std::fs::create_dir_all(&dir).unwrap();
            mounts.push(bind(dest, dir, ro));
        } else if let Some(path) = volume["hostPath"]["path"].as_str() {
            if volume["hostPath"]["type"] == "Directory" {
                assert!(Path::new(path).is_dir(), "hostPath type check: {path} is not a directory on the node");
            }
            mounts.push(bind(dest, path.into(), ro));
        } else {
            panic!("a volume the lab does not mount: {volume}");
        }
    }

    let devices: Vec<Value> = plugin_devices(&granted_devices(pod).unwrap_or_else(|e| panic!("{}: {e}", pod.name())))
        .iter()
        .map(|p| {
            let (major, minor) = char_device(p);
            json!({ "path": p, "type": "c", "major": major, "minor": minor, "fileMode": 0o666, "uid": 0, "gid": 0 })
        })
        .collect();
    // Deny every device but the runtime's defaults (null, zero, full, tty, random,
    // urandom, ptmx, pts) and the plugin's.
    let mut device_rules = vec![json!({ "allow": false, "access": "rwm" })];
    for (major, minor) in [(1, 3), (1, 5), (1, 7), (5, 0), (1, 8), (1, 9), (5, 2)] {
        device_rules.push(json!({ "allow": true, "type": "c", "major": major, "minor": minor, "access": "rwm" }));
    }
    device_rules.push(json!({ "allow": true, "type": "c", "major": 136, "access": "rwm" }));
    for d in &devices {
        device_rules
            .push(json!({ "allow": true, "type": "c", "major": d["major"], "minor": d["minor"], "access": "rw" }));
    }

    let mut args: Vec<Value> = c["command"].as_array().expect("the Job's container names its command").clone();
    args.extend(c["args"].as_array().cloned().unwrap_or_default());
    let mut namespaces = vec![json!({ "type": "pid" }), json!({ "type": "ipc" }), json!({ "type": "mount" })];
    if !pod.host_network() {
        namespaces.push(json!({ "type": "uts" }));
    }
    let limit = memory_limit(c);
    let mut linux = json!({
        "namespaces": namespaces,
        "cgroupsPath": format!("/{CGROUP_PARENT}/{}", pod.name()),
        "resources": {
            "memory": { "limit": limit, "swap": limit },
            "devices": device_rules,
        },
        "devices": devices,
        "maskedPaths": ["/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
            "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"],
        "readonlyPaths": ["/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
    });
    if let Some(s) = seccomp {
        linux["seccomp"] = s;
    }
    let mut config = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": { "uid": 0, "gid": 0 },
            "args": args,
            "env": env,
            "cwd": "/",
            "capabilities": { "bounding": caps, "effective": caps, "permitted": caps },
            "rlimits": [
                { "type": "RLIMIT_MEMLOCK", "hard": DEFAULT_MEMLOCK, "soft": DEFAULT_MEMLOCK },
                { "type": "RLIMIT_NOFILE", "hard": 1048576, "soft": 1048576 },
            ],
            "noNewPrivileges": security["allowPrivilegeEscalation"] == false,
        },
        "root": { "path": "rootfs", "readonly": security["readOnlyRootFilesystem"] == true },
        "mounts": mounts,
        "linux": linux,
    });
    // A hostNetwork pod keeps the node's host name (and UTS namespace).
    if !pod.host_network() {
        config["hostname"] = json!(pod.name());
    }
    config
}

/// Starts every pod of `job` at once, pod i on `nodes[i]`, as its controller creates them.
pub fn start_all(job: &Value, nodes: &[&Node]) -> Vec<Running> {
    node_topology_dir();
    let ips: Vec<&str> = nodes.iter().map(|n| n.ip).collect();
    nodes.iter().enumerate().map(|(index, node)| start(&PodSpec { job, index, node, pod_ips: &ips })).collect()
}

/// A pod's container while the runtime runs it.
pub struct Running {
    pub name: String,
    bundle: PathBuf,
    logs: PathBuf,
    child: Option<Child>,
    peak: Arc<AtomicU64>,
    max: Arc<AtomicU64>,
    watcher: Option<std::thread::JoinHandle<()>>,
}

/// What a finished pod left: its log (both streams, as `kubectl logs` shows them), exit
/// code, termination message, and its cgroup's memory.max and memory.peak.
pub struct Finished {
    pub name: String,
    pub out: Out,
    pub termination_message: String,
    pub memory_max: u64,
    pub memory_peak: u64,
}

/// Where the pods' logs go, as the kubelet keeps them in /var/log/pods: the lab's share
/// when there is one, so that a pod still running can be read from the host. `pods.txt`
/// there gets a line per finished pod: its exit code and memory peak against its limit.
fn log_dir(bundle: &Path) -> PathBuf {
    match std::env::var_os("RDMABENCH_LAB_SHARE") {
        Some(share) => Path::new(&share).join("pods"),
        None => bundle.to_path_buf(),
    }
}

/// Starts the pod's container: its bundle (an overlay on the unpacked image, config.json)
/// and `crun run`.
pub fn start(pod: &PodSpec) -> Running {
    ensure_cgroups();
    let name = pod.name();
    let bundle = Path::new(STATE).join(&name);
    let _ = Command::new("umount").arg(bundle.join("rootfs")).output();
    let _ = std::fs::remove_dir_all(&bundle);
    for d in ["rootfs", "upper", "work"] {
        std::fs::create_dir_all(bundle.join(d)).unwrap();
    }
    let lower = image().rootfs.display().to_string();
    let options = format!(
        "lowerdir={lower},upperdir={},workdir={}",
        bundle.join("upper").display(),
        bundle.join("work").display()
    );
    let mounted = Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &options])
        .arg(bundle.join("rootfs"))
        .status()
        .unwrap();
    assert!(mounted.success(), "overlay rootfs for {name}");
    let config = oci_config(pod, &bundle);
    std::fs::write(bundle.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
    let logs = log_dir(&bundle);
    std::fs::create_dir_all(&logs).unwrap();
    let log = |stream: &str| std::fs::File::create(logs.join(format!("{name}.{stream}"))).unwrap();
    let child = Command::new(RUNTIME)
        .args(["--root", &format!("{STATE}/runtime"), "run", "--bundle"])
        .arg(&bundle)
        .arg(&name)
        .stdout(log("stdout"))
        .stderr(log("stderr"))
        .spawn()
        .expect("crun (lab/setup.sh installs it)");
    // The cgroup goes with the container: read its memory figures while it lives.
    let peak = Arc::new(AtomicU64::new(0));
    let max = Arc::new(AtomicU64::new(0));
    let cgroup = Path::new("/sys/fs/cgroup").join(CGROUP_PARENT).join(&name);
    let (p, m, pid) = (peak.clone(), max.clone(), child.id());
    let watcher = std::thread::spawn(move || {
        let read = |f: &str| std::fs::read_to_string(cgroup.join(f)).ok().and_then(|s| s.trim().parse::<u64>().ok());
        while Path::new(&format!("/proc/{pid}")).exists() {
            if let Some(v) = read("memory.max") {
                m.store(v, Ordering::Relaxed);
            }
            if let Some(v) = read("memory.peak").or_else(|| read("memory.current")) {
                p.fetch_max(v, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    Running { name, bundle, logs, child: Some(child), peak, max, watcher: Some(watcher) }
}

impl Running {
    fn runtime(&self, args: &[&str]) {
        let _ = Command::new(RUNTIME).args(["--root", &format!("{STATE}/runtime")]).args(args).arg(&self.name).output();
    }

    /// `kubectl cp SRC POD:DEST`: the file lands in the container's own filesystem (the
    /// overlay's upper layer, seen through the merged root it runs in), whole: written
    /// beside DEST, then renamed, as a `kubectl exec` after the copy would find it.
    pub fn copy_in(&self, src: &Path, dest: &str) {
        let dest = self.bundle.join("rootfs").join(dest.trim_start_matches('/'));
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        let part = dest.with_extension("part");
        std::fs::copy(src, &part).unwrap_or_else(|e| panic!("{} -> {}: {e}", src.display(), part.display()));
        std::fs::rename(&part, &dest).unwrap();
    }

    /// The OCI runtime config the pod runs with.
    pub fn config(&self) -> Value {
        serde_json::from_str(&std::fs::read_to_string(self.bundle.join("config.json")).unwrap()).unwrap()
    }

    /// `/proc/PID/status` of the container's own process (its pid 1), read from the node:
    /// what `/proc/self/status` shows that process inside. None once it has ended.
    ///
    /// Not `crun exec ... cat /proc/self/status`: the guest's root is an initramfs, where
    /// pivot_root cannot work, so the runtime chroots the container's process, and a
    /// process exec'd later joins its namespaces but not its root: it read the guest's
    /// files and /proc (seen: `/proc/1` was the guest's init).
    pub fn status(&self) -> Option<String> {
        let state =
            Command::new(RUNTIME).args(["--root", &format!("{STATE}/runtime"), "state", &self.name]).output().ok()?;
        let state: Value = serde_json::from_slice(&state.stdout).ok()?;
        let pid = state["pid"].as_u64().filter(|&p| p > 0)?;
        std::fs::read_to_string(format!("/proc/{pid}/status")).ok()
    }

    /// Waits for the container until `deadline`, then has the runtime kill it (as the
    /// Job's activeDeadlineSeconds would); the pod's exit code then says 137.
    pub fn wait(mut self, deadline: Instant) -> Finished {
        let mut child = self.child.take().unwrap();
        let mut killed = false;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline && !killed {
                self.runtime(&["kill", "--all"]);
                killed = true;
            }
            if Instant::now() > deadline + Duration::from_secs(10) {
                let _ = child.kill();
                break child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
        use std::os::unix::process::ExitStatusExt;
        let read = |stream: &str| {
            std::fs::read_to_string(self.logs.join(format!("{}.{stream}", self.name))).unwrap_or_default()
        };
        let mut stderr = read("stderr");
        if killed {
            stderr.push_str(&format!("\n(the lab killed pod {} at its deadline)\n", self.name));
        }
        let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        let (max, peak) = (self.max.load(Ordering::Relaxed), self.peak.load(Ordering::Relaxed));
        let summary = format!(
            "{}: exit {code}, memory.peak {:.1} MiB of memory.max {:.1} MiB\n",
            self.name,
            peak as f64 / (1 << 20) as f64,
            max as f64 / (1 << 20) as f64
        );
        use std::io::Write;
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.logs.join("pods.txt"))
            .and_then(|mut f| f.write_all(summary.as_bytes()));
        Finished {
            name: self.name.clone(),
            out: Out { code, stdout: read("stdout"), stderr },
            termination_message: std::fs::read_to_string(self.bundle.join("termination-log")).unwrap_or_default(),
            memory_max: max,
            memory_peak: peak,
        }
    }
}

impl Finished {
    /// Both streams, as `kubectl logs` shows them.
    pub fn log(&self) -> String {
        format!("{}\n{}", self.out.stdout, self.out.stderr)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            self.runtime(&["kill", "--all"]);
            let _ = c.kill();
            let _ = c.wait();
        }
        self.runtime(&["delete", "--force"]);
        let _ = Command::new("umount").arg(self.bundle.join("rootfs")).output();
        let _ = std::fs::remove_dir_all(&self.bundle);
    }
}

/// The memory controller enabled for the pods' parent cgroup, as a node's init leaves it.
fn ensure_cgroups() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let root = Path::new("/sys/fs/cgroup");
        assert!(root.join("cgroup.controllers").is_file(), "cgroup v2 is mounted on /sys/fs/cgroup (lab/guest-init)");
        let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap();
        assert!(controllers.contains("memory"), "the memory controller: {controllers}");
        std::fs::write(root.join("cgroup.subtree_control"), "+memory +pids").unwrap();
        let parent = root.join(CGROUP_PARENT);
        std::fs::create_dir_all(&parent).unwrap();
        std::fs::write(parent.join("cgroup.subtree_control"), "+memory +pids").unwrap();
    });
}
