//! How busy the machine was during a run, and with whose work: the bench
//! shares two cores with its own servers, so anything else running at the
//! same time (a build, another test suite) moves its numbers. Each run
//! reports the CPU that processes outside the bench used, so a disturbed run
//! can be told from a real regression.

use std::collections::HashMap;
use std::time::Instant;

/// CPU counters at one instant, in clock ticks (USER_HZ).
#[derive(Clone, Debug)]
pub struct Snapshot {
    at: Instant,
    /// user + nice + system of the whole machine. Interrupt and softirq time
    /// is left out: loopback traffic is processed there, on behalf of the
    /// bench, but charged to no process.
    busy: u64,
    steal: u64,
    /// user + system of this process and every process it started.
    ours: u64,
}

/// What happened between two snapshots, in percent of all cores.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    /// CPU used by processes that are not part of the bench.
    pub other_pct: f64,
    /// CPU the hypervisor gave to someone else.
    pub steal_pct: f64,
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a system constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as f64
    } else {
        100.0
    }
}

/// user + system ticks and parent pid of a process, from /proc/PID/stat.
fn process_ticks(stat: &str) -> Option<(u32, u64)> {
    // The command name may hold spaces and parentheses: fields start after
    // the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 4 (ppid) is index 1 here; utime and stime are fields 14 and 15.
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((ppid, utime + stime))
}

/// CPU ticks of this process and all its descendants.
fn our_ticks() -> u64 {
    let me = std::process::id();
    let mut procs: HashMap<u32, (u32, u64)> = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some(t) = std::fs::read_to_string(entry.path().join("stat"))
                .ok()
                .as_deref()
                .and_then(process_ticks)
            {
                procs.insert(pid, t);
            }
        }
    }
    procs
        .iter()
        .filter(|(pid, _)| {
            // Walk up to init; a short chain, so no memo is needed.
            let mut p = **pid;
            for _ in 0..64 {
                if p == me {
                    return true;
                }
                match procs.get(&p) {
                    Some((parent, _)) if *parent != 0 => p = *parent,
                    _ => return false,
                }
            }
            false
        })
        .map(|(_, (_, ticks))| ticks)
        .sum()
}

impl Snapshot {
    pub fn take() -> Option<Snapshot> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let cpu = stat.lines().next()?.strip_prefix("cpu ")?;
        let f: Vec<u64> = cpu
            .split_whitespace()
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        // user nice system idle iowait irq softirq steal ...
        Some(Snapshot {
            at: Instant::now(),
            busy: f.first()? + f.get(1)? + f.get(2)?,
            steal: *f.get(7).unwrap_or(&0),
            ours: our_ticks(),
        })
    }

    pub fn since(&self, earlier: &Snapshot) -> Usage {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let capacity =
            self.at.duration_since(earlier.at).as_secs_f64() * ticks_per_second() * cores;
        if capacity <= 0.0 {
            return Usage::default();
        }
        let busy = self.busy.saturating_sub(earlier.busy) as f64;
        let ours = self.ours.saturating_sub(earlier.ours) as f64;
        Usage {
            other_pct: ((busy - ours).max(0.0) / capacity * 100.0).min(100.0),
            steal_pct: (self.steal.saturating_sub(earlier.steal) as f64 / capacity * 100.0)
                .min(100.0),
        }
    }
}
