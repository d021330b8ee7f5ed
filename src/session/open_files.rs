//! The open-file limit a process with many connections needs: a fleet's node 0 holds one
//! connection per node (two descriptors each), past the 1,024 a shell gives by default.

use crate::error::{Error, Result};

/// Raises this process's soft limit on open files to at least `needed` (up to the hard
/// limit, which only root may raise); Err naming `who`, the numbers and the fix when the
/// hard limit is lower.
pub fn ensure(needed: u64, who: &str) -> Result<()> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(Error::Environment(format!(
            "cannot read the open-file limit: {}",
            std::io::Error::last_os_error()
        )));
    }
    if lim.rlim_cur == libc::RLIM_INFINITY || lim.rlim_cur >= needed {
        return Ok(());
    }
    if lim.rlim_max != libc::RLIM_INFINITY && lim.rlim_max < needed {
        return Err(Error::Environment(format!(
            "{who} needs {needed} open files and this process may have at most {} (hard limit; `ulimit -Hn`): \
             raise it (the container runtime's or the pod's nofile limit, or `ulimit -n {needed}` as root)",
            lim.rlim_max
        )));
    }
    let raised = libc::rlimit { rlim_cur: needed.max(lim.rlim_cur), rlim_max: lim.rlim_max };
    // SAFETY: setrlimit reads the struct we own.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Err(Error::Environment(format!(
            "{who} needs {needed} open files; raising the limit from {} failed: {}",
            lim.rlim_cur,
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_need_within_the_hard_limit_is_met_and_one_beyond_it_says_how_to_raise_it() {
        ensure(64, "this test").unwrap();
        let e = ensure(u64::MAX - 1, "node 0 of a fleet of 1024").unwrap_err();
        // Unless the hard limit is unlimited, which a root shell may have.
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
        if lim.rlim_max != libc::RLIM_INFINITY {
            assert!(e.message().contains("ulimit -Hn") && e.message().contains("node 0"), "{e}");
        }
    }
}
