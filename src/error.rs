//! The error every command returns, and the exit code each kind maps to.
//!
//! Exit codes (design.md): 0 pass, 1 a check failed, 2 usage, 3 no usable RDMA device or
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
