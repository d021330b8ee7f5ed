//! SIGINT/SIGTERM become a flag that every wait loop polls, so a signal unwinds the run
//! through the normal error path and every verbs resource is released by its `Drop`.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Error, Result};

static STOP: OnceLock<Arc<AtomicUsize>> = OnceLock::new();

/// Installs the handlers once; later calls are no-ops.
pub fn install() {
    let flag = STOP.get_or_init(|| Arc::new(AtomicUsize::new(0)));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // Registration only fails for forbidden signals; these two are always allowed.
        let _ = signal_hook::flag::register_usize(sig, Arc::clone(flag), sig as usize);
    }
}

/// The signal that asked us to stop, if any.
pub fn pending() -> Option<i32> {
    STOP.get().map(|f| f.load(Ordering::Relaxed)).filter(|&s| s != 0).map(|s| s as i32)
}

/// Err(Interrupted) once a stop signal has arrived.
pub fn check() -> Result<()> {
    match pending() {
        Some(sig) => Err(Error::Interrupted(sig)),
        None => Ok(()),
    }
}
