//! Refusal logs that do not flood: a refused call (bad credentials, a rate limit, an oversized body) is logged the
//! first time for each kind and source, then at most once per window with the number left out in between. A
//! hostile or misconfigured client hammering the API costs a log line a minute, not one per request, and the
//! operator still learns that it goes on and how often. Every refusal is also counted in
//! `ironguard_controlplane_refusals_total{kind}`, whether logged or not.
//!
//! The table is bounded: past [`MAX_SOURCES`] sources, entries older than the window are dropped, and if that is
//! not enough, new sources share one entry per kind (an attacker with many addresses cannot grow it).

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

/// How often one kind of refusal from one source is logged at most.
pub const WINDOW: Duration = Duration::from_secs(60);

/// Sources remembered before old entries are dropped.
pub const MAX_SOURCES: usize = 4096;

/// The source of refusals beyond [`MAX_SOURCES`].
const MANY: &str = "(many sources)";

/// Whether to log this refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Log {
    /// Log it; `suppressed` more of the same were left out since the last line.
    Yes { suppressed: u64 },
    /// Already logged within the window.
    No,
}

#[derive(Debug)]
struct Slot {
    logged_at: Instant,
    suppressed: u64,
}

/// The log decisions for each (kind, source).
#[derive(Debug)]
pub struct Throttle {
    window: Duration,
    max_sources: usize,
    slots: Mutex<HashMap<(&'static str, String), Slot>>,
}

impl Throttle {
    pub fn new(window: Duration, max_sources: usize) -> Self {
        Self { window, max_sources, slots: Mutex::new(HashMap::new()) }
    }

    /// Notes a refusal of `kind` from `source` at `now`.
    pub fn check(&self, kind: &'static str, source: &str, now: Instant) -> Log {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let mut key = (kind, source.to_string());
        if !slots.contains_key(&key) && slots.len() >= self.max_sources {
            let window = self.window;
            slots.retain(|_, s| now.saturating_duration_since(s.logged_at) < window);
            if slots.len() >= self.max_sources {
                key = (kind, MANY.to_string());
            }
        }
        match slots.get_mut(&key) {
            Some(s) if now.saturating_duration_since(s.logged_at) < self.window => {
                s.suppressed += 1;
                Log::No
            }
            Some(s) => {
                let suppressed = std::mem::take(&mut s.suppressed);
                s.logged_at = now;
                Log::Yes { suppressed }
            }
            None => {
                slots.insert(key, Slot { logged_at: now, suppressed: 0 });
                Log::Yes { suppressed: 0 }
            }
        }
    }
}

static THROTTLE: LazyLock<Throttle> = LazyLock::new(|| Throttle::new(WINDOW, MAX_SOURCES));
static COUNTS: LazyLock<
    prometheus_client::metrics::family::Family<KindLabel, prometheus_client::metrics::counter::Counter>,
> = LazyLock::new(Default::default);

#[derive(Debug, Clone, PartialEq, Eq, Hash, prometheus_client::encoding::EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

/// The counter family behind `ironguard_controlplane_refusals_total`, for the metrics registry.
pub fn counts() -> prometheus_client::metrics::family::Family<KindLabel, prometheus_client::metrics::counter::Counter> {
    COUNTS.clone()
}

/// Counts a refusal and says whether to log it (`Some(suppressed)`), and how many were left out before it.
pub fn note(kind: &'static str, source: &str) -> Option<u64> {
    COUNTS.get_or_create(&KindLabel { kind: kind.to_string() }).inc();
    match THROTTLE.check(kind, source, Instant::now()) {
        Log::Yes { suppressed } => Some(suppressed),
        Log::No => None,
    }
}

/// Logs a refusal at warn level, throttled per kind and source: `$kind` names it, `$source` is who (address or
/// certificate name), then the fields and message as for `tracing::warn!`. The line carries `suppressed`: how many
/// of the same were left out since the last one.
#[macro_export]
macro_rules! refused {
    ($kind:expr, $source:expr, $($rest:tt)+) => {
        let source = $source.to_string();
        if let Some(suppressed) = $crate::refusals::note($kind, &source) {
            tracing::warn!(refusal = $kind, source = %source, suppressed, $($rest)+);
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_per_window_per_source_with_the_count_left_out() {
        let t = Throttle::new(Duration::from_secs(60), 100);
        let t0 = Instant::now();
        assert_eq!(t.check("token", "10.0.0.1", t0), Log::Yes { suppressed: 0 });
        for i in 1..=500 {
            assert_eq!(t.check("token", "10.0.0.1", t0 + Duration::from_millis(i)), Log::No);
        }
        // Another source, or another kind, is logged at once.
        assert_eq!(t.check("token", "10.0.0.2", t0), Log::Yes { suppressed: 0 });
        assert_eq!(t.check("rate", "10.0.0.1", t0), Log::Yes { suppressed: 0 });
        // After the window: one line saying how many were left out.
        assert_eq!(t.check("token", "10.0.0.1", t0 + Duration::from_secs(61)), Log::Yes { suppressed: 500 });
        assert_eq!(t.check("token", "10.0.0.1", t0 + Duration::from_secs(62)), Log::No);
    }

    #[test]
    fn many_sources_cannot_grow_the_table_past_its_bound() {
        let t = Throttle::new(Duration::from_secs(60), 10);
        let t0 = Instant::now();
        for i in 0..10 {
            assert_eq!(t.check("token", &format!("10.0.0.{i}"), t0), Log::Yes { suppressed: 0 });
        }
        // Full of live entries: the next new sources share one entry (logged once).
        assert_eq!(t.check("token", "10.0.1.1", t0), Log::Yes { suppressed: 0 });
        assert_eq!(t.check("token", "10.0.1.2", t0), Log::No);
        assert_eq!(t.slots.lock().unwrap().len(), 11, "the ten sources and one shared entry for the kind");
        // Once the old entries age out, new sources get their own again.
        let later = t0 + Duration::from_secs(120);
        assert_eq!(t.check("token", "10.0.2.1", later), Log::Yes { suppressed: 0 });
        assert!(t.slots.lock().unwrap().len() <= 11);
    }
}
