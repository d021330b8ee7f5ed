//! CPU time this process spends during a measurement (user + system, all threads), as a
//! percentage of one core over the wall time. A busy-polling kernel shows about 100 %.

/// Whose CPU time: the process (what reports use) or the calling thread alone.
#[derive(Debug, Clone, Copy)]
pub enum Scope {
    Process,
    Thread,
}

fn cpu_ns(scope: Scope) -> u64 {
    let who = match scope {
        Scope::Process => libc::RUSAGE_SELF,
        Scope::Thread => libc::RUSAGE_THREAD,
    };
    // SAFETY: rusage is a C struct of integers, for which all-zero is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct we own.
    if unsafe { libc::getrusage(who, &mut ru) } != 0 {
        return 0;
    }
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

pub struct CpuMeter {
    scope: Scope,
    cpu_start: u64,
    wall_start: std::time::Instant,
}

impl CpuMeter {
    /// Measures the whole process.
    pub fn start() -> CpuMeter {
        CpuMeter::start_for(Scope::Process)
    }

    pub fn start_for(scope: Scope) -> CpuMeter {
        CpuMeter { scope, cpu_start: cpu_ns(scope), wall_start: std::time::Instant::now() }
    }

    /// Percent of one core used since `start`.
    pub fn percent(&self) -> f64 {
        let wall = self.wall_start.elapsed().as_nanos() as f64;
        if wall <= 0.0 {
            return 0.0;
        }
        (cpu_ns(self.scope).saturating_sub(self.cpu_start)) as f64 / wall * 100.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spinning_shows_about_one_core_and_sleeping_shows_little() {
        // The thread's own time: other tests run in this process at the same time.
        let (m, whole) = (CpuMeter::start_for(Scope::Thread), CpuMeter::start());
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(200) {
            std::hint::spin_loop();
        }
        let busy = m.percent();
        assert!(busy > 50.0 && busy < 110.0, "busy {busy}");
        assert!(whole.percent() >= busy * 0.95, "the process includes the thread");
        let m = CpuMeter::start_for(Scope::Thread);
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(m.percent() < 30.0);
    }
}
