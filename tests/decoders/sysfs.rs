//! The sysfs, procfs and /dev trees `validate` and `nccl-env` read (`--sysfs-root`,
//! `--proc-root`): a device plugin, a kernel or a hand-made fixture may put anything in a
//! file, remove it, or leave a link dangling. The trees start as the fixtures the unit
//! tests use (one per kind of node) and have files changed, emptied or removed.

use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use proptest::sample::Index;
use rdmabench::validate::fixture::{self, Nic, Process};
use rdmabench::validate::profiles::PROFILES;
use rdmabench::validate::sysfs::Tree;
use rdmabench::validate::{self, NcclFormat, Request};

use super::harness::*;

/// Nodes as the platforms give them: two RoCE NICs and GPUs; one IPv6 NIC of a VF; eight
/// NICs of one physical card, one port down.
fn seed_nodes() -> Vec<(Vec<Nic>, Process)> {
    let gpus = Process { gpus: vec![0, 0, 1, 1], ..Process::default() };
    let mut v6 = Nic::roce(0);
    (v6.ipv4, v6.ipv6, v6.vf) = (None, Some("fd00::2".parse::<Ipv6Addr>().unwrap()), true);
    let mut eight: Vec<Nic> = (0..8).map(Nic::roce).collect();
    for n in &mut eight {
        n.sys_image_guid = "b8ce:f603:0000:1234".into();
    }
    (eight[5].state, eight[5].carrier) = ("1: DOWN".into(), false);
    let unlimited =
        Process { memlock: None, shm: None, netns_shared: Some(false), topology_file: false, ..Process::default() };
    vec![(vec![Nic::roce(0), Nic::roce(1)], gpus), (vec![v6], Process::default()), (eight, unlimited)]
}

/// A tree written under `root`, with every file and link in it.
struct Seed {
    tree: Tree,
    files: Vec<PathBuf>,
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let ty = e.file_type().unwrap();
        if ty.is_dir() {
            walk(&e.path(), out);
        } else {
            out.push(e.path());
        }
    }
}

fn seeds(root: &Path) -> Vec<Seed> {
    seed_nodes()
        .iter()
        .enumerate()
        .map(|(k, (nics, process))| {
            let dir = root.join(k.to_string());
            let tree = fixture::write(&dir, nics, process);
            let mut files = Vec::new();
            walk(&dir, &mut files);
            files.sort();
            Seed { tree, files }
        })
        .collect()
}

/// One file of a tree changed.
#[derive(Debug, Clone)]
enum Change {
    /// Its text mutated.
    Text(Vec<Mutation>),
    /// Emptied.
    Empty,
    /// Removed (a link: gone; a device node: not given).
    Remove,
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        6 => proptest::collection::vec(mutation(), 1..4).prop_map(Change::Text),
        1 => Just(Change::Empty),
        1 => Just(Change::Remove),
    ]
}

/// Validates `tree` under one profile and computes the NCCL environment in one format.
fn read_tree(tree: &Tree, profile: usize, expect_nics: u32, format: usize) -> Result<(), String> {
    let mut sink = Vec::new();
    let profile = &PROFILES[profile % PROFILES.len()];
    let req = Request {
        tree: tree.clone(),
        profile,
        expect_nics: Some(expect_nics),
        expect_gpus: Some(4),
        mr_size: 64 << 20,
        json: None,
        junit: None,
    };
    let outcome = validate::evaluate(&req);
    validate::print_lines(profile, &outcome, &mut sink).map_err(|e| e.message())?;
    let _ = serde_json::to_string(&outcome.checks).unwrap();
    // No usable NIC is a refusal (exit 3) with its reason.
    let format = [NcclFormat::Export, NcclFormat::Env, NcclFormat::Json][format % 3];
    validate::nccl_env(tree, format, &mut sink).map_err(|e| e.message())
}

fn tree_size(files: &[PathBuf]) -> usize {
    files.iter().map(|f| std::fs::symlink_metadata(f).map_or(0, |m| m.len() as usize)).sum()
}

#[test]
fn changed_sysfs_trees_validate_or_are_refused_clearly() {
    let root = tempfile::tempdir().unwrap();
    let seeds = seeds(root.path());
    // The healthy two-NIC node gives an NCCL environment in every format.
    for (k, profile) in PROFILES.iter().enumerate() {
        let outcome = read_tree(&seeds[0].tree, k, 2, k);
        assert!(outcome.is_ok(), "{}: {outcome:?}", profile.name);
    }
    let changes = proptest::collection::vec((any::<Index>(), change()), 1..4);
    let strategy = (0..seeds.len(), changes, any::<usize>(), 0u32..10, any::<usize>());
    property("sysfs trees", strategy, |(k, changes, profile, expect_nics, format)| {
        let seed = &seeds[*k];
        // Each case changes files and puts them back: the originals, read first.
        let mut saved = Vec::new();
        for (i, c) in changes {
            let path = &seed.files[i.index(seed.files.len())];
            let link = std::fs::read_link(path).ok();
            let bytes = if link.is_none() { std::fs::read(path).ok() } else { None };
            saved.push((path.clone(), link, bytes.clone()));
            match c {
                Change::Remove => {
                    let _ = std::fs::remove_file(path);
                }
                Change::Empty => {
                    let _ = std::fs::remove_file(path);
                    std::fs::write(path, b"").unwrap();
                }
                Change::Text(ms) => {
                    let mut text = bytes.unwrap_or_default();
                    for m in ms {
                        m.apply(&mut text);
                    }
                    let _ = std::fs::remove_file(path);
                    std::fs::write(path, text).unwrap();
                }
            }
        }
        let size = tree_size(&seed.files);
        let outcome = read_tree(&seed.tree, *profile, *expect_nics, *format);
        for (path, link, bytes) in saved.into_iter().rev() {
            let _ = std::fs::remove_file(&path);
            match (link, bytes) {
                (Some(target), _) => std::os::unix::fs::symlink(target, &path).unwrap(),
                (None, Some(b)) => std::fs::write(&path, b).unwrap(),
                (None, None) => {}
            }
        }
        (size, outcome)
    });
}
