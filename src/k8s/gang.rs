//! How an all-pairs fleet's pods are scheduled all or nothing, the way each platform does
//! it: what each gang's controller calls the pod's index, the host names it gives the
//! pods, and the Kubernetes it needs. A fleet with one pod missing waits out its join
//! timeout and fails, so its pods must start together.

use clap::ValueEnum;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Gang {
    /// An Indexed Job and a headless Service (publishNotReadyAddresses): no gang, the
    /// default scheduler places the pods one by one.
    None,
    /// A Volcano Job (batch.volcano.sh/v1alpha1, minAvailable N, the env and svc plugins).
    Volcano,
    /// The Indexed Job created suspended with kueue.x-k8s.io/queue-name: Kueue admits it whole.
    Kueue,
    /// A JobSet (jobset.x-k8s.io/v1alpha2) of one Indexed Job; Kueue admits it whole too.
    Jobset,
    /// The Indexed Job with ACK's coscheduling labels (pod-group.scheduling.sigs.k8s.io).
    Ack,
}

/// The task (Volcano) and replicated Job (JobSet) that hold the fleet's pods.
pub const MEMBER: &str = "node";

/// `--gang`'s help, shared by every place that documents it.
pub const GANG_HELP: &str = "How the fleet's pods are scheduled all or nothing: none (Indexed Job), volcano \
     (Volcano Job), kueue (suspended Indexed Job in --queue), jobset (JobSet), ack (ACK coscheduling labels)";

impl Gang {
    pub fn name(self) -> &'static str {
        match self {
            Gang::None => "none",
            Gang::Volcano => "volcano",
            Gang::Kueue => "kueue",
            Gang::Jobset => "jobset",
            Gang::Ack => "ack",
        }
    }

    /// The environment variable that holds a pod's index: the Job controller's completion
    /// index, or Volcano's env plugin's task index.
    pub fn index_env(self) -> &'static str {
        match self {
            Gang::Volcano => "VC_TASK_INDEX",
            _ => "JOB_COMPLETION_INDEX",
        }
    }

    /// Pod `index`'s host name: an Indexed Job's `<job>-<i>`, Volcano's svc plugin's
    /// `<job>-<task>-<i>`, a JobSet's `<jobset>-<replicated job>-<job index>-<i>`.
    pub fn hostname(self, name: &str, index: &str) -> String {
        match self {
            Gang::Volcano => format!("{name}-{MEMBER}-{index}"),
            Gang::Jobset => format!("{name}-{MEMBER}-0-{index}"),
            _ => format!("{name}-{index}"),
        }
    }

    /// Every node's control address for `rdmabench fleet --peers`: the host name under
    /// the headless Service, which has the Job's name in every variant (ours, the svc
    /// plugin's, JobSet's default subdomain).
    pub fn peers(self, name: &str) -> String {
        format!("{}.{name}", self.hostname(name, "{i}"))
    }

    /// Whether `render` writes the headless Service; Volcano's svc plugin and JobSet make
    /// their own.
    pub fn own_service(self) -> bool {
        matches!(self, Gang::None | Gang::Kueue | Gang::Ack)
    }

    /// The oldest Kubernetes the rendered fleet runs on, and why: every variant's Indexed
    /// Job (JobSet's too) lets each index run to its end (backoffLimitPerIndex with the
    /// FailIndex action: beta and on by default in 1.29, GA in 1.33), so node 0 gives its
    /// verdict whatever another node did.
    pub fn min_kubernetes(self) -> &'static str {
        match self {
            Gang::Volcano => "a Kubernetes that Volcano v1.15 supports (the pods use no field newer than 1.24)",
            Gang::Jobset => "Kubernetes 1.29 (backoffLimitPerIndex in the JobSet's Job) and JobSet serving v1alpha2",
            Gang::Kueue => "Kubernetes 1.29 (backoffLimitPerIndex, FailIndex) and Kueue",
            Gang::None | Gang::Ack => "Kubernetes 1.29 (backoffLimitPerIndex, FailIndex)",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_gang_names_its_pods_as_its_controller_does() {
        assert_eq!(Gang::None.peers("fl"), "fl-{i}.fl");
        assert_eq!(Gang::Volcano.peers("fl"), "fl-node-{i}.fl");
        assert_eq!(Gang::Jobset.peers("fl"), "fl-node-0-{i}.fl");
        assert_eq!(Gang::Volcano.index_env(), "VC_TASK_INDEX");
        assert_eq!(Gang::Kueue.index_env(), "JOB_COMPLETION_INDEX");
        assert!(!Gang::Volcano.own_service() && !Gang::Jobset.own_service() && Gang::Ack.own_service());
    }
}
