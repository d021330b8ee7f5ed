//! Which devices a run uses ("rails": one NIC each, as NCCL drives every NIC of a node)
//! and whether they run at once or one after another. Pure data and checks: the names
//! are matched against the devices this process can open in the binding's caller.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The most rails one run drives (a GPU node has at most one NIC per GPU plus a few).
pub const MAX_RAILS: usize = 32;

/// What `-d` asked for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Devices {
    /// No `-d`: one rail on the first device.
    #[default]
    First,
    /// `-d all`: every device this process can open, in the library's order.
    All,
    /// `-d a,b,...`: these devices, in this order (rail i is the i-th name).
    Named(Vec<String>),
}

impl FromStr for Devices {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Devices, String> {
        if s == "all" {
            return Ok(Devices::All);
        }
        let names: Vec<String> = s.split(',').map(|n| n.trim().to_string()).collect();
        if let Some(empty) = names.iter().position(String::is_empty) {
            return Err(format!(
                "device {} of {s:?} is empty; give device names separated by commas (-d mlx5_0,mlx5_1) or all",
                empty + 1
            ));
        }
        for (i, n) in names.iter().enumerate() {
            if names[..i].contains(n) {
                return Err(format!("{n} is named twice in {s:?}; each rail needs a device of its own"));
            }
        }
        if names.len() > MAX_RAILS {
            return Err(format!("{} devices in {s:?}; at most {MAX_RAILS} rails per run", names.len()));
        }
        Ok(Devices::Named(names))
    }
}

impl fmt::Display for Devices {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Devices::First => f.write_str("the first device"),
            Devices::All => f.write_str("all"),
            Devices::Named(n) => f.write_str(&n.join(",")),
        }
    }
}

impl Devices {
    /// The rails' device names, given the devices this process can open (`available`, in
    /// the library's order). An unknown name is an environment error listing what exists.
    pub fn resolve(&self, available: &[String]) -> Result<Vec<String>> {
        let none = || Error::no_rdma("libibverbs lists no device this process can open");
        match self {
            Devices::First => available.first().map(|d| vec![d.clone()]).ok_or_else(none),
            Devices::All if available.is_empty() => Err(none()),
            Devices::All => Ok(available.iter().take(MAX_RAILS).cloned().collect()),
            Devices::Named(names) => {
                let unknown: Vec<&str> = names.iter().filter(|n| !available.contains(n)).map(String::as_str).collect();
                if unknown.is_empty() {
                    Ok(names.clone())
                } else {
                    Err(Error::Environment(format!(
                        "no RDMA device named {}; this process can open: {} (see `rdmabench devices`; a pod sees \
                         only the devices its plugin gave it)",
                        unknown.join(", "),
                        available.join(", ")
                    )))
                }
            }
        }
    }
}

/// `--rails`' help, shared by `run`/the tests and `k8s render`.
pub const RAIL_MODE_HELP: &str = "With several devices: `concurrent` (every rail at once, as NCCL loads them) or \
     `sequential` (one rail at a time, to isolate each)";

/// How several rails share the time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RailMode {
    /// Every rail at once, as NCCL loads them: PCIe, NUMA and switch contention show.
    #[default]
    Concurrent,
    /// One rail at a time (each size runs on rail 0, then rail 1, ...): isolates a rail.
    Sequential,
}

impl FromStr for RailMode {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<RailMode, String> {
        match s {
            "concurrent" => Ok(RailMode::Concurrent),
            "sequential" => Ok(RailMode::Sequential),
            _ => Err(format!("{s:?} is not a rail mode; use concurrent or sequential")),
        }
    }
}

impl RailMode {
    pub fn label(self) -> &'static str {
        match self {
            RailMode::Concurrent => "concurrent",
            RailMode::Sequential => "sequential",
        }
    }
}

/// The server's side of pairing: rail i of the client goes with `ours[i]`. A client with
/// more rails than this side has is refused before any traffic, saying what each side has.
pub fn pair(ours: &[String], theirs: &[String]) -> Result<()> {
    if theirs.is_empty() || theirs.len() > MAX_RAILS {
        return Err(Error::Peer(format!("the client announced {} rails; 1 to {MAX_RAILS} are valid", theirs.len())));
    }
    if theirs.len() > ours.len() {
        return Err(Error::Usage(format!(
            "the client has {} rails ({}) but this server has {} ({}); rail i of the client pairs with rail i of \
             the server: give the server as many devices with -d (or -d all), or the client fewer",
            theirs.len(),
            theirs.join(", "),
            ours.len(),
            ours.join(", ")
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_all_lists_and_refuses_duplicates_and_empty_names() {
        assert_eq!("all".parse::<Devices>().unwrap(), Devices::All);
        assert_eq!("mlx5_0".parse::<Devices>().unwrap(), Devices::Named(names(&["mlx5_0"])));
        assert_eq!("a, b".parse::<Devices>().unwrap(), Devices::Named(names(&["a", "b"])));
        let twice = "a,b,a".parse::<Devices>().unwrap_err();
        assert!(twice.contains("a is named twice"), "{twice}");
        assert!("a,,b".parse::<Devices>().unwrap_err().contains("device 2"));
        let many = (0..=MAX_RAILS).map(|i| format!("d{i}")).collect::<Vec<_>>().join(",");
        assert!(many.parse::<Devices>().unwrap_err().contains("at most 32"));
    }

    #[test]
    fn resolves_against_what_the_process_can_open() {
        let have = names(&["rxea0", "rxea1"]);
        assert_eq!(Devices::First.resolve(&have).unwrap(), names(&["rxea0"]));
        assert_eq!(Devices::All.resolve(&have).unwrap(), have);
        assert_eq!(Devices::Named(names(&["rxea1", "rxea0"])).resolve(&have).unwrap(), names(&["rxea1", "rxea0"]));
        let e = Devices::Named(names(&["rxea1", "mlx5_3"])).resolve(&have).unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(e.message().contains("no RDMA device named mlx5_3; this process can open: rxea0, rxea1"), "{e}");
        assert_eq!(Devices::All.resolve(&[]).unwrap_err().exit_code(), 3);
    }

    #[test]
    fn a_client_with_more_rails_than_the_server_is_refused_naming_both_sides() {
        pair(&names(&["b0", "b1"]), &names(&["a0", "a1"])).unwrap();
        pair(&names(&["b0", "b1", "b2"]), &names(&["a0"])).unwrap();
        let e = pair(&names(&["b0"]), &names(&["a0", "a1"])).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.message().contains("the client has 2 rails (a0, a1) but this server has 1 (b0)"), "{e}");
        assert_eq!(pair(&names(&["b0"]), &[]).unwrap_err().exit_code(), 4);
    }

    #[test]
    fn rail_modes() {
        assert_eq!("sequential".parse::<RailMode>().unwrap(), RailMode::Sequential);
        assert_eq!(RailMode::default(), RailMode::Concurrent);
        assert!("parallel".parse::<RailMode>().unwrap_err().contains("concurrent or sequential"));
    }
}
