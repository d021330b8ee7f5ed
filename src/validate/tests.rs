//! `validate` and `nccl-env` on fixture trees: a passing tree per profile, and a tree
//! failing each check for its reason.

use std::net::Ipv6Addr;

use super::checks::{self, Inputs, Outcome, Registration, Status};
use super::fixture::{self, Nic, Process};
use super::nccl;
use super::profiles::{PROFILES, Profile};
use crate::error::Error;

fn profile(name: &str) -> &'static Profile {
    PROFILES.iter().find(|p| p.name == name).unwrap()
}

struct Case {
    profile: &'static str,
    nics: Vec<Nic>,
    process: Process,
    expect_nics: Option<u32>,
    expect_gpus: Option<u32>,
}

impl Case {
    fn run(&self) -> Outcome {
        let dir = tempfile::tempdir().unwrap();
        let tree = fixture::write(dir.path(), &self.nics, &self.process);
        checks::run(&Inputs {
            tree: &tree,
            profile: profile(self.profile),
            expect_nics: self.expect_nics,
            expect_gpus: self.expect_gpus,
            mr_size: 64 << 20,
            registration: Registration::Skipped("fixture".into()),
        })
    }
}

fn status(o: &Outcome, id: &str) -> Status {
    o.checks
        .iter()
        .filter(|c| c.id == id)
        .map(|c| c.status)
        .max()
        .unwrap_or_else(|| panic!("no check {id}: {:#?}", o.checks))
}

fn failed(o: &Outcome) -> Vec<&str> {
    o.checks.iter().filter(|c| c.status == Status::Fail).map(|c| c.id.as_str()).collect()
}

/// A passing tree for each profile, shaped like that mode.
fn passing(profile: &'static str) -> Case {
    let two = |f: &dyn Fn(&mut Nic)| {
        (0..2)
            .map(|n| {
                let mut nic = Nic::roce(n);
                f(&mut nic);
                nic
            })
            .collect::<Vec<_>>()
    };
    let nics = match profile {
        "vke-exclusive" | "ack-exclusive" => two(&|_| {}),
        "vke-shared" | "ack-shared-hostnet" => two(&|n| n.vf = true),
        "vke-shared-multi" => two(&|n| {
            n.vf = true;
            n.sys_image_guid = "b8ce:f603:0000:1234".into();
        }),
        "vke-shared-host" => (0..4)
            .map(|n| {
                let mut nic = Nic::roce(n);
                nic.sub_interface = true;
                nic
            })
            .collect(),
        "ack-shared-podnet" => two(&|n| {
            n.ipv4 = None;
            n.ipv6 = Some(format!("fd00:{}::2", n.name.len() + n.netdev.len()).parse().unwrap());
        }),
        _ => vec![Nic::roce(0)],
    };
    Case { profile, nics, process: Process::default(), expect_nics: Some(2), expect_gpus: None }
}

#[test]
fn every_profile_passes_its_own_tree() {
    for p in PROFILES {
        let mut case = passing(p.name);
        if p.name == "generic" {
            case.expect_nics = Some(1);
        }
        let o = case.run();
        assert_eq!(failed(&o), Vec::<&str>::new(), "{}: {:#?}", p.name, o.checks);
        assert!(o.checks.iter().all(|c| c.status != Status::Warn), "{}: {:#?}", p.name, o.checks);
        assert_eq!(o.gid_index, Some(3), "{}", p.name);
    }
}

#[test]
fn no_device_at_all_is_no_rdma() {
    let o = Case { nics: vec![], ..passing("generic") }.run();
    assert!(o.no_rdma);
    assert_eq!(failed(&o), ["rdma-present"]);
}

#[test]
fn each_broken_tree_fails_for_its_reason() {
    type Break = fn(&mut Case);
    let cases: &[(&str, &str, Break)] = &[
        ("vke-shared", "usable-devices", |c| c.expect_nics = Some(4)),
        ("vke-shared", "usable-devices", |c| c.nics.iter_mut().for_each(|n| n.uverbs = false)),
        ("vke-shared-host", "usable-devices", |c| c.expect_nics = Some(8)),
        ("vke-exclusive", "port-state", |c| c.nics[1].state = "1: DOWN".into()),
        ("vke-exclusive", "port-state", |c| c.nics[0].phys_state = "3: Disabled".into()),
        ("vke-shared", "link-layer", |c| c.nics[0].link_layer = "InfiniBand".into()),
        ("ack-shared-podnet", "gid", |c| c.nics[0].ipv6 = None),
        ("ack-shared-podnet", "gid", |c| {
            c.nics[0].ipv6 = None;
            c.nics[0].ipv4 = Some("10.1.1.1".parse().unwrap());
        }),
        ("vke-shared", "gid", |c| {
            c.nics[0].ipv4 = None;
            c.nics[0].ipv6 = Some("fd00::9".parse().unwrap());
        }),
        ("vke-shared", "netdev", |c| c.nics[0].netdev_present = false),
        ("vke-shared", "netdev", |c| c.nics[0].carrier = false),
        ("vke-shared", "netdev", |c| c.nics[1].mtu = 1500),
        ("vke-shared", "gid-index", |c| c.nics[1].first_index = 5),
        ("vke-shared", "cap-ipc-lock", |c| c.process.cap_eff &= !(1 << 14)),
        ("ack-shared-hostnet", "cap-sys-resource", |c| c.process.cap_eff &= !(1 << 24)),
        ("generic", "memlock", |c| c.process.cap_eff = 0),
        ("vke-shared", "dev-shm", |c| c.process.shm = Some("65536k".into())),
        ("vke-shared", "dev-shm", |c| c.process.shm = None),
        ("vke-shared", "gpus", |c| {
            c.process.gpus = vec![0, 0];
            c.expect_gpus = Some(8);
        }),
        ("vke-shared", "uverbs-abi", |c| {
            c.process.abi = None;
            c.nics.iter_mut().for_each(|n| n.uverbs = false);
        }),
    ];
    for (profile, id, breaks) in cases {
        let mut case = passing(profile);
        if *profile == "generic" {
            case.expect_nics = Some(1);
        }
        breaks(&mut case);
        let o = case.run();
        assert_eq!(status(&o, id), Status::Fail, "{profile}/{id}: {:#?}", o.checks);
        let c = o.checks.iter().find(|c| c.id == *id && c.status == Status::Fail).unwrap();
        assert!(c.fix.is_some(), "{profile}/{id}: a failure says how to fix it");
    }
}

#[test]
fn soft_problems_warn_and_do_not_fail() {
    type Break = fn(&mut Case);
    let cases: &[(&str, &str, Break)] = &[
        ("vke-shared", "topology-file", |c| c.process.topology_file = false),
        ("vke-shared-host", "ipvlan", |c| c.nics.iter_mut().for_each(|n| n.sub_interface = false)),
        ("vke-exclusive", "exclusive-nic", |c| c.nics[0].vf = true),
        ("vke-exclusive", "exclusive-nic", |c| c.nics[1].sys_image_guid = c.nics[0].sys_image_guid.clone()),
        ("vke-shared", "rate", |c| c.nics[1].rate = "100 Gb/sec (4X EDR)".into()),
        ("vke-shared", "numa", |c| c.process.gpus = vec![0, 3]),
        ("generic", "cap-ipc-lock", |c| c.process.cap_eff = 0),
        ("generic", "dev-shm", |c| c.process.shm = None),
    ];
    for (profile, id, breaks) in cases {
        let mut case = passing(profile);
        if *profile == "generic" {
            case.expect_nics = Some(1);
            case.process.memlock = None;
        }
        breaks(&mut case);
        let o = case.run();
        assert_eq!(status(&o, id), Status::Warn, "{profile}/{id}: {:#?}", o.checks);
        assert_eq!(failed(&o), Vec::<&str>::new(), "{profile}/{id}");
    }
}

#[test]
fn whole_node_modes_accept_more_devices_than_requested() {
    let o = Case { expect_nics: Some(1), ..passing("vke-shared-host") }.run();
    assert_eq!(status(&o, "usable-devices"), Status::Pass);
    let o = Case { expect_nics: Some(1), ..passing("vke-shared") }.run();
    assert_eq!(status(&o, "usable-devices"), Status::Fail, "requested modes see exactly what was requested");
}

fn nccl_of(nics: &[Nic]) -> crate::Result<nccl::NcclEnv> {
    let dir = tempfile::tempdir().unwrap();
    let tree = fixture::write(dir.path(), nics, &Process::default());
    nccl::compute(&tree)
}

#[test]
fn nccl_env_one_device() {
    let env = nccl_of(&[Nic::roce(0)]).unwrap();
    assert_eq!(env.vars(), [("NCCL_IB_HCA", "mlx5_0:1".to_string()), ("NCCL_IB_GID_INDEX", "3".to_string())]);
}

#[test]
fn nccl_env_keeps_the_fastest_devices() {
    let mut slow = Nic::roce(1);
    slow.rate = "100 Gb/sec (4X EDR)".into();
    slow.first_index = 7; // a different index does not matter: it is not selected
    let env = nccl_of(&[Nic::roce(0), slow, Nic::roce(2)]).unwrap();
    assert_eq!(env.hca, ["mlx5_0:1", "mlx5_2:1"]);
    assert_eq!(env.gid_index, 3);
    assert_eq!(env.rate_gbps, 200.0);
}

#[test]
fn nccl_env_inconsistent_indexes_name_each_device() {
    let mut other = Nic::roce(1);
    other.first_index = 5;
    let e = nccl_of(&[Nic::roce(0), other]).unwrap_err();
    assert!(matches!(e, Error::Check(_)), "{e:?}");
    let m = e.message();
    assert!(
        m.contains("index inconsistent") && m.contains("mlx5_0:1 index 3") && m.contains("mlx5_1:1 index 5"),
        "{m}"
    );
}

#[test]
fn nccl_env_refuses_what_the_script_skips() {
    type Break = fn(&mut Nic);
    let cases: &[(&str, Break)] = &[
        ("IPv6 only", |n| {
            n.ipv4 = None;
            n.ipv6 = Some("fd00::2".parse::<Ipv6Addr>().unwrap());
        }),
        ("carrier down", |n| n.carrier = false),
        ("MTU 1500", |n| n.mtu = 1500),
        ("no dev_id", |n| n.dev_id = false),
        ("netdev elsewhere", |n| n.netdev_present = false),
    ];
    for (what, breaks) in cases {
        let mut nic = Nic::roce(0);
        breaks(&mut nic);
        let e = nccl_of(&[nic]).unwrap_err();
        assert!(matches!(e, Error::Environment(_)), "{what}: {e:?}");
        assert!(e.message().contains("Not found RDMA device"), "{what}: {}", e.message());
    }
    let e = nccl_of(&[]).unwrap_err();
    assert!(
        e.message().starts_with("no RDMA here: no device under") && e.message().contains("lab/run"),
        "{}",
        e.message()
    );
}

#[test]
fn nccl_env_lists_only_the_devices_this_process_can_open() {
    // A shared-mode pod: sysfs shows four NICs, the plugin mounted the verbs nodes of two.
    let mut nics: Vec<Nic> = (0..4).map(Nic::roce).collect();
    nics[1].uverbs = false;
    nics[3].uverbs = false;
    let env = nccl_of(&nics).unwrap();
    assert_eq!(env.hca, ["mlx5_0:1", "mlx5_2:1"]);
    assert_eq!(env.skipped, ["mlx5_1", "mlx5_3"]);
    for nic in &mut nics {
        nic.uverbs = false;
    }
    let e = nccl_of(&nics).unwrap_err();
    assert_eq!(e.exit_code(), 3);
    assert!(e.message().contains("4 device(s) in sysfs") && e.message().contains("no verbs node"), "{}", e.message());
}

#[test]
fn nccl_env_lists_a_port_with_two_addresses_once() {
    let mut two = Nic::roce(0);
    two.more_ipv4 = vec!["10.9.9.9".parse().unwrap()];
    let env = nccl_of(&[two, Nic::roce(1)]).unwrap();
    assert_eq!(env.hca, ["mlx5_0:1", "mlx5_1:1"]);
    assert_eq!(env.gid_index, 3, "the index both ports have");
}

#[test]
fn nccl_env_export_lines_cannot_run_a_netdev_name() {
    assert_eq!(super::shell_word("mlx5_0:1,mlx5_1:1"), "mlx5_0:1,mlx5_1:1");
    assert_eq!(super::shell_word("$(reboot)"), "'$(reboot)'");
    assert_eq!(super::shell_word("a'b;c"), r"'a'\''b;c'");
    assert_eq!(super::shell_word(""), "''");
}
