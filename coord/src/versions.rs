//! Which etcd servers lack fixes that ironguard's leases and fencing rely on.
//!
//! ironguard's safety rests on etcd's leases: a leader's kernel lease is refreshed only after a keep-alive etcd
//! answered, and a singleton write commits only while its leader's key lives. etcd fixed bugs that undermine exactly
//! that on each release line (etcd's CHANGELOG-3.4, -3.5 and -3.6); [`FIXES`] lists them with the first release of
//! each line that has them. [`missing`] says which a server version lacks; the agent and the control plane read
//! each endpoint's version at start ([`crate::etcd::EtcdCoordinator::server_versions`]) and warn, in their logs, a
//! metric and `ironguardctl agents`, with [`warning`]'s words.

/// A fix in etcd, and the first release of each line that has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EtcdFix {
    /// What went wrong without it, in words.
    pub what: &'static str,
    /// The first fixed release of each line, `(major, minor, patch)`. A line older than all of them lacks the fix;
    /// a line newer than one listed and not listed itself was released with it.
    pub fixed_in: &'static [(u32, u32, u32)],
}

/// The fixes ironguard relies on.
pub const FIXES: &[EtcdFix] = &[
    EtcdFix {
        what: "leases wrongly revoked by a former etcd leader (etcd PR 17425)",
        fixed_in: &[(3, 4, 31), (3, 5, 13)],
    },
    EtcdFix {
        what: "a lease keep-alive answered as successful after the lease was revoked (etcd PR 20616)",
        fixed_in: &[(3, 4, 38), (3, 5, 23), (3, 6, 5)],
    },
    EtcdFix {
        what: "a race between a read index and an etcd leader change (etcd PR 21387)",
        fixed_in: &[(3, 4, 42), (3, 5, 28), (3, 6, 9)],
    },
    EtcdFix {
        what: "stale reads after an etcd process pause (etcd PR 21421)",
        fixed_in: &[(3, 4, 42), (3, 5, 28), (3, 6, 9)],
    },
];

/// The releases that have every fix of [`FIXES`], in words.
pub const RECOMMENDED: &str = "3.5.28 or 3.6.9 or later (3.4.42 on the 3.4 line)";

/// `major.minor.patch` of a version string such as `3.5.16` or `3.6.0-rc.1` (a missing patch is 0).
pub fn parse(version: &str) -> Option<(u32, u32, u32)> {
    let core = version.trim().trim_start_matches('v');
    let core = core.split(['-', '+']).next().unwrap_or_default();
    let mut parts = core.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = match parts.next() {
        Some(p) => p.parse().ok()?,
        None => 0,
    };
    Some((major, minor, patch))
}

/// The fixes of [`FIXES`] that `version` lacks; `None` when the version cannot be read.
pub fn missing(version: &str) -> Option<Vec<&'static EtcdFix>> {
    let v = parse(version)?;
    Some(FIXES.iter().filter(|f| lacks(v, f)).collect())
}

fn lacks(v: (u32, u32, u32), fix: &EtcdFix) -> bool {
    let line = (v.0, v.1);
    match fix.fixed_in.iter().find(|f| (f.0, f.1) == line) {
        Some(first) => v < *first,
        // not a listed line: older than every listed line lacks it, newer ones were released with it
        None => fix.fixed_in.iter().all(|f| line < (f.0, f.1)),
    }
}

/// What to say about `endpoint` answering with `version`: `None` when it has every fix.
pub fn warning(endpoint: &str, version: &str) -> Option<String> {
    let Some(missing) = missing(version) else {
        return Some(format!(
            "etcd at {endpoint} reports version {version:?}, which ironguard cannot read: make sure it is \
             {RECOMMENDED}"
        ));
    };
    if missing.is_empty() {
        return None;
    }
    let list: Vec<&str> = missing.iter().map(|f| f.what).collect();
    Some(format!(
        "etcd at {endpoint} runs {version}, without the fixes for {}: ironguard's leases and fencing rely on them; \
         upgrade etcd to {RECOMMENDED}",
        list.join("; ")
    ))
}

/// How often the versions are read again once read (a rolling upgrade changes them).
const RECHECK: std::time::Duration = std::time::Duration::from_secs(6 * 3600);
/// How soon they are read again while no endpoint answered.
const RETRY: std::time::Duration = std::time::Duration::from_secs(60);

/// Reads the versions of `cfg`'s servers in the background, at once and then every 6 hours (every minute until one
/// answers): each server lacking a fix is logged as a warning, and `outdated` is told how many do. Returns the
/// warnings of the last read (empty until then). Without etcd: no task, no warning, and `outdated(0)`.
pub fn watch(
    cfg: &crate::EtcdConfig,
    outdated: impl Fn(usize) + Send + 'static,
) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    let shared = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    if !cfg.enabled() {
        outdated(0);
        return shared;
    }
    let (cfg, out) = (cfg.clone(), shared.clone());
    tokio::spawn(async move {
        loop {
            let versions = crate::etcd::EtcdCoordinator::server_versions(&cfg).await;
            let answered: Vec<String> =
                versions.iter().filter_map(|(e, v)| v.as_ref().ok().map(|v| format!("{e} {v}"))).collect();
            if answered.is_empty() {
                tokio::time::sleep(RETRY).await;
                continue;
            }
            let warnings = crate::etcd::EtcdCoordinator::version_warnings(&versions);
            for w in &warnings {
                tracing::warn!("{w}");
            }
            if warnings.is_empty() {
                tracing::info!(
                    servers = %answered.join(", "),
                    "the etcd servers have the lease and read fixes ironguard relies on"
                );
            }
            outdated(warnings.len());
            *out.lock().unwrap_or_else(|e| e.into_inner()) = warnings;
            tokio::time::sleep(RECHECK).await;
        }
    });
    shared
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_with_their_suffixes() {
        assert_eq!(parse("3.4.23"), Some((3, 4, 23)));
        assert_eq!(parse("v3.6.0-rc.1"), Some((3, 6, 0)));
        assert_eq!(parse("3.5"), Some((3, 5, 0)));
        assert_eq!(parse("3.x.1"), None);
        assert_eq!(parse(""), None);
    }

    #[test]
    fn each_line_needs_its_own_first_fixed_release() {
        let n = |v: &str| missing(v).map(|m| m.len());
        // Debian 12's and Debian 13's packages, and the releases just before and at the last fixes
        assert_eq!(n("3.4.23"), Some(4));
        assert_eq!(n("3.5.16"), Some(3), "3.5.16 has the fix of 3.5.13 only");
        assert_eq!(n("3.5.27"), Some(2));
        assert_eq!(n("3.5.28"), Some(0));
        assert_eq!(n("3.4.41"), Some(2));
        assert_eq!(n("3.4.42"), Some(0));
        // 3.6 was released with the fix of 3.5.13; it lacks the later ones until 3.6.5 and 3.6.9
        assert_eq!(n("3.6.0"), Some(3));
        assert_eq!(n("3.6.9"), Some(0));
        // an older line lacks everything; a newer one has everything
        assert_eq!(n("3.3.27"), Some(4));
        assert_eq!(n("3.7.0"), Some(0));
        assert_eq!(n("junk"), None);
    }

    #[test]
    fn the_warning_names_the_endpoint_the_bugs_and_the_way_out() {
        let w = warning("http://10.0.0.1:2379", "3.4.23").unwrap_or_default();
        assert!(w.contains("http://10.0.0.1:2379") && w.contains("3.4.23") && w.contains("PR 20616"), "{w}");
        assert!(w.contains(RECOMMENDED), "{w}");
        assert_eq!(warning("e", "3.5.28"), None);
        assert!(warning("e", "junk").is_some_and(|w| w.contains("cannot read")));
    }
}
