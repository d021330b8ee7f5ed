//! Host tests of the binary's behaviour that need no RDMA.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_rdmabench");

fn has_rdma() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

#[test]
fn devices_without_rdma_says_so_in_one_line_and_exits_3() {
    let out = Command::new(BIN).arg("devices").output().unwrap();
    if has_rdma() {
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        return;
    }
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("no RDMA") && stderr.contains("lab/run"), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn usage_errors_exit_2_before_touching_a_device() {
    for args in [
        &["write-bw", "-s", "0", "127.0.0.1"][..],
        &["write-lat", "-t", "0", "127.0.0.1"],
        &["write-bw", "-m", "1500", "x"],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let out = Command::new(BIN).args(["write-bw", "--no-such-flag"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn help_lists_perftest_flags() {
    let out = Command::new(BIN).args(["write-bw", "--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in ["-d", "-i", "-x", "-p", "-s", "-n", "-D", "-t", "-Q", "-I", "-a", "--report_gbits", "--json"] {
        assert!(text.contains(flag), "{flag} missing from help");
    }
}
