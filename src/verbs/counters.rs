//! The port's event counters, as the kernel keeps them in sysfs: the InfiniBand port
//! counters (`ports/N/counters/`) and the driver's hw_counters (`ports/N/hw_counters/`:
//! on rxe sent/received packets, retries, sequence errors, RNR NAKs ...). A run reads
//! them before and after each size; the difference says what the fabric did meanwhile
//! (a run that passes on speed but retransmitted shows it here).
//!
//! They count for the whole port, not one QP: other traffic on the device in the same
//! interval is included. The root is a parameter so tests read fixture trees.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One reading of a port's counters: name -> value. Names are the sysfs file names,
/// defused (`names::defuse`: any driver's odd name is kept, in the form both sides send and
/// show); a hw_counter whose name a port counter already has is kept as `hw_<name>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reading(pub BTreeMap<String, u64>);

/// The port's counter directories under `root` (`/` on a live system).
fn directories(root: &Path, device: &str, port: u8) -> [PathBuf; 2] {
    let port_dir = root.join("sys/class/infiniband").join(device).join("ports").join(port.to_string());
    [port_dir.join("counters"), port_dir.join("hw_counters")]
}

/// Reads every counter the port has. Files that cannot be read (rxe has no MAD agent, so
/// its `counters/` files answer EINVAL) or that are not counters (writable knobs such as
/// rxe's `lifespan`, text) are left out; a device with none gives an empty reading.
pub fn read(root: &Path, device: &str, port: u8) -> Reading {
    let mut values = BTreeMap::new();
    for (i, dir) in directories(root, device, port).iter().enumerate() {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        let mut files: Vec<(String, PathBuf)> = entries
            .flatten()
            .filter(|e| !writable(&e.path()))
            .map(|e| (crate::names::defuse(e.file_name().as_encoded_bytes()), e.path()))
            .collect();
        files.sort();
        for (name, path) in files {
            let Some(value) = std::fs::read_to_string(&path).ok().and_then(|t| t.trim().parse::<u64>().ok()) else {
                continue;
            };
            let name = if i == 1 && values.contains_key(&name) { format!("hw_{name}") } else { name };
            values.insert(name, value);
        }
    }
    Reading(values)
}

fn writable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o222 != 0)
}

/// The live system's reading (root `/`).
pub fn read_now(device: &str, port: u8) -> Reading {
    read(Path::new("/"), device, port)
}

impl Reading {
    /// The counters' names (what this device can report).
    pub fn names(&self) -> Vec<String> {
        self.0.keys().cloned().collect()
    }

    /// What moved since `before`: the non-zero increases. A counter that went down (reset,
    /// or a 32-bit port counter that wrapped) or that appeared in between is left out:
    /// its change is unknown, and a false figure is worse than none.
    pub fn since(&self, before: &Reading) -> BTreeMap<String, u64> {
        self.0
            .iter()
            .filter_map(|(name, &now)| {
                let was = *before.0.get(name)?;
                (now > was).then(|| (name.clone(), now - was))
            })
            .collect()
    }
}

/// Names that mean the same event on every device, each the sum of the counters that
/// count it on rxe and on mlx5 (whichever the device has). Thresholds and tables accept
/// them, so a workload says "no retransmissions" once for every NIC.
pub const ALIASES: &[(&str, &str, &[&str])] = &[
    (
        "retransmissions",
        "requests sent again after a timeout or a NAK",
        &["completer_retry_err", "local_ack_timeout_err", "packet_seq_err", "implied_nak_seq_err"],
    ),
    (
        "sequence_errors",
        "packets that arrived out of sequence",
        &["rcvd_seq_err", "out_of_seq_request", "out_of_sequence"],
    ),
    ("rnr_naks", "receiver-not-ready NAKs sent or received", &["rcvd_rnr_err", "send_rnr_err", "rnr_nak_retry_err"]),
];

/// The counters `name` stands for: an alias's members, or the name itself.
pub fn members(name: &str) -> Vec<&str> {
    match ALIASES.iter().find(|a| a.0 == name) {
        Some(a) => a.2.to_vec(),
        None => vec![name],
    }
}

/// `name` (a counter or an alias) summed over `deltas`, if the device has any counter it
/// stands for (`available`); a counter absent from `deltas` did not move.
pub fn value_of(name: &str, available: &[String], deltas: &BTreeMap<String, u64>) -> Option<u64> {
    let members = members(name);
    let present = members.iter().any(|m| available.iter().any(|a| a == m));
    present.then(|| members.iter().filter_map(|m| deltas.get(*m)).sum())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn port(root: &Path, dir: &str, files: &[(&str, &str)]) {
        let d = root.join("sys/class/infiniband/rxe0/ports/1").join(dir);
        std::fs::create_dir_all(&d).unwrap();
        for (name, text) in files {
            std::fs::write(d.join(name), text).unwrap();
            std::fs::set_permissions(d.join(name), std::fs::Permissions::from_mode(0o444)).unwrap();
        }
    }

    #[test]
    fn reads_both_directories_and_leaves_out_what_is_no_counter() {
        let root = tempfile::tempdir().unwrap();
        port(
            root.path(),
            "hw_counters",
            &[("sent_pkts", "120\n"), ("completer_retry_err", "3\n"), ("odd", "x\n"), ("rx pkts", "5\n")],
        );
        port(root.path(), "counters", &[("port_xmit_packets", "7\n"), ("sent_pkts", "1\n")]);
        let knob = root.path().join("sys/class/infiniband/rxe0/ports/1/hw_counters/lifespan");
        std::fs::write(&knob, "10\n").unwrap();
        std::fs::set_permissions(&knob, std::fs::Permissions::from_mode(0o644)).unwrap();
        let r = read(root.path(), "rxe0", 1);
        assert_eq!(r.names(), ["completer_retry_err", "hw_sent_pkts", "port_xmit_packets", "rx%20pkts", "sent_pkts"]);
        assert_eq!(r.0["hw_sent_pkts"], 120);
        assert_eq!(read(root.path(), "rxe9", 1), Reading::default());
    }

    #[test]
    fn deltas_keep_only_what_grew() {
        let r = |v: &[(&str, u64)]| Reading(v.iter().map(|(k, v)| (k.to_string(), *v)).collect());
        let before = r(&[("a", 5), ("b", 9), ("c", 4)]);
        let after = r(&[("a", 8), ("b", 9), ("c", 1), ("new", 3)]);
        assert_eq!(after.since(&before), BTreeMap::from([("a".to_string(), 3)]));
    }

    #[test]
    fn aliases_add_their_members_when_the_device_has_one() {
        let available = vec!["completer_retry_err".to_string(), "sent_pkts".to_string()];
        let deltas = BTreeMap::from([("completer_retry_err".to_string(), 4), ("sent_pkts".to_string(), 100)]);
        assert_eq!(value_of("retransmissions", &available, &deltas), Some(4));
        assert_eq!(value_of("sent_pkts", &available, &deltas), Some(100));
        assert_eq!(value_of("rnr_naks", &available, &deltas), None);
        assert_eq!(value_of("completer_retry_err", &available, &BTreeMap::new()), Some(0));
    }
}
