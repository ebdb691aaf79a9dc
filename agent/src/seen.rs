//! What this host's kernel saw of recent boots, for the status report (and so for `ironguardctl explain MAC
//! --timeline`): per MAC, the DHCP requests that reached the filter, the ones it let through to the local server,
//! and the server's replies to it. The kernel records them itself in bounded, expiring sets
//! ([`ironguard_dataplane::Dataplane::dhcp_seen`]); the agent only reads them when it reports.
//!
//! A report carries at most [`REPORTED`] MACs: the ones that were served (let through or answered) first, then
//! the rest, each group newest first. A flood of made-up addresses from the PXE network, all dropped, cannot push a
//! node that is booting for real out of the report.

use std::sync::Arc;
use std::time::Duration;

use ironguard_dataplane::{MacAddr, MacSeen, Seen};
use ironguard_proto::v1::{DhcpSeen, SeenCount};

/// MACs per report at most.
pub const REPORTED: usize = 128;

/// What one read of the kernel's observation gives the report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SeenReport {
    /// The backend observes (nftables); false for ipset and hostsdir, or when the read failed.
    pub observed: bool,
    pub entries: Vec<DhcpSeen>,
    /// Why it could not be read, if it could not.
    pub error: String,
    /// The kernel's set of requests is full: new MACs are not recorded until old ones expire.
    pub full: bool,
}

/// Reads the kernel's observation (blocking: the report loop runs it on a blocking thread).
pub type SeenSource = Arc<dyn Fn() -> SeenReport + Send + Sync>;

/// The report of one read: `read` is the dataplane's answer, `exclude` the agent's own probe identity (its
/// DISCOVERs are let through and answered twice a second: not a boot), `now_unix_ms` the agent's clock.
pub fn report<E: std::fmt::Display>(
    read: Result<Option<Vec<MacSeen>>, E>,
    exclude: Option<MacAddr>,
    now_unix_ms: u64,
) -> SeenReport {
    match read {
        Ok(Some(all)) => {
            let requested = all.iter().filter(|m| m.requests.count > 0).count();
            let full = requested >= ironguard_dataplane::ruleset::SEEN_SIZE as usize;
            SeenReport { observed: true, entries: select(all, exclude, now_unix_ms), error: String::new(), full }
        }
        Ok(None) => SeenReport {
            observed: false,
            entries: Vec::new(),
            error: "this host's backend does not observe DHCP (only nftables does)".into(),
            full: false,
        },
        Err(e) => SeenReport {
            observed: false,
            entries: Vec::new(),
            error: format!("cannot read what the kernel saw: {e}"),
            full: false,
        },
    }
}

/// The MACs a report carries, in order: served first, newest first, at most [`REPORTED`].
pub fn select(mut all: Vec<MacSeen>, exclude: Option<MacAddr>, now_unix_ms: u64) -> Vec<DhcpSeen> {
    all.retain(|m| Some(m.mac) != exclude);
    let newest = |m: &MacSeen| [m.requests, m.passed, m.answers].iter().filter_map(|s| s.last_ms_ago).min();
    let served = |m: &MacSeen| m.passed.count > 0 || m.answers.count > 0;
    all.sort_by_key(|m| (!served(m), newest(m).unwrap_or(u64::MAX), m.mac));
    all.truncate(REPORTED);
    all.into_iter()
        .map(|m| DhcpSeen {
            mac: m.mac.to_string(),
            requests: Some(count(m.requests, now_unix_ms)),
            passed: Some(count(m.passed, now_unix_ms)),
            answers: Some(count(m.answers, now_unix_ms)),
        })
        .collect()
}

fn count(s: Seen, now_unix_ms: u64) -> SeenCount {
    SeenCount {
        count: s.count,
        last_unix_ms: match (s.count, s.last_ms_ago) {
            (0, _) | (_, None) => 0,
            (_, Some(ago)) => now_unix_ms.saturating_sub(ago).max(1),
        },
    }
}

/// How long the report waits for a read before it goes without one.
pub const READ_BOUND: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(n: u8) -> MacAddr {
        MacAddr::from_octets([0x52, 0x54, 0, 0, 1, n]).unwrap()
    }

    fn seen(count: u64, ago: u64) -> Seen {
        Seen { count, last_ms_ago: (count > 0).then_some(ago) }
    }

    fn m(n: u8, requests: (u64, u64), passed: (u64, u64), answers: (u64, u64)) -> MacSeen {
        MacSeen {
            mac: mac(n),
            requests: seen(requests.0, requests.1),
            passed: seen(passed.0, passed.1),
            answers: seen(answers.0, answers.1),
        }
    }

    #[test]
    fn served_macs_come_first_then_the_newest_and_the_probe_is_left_out() {
        let all = vec![
            m(1, (3, 50), (0, 0), (0, 0)),         // dropped, recent
            m(2, (2, 9000), (2, 9000), (2, 8990)), // served, old
            m(3, (1, 10), (0, 0), (0, 0)),         // dropped, newest
            m(4, (4, 400), (4, 400), (3, 390)),    // served, newer
            m(9, (100, 1), (100, 1), (100, 1)),    // the probe
        ];
        let out = select(all, Some(mac(9)), 1_000_000);
        let order: Vec<_> = out.iter().map(|d| d.mac.clone()).collect();
        assert_eq!(order, [mac(4), mac(2), mac(3), mac(1)].map(|m| m.to_string()));
        let first = &out[0];
        assert_eq!(first.requests.unwrap(), SeenCount { count: 4, last_unix_ms: 1_000_000 - 400 });
        assert_eq!(first.answers.unwrap(), SeenCount { count: 3, last_unix_ms: 1_000_000 - 390 });
        assert_eq!(out[2].passed.unwrap(), SeenCount { count: 0, last_unix_ms: 0 }, "never let through: no time");
    }

    #[test]
    fn a_flood_of_dropped_addresses_cannot_push_a_served_boot_out() {
        let mut all: Vec<_> = (0..=250u8).map(|n| m(n, (1, 1), (0, 0), (0, 0))).collect();
        let booting = MacSeen {
            mac: MacAddr::from_octets([0x52, 0x54, 0, 0, 2, 1]).unwrap(),
            requests: seen(5, 60_000),
            passed: seen(5, 60_000),
            answers: seen(0, 0),
        };
        all.push(booting.clone());
        let out = select(all, None, 10_000_000);
        assert_eq!(out.len(), REPORTED);
        assert_eq!(out[0].mac, booting.mac.to_string());
    }

    #[test]
    fn what_could_not_be_read_says_so() {
        let r = report::<String>(Ok(None), None, 1);
        assert!(!r.observed && r.error.contains("does not observe"));
        let r = report(Err("EPERM"), None, 1);
        assert!(!r.observed && r.error.contains("EPERM"));
        let r = report::<String>(Ok(Some(vec![m(1, (1, 5), (0, 0), (0, 0))])), None, 100);
        assert!(r.observed && r.error.is_empty() && !r.full);
        assert_eq!(r.entries[0].requests.unwrap().last_unix_ms, 95);
        let size = ironguard_dataplane::ruleset::SEEN_SIZE as usize;
        let flood: Vec<_> = (0..size)
            .map(|i| {
                let [a, b] = (i as u16).to_be_bytes();
                MacSeen { mac: MacAddr::from_octets([2, 0, 0, 0, a, b]).unwrap(), ..m(1, (1, 5), (0, 0), (0, 0)) }
            })
            .collect();
        let r = report::<String>(Ok(Some(flood)), None, 100);
        assert!(r.full && r.entries.len() == REPORTED, "a full set is reported as full");
    }
}
