//! The alert rules and the Grafana dashboard in `packaging/` must name only metrics that exist: a renamed metric
//! would leave an alert that can never fire.

/// The packaged files that name metrics.
pub const PACKAGED: [(&str, &str); 2] = [
    ("packaging/prometheus/ironguard-alerts.yml", include_str!("../../../packaging/prometheus/ironguard-alerts.yml")),
    ("packaging/grafana/ironguard-dashboard.json", include_str!("../../../packaging/grafana/ironguard-dashboard.json")),
];

/// Every series the packaged files name whose name starts with `prefix` (e.g. `ironguard_agent_`), with the
/// metric family it belongs to: counters and histograms are named by their series (`_total`, `_bucket`, …).
pub fn named_with_prefix(prefix: &str) -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    for (_, text) in PACKAGED {
        for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with(prefix) {
                let family =
                    ["_total", "_bucket", "_sum", "_count"].iter().find_map(|s| word.strip_suffix(s)).unwrap_or(word);
                out.push((word, family));
            }
        }
    }
    out
}

/// The series named in the packaged files whose family `exposition` (a process's `/metrics` text) does not declare
/// with `# TYPE`. A family shows there only once it has a series, so fill labelled families first.
pub fn missing_from(exposition: &str, prefix: &str) -> Vec<&'static str> {
    named_with_prefix(prefix)
        .into_iter()
        .filter(|(_, family)| !exposition.contains(&format!("# TYPE {family} ")))
        .map(|(word, _)| word)
        .collect()
}
