//! The memory budget of a test: what a spec makes this side register (`link::memory_need`,
//! per rail), checked against `--max-memory` before anything is allocated, so a spec from
//! the wire cannot make a server take more than it was given (pods lift the memlock limit
//! with IPC_LOCK, so nothing else would stop it).

use std::path::Path;

use crate::error::{Error, Result};
use crate::link::memory_need;
use crate::spec::TestSpec;
use crate::verbs::memlock::human_bytes;

/// What `--max-memory` defaults to, for its help.
pub const DEFAULT_DOC: &str = "half of this container's memory limit (cgroup memory.max), or of the host's memory";

/// Half the memory this process may use: the cgroup v2 limit where one is set, else
/// MemTotal (read from `proc` and the cgroup tree under `sys`, so tests use fixtures).
pub fn default_budget(proc: &Path, sys: &Path) -> u64 {
    let total = std::fs::read_to_string(proc.join("meminfo")).ok().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
    });
    let cgroup = std::fs::read_to_string(proc.join("self/cgroup")).ok().and_then(|c| {
        let rel = c.lines().find_map(|l| l.strip_prefix("0::"))?.trim_start_matches('/').to_string();
        let max = std::fs::read_to_string(sys.join("fs/cgroup").join(rel).join("memory.max")).ok()?;
        max.trim().parse::<u64>().ok()
    });
    let limit = match (total, cgroup) {
        (Some(t), Some(c)) => t.min(c),
        (t, c) => t.or(c).unwrap_or(8 << 30),
    };
    limit / 2
}

/// Refuses a spec whose `rails` rails need more than `budget` bytes, naming the need, the
/// budget and the fix (exit 2).
pub fn check(spec: &TestSpec, rails: usize, budget: u64, side: &str) -> Result<()> {
    let per_rail = memory_need(spec);
    let need = per_rail.saturating_mul(rails.max(1) as u64);
    if need <= budget {
        return Ok(());
    }
    let parts = if rails > 1 { format!(" ({rails} rails x {})", human_bytes(per_rail)) } else { String::new() };
    Err(Error::Usage(format!(
        "{} needs {} of registered memory on {side}{parts}, over its --max-memory {}: use smaller sizes (-s), \
         fewer QPs (-q), a smaller --capacity or no --validate-data on bandwidth tests, or raise --max-memory \
         where the host has room",
        spec.name(),
        human_bytes(need),
        human_bytes(budget)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Measure, Operation};

    #[test]
    fn the_budget_is_half_the_smaller_of_the_cgroup_limit_and_memtotal() {
        let dir = tempfile::tempdir().unwrap();
        let (proc, sys) = (dir.path().join("proc"), dir.path().join("sys"));
        std::fs::create_dir_all(proc.join("self")).unwrap();
        std::fs::create_dir_all(sys.join("fs/cgroup/kubepods/pod1")).unwrap();
        std::fs::write(proc.join("meminfo"), "MemTotal:       16384000 kB\nMemFree: 1 kB\n").unwrap();
        assert_eq!(default_budget(&proc, &sys), 16384000 * 1024 / 2, "no cgroup: MemTotal");
        std::fs::write(proc.join("self/cgroup"), "0::/kubepods/pod1\n").unwrap();
        std::fs::write(sys.join("fs/cgroup/kubepods/pod1/memory.max"), "max\n").unwrap();
        assert_eq!(default_budget(&proc, &sys), 16384000 * 1024 / 2, "an unlimited cgroup");
        std::fs::write(sys.join("fs/cgroup/kubepods/pod1/memory.max"), "1073741824\n").unwrap();
        assert_eq!(default_budget(&proc, &sys), 512 << 20, "the pod's limit");
    }

    #[test]
    fn a_spec_over_the_budget_is_refused_naming_need_budget_and_flag() {
        let mut spec = TestSpec::new(Operation::Write, Measure::Bandwidth);
        spec.sizes = vec![1 << 30];
        spec.num_qps = 4;
        // Two 1 GiB regions per lane (send and receive), four lanes, two rails.
        assert_eq!(memory_need(&spec), 4 * (2 << 30));
        let e = check(&spec, 2, 1 << 30, "this server").unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let m = e.to_string();
        for part in ["16.0 GiB", "2 rails x 8.0 GiB", "--max-memory 1.0 GiB", "this server"] {
            assert!(m.contains(part), "missing {part:?}: {m}");
        }
        assert!(check(&spec, 1, 8 << 30, "x").is_ok());
    }
}
