//! `ironguardctl discovery open|close|list`: rendering the control plane's discovery windows.

use ironguard_proto::v1::DiscoveryWindows;
use serde::Serialize;

use crate::table::Table;

/// The windows open after a call, for text or JSON.
#[derive(Debug, Clone, Serialize)]
pub struct WindowsReport {
    pub windows: Vec<WindowRow>,
    /// Why windows give unknown MACs no DHCP under the control plane's configuration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct WindowRow {
    pub network: String,
    pub until_unix_ms: u64,
    pub remaining_secs: u64,
    pub opened_by: String,
}

impl From<DiscoveryWindows> for WindowsReport {
    fn from(a: DiscoveryWindows) -> Self {
        let windows = a
            .windows
            .into_iter()
            .map(|w| WindowRow {
                network: w.network,
                until_unix_ms: w.until_unix_ms,
                remaining_secs: w.remaining_ms.div_ceil(1000),
                opened_by: w.opened_by,
            })
            .collect();
        Self { windows, note: (!a.note.is_empty()).then_some(a.note) }
    }
}

/// `1h 5m`, `4m 10s`, `9s`.
fn span(secs: u64) -> String {
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m {s}s"),
        _ => format!("{h}h {m}m"),
    }
}

impl WindowsReport {
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Some(n) = &self.note {
            out.push_str(&format!("NOTE: {n}\n"));
        }
        if self.windows.is_empty() {
            out.push_str("no discovery window is open: unknown machines are neither served nor enrolled\n");
            return out;
        }
        let mut t = Table::new(&["NETWORK", "CLOSES IN", "OPENED BY"]);
        for w in &self.windows {
            t.row(vec![w.network.clone(), span(w.remaining_secs), w.opened_by.clone()]);
        }
        out.push_str(&t.render());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ironguard_proto::v1::DiscoveryWindowInfo;

    #[test]
    fn open_windows_are_listed_with_the_time_left_and_a_closed_list_says_so() {
        let r = WindowsReport::from(DiscoveryWindows {
            windows: vec![DiscoveryWindowInfo {
                network: "provisioning".into(),
                until_unix_ms: 1,
                remaining_ms: 1_799_001,
                opened_by: "operator".into(),
            }],
            note: String::new(),
        });
        let text = r.render();
        assert!(text.contains("provisioning") && text.contains("30m 0s") && text.contains("operator"), "{text}");
        let none =
            WindowsReport::from(DiscoveryWindows { windows: vec![], note: "unknown_mac_policy = \"deny\"".into() });
        let text = none.render();
        assert!(text.starts_with("NOTE: unknown_mac_policy") && text.contains("no discovery window is open"), "{text}");
        let json = serde_json::to_value(&none).unwrap_or_default();
        assert_eq!(json["windows"].as_array().map(Vec::len), Some(0), "{json}");
    }

    #[test]
    fn durations_read_as_operators_write_them() {
        use crate::cli::parse_duration;
        use std::time::Duration;
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert!(parse_duration("0m").is_err());
        assert!(parse_duration("5 weeks").is_err());
        assert!(parse_duration("m").is_err());
    }
}
