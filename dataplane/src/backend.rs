//! Choosing the dataplane: [`open`] builds what `[dataplane] backends` names — one backend, or several applied
//! together ([`Combined`]) — and the standalone guard commands ([`guard_install`], [`guard_remove`],
//! [`guard_status`]) that run before the DHCP server starts and after the agent stops.

use std::time::Instant;

use crate::dataplane::{ApplyReport, Dataplane};
use crate::guard::{GuardStatus, Installed};
use crate::hostsdir::HostsdirDataplane;
use crate::ipset::IpsetDataplane;
use crate::model::{Backend, Delta, DesiredState, Mode, RulesetConfig, UnknownMacPolicy};
use crate::{KernelDataplane, NftError};

/// Opens the configured backends (validating the configuration first).
pub fn open(config: &RulesetConfig) -> Result<Box<dyn Dataplane>, NftError> {
    config.validate()?;
    let mut parts: Vec<Box<dyn Dataplane>> = Vec::new();
    for b in &config.backends {
        parts.push(open_one(*b, config)?);
    }
    if parts.len() == 1 {
        if let Some(one) = parts.pop() {
            return Ok(one);
        }
    }
    // The kernel backend first: it is the one that gates packets, so it closes first and opens last.
    parts.sort_by_key(|p| !p.kernel_lease() && p.nftables_port().is_none());
    Ok(Box::new(Combined { parts }))
}

fn open_one(b: Backend, config: &RulesetConfig) -> Result<Box<dyn Dataplane>, NftError> {
    Ok(match b {
        Backend::Nftables => Box::new(KernelDataplane::open()?),
        Backend::DnsmasqHostsdir => Box::new(HostsdirDataplane::open(config)?),
        Backend::Ipset => Box::new(IpsetDataplane::open(config)?),
    })
}

/// Several backends driven as one: every call goes to each, in order (the kernel's first). A failure stops at the
/// failing backend; the caller drops to Blocked, which closes every backend.
#[derive(Debug)]
pub struct Combined {
    parts: Vec<Box<dyn Dataplane>>,
}

impl std::fmt::Debug for dyn Dataplane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dyn Dataplane")
    }
}

impl Combined {
    fn each(
        &mut self,
        mut f: impl FnMut(&mut dyn Dataplane) -> Result<ApplyReport, NftError>,
    ) -> Result<ApplyReport, NftError> {
        let mut total = ApplyReport::default();
        for p in &mut self.parts {
            total.add(&f(p.as_mut())?);
        }
        Ok(total)
    }
}

impl Dataplane for Combined {
    fn apply(&mut self, desired: &DesiredState) -> Result<ApplyReport, NftError> {
        self.each(|p| p.apply(desired))
    }

    fn apply_delta(&mut self, delta: &Delta) -> Result<ApplyReport, NftError> {
        self.each(|p| p.apply_delta(delta))
    }

    fn set_mode(&mut self, mode: Mode, policy: UnknownMacPolicy) -> Result<ApplyReport, NftError> {
        self.each(|p| p.set_mode(mode, policy))
    }

    fn refresh_lease(&mut self, until: Option<Instant>) -> Result<ApplyReport, NftError> {
        self.each(|p| p.refresh_lease(until))
    }

    fn lease_until(&self) -> Option<Instant> {
        self.parts.first().and_then(|p| p.lease_until())
    }

    fn lease_rewrite_at(&self) -> Option<Instant> {
        self.parts.iter().filter_map(|p| p.lease_rewrite_at()).min()
    }

    fn committed(&self) -> Option<&DesiredState> {
        self.parts.first().and_then(|p| p.committed())
    }

    fn claim_guard(&mut self, config: &RulesetConfig, hold: bool) -> Result<(), NftError> {
        for p in &mut self.parts {
            p.claim_guard(config, hold)?;
        }
        Ok(())
    }

    fn guard_problems(&self, config: &RulesetConfig, hold: bool) -> Vec<String> {
        self.parts.iter().flat_map(|p| p.guard_problems(config, hold)).collect()
    }

    fn guard_description(&self, hold: bool) -> String {
        self.parts.iter().map(|p| p.guard_description(hold)).collect::<Vec<_>>().join(" + ")
    }

    fn probe_counts(&self) -> Result<Option<crate::ProbeCounts>, NftError> {
        for p in &self.parts {
            if let Some(c) = p.probe_counts()? {
                return Ok(Some(c));
            }
        }
        Ok(None)
    }

    /// The first part that observes (nftables, the only one that does).
    fn dhcp_seen(&self) -> Result<Option<Vec<crate::MacSeen>>, NftError> {
        for p in &self.parts {
            if let Some(seen) = p.dhcp_seen()? {
                return Ok(Some(seen));
            }
        }
        Ok(None)
    }

    fn drift(&self, with_members: bool) -> Result<Vec<String>, NftError> {
        let mut out = vec![];
        for p in &self.parts {
            out.extend(p.drift(with_members)?);
        }
        Ok(out)
    }

    fn nftables_port(&self) -> Option<u32> {
        self.parts.iter().find_map(|p| p.nftables_port())
    }

    fn kernel_lease(&self) -> bool {
        self.parts.iter().any(|p| p.kernel_lease())
    }
}

/// What `ironguard-agent guard install` did, per backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardInstalled {
    /// The nftables guard ([`crate::guard::install`]).
    Nftables(Installed),
    /// The hostsdir's closed state: this many files rewritten.
    Hostsdir { rewritten: usize },
    /// The ipset backend's guard chain.
    Ipset,
}

/// Installs every configured backend's guard: what runs before the DHCP server starts (and, for the hostsdir,
/// after the agent stops).
pub fn guard_install(config: &RulesetConfig) -> Result<Vec<GuardInstalled>, NftError> {
    config.validate()?;
    let mut out = vec![];
    for b in &config.backends {
        out.push(match b {
            Backend::Nftables => GuardInstalled::Nftables(crate::guard::install(config)?),
            Backend::DnsmasqHostsdir => GuardInstalled::Hostsdir { rewritten: HostsdirDataplane::close_all(config)? },
            Backend::Ipset => {
                crate::ipset::guard_install(config)?;
                GuardInstalled::Ipset
            }
        });
    }
    Ok(out)
}

/// Removes every configured backend's guard (decommissioning a PXE host).
pub fn guard_remove(config: &RulesetConfig) -> Result<(), NftError> {
    for b in &config.backends {
        match b {
            Backend::Nftables => crate::guard::remove()?,
            // Files are left as they are (closed): dnsmasq would keep their records anyway.
            Backend::DnsmasqHostsdir => {}
            Backend::Ipset => crate::ipset::guard_remove(config)?,
        }
    }
    Ok(())
}

/// The guards of every configured backend, read back.
pub fn guard_status(config: &RulesetConfig) -> Result<GuardStatus, NftError> {
    let mut status = if config.uses(Backend::Nftables) {
        crate::guard::status(config)?
    } else {
        GuardStatus { installed: true, ..GuardStatus::default() }
    };
    if config.uses(Backend::DnsmasqHostsdir) {
        let found = crate::hostsdir::read_dir(&config.hostsdir.dir)?;
        match found.wildcard {
            Some(crate::hostsdir::Entry::Ignore) => {}
            Some(crate::hostsdir::Entry::Serve) => status.notes.push(format!(
                "{}/{} serves unknown MACs: an agent leads with unknown MACs allowed (or left it so)",
                config.hostsdir.dir.display(),
                crate::hostsdir::UNKNOWN_HOSTS_FILE
            )),
            None => {
                status.installed = false;
                status.problems.push(format!(
                    "{}/{} is missing: run `ironguard-agent guard install` before dnsmasq starts",
                    config.hostsdir.dir.display(),
                    crate::hostsdir::UNKNOWN_HOSTS_FILE
                ));
            }
        }
        status.notes.push(
            "the dnsmasq hostsdir is not enforced by the kernel: a killed or frozen agent leaves it as it was \
             (docs/operations.md)"
                .into(),
        );
    }
    if config.uses(Backend::Ipset) {
        let problems = crate::ipset::guard_problems(config);
        if !problems.is_empty() {
            status.installed = false;
            status.problems.extend(problems);
        }
    }
    Ok(status)
}
