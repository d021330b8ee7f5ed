//! Locked-memory limits: what registration needs, what the process may lock, and the
//! message that tells a user (or a pod spec) how to raise it.

use crate::error::Error;

/// CAP_IPC_LOCK lifts RLIMIT_MEMLOCK for registration.
const CAP_IPC_LOCK: u32 = 14;

/// RLIMIT_MEMLOCK's soft limit in bytes; None when unlimited.
pub fn memlock_limit() -> Option<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return None;
    }
    (lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

/// Whether CAP_IPC_LOCK is in this process's effective set (from /proc/self/status).
pub fn has_ipc_lock() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| cap_eff(&s))
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// Parses the `CapEff:` line of a /proc/PID/status text.
pub fn cap_eff(status: &str) -> Option<u64> {
    status.lines().find_map(|l| l.strip_prefix("CapEff:")).and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

pub fn human_bytes(b: u64) -> String {
    const K: u64 = 1024;
    match b {
        b if b >= K * K * K => format!("{:.1} GiB", b as f64 / (K * K * K) as f64),
        b if b >= K * K => format!("{:.1} MiB", b as f64 / (K * K) as f64),
        b if b >= K => format!("{:.1} KiB", b as f64 / K as f64),
        b => format!("{b} B"),
    }
}

/// The error for a failed registration of `needed` bytes, given the limits in force.
/// A low memlock limit without CAP_IPC_LOCK is named with the fix; anything else keeps
/// the OS error.
pub fn registration_error(needed: u64, os_error: &str, limit: Option<u64>, ipc_lock: bool) -> Error {
    match limit {
        Some(lim) if !ipc_lock && lim < needed => Error::Environment(format!(
            "cannot register {} of memory ({os_error}): the locked-memory limit (ulimit -l) is {} and \
             this process lacks CAP_IPC_LOCK; at least {} KiB is needed. Raise it with `ulimit -l unlimited` \
             (or `ulimit -l {}`), LimitMEMLOCK=infinity for a systemd service, or in Kubernetes add \
             IPC_LOCK to securityContext.capabilities.add",
            human_bytes(needed),
            human_bytes(lim),
            needed.div_ceil(1024),
            needed.div_ceil(1024)
        )),
        _ => Error::Environment(format!(
            "cannot register {} of memory: {os_error} (locked-memory limit {}, CAP_IPC_LOCK {})",
            human_bytes(needed),
            limit.map_or("unlimited".into(), human_bytes),
            if ipc_lock { "present" } else { "absent" }
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_limit_without_capability_names_the_need_and_the_fix() {
        let e = registration_error(8 << 20, "Cannot allocate memory", Some(64 << 10), false);
        assert_eq!(e.exit_code(), 3);
        let m = e.to_string();
        for part in ["8.0 MiB", "64.0 KiB", "8192 KiB", "ulimit -l", "IPC_LOCK"] {
            assert!(m.contains(part), "missing {part:?}: {m}");
        }
    }

    #[test]
    fn with_capability_or_enough_limit_the_os_error_is_kept() {
        let m = registration_error(8 << 20, "Bad address", Some(64 << 10), true).to_string();
        assert!(m.contains("Bad address") && !m.contains("ulimit -l unlimited"), "{m}");
        let m = registration_error(4096, "Bad address", None, false).to_string();
        assert!(m.contains("unlimited"), "{m}");
    }

    #[test]
    fn cap_eff_parses_the_status_line() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t0000000000004000\n";
        assert_eq!(cap_eff(status), Some(1 << 14));
        assert_eq!(cap_eff("Name: x\n"), None);
    }
}
