//! The last inspection callbacks (`POST /v1/continue`) by the MACs they named, accepted or refused, so that
//! `ironguardctl explain MAC --timeline` can say "offered, but the ramdisk's data was refused: …" in one command.
//!
//! Kept in this replica's memory only (a callback another replica took shows there), and bounded: at most
//! [`ENTRIES`] entries in all, at most [`MACS_PER_CALLBACK`] MACs per callback, details cut at [`DETAIL_CHARS`]. A
//! flood of made-up callbacks from the PXE network (which `/v1/continue` is open to) only pushes older entries out.

use std::collections::VecDeque;
use std::sync::Mutex;

use ironguard_dataplane::MacAddr;
use ironguard_proto::v1::CallbackSeen;

/// Entries kept in all.
pub const ENTRIES: usize = 4096;
/// MACs of one callback that are recorded (a real inventory has a handful).
pub const MACS_PER_CALLBACK: usize = 16;
/// Characters of a refusal's reason that are kept.
pub const DETAIL_CHARS: usize = 300;
/// Entries one explanation returns at most.
pub const PER_MAC: usize = 5;

#[derive(Debug, Default)]
pub struct CallbackLog {
    entries: Mutex<VecDeque<(MacAddr, CallbackSeen)>>,
}

impl CallbackLog {
    /// Records one callback's outcome under each MAC it named: `Ok(node)` accepted for that node, `Err(why)`.
    pub fn record(&self, macs: &[MacAddr], at_unix_ms: u64, outcome: Result<&str, String>) {
        let seen = match outcome {
            Ok(node) => CallbackSeen { at_unix_ms, accepted: true, node: node.to_string(), detail: String::new() },
            Err(why) => CallbackSeen {
                at_unix_ms,
                accepted: false,
                node: String::new(),
                detail: why.chars().take(DETAIL_CHARS).collect(),
            },
        };
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        for mac in macs.iter().take(MACS_PER_CALLBACK) {
            if entries.len() == ENTRIES {
                entries.pop_front();
            }
            entries.push_back((*mac, seen.clone()));
        }
    }

    /// The last callbacks that named `mac`, newest first.
    pub fn of(&self, mac: MacAddr) -> Vec<CallbackSeen> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.iter().rev().filter(|(m, _)| *m == mac).map(|(_, s)| s.clone()).take(PER_MAC).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(n: u16) -> MacAddr {
        let [a, b] = n.to_be_bytes();
        MacAddr::from_octets([0x52, 0x54, 0, 0, a, b]).unwrap()
    }

    #[test]
    fn newest_first_per_mac_with_the_outcome() {
        let log = CallbackLog::default();
        log.record(&[mac(1), mac(2)], 10, Err("Could not find a node for attributes".into()));
        log.record(&[mac(1)], 20, Ok("node-a"));
        let got = log.of(mac(1));
        assert_eq!(got.len(), 2);
        assert!(got[0].accepted && got[0].node == "node-a" && got[0].at_unix_ms == 20);
        assert!(!got[1].accepted && got[1].detail.contains("Could not find"));
        assert_eq!(log.of(mac(2)).len(), 1);
        assert!(log.of(mac(3)).is_empty());
    }

    #[test]
    fn a_flood_is_bounded_in_entries_macs_and_detail() {
        let log = CallbackLog::default();
        let many: Vec<_> = (0..100).map(mac).collect();
        log.record(&many, 1, Err("x".repeat(10_000)));
        assert!(log.of(mac(15)).len() == 1 && log.of(mac(16)).is_empty(), "16 MACs per callback");
        assert_eq!(log.of(mac(0))[0].detail.len(), DETAIL_CHARS);
        for i in 0..(ENTRIES as u16) {
            log.record(&[mac(1000 + i % 500)], 2, Ok("n"));
        }
        assert!(log.of(mac(0)).is_empty(), "the oldest entries went first");
        assert_eq!(log.entries.lock().unwrap().len(), ENTRIES);
        assert_eq!(log.of(mac(1000)).len(), PER_MAC);
    }
}
