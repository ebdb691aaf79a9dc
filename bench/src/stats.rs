//! Small helpers shared by the benchmarks: test MACs, medians and percentiles of durations, table formatting.

use std::time::Duration;

use ironguard_dataplane::MacAddr;

/// `n` distinct unicast MACs `02:TAG:xx:xx:xx:01` (a tag per benchmark keeps sets apart).
pub fn macs(n: usize, tag: u8) -> Vec<MacAddr> {
    (0..n)
        .map(|i| MacAddr::from_octets([0x02, tag, (i >> 16) as u8, (i >> 8) as u8, i as u8, 0x01]))
        .collect::<Result<_, _>>()
        .unwrap_or_default()
}

/// Sorted samples of one measurement.
#[derive(Debug, Clone)]
pub struct Samples(Vec<Duration>);

impl Samples {
    pub fn new(mut v: Vec<Duration>) -> Self {
        v.sort();
        Self(v)
    }

    pub fn percentile(&self, p: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        let idx = ((self.0.len() - 1) as f64 * p / 100.0).round() as usize;
        self.0[idx.min(self.0.len() - 1)]
    }

    pub fn median(&self) -> Duration {
        self.percentile(50.0)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Every sample, smallest first.
    pub fn sorted(&self) -> &[Duration] {
        &self.0
    }

    /// Every sample, smallest first, for logs.
    pub fn list(&self) -> String {
        self.0.iter().map(|d| human(*d)).collect::<Vec<_>>().join(" ")
    }
}

/// Milliseconds as a float, for JSON.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Human formatting: µs under 1 ms, ms under 10 s, s above.
pub fn human(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else if us < 10e6 {
        format!("{:.1} ms", us / 1e3)
    } else {
        format!("{:.1} s", us / 1e6)
    }
}

/// A `/proc/PID/status` field in KiB (`VmRSS:`, `VmHWM:`), 0 if the process or field is gone.
pub fn vm_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}
