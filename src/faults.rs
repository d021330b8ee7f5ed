//! Fault points for tests of what no signal can make: a session thread that stands still
//! while its process (and its keepalive) lives on, as one stuck in a driver call or a
//! deadlock does; a history writer stopped inside its transaction, to be killed there. Nothing is
//! injected unless `RDMABENCH_FAULT` names a point; docs/development.md lists them.

use std::time::Duration;

/// The variable that names the fault point, e.g. `RDMABENCH_FAULT=stall:server-run`.
pub const FAULT_ENV: &str = "RDMABENCH_FAULT";

/// A server's session thread, once the client's measured run has begun (after `Ready`).
pub const SERVER_RUN: &str = "server-run";

/// `history add`, inside its transaction: the run's row written, its points not yet.
pub const HISTORY_WRITE: &str = "history-write";

/// Stands still at `point` when `RDMABENCH_FAULT` is `stall:<point>`: sleeps until a
/// SIGINT or SIGTERM, touching nothing (the keepalive goes on beating).
pub fn stall_at(point: &str) {
    let Ok(fault) = std::env::var(FAULT_ENV) else { return };
    if fault.strip_prefix("stall:") != Some(point) {
        return;
    }
    eprintln!("rdmabench: {FAULT_ENV}: this session's thread stands still at {point}");
    while crate::signals::check().is_ok() {
        std::thread::sleep(Duration::from_millis(100));
    }
}
