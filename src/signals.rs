//! SIGINT/SIGTERM become a flag that every wait loop polls, so a signal unwinds the run
//! through the normal error path and every verbs resource is released by its `Drop`.
//!
//! A soak (`--interval`) softens the first SIGINT: it asks the run to wind down (the size
//! in progress ends early as if its duration were up, and what it measured is reported and
//! written) instead of stopping at once. A second SIGINT, or a SIGTERM, stops as before.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::error::{Error, Result};

/// The signal that stops the run (0: none).
static STOP: AtomicUsize = AtomicUsize::new(0);
/// The SIGINT that asked a soak to wind down (0: none).
static WIND_DOWN: AtomicUsize = AtomicUsize::new(0);
/// Whether the first SIGINT winds down instead of stopping.
static SOFT: AtomicBool = AtomicBool::new(false);
static INSTALLED: OnceLock<()> = OnceLock::new();

/// Installs the handlers once; later calls are no-ops.
pub fn install() {
    INSTALLED.get_or_init(|| {
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            // SAFETY: the handler only loads and stores atomics (async-signal-safe).
            // Registration only fails for forbidden signals; these two are always allowed.
            let _ = unsafe { signal_hook::low_level::register(sig, move || on_signal(sig)) };
        }
    });
}

fn on_signal(sig: i32) {
    let soft = sig == signal_hook::consts::SIGINT && SOFT.load(Ordering::Relaxed);
    if soft && WIND_DOWN.compare_exchange(0, sig as usize, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
        return;
    }
    STOP.store(sig as usize, Ordering::Relaxed);
}

/// From now on the first SIGINT asks for a wind-down (see the module's docs).
pub fn soften() {
    SOFT.store(true, Ordering::Relaxed);
}

/// The signal that asked us to stop, if any.
pub fn pending() -> Option<i32> {
    Some(STOP.load(Ordering::Relaxed)).filter(|&s| s != 0).map(|s| s as i32)
}

/// The SIGINT that asked a soak to wind down, if one did.
#[inline(always)]
pub fn winding_down() -> Option<i32> {
    Some(WIND_DOWN.load(Ordering::Relaxed)).filter(|&s| s != 0).map(|s| s as i32)
}

/// Err(Interrupted) once a stop signal has arrived.
pub fn check() -> Result<()> {
    match pending() {
        Some(sig) => Err(Error::Interrupted(sig)),
        None => Ok(()),
    }
}
