//! Workload files: the shipped ones parse; every kind of bad input names file, line, key.

use std::collections::BTreeMap;

use super::file::{StepKind, parse};

fn shipped(name: &str) -> String {
    std::fs::read_to_string(format!("{}/workloads/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn err(text: &str) -> String {
    parse(text, "w.toml", &BTreeMap::new()).unwrap_err().message()
}

#[test]
fn shipped_workloads_parse() {
    for (name, steps) in [("smoke.toml", 3), ("acceptance.toml", 7), ("sweep.toml", 2), ("regression.toml", 4)] {
        let w = parse(&shipped(name), name, &BTreeMap::new()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(w.steps.len(), steps, "{name}");
    }
    let w = parse(&shipped("sweep.toml"), "sweep.toml", &BTreeMap::new()).unwrap();
    let StepKind::Measure(m) = &w.steps[0].kind else { panic!() };
    assert_eq!(m.spec.sizes.len(), 23);
}

#[test]
fn params_feed_thresholds_and_can_be_overridden() {
    let text = shipped("acceptance.toml");
    let w = parse(&text, "a.toml", &BTreeMap::new()).unwrap();
    let StepKind::Measure(m) = &w.steps[1].kind else { panic!() };
    assert_eq!(m.thresholds[0].limit, 1000.0);
    assert_eq!(m.repeat, 3);
    let over = BTreeMap::from([("max_write_p50_us".to_string(), 3.5)]);
    let w = parse(&text, "a.toml", &over).unwrap();
    let StepKind::Measure(m) = &w.steps[1].kind else { panic!() };
    assert_eq!(m.thresholds[0].limit, 3.5);
    let bad = BTreeMap::from([("nope".to_string(), 1.0)]);
    let e = parse(&text, "a.toml", &bad).unwrap_err().message();
    assert!(e.contains("--param nope") && e.contains("max_write_p50_us"), "{e}");
}

const BASE: &str = "name = \"t\"\n\n[[step]]\nname = \"s\"\ntest = \"write-bw\"\n";

#[test]
fn unknown_key_names_file_line_and_key() {
    let e = err(&format!("{BASE}sise = 64\n"));
    assert!(e.starts_with("w.toml:6:") && e.contains("`sise`") && e.contains("unknown field"), "{e}");
    let e = err("name = \"t\"\ncolour = 1\n[[step]]\nname = \"s\"\ntest = \"write-bw\"\n");
    assert!(e.starts_with("w.toml:2:") && e.contains("colour"), "{e}");
}

#[test]
fn wrong_type_names_file_line_and_key() {
    let e = err(&format!("{BASE}iterations = \"many\"\n"));
    assert!(e.starts_with("w.toml:6:") && e.contains("key `iterations`"), "{e}");
    let e = err(&format!("{BASE}transport = \"TCP\"\n"));
    assert!(e.starts_with("w.toml:6:") && e.contains("key `transport`") && e.contains("RC"), "{e}");
}

#[test]
fn impossible_values_name_file_line_and_key() {
    let cases = [
        ("size = 0\n", "size", "size 0"),
        ("iterations = 0\n", "iterations", "use iterations 1 or more"),
        ("tx_depth = 0\n", "tx_depth", "use tx_depth 1 or more"),
        ("mtu = 1500\n", "mtu", "4096"),
        ("qps = 0\n", "qps", "use qps 1..=256"),
        ("threads = 2\n", "threads", "threads 2 needs at least as many QPs (qps 1)"),
        ("post_list = 500\n", "post_list", "use post_list 1..=128 (or raise tx_depth)"),
        ("transport = \"UC\"\nrdma_cm = true\n", "rdma_cm", "drop rdma_cm"),
        ("repeat = 0\n", "repeat", "1..=100"),
        ("transport = \"UD\"\n", "transport", "UD carries only SEND"),
        ("[step.thresholds]\nmin_gbps = -1\n", "min_gbps", "positive"),
        ("[step.thresholds]\nmax_gbps = 1\n", "max_gbps", "min_gbps"),
        ("[step.thresholds]\nmin_gbps = \"$nope\"\n", "min_gbps", "not defined"),
        ("[step.thresholds]\nmin_gbps = \"fast\"\n", "min_gbps", "parameter reference"),
        ("[step.tolerance]\nlatency = 5\n", "latency", "p50_us"),
        ("expect_nics = 2\n", "expect_nics", "validate steps only"),
        ("size = 64\nsizes = [64]\n", "size", "one of `size`"),
    ];
    for (extra, key, part) in cases {
        let text = format!("{BASE}{extra}");
        let e = err(&text);
        // Workload errors name keys, never the flags (the same check says `-t` on the CLI).
        let flag = e.match_indices(" -").any(|(i, _)| e[i + 2..].starts_with(|c: char| c.is_ascii_alphabetic()));
        assert!(!flag, "{extra:?}: a flag in a workload error: {e}");
        let line = text.lines().position(|l| l.starts_with(key)).map(|i| i + 1).unwrap();
        assert!(e.starts_with(&format!("w.toml:{line}: key `{key}`")), "{extra:?}: {e}");
        assert!(e.contains(part), "{extra:?}: missing {part:?} in {e}");
    }
}

#[test]
fn step_shape_errors() {
    let e = err("name = \"t\"\n[[step]]\nname = \"s\"\nvalidate = \"generic\"\ntest = \"write-bw\"\n");
    assert!(e.contains("either validates or measures"), "{e}");
    let e = err("name = \"t\"\n[[step]]\nname = \"s\"\n");
    assert!(e.contains("neither"), "{e}");
    let e = err("name = \"t\"\n[[step]]\nname = \"s\"\ntest = \"write-speed\"\n");
    assert!(e.contains("w.toml:4: key `test`") && e.contains("write-bw"), "{e}");
    let e = err("name = \"t\"\n[[step]]\nname = \"s\"\nvalidate = \"gke\"\n");
    assert!(e.contains("key `validate`") && e.contains("vke-shared"), "{e}");
    let e = err(&format!("{BASE}[[step]]\nname = \"s\"\ntest = \"read-bw\"\n"));
    assert!(e.contains("w.toml:7: key `name`") && e.contains("two steps"), "{e}");
    let e = err("name = \"t\"\n");
    assert!(e.contains("no [[step]]"), "{e}");
}

#[test]
fn byte_keys_take_the_flags_suffixes() {
    let text = format!("{BASE}sizes = [4096, \"64K\", \"1MiB\"]\ninline = \"0\"\nmtu = \"4K\"\n");
    let w = parse(&text, "w.toml", &BTreeMap::new()).unwrap();
    let StepKind::Measure(m) = &w.steps[0].kind else { panic!() };
    assert_eq!(m.spec.sizes, vec![4096, 65536, 1 << 20]);
    assert_eq!((m.spec.inline_size, m.spec.mtu), (Some(0), Some(4096)));
    let w = parse(&format!("{BASE}size = \"8M\"\n"), "w.toml", &BTreeMap::new()).unwrap();
    let StepKind::Measure(m) = &w.steps[0].kind else { panic!() };
    assert_eq!(m.spec.sizes, vec![8 << 20]);
    let e = err(&format!("{BASE}size = \"64Q\"\n"));
    assert!(e.starts_with("w.toml:6:") && e.contains("key `size`") && e.contains("KiB"), "{e}");
    let e = err(&format!("{BASE}mtu = \"8G\"\n"));
    assert!(e.starts_with("w.toml:6:") && e.contains("key `mtu`") && e.contains("too large"), "{e}");
}

#[test]
fn ring_tests_take_the_clis_defaults_and_their_own_keys() {
    let text =
        "name = \"t\"\n[[step]]\nname = \"r\"\ntest = \"ring-bw\"\n[[step]]\nname = \"l\"\ntest = \"ring-lat\"\n";
    let w = parse(text, "w.toml", &BTreeMap::new()).unwrap();
    let StepKind::Measure(bw) = &w.steps[0].kind else { panic!() };
    let StepKind::Measure(lat) = &w.steps[1].kind else { panic!() };
    use crate::spec::{Measure, Operation, TestSpec};
    assert_eq!(bw.spec, TestSpec::new(Operation::Ring, Measure::Bandwidth), "the CLI's ring-bw defaults");
    assert_eq!(lat.spec, TestSpec::new(Operation::Ring, Measure::Latency));
    assert_eq!(bw.spec.ring.unwrap().capacity, 4 << 20, "32 records of 64 KiB");
    let text = "name = \"t\"\n[[step]]\nname = \"r\"\ntest = \"ring-bw\"\ncapacity = \"64K\"\nbatch = 4\nnotify = \"poll\"\nsize = 64\n";
    let w = parse(text, "w.toml", &BTreeMap::new()).unwrap();
    let StepKind::Measure(m) = &w.steps[0].kind else { panic!() };
    let r = m.spec.ring.unwrap();
    assert_eq!((r.capacity, r.batch, r.notify), (65536, 4, crate::spec::Notify::Poll));
    let e = err(&format!("{BASE}capacity = \"64K\"\n"));
    assert!(
        e.starts_with("w.toml:6:") && e.contains("key `capacity`") && e.contains("ring-bw and ring-lat only"),
        "{e}"
    );
}

#[test]
fn fabric_keys_set_the_path_and_out_of_range_ones_name_the_key() {
    let text = format!("{BASE}tclass = 106\nsl = 3\nflow_label = 74565\nqp_timeout = 10\nretry_count = 2\n");
    let w = parse(&text, "w.toml", &BTreeMap::new()).unwrap();
    let StepKind::Measure(m) = &w.steps[0].kind else { panic!() };
    let f = m.spec.fabric;
    assert_eq!((f.traffic_class, f.service_level, f.flow_label, f.qp_timeout, f.retry_count), (106, 3, 74565, 10, 2));
    assert_eq!((f.hop_limit, f.rnr_retry), (64, 7), "the rest keep their defaults");
    let e = err(&format!("{BASE}sl = 16\n"));
    assert!(e.contains("sl 16 is out of range; use sl 0..=15"), "{e}");
}

#[test]
fn counter_limits_are_a_table_of_their_own() {
    let text = format!("{BASE}[step.max_counters]\nretransmissions = 0\nrcvd_seq_err = 5\n");
    let w = parse(&text, "w.toml", &BTreeMap::new()).unwrap();
    let StepKind::Measure(m) = &w.steps[0].kind else { panic!() };
    let keys: Vec<(&str, f64)> = m.thresholds.iter().map(|t| (t.key.as_str(), t.limit)).collect();
    assert_eq!(keys, [("max_counters.rcvd_seq_err", 5.0), ("max_counters.retransmissions", 0.0)]);
    let e = err(&format!("{BASE}[step.max_counters]\nretransmissions = 0.5\n"));
    assert!(e.starts_with("w.toml:") && e.contains("whole number"), "{e}");
}

#[test]
fn step_keys_are_every_key_a_step_takes() {
    // serde names every field it would have taken when it refuses an unknown one.
    let e = err("name = \"w\"\n[[step]]\nname = \"s\"\nno_such_key = 1\n");
    let expected = e.split("expected one of ").nth(1).unwrap_or_else(|| panic!("{e}"));
    let taken: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    assert_eq!(taken, super::file::STEP_KEYS, "{e}");
    for (key, _) in super::file::OWN_STEP_KEYS {
        assert!(super::file::STEP_KEYS.contains(key), "{key}");
    }
}
