//! Who measures whom in a Job of N pods: a ring (every pod serves, and measures against
//! its successor) or fixed pairs (even pods serve, odd pods measure against the pod
//! before them). Pods learn their role from `rdmabench k8s role`, so this arithmetic is
//! the only copy of it.

use clap::ValueEnum;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Topology {
    Ring,
    Pairs,
}

impl Topology {
    /// The `--topology` value.
    pub fn name(self) -> &'static str {
        match self {
            Topology::Ring => "ring",
            Topology::Pairs => "pairs",
        }
    }
}

/// What pod `index` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Role {
    /// Serves the pod that measures against it.
    pub serve: bool,
    /// Measures against this pod.
    pub client_of: Option<u32>,
}

/// Refuses pod counts a topology cannot use.
pub fn check(pods: u32, topology: Topology) -> Result<(), String> {
    match topology {
        _ if pods < 2 => Err(format!("--pods {pods}: a fleet needs at least 2 pods")),
        Topology::Pairs if pods % 2 == 1 => {
            Err(format!("--pods {pods} with --topology pairs: pairs need an even count; use {} or ring", pods + 1))
        }
        _ if pods > 1000 => Err(format!("--pods {pods}: at most 1000 pods per Job")),
        _ => Ok(()),
    }
}

pub fn role(index: u32, pods: u32, topology: Topology) -> Result<Role, String> {
    check(pods, topology)?;
    if index >= pods {
        return Err(format!("--index {index} is not a pod of {pods} (0..={})", pods - 1));
    }
    Ok(match topology {
        Topology::Ring => Role { serve: true, client_of: Some((index + 1) % pods) },
        Topology::Pairs if index.is_multiple_of(2) => Role { serve: true, client_of: None },
        Topology::Pairs => Role { serve: false, client_of: Some(index - 1) },
    })
}

/// Every measured link as (client pod, server pod).
pub fn links(pods: u32, topology: Topology) -> Result<Vec<(u32, u32)>, String> {
    (0..pods).filter_map(|i| role(i, pods, topology).map(|r| r.client_of.map(|s| (i, s))).transpose()).collect()
}

/// The line `rdmabench k8s role` prints for a pod script: `SERVE PEER`, e.g. `yes 3`,
/// `yes -` or `no 0`.
pub fn role_line(r: &Role) -> String {
    format!("{} {}", if r.serve { "yes" } else { "no" }, r.client_of.map_or("-".into(), |p| p.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_closes_and_every_pod_serves_once() {
        let l = links(5, Topology::Ring).unwrap();
        assert_eq!(l, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 0)]);
        let mut served: Vec<u32> = l.iter().map(|x| x.1).collect();
        served.sort();
        assert_eq!(served, [0, 1, 2, 3, 4]);
        assert_eq!(links(2, Topology::Ring).unwrap(), [(0, 1), (1, 0)]);
    }

    #[test]
    fn pairs_are_disjoint() {
        assert_eq!(links(6, Topology::Pairs).unwrap(), [(1, 0), (3, 2), (5, 4)]);
        assert_eq!(role(4, 6, Topology::Pairs).unwrap(), Role { serve: true, client_of: None });
        assert_eq!(role_line(&role(5, 6, Topology::Pairs).unwrap()), "no 4");
        assert_eq!(role_line(&role(2, 3, Topology::Ring).unwrap()), "yes 0");
    }

    #[test]
    fn impossible_fleets_are_refused() {
        assert!(check(1, Topology::Ring).unwrap_err().contains("at least 2"));
        assert!(check(3, Topology::Pairs).unwrap_err().contains("use 4"));
        assert!(role(3, 3, Topology::Ring).unwrap_err().contains("0..=2"));
    }
}
