//! Where rails' threads run: each rail on CPUs of its NIC's NUMA node when sysfs says
//! which and this process may run there, never outside the process's CPU set
//! (`sched_getaffinity`: a pod's cgroup or `taskset` decides it, not us).

/// CPU numbers of a sysfs cpulist ("0-3,8,10-11"); malformed parts are skipped.
pub fn parse_cpulist(text: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
                    cpus.extend(a..=b.min(a + 4096));
                }
            }
            None => cpus.extend(part.trim().parse::<usize>().ok()),
        }
    }
    cpus
}

/// The CPUs this process may run on.
pub fn allowed() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity fills the one we own.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return (0..std::thread::available_parallelism().map_or(1, |c| c.get())).collect();
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

/// The CPUs of NUMA node `node`, from sysfs.
pub fn of_numa_node(node: i32) -> Vec<usize> {
    std::fs::read_to_string(format!("/sys/devices/system/node/node{node}/cpulist"))
        .map(|t| parse_cpulist(&t))
        .unwrap_or_default()
}

/// Pins the calling thread to `cpu`.
pub fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; we set one bit and apply it to this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// CPUs for each rail's `threads` threads: rail i takes CPUs of its NUMA node's share of
/// `allowed` (`node_cpus(node)`), any allowed CPU when the node is unknown or has none
/// allowed. Rails on one node take different CPUs while there are enough; beyond that
/// they wrap around.
pub fn plan(
    numa_nodes: &[Option<i32>],
    threads: usize,
    allowed: &[usize],
    node_cpus: impl Fn(i32) -> Vec<usize>,
) -> Vec<Vec<usize>> {
    let threads = threads.max(1);
    let mut next_in_pool: std::collections::BTreeMap<Option<i32>, usize> = Default::default();
    numa_nodes
        .iter()
        .map(|&node| {
            let on_node: Vec<usize> = node.map(&node_cpus).unwrap_or_default();
            let mut pool: Vec<usize> = allowed.iter().copied().filter(|c| on_node.contains(c)).collect();
            let key = if pool.is_empty() { None } else { node };
            if pool.is_empty() {
                pool = allowed.to_vec();
            }
            if pool.is_empty() {
                return Vec::new();
            }
            let next = next_in_pool.entry(key).or_default();
            let cpus = (0..threads).map(|t| pool[(*next + t) % pool.len()]).collect();
            *next += threads;
            cpus
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists() {
        assert_eq!(parse_cpulist("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpulist(""), Vec::<usize>::new());
        assert_eq!(parse_cpulist("x,2"), vec![2]);
    }

    #[test]
    fn rails_go_to_their_numa_node_within_the_allowed_set() {
        let nodes = |n: i32| if n == 0 { (0..4).collect() } else { (4..8).collect() };
        let allowed: Vec<usize> = vec![1, 2, 3, 5, 6];
        // Two rails on node 0, one on node 1, one unknown; one thread each.
        let p = plan(&[Some(0), Some(0), Some(1), None], 1, &allowed, nodes);
        assert_eq!(p, vec![vec![1], vec![2], vec![5], vec![1]]);
        // A node with none of its CPUs allowed falls back to the allowed set.
        let p = plan(&[Some(1)], 2, &[0, 1], nodes);
        assert_eq!(p, vec![vec![0, 1]]);
        // More threads than CPUs wrap around, never leaving the allowed set.
        let p = plan(&[Some(0), Some(0)], 2, &[1, 2, 3], nodes);
        assert_eq!(p, vec![vec![1, 2], vec![3, 1]]);
    }
}
