//! Typed drift against the real kernel: rules are read back by what their expressions do, not by their comments.
//!
//! - The fake follows the real thing: for the same states, `FakeDataplane`'s read-back equals the kernel's
//!   (statements, chains, hooks, devices, sets), on the request side and on the egress twin.
//! - The real agent (leader, unknown MACs denied, `[guard] claim = false` so that `nft` may edit the guard) has its
//!   guard edited with `nft` while it is frozen: the rule turned to `accept`, the drop deleted, another port,
//!   another mark. Each is named by the read-back's drift before the repair (and an accepting guard is
//!   UNGUARDED in `ironguardctl chains`, whatever its comment says); once thawed, the agent repairs it (the kernel
//!   reads back as built); an unknown MAC is not served meanwhile. The agent's own table cannot be edited this
//!   way (the kernel refuses every process but its owner, EPERM): its edits are covered by observe.rs' unit tests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use ironguard_dataplane::rule::Stmt;
use ironguard_dataplane::{
    Dataplane, Delta, DesiredState, FakeDataplane, KernelDataplane, MacAddr, Mode, Observed, RulesetConfig,
    UnknownMacPolicy,
};
use ironguard_netns_tests::shapes::*;
use ironguard_netns_tests::*;
use nix::sys::signal::Signal;

const ALLOWED: &str = "52:54:00:d1:00:01";
const DENIED: &str = "52:54:00:d1:00:02";
const UNKNOWN: &str = "52:54:00:d1:00:99";

/// What varies between two reads of the same state: rule handles, counters, the owner's port, the lease's
/// remaining time.
fn normalized(mut o: Observed) -> Observed {
    for t in [&mut o.guard, &mut o.owned, &mut o.egress_guard, &mut o.egress_owned].into_iter().flatten() {
        t.owner_portid = t.owner_portid.map(|_| 0);
        for c in &mut t.chains {
            for r in &mut c.rules {
                r.handle = 0;
                r.packets = r.packets.map(|_| 0);
                r.bytes = r.bytes.map(|_| 0);
            }
        }
        for s in &mut t.sets {
            s.expires_in_ms = s.expires_in_ms.map(|_| 0);
        }
    }
    o
}

fn macs(list: &[&str]) -> std::collections::BTreeSet<MacAddr> {
    list.iter().map(|m| mac(m)).collect()
}

/// Compares the fake's read-back with the kernel's after each step.
fn same_read_back(kernel: &KernelDataplane, fake: &FakeDataplane, step: &str) {
    let k = normalized(kernel.observe(true).unwrap());
    let f = normalized(fake.observe(true).unwrap());
    assert_eq!(f, k, "{step}: the fake's read-back (left) differs from the kernel's (right)");
    let rules: Vec<_> = [&k.owned, &k.egress_owned, &k.guard, &k.egress_guard]
        .into_iter()
        .flatten()
        .flat_map(|t| &t.chains)
        .flat_map(|c| &c.rules)
        .collect();
    assert!(rules.len() >= 4, "{step}: the kernel holds the rules: {k:#?}");
    let unknown = rules.iter().filter(|r| r.statements.iter().any(|s| matches!(s, Stmt::Unknown(_)))).count();
    assert_eq!(unknown, 0, "{step}: every expression the kernel holds was decoded: {k:#?}");
    assert_eq!(kernel.drift(true).unwrap(), Vec::<String>::new(), "{step}: kernel drift");
    assert_eq!(fake.drift(true).unwrap(), Vec::<String>::new(), "{step}: fake drift");
    assert_eq!(f.verdict(), k.verdict(), "{step}");
}

#[test]
fn the_fakes_read_back_equals_the_kernels() {
    let ns = Netns::new("contract");
    for dev in ["e0", "e1"] {
        ns.ip(&["link", "add", dev, "type", "bridge"]);
        ns.ip(&["link", "set", dev, "up"]);
    }
    let configs = vec![
        RulesetConfig { interfaces: vec!["e0".into()], ..Default::default() },
        RulesetConfig {
            interfaces: vec!["e0".into(), "e1".into()],
            ports: vec![67, 4011],
            hooks: vec![ironguard_dataplane::HookKind::Input, ironguard_dataplane::HookKind::Forward],
            egress_interfaces: vec!["e1".into(), "e0".into()],
            mark: 0x0000_0100,
            mask: 0x0000_0f00,
            ..Default::default()
        },
        RulesetConfig {
            hooks: vec![],
            egress_interfaces: vec!["e0".into()],
            match_mode: ironguard_dataplane::MatchMode::Chaddr,
            ..Default::default()
        },
    ];
    in_netns(&ns, move || {
        for config in configs {
            let mut kernel = KernelDataplane::open().unwrap();
            let mut fake = FakeDataplane::new();
            kernel.claim_guard(&config, false).unwrap();
            fake.claim_guard(&config, false).unwrap();
            let state = DesiredState {
                config: config.clone(),
                mode: Mode::Leader,
                unknown_mac_policy: UnknownMacPolicy::Allow,
                allow: macs(&[ALLOWED]),
                deny: macs(&[DENIED]),
            };
            let what = format!("{config:?}");
            for dp in [&mut kernel as &mut dyn Dataplane, &mut fake] {
                dp.apply(&state).unwrap();
            }
            same_read_back(&kernel, &fake, &format!("leader, no lease, {what}"));
            let until = Instant::now() + Duration::from_secs(60);
            for dp in [&mut kernel as &mut dyn Dataplane, &mut fake] {
                dp.refresh_lease(Some(until)).unwrap();
            }
            same_read_back(&kernel, &fake, &format!("leader, {what}"));
            type Step = Box<dyn Fn(&mut dyn Dataplane)>;
            let steps: Vec<(&str, Step)> = vec![
                (
                    "policy deny",
                    Box::new(|dp| {
                        dp.set_mode(Mode::Leader, UnknownMacPolicy::Deny).unwrap();
                    }),
                ),
                (
                    "follower",
                    Box::new(|dp| {
                        dp.set_mode(Mode::Follower, UnknownMacPolicy::Deny).unwrap();
                    }),
                ),
                (
                    "delta",
                    Box::new(|dp| {
                        let d = Delta {
                            allow_add: vec![mac(UNKNOWN)],
                            deny_remove: vec![mac(DENIED)],
                            ..Default::default()
                        };
                        dp.apply_delta(&d).unwrap();
                    }),
                ),
                (
                    "blocked",
                    Box::new(|dp| {
                        dp.set_mode(Mode::Blocked, UnknownMacPolicy::Allow).unwrap();
                    }),
                ),
                (
                    "leader again",
                    Box::new(|dp| {
                        dp.set_mode(Mode::Leader, UnknownMacPolicy::Allow).unwrap();
                    }),
                ),
            ];
            for (step, f) in steps {
                f(&mut kernel);
                f(&mut fake);
                same_read_back(&kernel, &fake, &format!("{step}, {what}"));
            }
        }
    });
}

/// The PXE host: dnsmasq on br0 (its replies leave through br0's egress hook too), the real agent and control
/// plane, filtering requests on the input hook and replies at br0's egress; the guard a plain table.
struct Host {
    host: GuardedHost,
    lan: PxeLan,
    config: RulesetConfig,
}

impl Host {
    fn start() -> Self {
        let lan = PxeLan::new(1);
        let dataplane = "egress_interfaces = [\"br0\"]\n\n[guard]\nclaim = false\n";
        // The agent probes its dnsmasq (leadership confirmed by answers) as this identity: its rules are part of
        // what it committed.
        let probe = "02:49:47:0d:00:01";
        let host = GuardedHost::start_with(&lan.pxe, &lan.dir, "br0", dataplane, "", |toml| {
            format!("{toml}\n[dhcp_probe]\nmac = \"{probe}\"\n")
        });
        host.filter(&lan.pxe, "allow", mac(ALLOWED));
        let config = RulesetConfig {
            interfaces: vec!["br0".into()],
            egress_interfaces: vec!["br0".into()],
            probe: Some(mac(probe)),
            ..Default::default()
        };
        let h = Self { host, lan, config };
        assert_eq!(h.drift(), Vec::<String>::new(), "as committed before any edit");
        h
    }

    /// What the agent committed: leader, unknown MACs denied, ALLOWED allowed.
    fn desired(&self) -> DesiredState {
        DesiredState {
            config: self.config.clone(),
            mode: Mode::Leader,
            unknown_mac_policy: UnknownMacPolicy::Deny,
            allow: macs(&[ALLOWED]),
            deny: Default::default(),
        }
    }

    /// The kernel dataplane's drift, as `KernelDataplane::drift` computes it (read back, compared with what was
    /// committed), from outside the agent.
    fn drift(&self) -> Vec<String> {
        let desired = self.desired();
        in_netns(&self.lan.pxe, move || ironguard_dataplane::observe(true).unwrap().drift(&desired))
    }

    /// The handle of the guard's first rule in `table` (`guard` or `egress_guard` of `ironguardctl chains`).
    fn guard_rule_handle(&self, table: &str) -> String {
        let j = chains_json(&self.lan.pxe);
        j[table]["chains"][0]["rules"][0]["handle"].as_u64().expect("the guard has a rule").to_string()
    }

    /// Freezes the agent, makes `edit` with `nft`, checks that the drift names it (`want` in one line) and
    /// `check`s the kernel, thaws the agent and waits until it has repaired everything.
    fn edit(&self, what: &str, edit: &[String], want: &str, check: impl FnOnce(&Self)) {
        self.host.agent.signal(Signal::SIGSTOP);
        let stat = format!("/proc/{}/stat", self.host.agent.pid());
        let stopped = wait_for(Duration::from_secs(5), || {
            let s = std::fs::read_to_string(&stat).unwrap_or_default();
            // the state follows the command name in parentheses
            s.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T')).then_some(())
        });
        assert!(stopped.is_some(), "{what}: the agent did not stop");
        let out = self.lan.pxe.nft(&edit.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(out.status.success(), "{what}: nft {edit:?}: {out:?}");
        let drift = self.drift();
        assert!(drift.iter().any(|d| d.contains(want) && d.contains("guard")), "{what}: drift {drift:#?}");
        check(self);
        self.host.agent.signal(Signal::SIGCONT);
        let repaired = wait_for(Duration::from_secs(20), || self.drift().is_empty().then_some(()));
        assert!(repaired.is_some(), "{what}: not repaired: {:#?}\n{}", self.drift(), self.host.agent.log_text());
        // A freeze longer than the fence (a busy machine) closes the leader by its kernel lease; it leads again by
        // itself once thawed.
        assert!(wait_serving_leader(&self.lan.pxe), "{what}: leads again: {}", verdict(&self.lan.pxe));
    }
}

/// The guard's rule, in nft's syntax and with its comment, with another verdict, port or mark.
fn guard_rule(family: &str, handle: &str, matches: &str, mark: &str, verdict: &str) -> Vec<String> {
    let chain = if family == "inet" { "input" } else { "egress" };
    let mut v: Vec<String> =
        ["replace", "rule", family, "ironguard_guard", chain, "handle", handle].iter().map(|s| s.to_string()).collect();
    v.extend(matches.split(' ').map(String::from));
    v.extend(["meta", "mark", "and", "0x00100000", "!=", mark, "counter", verdict].map(String::from));
    // the same comment as the guard's own rule: only what the rule does differs
    v.extend(["comment", "\"ironguard-guard:drop-unmarked\""].map(String::from));
    v
}

fn edits_are_drift_and_repaired(family: &str, table: &str) {
    let h = Host::start();
    let (matches, port) =
        if family == "inet" { ("iifname br0 udp dport 67", "th dport 68") } else { ("udp sport 67", "th sport 68") };
    let chain = if family == "inet" { "input" } else { "egress" };
    let run = |what: &str, edit: Vec<String>, want: &str, check: &dyn Fn(&Host)| h.edit(what, &edit, want, check);

    let accept = guard_rule(family, &h.guard_rule_handle(table), matches, "0x00100000", "accept");
    run("the guard's drop edited to accept", accept, "accept", &|h: &Host| {
        // The comment still says drop-unmarked: the verdict reads the rule by what it does.
        let j = chains_json(&h.lan.pxe);
        assert_eq!(j[table]["chains"][0]["rules"][0]["comment"], "ironguard-guard:drop-unmarked");
        assert_eq!(j["verdict"], "UNGUARDED", "{j:#}");
        // The agent's table still drops what it does not mark: an unknown MAC is not served.
        assert_eq!(dhcp(&h.lan.nodes[0], "eth0", mac(UNKNOWN)), None, "an unknown MAC is not served");
    });
    let delete = ["delete", "rule", family, "ironguard_guard", chain, "handle", &h.guard_rule_handle(table)]
        .map(String::from)
        .to_vec();
    run("the guard's drop deleted", delete, "0 rules", &|h: &Host| {
        assert_eq!(verdict(&h.lan.pxe), "UNGUARDED");
    });
    let other_port =
        guard_rule(family, &h.guard_rule_handle(table), &matches.replace("67", "68"), "0x00100000", "drop");
    run("the guard matching another port", other_port, port, &|_: &Host| {});
    let other_mark = guard_rule(family, &h.guard_rule_handle(table), matches, "0x00000000", "drop");
    run("the guard checking another mark", other_mark, "!= 0x00000000", &|h: &Host| {
        // `meta mark & MASK != 0 drop` drops the marked packets and passes the others: no guard at all.
        assert_eq!(verdict(&h.lan.pxe), "UNGUARDED");
    });
    let lease = dhcp(&h.lan.nodes[0], "eth0", mac(ALLOWED)).expect("repaired, the allowed MAC is served");
    assert_eq!(lease.server_id.to_string(), PxeLan::SERVER);
}

#[test]
fn guard_edits_on_the_request_side_are_drift_and_the_agent_repairs_them() {
    edits_are_drift_and_repaired("inet", "guard");
}

#[test]
fn guard_edits_on_the_egress_twin_are_drift_and_the_agent_repairs_them() {
    edits_are_drift_and_repaired("netdev", "egress_guard");
}
