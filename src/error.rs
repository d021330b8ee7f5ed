//! The error every command returns, and the exit code each kind maps to.
//!
//! Exit codes (the README's table): 0 pass, 1 a check failed, 2 usage, 3 no usable RDMA device or
//! environment problem, 4 peer lost or timed out; 128+N when stopped by signal N.

use std::fmt;

/// What went wrong, classified by who can fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A flag value is invalid or outside a device limit: the user fixes the command line.
    Usage(String),
    /// No RDMA, no such device, memlock too low...: the user fixes the environment.
    Environment(String),
    /// The run completed but a check failed (data corruption, a count mismatch).
    Check(String),
    /// The peer died, hung, refused the protocol or never came.
    Peer(String),
    /// SIGINT or SIGTERM arrived; the number is the signal.
    Interrupted(i32),
}

impl Error {
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Check(_) => 1,
            Error::Usage(_) => 2,
            Error::Environment(_) => 3,
            Error::Peer(_) => 4,
            Error::Interrupted(sig) => 128 + sig,
        }
    }

    /// Rebuilds an error that the peer reported over the session, keeping its class.
    pub fn from_code(code: i32, message: String) -> Error {
        match code {
            1 => Error::Check(message),
            2 => Error::Usage(message),
            3 => Error::Environment(message),
            c if c > 128 => Error::Peer(message),
            _ => Error::Peer(message),
        }
    }

    pub fn message(&self) -> String {
        match self {
            Error::Usage(m) | Error::Environment(m) | Error::Check(m) | Error::Peer(m) => m.clone(),
            Error::Interrupted(sig) => format!("interrupted by signal {sig}; resources released"),
        }
    }

    /// The one wording of "this process sees no RDMA device", whichever command found it
    /// (`devices`, a test, `validate`, `nccl-env`): what was seen, then the fix for each
    /// place a user may be (an RDMA host, a pod, a machine whose kernel has no RDMA).
    pub fn no_rdma(seen: impl fmt::Display) -> Error {
        Error::Environment(format!(
            "no RDMA here: {seen}. Fix: on an RDMA host, load the NIC's driver (soft-RoCE: modprobe rdma_rxe; \
             rdma link add rxe0 type rxe netdev IFACE); in a pod, request the RDMA resource (`rdmabench k8s \
             render` shows how); on a machine whose kernel has no RDMA, run inside the soft-RoCE lab: \
             lab/run -- rdmabench ..."
        ))
    }

    /// The same error, its message made safe to print and bounded
    /// (`names::quoting_error`): for an error that quotes what a file or a peer said.
    pub fn quoting(self) -> Error {
        match self {
            Error::Usage(m) => Error::Usage(crate::names::quoting_error(&m)),
            Error::Environment(m) => Error::Environment(crate::names::quoting_error(&m)),
            Error::Check(m) => Error::Check(crate::names::quoting_error(&m)),
            Error::Peer(m) => Error::Peer(crate::names::quoting_error(&m)),
            e @ Error::Interrupted(_) => e,
        }
    }

    /// Prefixes the message with context, keeping the class.
    pub fn context(self, what: &str) -> Error {
        match self {
            Error::Usage(m) => Error::Usage(format!("{what}: {m}")),
            Error::Environment(m) => Error::Environment(format!("{what}: {m}")),
            Error::Check(m) => Error::Check(format!("{what}: {m}")),
            Error::Peer(m) => Error::Peer(format!("{what}: {m}")),
            e @ Error::Interrupted(_) => e,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_rdma_says_what_was_seen_and_every_fix_in_one_line() {
        let e = Error::no_rdma("no device under /sys/class/infiniband");
        assert_eq!(e.exit_code(), 3);
        let m = e.message();
        assert!(m.starts_with("no RDMA here: no device under /sys/class/infiniband. Fix:"), "{m}");
        for part in ["modprobe rdma_rxe", "RDMA resource", "lab/run -- rdmabench"] {
            assert!(m.contains(part), "{part}: {m}");
        }
        assert!(!m.contains('\n'));
    }
}
