//! [`HostsdirDataplane`]: the filter written into dnsmasq's `--dhcp-hostsdir`, in exactly the format of Ironic's
//! `ironic-pxe-filter` and ironic-inspector's dnsmasq PXE filter, so that a dnsmasq configured for either serves
//! (or ignores) what ironguard decides, unchanged.
//!
//! The format (both read a file's meaning from its size, so the bytes must be exactly these):
//!
//! ```text
//! DIR/52:54:00:12:34:56      "52:54:00:12:34:56\n"          served (an allowed MAC)
//! DIR/52:54:00:12:34:57      "52:54:00:12:34:57,ignore\n"   ignored (a denied MAC)
//! DIR/unknown_hosts_filter   "*:*:*:*:*:*\n"                every other MAC served (discovery)
//!                            "*:*:*:*:*:*,ignore\n"         every other MAC ignored
//! ```
//!
//! How dnsmasq reads it (measured with dnsmasq 2.90; see docs/operations.md): a file written and closed, or renamed
//! into the directory, is read within milliseconds (inotify), and its record takes precedence over any older record
//! of the same MAC; an exact MAC beats the wildcard. But records are only ever *added*: a deleted or emptied file
//! keeps its last record until dnsmasq is sent SIGHUP or restarted. So this backend never deletes a file: a MAC
//! that leaves a set keeps its file, rewritten to what the wildcard now says. Files whose names start with `.` are
//! never read, so each file is written as a dot-named temporary and renamed into place (atomic: dnsmasq reads the
//! old content or the new one). A file is rewritten only when its content changes.
//!
//! Modes in dnsmasq's terms: on the leader, allowed MACs are served, denied ones ignored, and the wildcard follows
//! the unknown-MAC policy; a follower or a blocked host ignores everyone (every MAC file and the wildcard say
//! `ignore`). Nothing here is enforced by the kernel: a killed agent leaves the files as they were, and a frozen one
//! does not close at its fence deadline — [`Dataplane::kernel_lease`] is false, and the agent's own timer is the
//! only fence. Run the nftables backend alongside (`backends = ["nftables", "dnsmasq-hostsdir"]`) wherever the
//! kernel has nftables.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tracing::debug;

use crate::dataplane::{ApplyReport, Dataplane};
use crate::model::{Delta, DesiredState, Mode, RulesetConfig, UnknownMacPolicy};
use crate::{MacAddr, NftError};

/// The file that says what happens to every MAC without a file of its own.
pub const UNKNOWN_HOSTS_FILE: &str = "unknown_hosts_filter";
const WILDCARD: &str = "*:*:*:*:*:*";

/// What one hostsdir file says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    Serve,
    Ignore,
}

impl Entry {
    /// The file's bytes for `key` (a MAC or the wildcard).
    pub fn content(self, key: &str) -> String {
        match self {
            Entry::Serve => format!("{key}\n"),
            Entry::Ignore => format!("{key},ignore\n"),
        }
    }

    /// Reads a file's meaning from its content; `None` for anything this backend did not write.
    pub fn parse(key: &str, content: &str) -> Option<Entry> {
        if content == Entry::Serve.content(key) {
            Some(Entry::Serve)
        } else if content == Entry::Ignore.content(key) {
            Some(Entry::Ignore)
        } else {
            None
        }
    }
}

/// What the unknown-hosts file should say for `s`.
pub fn wildcard_entry(s: &DesiredState) -> Entry {
    if s.mode == Mode::Leader && s.unknown_mac_policy == UnknownMacPolicy::Allow { Entry::Serve } else { Entry::Ignore }
}

/// What the file of `m` should say for `s` (the whitelist first, as in the nftables backend).
pub fn entry_for(s: &DesiredState, m: &MacAddr) -> Entry {
    let leader = s.mode == Mode::Leader;
    if leader && s.allow.contains(m) {
        Entry::Serve
    } else if s.deny.contains(m) || !leader {
        Entry::Ignore
    } else {
        wildcard_entry(s)
    }
}

/// What every file of the directory should say for `s`: `(per-MAC entries for every MAC named in `known` or in a
/// set, the wildcard)`. `known` is every MAC that has a file (files are never deleted, see the module docs).
pub fn desired_entries(s: &DesiredState, known: &BTreeSet<MacAddr>) -> (BTreeMap<MacAddr, Entry>, Entry) {
    let all = known.iter().chain(&s.allow).chain(&s.deny);
    (all.map(|m| (*m, entry_for(s, m))).collect(), wildcard_entry(s))
}

/// The hostsdir backend.
#[derive(Debug)]
pub struct HostsdirDataplane {
    dir: PathBuf,
    committed: Option<DesiredState>,
    /// What each MAC's file says, as last written or found when opened.
    files: BTreeMap<MacAddr, Entry>,
    /// What the unknown-hosts file says (`None`: absent or not ours).
    wildcard: Option<Entry>,
    lease_until: Option<Instant>,
    tmp_seq: u64,
}

/// What is in a hostsdir directory, read back.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HostsdirContents {
    pub files: BTreeMap<MacAddr, Entry>,
    pub wildcard: Option<Entry>,
    /// Files this backend did not write (other names, or contents in another format).
    pub foreign: Vec<String>,
}

fn io_error(what: String, source: std::io::Error) -> NftError {
    NftError::Io { what, source }
}

/// Reads `dir`. A missing directory is an error: dnsmasq watches the directory that existed when it started.
pub fn read_dir(dir: &Path) -> Result<HostsdirContents, NftError> {
    let mut out = HostsdirContents::default();
    let entries = std::fs::read_dir(dir).map_err(|e| io_error(format!("reading hostsdir {}", dir.display()), e))?;
    for e in entries {
        let e = e.map_err(|e| io_error(format!("reading hostsdir {}", dir.display()), e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue; // dnsmasq never reads these (our temporaries)
        }
        let content = std::fs::read_to_string(e.path()).unwrap_or_default();
        if name == UNKNOWN_HOSTS_FILE {
            match Entry::parse(WILDCARD, &content) {
                Some(w) => out.wildcard = Some(w),
                None => out.foreign.push(name),
            }
            continue;
        }
        match name.parse::<MacAddr>().ok().and_then(|m| Some((m, Entry::parse(&m.to_string(), &content)?))) {
            Some((m, entry)) => {
                out.files.insert(m, entry);
            }
            None => out.foreign.push(name),
        }
    }
    out.foreign.sort();
    Ok(out)
}

impl HostsdirDataplane {
    /// Opens `config.hostsdir.dir` (creating it if missing, mode 0755) and reads what is there.
    pub fn open(config: &RulesetConfig) -> Result<Self, NftError> {
        let dir = config.hostsdir.dir.clone();
        std::fs::create_dir_all(&dir).map_err(|e| io_error(format!("creating hostsdir {}", dir.display()), e))?;
        let found = read_dir(&dir)?;
        Ok(Self { dir, committed: None, files: found.files, wildcard: found.wildcard, lease_until: None, tmp_seq: 0 })
    }

    /// The directory written.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes one file atomically: a dot-named temporary (never read by dnsmasq) renamed over the file.
    fn write_file(&mut self, name: &str, content: &str) -> Result<(), NftError> {
        self.tmp_seq += 1;
        let tmp = self.dir.join(format!(".ironguard-{}-{}", std::process::id(), self.tmp_seq));
        let path = self.dir.join(name);
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(content.as_bytes())?;
            // dnsmasq re-reads the directory after dropping its privileges: the files must be readable by all.
            f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
            drop(f);
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io_error(format!("writing {}", path.display()), e)
        })
    }

    /// Brings the directory to `next`: rewrites every file whose content changes, the wildcard last when it opens
    /// and first when it closes (so no MAC is served in between that neither state serves). Returns the report; on
    /// error the files written so far stay written and the caller (the agent) drops to Blocked.
    fn converge(&mut self, next: &DesiredState) -> Result<ApplyReport, NftError> {
        let known: BTreeSet<MacAddr> = self.files.keys().copied().collect();
        let (files, wildcard) = desired_entries(next, &known);
        self.write_entries(files, wildcard)
    }

    /// Like [`Self::converge`] when only `macs` may have changed (a delta: the mode and policy, hence the
    /// wildcard, are the same): costs what the delta names, not what the directory holds.
    fn converge_macs(&mut self, next: &DesiredState, macs: &[MacAddr]) -> Result<ApplyReport, NftError> {
        let files = macs.iter().map(|m| (*m, entry_for(next, m))).collect();
        self.write_entries(files, wildcard_entry(next))
    }

    fn write_entries(&mut self, files: BTreeMap<MacAddr, Entry>, wildcard: Entry) -> Result<ApplyReport, NftError> {
        let start = Instant::now();
        let mut writes = 0usize;
        let closing = wildcard == Entry::Ignore;
        if closing && self.wildcard != Some(wildcard) {
            self.write_file(UNKNOWN_HOSTS_FILE, &wildcard.content(WILDCARD))?;
            self.wildcard = Some(wildcard);
            writes += 1;
        }
        // Closing files first, then opening ones.
        for pass in [Entry::Ignore, Entry::Serve] {
            for (m, e) in files.iter().filter(|(_, e)| **e == pass) {
                if self.files.get(m) != Some(e) {
                    self.write_file(&m.to_string(), &e.content(&m.to_string()))?;
                    self.files.insert(*m, *e);
                    writes += 1;
                }
            }
        }
        if self.wildcard != Some(wildcard) {
            self.write_file(UNKNOWN_HOSTS_FILE, &wildcard.content(WILDCARD))?;
            self.wildcard = Some(wildcard);
            writes += 1;
        }
        debug!(writes, dir = %self.dir.display(), "hostsdir converged");
        Ok(ApplyReport {
            transactions: u32::from(writes > 0),
            messages: writes as u32,
            bytes: 0,
            elements: writes,
            elapsed: start.elapsed(),
            lease_rewrites: 0,
        })
    }

    /// Writes the closed state for every file found: what `guard install` does before dnsmasq starts, and what the
    /// packaged agent unit runs after the agent stops, however it stopped (SIGKILL too: its `ExecStopPost=`).
    pub fn close_all(config: &RulesetConfig) -> Result<usize, NftError> {
        let mut dp = Self::open(config)?;
        let closed = DesiredState::blocked(config.clone());
        Ok(dp.converge(&closed)?.elements)
    }
}

impl Dataplane for HostsdirDataplane {
    /// Reads the directory again first (a full apply is also how drift is repaired), then writes what differs.
    fn apply(&mut self, desired: &DesiredState) -> Result<ApplyReport, NftError> {
        desired.config.validate()?;
        let found = read_dir(&self.dir)?;
        self.files = found.files;
        self.wildcard = found.wildcard;
        let r = self.converge(desired)?;
        self.committed = Some(desired.clone());
        Ok(r)
    }

    /// Rewrites only the files of the MACs the delta changes. On error the files written so far stay written
    /// (`self.files` knows which), and the agent's drop to Blocked rewrites whatever is left open.
    fn apply_delta(&mut self, delta: &Delta) -> Result<ApplyReport, NftError> {
        let mut next = self.committed.take().ok_or(NftError::NotInitialised)?;
        let eff = next.merge(delta);
        let named: Vec<MacAddr> = eff
            .allow_add
            .iter()
            .chain(&eff.allow_remove)
            .chain(&eff.deny_add)
            .chain(&eff.deny_remove)
            .copied()
            .collect();
        let r = self.converge_macs(&next, &named);
        self.committed = Some(next);
        r
    }

    fn set_mode(&mut self, mode: Mode, policy: UnknownMacPolicy) -> Result<ApplyReport, NftError> {
        let cur = self.committed.clone().ok_or(NftError::NotInitialised)?;
        let next = DesiredState { mode, unknown_mac_policy: policy, ..cur };
        let r = self.converge(&next)?;
        self.committed = Some(next);
        Ok(r)
    }

    /// Nothing to write: dnsmasq has no notion of a lease. The deadline is kept for [`Dataplane::lease_until`]; the
    /// agent's own timer closes the files at its fence deadline.
    fn refresh_lease(&mut self, until: Option<Instant>) -> Result<ApplyReport, NftError> {
        self.committed.as_ref().ok_or(NftError::NotInitialised)?;
        self.lease_until = until.filter(|u| *u > Instant::now());
        Ok(ApplyReport { elapsed: Duration::ZERO, ..ApplyReport::default() })
    }

    fn lease_until(&self) -> Option<Instant> {
        self.lease_until
    }

    fn committed(&self) -> Option<&DesiredState> {
        self.committed.as_ref()
    }

    /// The closed state (every file `ignore`), unless this agent has committed a state: then that state again.
    fn claim_guard(&mut self, config: &RulesetConfig, _hold: bool) -> Result<(), NftError> {
        let found = read_dir(&self.dir)?;
        self.files = found.files;
        self.wildcard = found.wildcard;
        let next = self.committed.clone().unwrap_or_else(|| DesiredState::blocked(config.clone()));
        self.converge(&next).map(|_| ())
    }

    fn guard_problems(&self, _config: &RulesetConfig, _hold: bool) -> Vec<String> {
        let found = match read_dir(&self.dir) {
            Ok(f) => f,
            Err(e) => return vec![e.to_string()],
        };
        let mut p = vec![];
        if found.wildcard.is_none() {
            p.push(format!(
                "{}/{UNKNOWN_HOSTS_FILE} is missing or not ours: dnsmasq serves unknown MACs unless its configuration \
                 ignores them (dhcp-ignore=tag:!known)",
                self.dir.display()
            ));
        }
        p
    }

    fn guard_description(&self, _hold: bool) -> String {
        format!(
            "dnsmasq hostsdir {} (no kernel guard: closed files, written before dnsmasq starts and after the agent \
             stops)",
            self.dir.display()
        )
    }

    fn drift(&self, _with_members: bool) -> Result<Vec<String>, NftError> {
        let Some(s) = &self.committed else { return Ok(vec!["nothing committed yet".into()]) };
        let found = read_dir(&self.dir)?;
        let known: BTreeSet<MacAddr> = self.files.keys().chain(found.files.keys()).copied().collect();
        let (want, wildcard) = desired_entries(s, &known);
        let mut out = vec![];
        if found.wildcard != Some(wildcard) {
            out.push(format!(
                "hostsdir: {UNKNOWN_HOSTS_FILE} says {:?}, {wildcard:?} desired",
                found.wildcard.map_or("nothing of ours".to_string(), |w| format!("{w:?}"))
            ));
        }
        let wrong: Vec<String> = want
            .iter()
            .filter(|(m, e)| found.files.get(m) != Some(e))
            .map(|(m, e)| format!("{m} ({e:?} desired)"))
            .take(5)
            .collect();
        let n_wrong = want.iter().filter(|(m, e)| found.files.get(m) != Some(e)).count();
        if n_wrong > 0 {
            out.push(format!("hostsdir: {n_wrong} MAC files differ, e.g. {}", wrong.join(", ")));
        }
        if !found.foreign.is_empty() {
            out.push(format!(
                "hostsdir: {} files ironguard did not write (e.g. {}); dnsmasq reads them too",
                found.foreign.len(),
                found.foreign.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(n: u8) -> MacAddr {
        MacAddr::from_octets([0x52, 0x54, 0, 0, 0, n]).unwrap()
    }

    fn dir(tag: &str) -> RulesetConfig {
        let d = std::env::temp_dir().join(format!("ig-hostsdir-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        RulesetConfig {
            backends: vec![crate::Backend::DnsmasqHostsdir],
            hostsdir: crate::model::HostsdirConfig { dir: d },
            ..RulesetConfig::default()
        }
    }

    fn file(c: &RulesetConfig, name: &str) -> String {
        std::fs::read_to_string(c.hostsdir.dir.join(name)).unwrap()
    }

    #[test]
    fn writes_ironics_format_and_never_deletes() {
        let c = dir("format");
        let mut dp = HostsdirDataplane::open(&c).unwrap();
        let mut s = DesiredState::blocked(c.clone());
        s.allow.insert(mac(1));
        s.deny.insert(mac(2));
        dp.apply(&s).unwrap();
        // Blocked: everything ignored.
        assert_eq!(file(&c, "52:54:00:00:00:01"), "52:54:00:00:00:01,ignore\n");
        assert_eq!(file(&c, UNKNOWN_HOSTS_FILE), "*:*:*:*:*:*,ignore\n");
        dp.set_mode(Mode::Leader, UnknownMacPolicy::Allow).unwrap();
        assert_eq!(file(&c, "52:54:00:00:00:01"), "52:54:00:00:00:01\n");
        assert_eq!(file(&c, "52:54:00:00:00:02"), "52:54:00:00:00:02,ignore\n");
        assert_eq!(file(&c, UNKNOWN_HOSTS_FILE), "*:*:*:*:*:*\n");
        // A MAC that leaves the deny set is unknown: its file says what the wildcard says, and stays.
        dp.apply_delta(&Delta { deny_remove: vec![mac(2)], ..Default::default() }).unwrap();
        assert_eq!(file(&c, "52:54:00:00:00:02"), "52:54:00:00:00:02\n");
        dp.set_mode(Mode::Follower, UnknownMacPolicy::Allow).unwrap();
        for name in ["52:54:00:00:00:01", "52:54:00:00:00:02"] {
            assert!(file(&c, name).ends_with(",ignore\n"), "follower: {name} ignored");
        }
        assert!(dp.drift(true).unwrap().is_empty(), "{:?}", dp.drift(true));
        let names: Vec<String> = std::fs::read_dir(&c.hostsdir.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 3, "two MAC files and the wildcard, no temporaries left: {names:?}");
        let _ = std::fs::remove_dir_all(&c.hostsdir.dir);
    }

    #[test]
    fn a_reopened_directory_is_read_back_and_tampering_is_drift() {
        let c = dir("reopen");
        let mut dp = HostsdirDataplane::open(&c).unwrap();
        let mut s = DesiredState::blocked(c.clone());
        s.mode = Mode::Leader;
        s.unknown_mac_policy = UnknownMacPolicy::Deny;
        s.allow.insert(mac(1));
        dp.apply(&s).unwrap();
        let again = HostsdirDataplane::open(&c).unwrap();
        assert_eq!(again.files.get(&mac(1)), Some(&Entry::Serve));
        assert_eq!(again.wildcard, Some(Entry::Ignore));
        // Someone allows a MAC by hand, and opens the wildcard.
        std::fs::write(c.hostsdir.dir.join("52:54:00:00:00:09"), "52:54:00:00:00:09\n").unwrap();
        std::fs::write(c.hostsdir.dir.join(UNKNOWN_HOSTS_FILE), "*:*:*:*:*:*\n").unwrap();
        let d = dp.drift(true).unwrap();
        assert!(d.iter().any(|x| x.contains(UNKNOWN_HOSTS_FILE)), "{d:?}");
        assert!(d.iter().any(|x| x.contains("52:54:00:00:00:09")), "{d:?}");
        // The repair (what the agent does on drift) closes both.
        dp.claim_guard(&c, false).unwrap();
        assert_eq!(file(&c, "52:54:00:00:00:09"), "52:54:00:00:00:09,ignore\n");
        assert_eq!(file(&c, UNKNOWN_HOSTS_FILE), "*:*:*:*:*:*,ignore\n");
        assert!(dp.drift(true).unwrap().is_empty());
        let _ = std::fs::remove_dir_all(&c.hostsdir.dir);
    }

    #[test]
    fn foreign_files_are_reported_not_touched() {
        let c = dir("foreign");
        std::fs::create_dir_all(&c.hostsdir.dir).unwrap();
        std::fs::write(c.hostsdir.dir.join("operator-notes"), "hello\n").unwrap();
        std::fs::write(c.hostsdir.dir.join("52:54:00:00:00:07"), "52:54:00:00:00:07,set:foo\n").unwrap();
        let mut dp = HostsdirDataplane::open(&c).unwrap();
        dp.apply(&DesiredState::blocked(c.clone())).unwrap();
        let d = dp.drift(true).unwrap();
        assert!(d.iter().any(|x| x.contains("2 files ironguard did not write")), "{d:?}");
        assert_eq!(file(&c, "operator-notes"), "hello\n");
        let _ = std::fs::remove_dir_all(&c.hostsdir.dir);
    }
}
