//! The core driven event by event on [`FakeDataplane`]: every safety path, each asserting the mode the core chose
//! and what the (fake) kernel holds. Time is a parameter: the tests move it forward by hand.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use ironguard_coord::Expiry;
use ironguard_dataplane::monitor::GuardEvent;
use ironguard_dataplane::{Dataplane, DesiredState, FakeDataplane, MacAddr, Mode, RulesetConfig, UnknownMacPolicy};
use ironguard_proto::v1::{self as pb, FilterEvent, filter_event::Event as Ev};
use nix::errno::Errno;

use super::*;
use crate::coordination::CoordState;
use crate::dhcp_health::Health;
use crate::metrics::Metrics;
use crate::stream::{Identity, StreamMsg};

const TTL: Duration = Duration::from_secs(3);
const MARGIN: Duration = Duration::from_secs(1);

fn mac(n: u8) -> String {
    format!("52:54:00:00:00:{n:02x}")
}

fn m(n: u8) -> MacAddr {
    mac(n).parse().unwrap()
}

/// A core and a fake host whose table was just created Blocked, as `ironguard-agent run` starts.
struct Host {
    core: Core,
    dp: FakeDataplane,
    t0: Instant,
    generation: u64,
}

impl Host {
    fn new() -> Self {
        Self::with(|_| {})
    }

    fn with(f: impl FnOnce(&mut CoreConfig)) -> Self {
        let mut cfg = CoreConfig {
            dataplane: RulesetConfig::default(),
            guard_claim: true,
            ttl: TTL,
            margin: MARGIN,
            lost_after: Duration::from_secs(30),
            exit_on_partition: false,
            reconcile_every: Duration::from_secs(60),
            who: Identity {
                agent_id: "pxe-1".into(),
                host: "pxe-1".into(),
                network: "default".into(),
                coordination: "etcd",
            },
        };
        f(&mut cfg);
        let mut dp = FakeDataplane::new();
        dp.apply(&DesiredState::blocked(cfg.dataplane.clone())).unwrap();
        let t0 = Instant::now();
        let core = Core::new(cfg, Arc::new(Metrics::new()), t0, Box::new(|| 1.0));
        Self { core, dp, t0, generation: 0 }
    }

    fn at(&self, secs: f64) -> Instant {
        self.t0 + Duration::from_secs_f64(secs)
    }

    fn step_at(&mut self, secs: f64, ev: Event) -> Vec<Effect> {
        let now = self.at(secs);
        self.core.step(&mut self.dp, now, ev).expect("no fatal kernel error")
    }

    fn step(&mut self, ev: Event) -> Vec<Effect> {
        self.step_at(0.0, ev)
    }

    /// What the fake kernel holds.
    fn kernel(&self) -> DesiredState {
        self.dp.committed().cloned().expect("a table")
    }

    fn transactions(&self) -> u32 {
        self.dp.state.lock().unwrap().transactions
    }

    fn connect(&mut self) -> Vec<Effect> {
        self.generation += 1;
        let since = self.core.resume_revision();
        self.step(Event::Stream(vec![StreamMsg::Connected {
            generation: self.generation,
            endpoint: "cp".into(),
            since,
        }]))
    }

    fn event(&self, e: Ev) -> StreamMsg {
        StreamMsg::Event { generation: self.generation, event: FilterEvent { event: Some(e) } }
    }

    fn send(&mut self, events: Vec<Ev>) -> Vec<Effect> {
        let batch = events.into_iter().map(|e| self.event(e)).collect();
        self.step(Event::Stream(batch))
    }

    fn healthy(&mut self) {
        self.step(Event::Dhcp(Health { healthy: true, detail: "1 socket(s) listening on udp/67".into() }));
    }

    /// A session alive until `expires` seconds after t0, elected or not.
    fn session(&mut self, at: f64, expires: f64, elected: bool) -> Vec<Effect> {
        let c = CoordState { expiry: Expiry::At(self.at(expires)), session: 1, elected, error: None, amnesia: None };
        self.step_at(at, Event::Coord(c))
    }

    /// Connected, healthy, holding `allow` at revision `rev`, elected with a fresh session: the leader.
    fn leader(allow: &[u8], rev: u64) -> Self {
        let mut h = Self::new();
        h.connect();
        h.healthy();
        h.send(vec![snapshot(rev, allow, &[], pb::UnknownMacPolicy::Deny)]);
        h.session(0.0, 3.0, true);
        assert_eq!(h.core.mode(), Mode::Leader, "{:?}", h.core.reason());
        h
    }
}

fn snapshot(rev: u64, allow: &[u8], deny: &[u8], policy: pb::UnknownMacPolicy) -> Ev {
    Ev::Snapshot(pb::FilterSnapshot {
        revision: rev,
        allow: allow.iter().map(|n| mac(*n)).collect(),
        deny: deny.iter().map(|n| mac(*n)).collect(),
        unknown_mac_policy: policy as i32,
        epoch: String::new(),
    })
}

/// A snapshot of store epoch `epoch` (unknown MACs denied).
fn snapshot_in(epoch: &str, rev: u64, allow: &[u8]) -> Ev {
    let Ev::Snapshot(s) = snapshot(rev, allow, &[], pb::UnknownMacPolicy::Deny) else { unreachable!() };
    Ev::Snapshot(pb::FilterSnapshot { epoch: epoch.into(), ..s })
}

/// A delta of store epoch `epoch`.
fn delta_in(epoch: &str, rev: u64, allow_add: &[u8]) -> Ev {
    let Ev::Delta(d) = delta(rev, allow_add, &[]) else { unreachable!() };
    Ev::Delta(pb::FilterDelta { epoch: epoch.into(), ..d })
}

fn delta(rev: u64, allow_add: &[u8], allow_remove: &[u8]) -> Ev {
    Ev::Delta(pb::FilterDelta {
        revision: rev,
        allow_add: allow_add.iter().map(|n| mac(*n)).collect(),
        allow_remove: allow_remove.iter().map(|n| mac(*n)).collect(),
        ..Default::default()
    })
}

fn heartbeat(rev: u64) -> Ev {
    Ev::Heartbeat(pb::Heartbeat { revision: rev, epoch: String::new() })
}

#[test]
fn the_kernel_lease_ends_at_the_fence_deadline() {
    let now = Instant::now();
    // An etcd session alive until now + 3 s: the lease runs until the fence deadline, now + 2 s.
    assert_eq!(lease_until(Expiry::At(now + Duration::from_secs(3)), MARGIN, now), Some(now + Duration::from_secs(2)));
    // A keep-alive answered so late that the deadline is (almost) past: no lease.
    assert_eq!(lease_until(Expiry::At(now + Duration::from_millis(1010)), MARGIN, now), None);
    assert_eq!(lease_until(Expiry::At(now + Duration::from_millis(500)), MARGIN, now), None);
    assert_eq!(lease_until(Expiry::Expired, MARGIN, now), None);
    // The local backend: a watchdog.
    assert_eq!(lease_until(Expiry::Never, MARGIN, now), Some(now + LOCAL_LEASE));
}

#[test]
fn every_doubt_blocks() {
    let h = Health { healthy: true, detail: "ok".into() };
    let sick = Health { healthy: false, detail: "nothing listens on udp/67".into() };
    let applied = FilterSync::Applied { rev: 7 };
    let base = |dhcp| Inputs {
        sync: &applied,
        lost_for: None,
        lost_after: Duration::from_secs(30),
        dhcp,
        session_valid: true,
        session_error: None,
        store_amnesia: None,
        guard_broken: None,
        readback_failing: None,
        elected: true,
        shutting_down: false,
    };
    let d = |f: &dyn Fn(&mut Inputs<'_>)| {
        let mut i = base(&h);
        f(&mut i);
        decide(&i)
    };
    assert_eq!(d(&|_| {}).0, Mode::Leader);
    assert_eq!(d(&|i| i.sync = &FilterSync::None), (Mode::Blocked, Reason::NoState));
    let failed = FilterSync::Failed { err: "x".into() };
    assert_eq!(decide(&Inputs { sync: &failed, ..base(&h) }), (Mode::Blocked, Reason::ApplyFailed));
    assert_eq!(d(&|i| i.lost_for = Some(Duration::from_secs(31))).0, Mode::Blocked);
    assert_eq!(d(&|i| i.lost_for = Some(Duration::from_secs(29))).0, Mode::Leader, "within the bound the state holds");
    assert_eq!(d(&|i| i.shutting_down = true), (Mode::Blocked, Reason::ShuttingDown));
    // The lease fence closes even an elected leader.
    let (m, r) = d(&|i| i.session_valid = false);
    assert_eq!((m, r.cause()), (Mode::Blocked, Some("partition")));
    assert_eq!(d(&|i| i.elected = false), (Mode::Follower, Reason::NotElected));
    let mut i = base(&sick);
    assert_eq!(decide(&i).0, Mode::Follower);
    assert!(decide(&i).1.to_string().contains("udp/67"));
    assert!(!may_lead(&i), "an agent with sick DHCP does not campaign");
    i.dhcp = &h;
    i.elected = false;
    assert!(may_lead(&i), "a healthy follower campaigns");
    i.session_valid = false;
    assert!(!may_lead(&i), "a fenced agent does not campaign");
    // A regressed filter state closes, whatever else holds.
    let regressed = FilterSync::Regressed { applied: 42, offered: 3 };
    let (m, r) = decide(&Inputs { sync: &regressed, ..base(&h) });
    assert_eq!((m, r.cause()), (Mode::Blocked, Some("state-regressed")));
    assert!(r.to_string().contains("from revision 42 to 3"), "{r}");
    // Store amnesia closes even an elected leader with a valid session, and it does not campaign meanwhile.
    let i = Inputs { store_amnesia: Some("store amnesia: the store's revision went back from 50 to 2"), ..base(&h) };
    let (m, r) = decide(&i);
    assert_eq!((m, r.cause()), (Mode::Blocked, Some("store-amnesia")));
    assert!(!may_lead(&i));
    // A broken guard: not leading, not campaigning, but no reason to close the table.
    let i = Inputs { guard_broken: Some("EPERM"), ..base(&h) };
    assert_eq!(decide(&i).0, Mode::Follower);
    assert!(!may_lead(&i));
    // A read-back that keeps failing: blocked.
    let (m, r) = decide(&Inputs { readback_failing: Some("EIO"), ..base(&h) });
    assert_eq!((m, r.cause()), (Mode::Blocked, Some("readback-failing")));
    // Control plane loss outranks DHCP health: no state can be trusted.
    let i = Inputs { lost_for: Some(Duration::from_secs(40)), ..base(&sick) };
    assert_eq!(decide(&i).0, Mode::Blocked);
}

#[test]
fn a_snapshot_opens_a_healthy_elected_agent_up_to_its_fence_deadline() {
    let mut h = Host::new();
    assert_eq!((h.core.mode(), h.kernel().mode), (Mode::Blocked, Mode::Blocked));
    h.connect();
    h.healthy();
    assert_eq!(h.core.reason(), &Reason::NoState, "no state yet: closed");
    h.send(vec![snapshot(5, &[1, 2], &[3], pb::UnknownMacPolicy::Deny)]);
    assert_eq!(h.core.mode(), Mode::Blocked, "no session yet: closed");
    assert!(!h.core.may_lead(h.at(0.0)), "nor campaign before it has a session");
    assert_eq!(h.kernel().allow, [m(1), m(2)].into_iter().collect());
    h.session(0.0, 3.0, true);
    assert_eq!((h.core.mode(), h.kernel().mode), (Mode::Leader, Mode::Leader));
    assert_eq!(h.kernel().unknown_mac_policy, UnknownMacPolicy::Deny);
    assert_eq!(h.dp.lease_until(), Some(h.at(2.0)), "the kernel lease ends at TTL - margin");
    assert!(h.core.ready());
    assert_eq!(h.core.status(&h.dp).applied_revision, 5);
    // A keep-alive moves the kernel lease; one that comes too late drops it.
    h.session(1.0, 4.0, true);
    assert_eq!(h.dp.lease_until(), Some(h.at(3.0)));
    h.session(2.98, 3.99, true);
    assert_eq!(h.dp.lease_until(), None, "no time left before the deadline: no lease");
}

#[test]
fn an_older_snapshot_is_refused_and_blocks_until_the_state_is_current_again() {
    let mut h = Host::leader(&[1], 10);
    let before = h.kernel();
    // The control plane comes back with an older state (its store was restored).
    h.connect();
    h.send(vec![snapshot(4, &[1, 9], &[], pb::UnknownMacPolicy::Allow)]);
    assert_eq!(h.core.sync(), &FilterSync::Regressed { applied: 10, offered: 4 });
    assert_eq!(h.core.mode(), Mode::Blocked);
    assert_eq!(h.kernel().mode, Mode::Blocked);
    assert_eq!(h.kernel().allow, before.allow, "nothing of the older state reached the kernel");
    assert!(!h.core.may_lead(h.at(0.0)));
    assert_eq!(h.core.resume_revision(), 0, "a reconnect asks for a snapshot");
    // Deltas of the regressed history are never applied; once it passes revision 10, a snapshot is asked for.
    let fx = h.send(vec![delta(5, &[9], &[])]);
    assert!(fx.is_empty());
    let fx = h.send(vec![delta(11, &[9], &[])]);
    assert_eq!(fx, vec![Effect::Resync]);
    assert_eq!(h.kernel().allow, before.allow);
    // A current snapshot reopens.
    h.connect();
    h.send(vec![snapshot(12, &[1, 9], &[], pb::UnknownMacPolicy::Deny)]);
    assert_eq!(h.core.sync(), &FilterSync::Applied { rev: 12 });
    assert_eq!((h.core.mode(), h.kernel().mode), (Mode::Leader, Mode::Leader));
    assert!(h.kernel().allow.contains(&m(9)));
}

/// The store was created again (wiped) and written up to this agent's revision while it was away: revision 10
/// there is not revision 10 here. A delta or heartbeat of another epoch changes nothing, closes and asks for a
/// snapshot; a snapshot of another epoch replaces the whole state, even below the old floor, which restarts from it.
#[test]
fn a_delta_of_another_store_epoch_is_never_applied_and_its_snapshot_replaces_the_state() {
    let mut h = Host::new();
    h.connect();
    h.healthy();
    h.send(vec![snapshot_in("aaaa", 10, &[1])]);
    h.session(0.0, 3.0, true);
    assert_eq!((h.core.mode(), h.core.floor()), (Mode::Leader, (10, "aaaa")));
    let fx = h.send(vec![delta_in("aaaa", 11, &[2])]);
    assert!(fx.is_empty() && h.kernel().allow.contains(&m(2)), "the same epoch: applied");
    let tx = h.transactions();
    let fx = h.send(vec![delta_in("bbbb", 12, &[3])]);
    assert_eq!(fx, vec![Effect::Resync]);
    assert!(matches!(h.core.sync(), FilterSync::Failed { err } if err.contains("epoch")), "{:?}", h.core.sync());
    assert_eq!((h.core.mode(), h.kernel().mode), (Mode::Blocked, Mode::Blocked));
    assert!(!h.kernel().allow.contains(&m(3)), "nothing of the other history reached the kernel");
    assert_eq!(h.transactions(), tx + 1, "only the switch to Blocked");
    assert_eq!(h.core.resume_revision(), 0, "a reconnect asks for a snapshot");
    // Its snapshot: revision 4, below the floor of the old history, is taken whole.
    h.connect();
    h.send(vec![snapshot_in("bbbb", 4, &[3])]);
    assert_eq!(h.core.sync(), &FilterSync::Applied { rev: 4 });
    assert_eq!(h.core.floor(), (4, "bbbb"));
    assert_eq!(h.kernel().allow, [m(3)].into_iter().collect(), "the old history's MACs are gone");
    h.session(0.5, 3.5, true);
    assert_eq!(h.core.mode(), Mode::Leader);
    // A heartbeat of yet another epoch closes as well.
    let fx = h.send(vec![Ev::Heartbeat(pb::Heartbeat { revision: 4, epoch: "cccc".into() })]);
    assert_eq!(fx, vec![Effect::Resync]);
    assert_eq!(h.core.mode(), Mode::Blocked);
}

/// A restarted agent keeps its floor: a control plane restored from a backup of the same store (same epoch, an
/// older revision) is refused as before the restart; another epoch is taken.
#[test]
fn the_floor_kept_across_a_restart_refuses_an_older_state_of_the_same_store() {
    let mut h = Host::new();
    h.core.restore_floor(10, "aaaa".into());
    h.connect();
    h.healthy();
    h.send(vec![snapshot_in("aaaa", 7, &[1])]);
    assert_eq!(h.core.sync(), &FilterSync::Regressed { applied: 10, offered: 7 });
    assert_eq!(h.kernel().mode, Mode::Blocked);
    assert!(h.kernel().allow.is_empty());
    h.connect();
    h.send(vec![snapshot_in("dddd", 7, &[1])]);
    assert_eq!(h.core.sync(), &FilterSync::Applied { rev: 7 });
    assert_eq!(h.core.floor(), (7, "dddd"));
}

#[test]
fn a_revision_gap_blocks_changes_nothing_and_asks_for_a_snapshot() {
    let mut h = Host::leader(&[1], 10);
    let tx = h.transactions();
    let fx = h.send(vec![delta(11, &[2], &[]), delta(13, &[3], &[])]);
    assert_eq!(fx, vec![Effect::Resync]);
    assert!(matches!(h.core.sync(), FilterSync::Failed { err } if err.contains("revision gap")));
    assert_eq!((h.core.mode(), h.kernel().mode), (Mode::Blocked, Mode::Blocked));
    assert_eq!(h.kernel().allow, [m(1)].into_iter().collect(), "not even revision 11 was applied");
    assert_eq!(h.transactions(), tx + 1, "one transaction: the switch to Blocked");
    assert_eq!(h.core.resume_revision(), 0);
    // The snapshot that follows reopens.
    h.connect();
    h.send(vec![snapshot(13, &[1, 2, 3], &[], pb::UnknownMacPolicy::Deny)]);
    assert_eq!(h.core.mode(), Mode::Leader);
}

#[test]
fn a_heartbeat_ahead_of_the_applied_revision_blocks_and_resyncs() {
    let mut h = Host::leader(&[1], 10);
    assert!(h.send(vec![heartbeat(10)]).is_empty(), "a heartbeat at the applied revision is fine");
    assert_eq!(h.core.mode(), Mode::Leader);
    let fx = h.send(vec![heartbeat(12)]);
    assert_eq!(fx, vec![Effect::Resync]);
    assert_eq!((h.core.mode(), h.kernel().mode), (Mode::Blocked, Mode::Blocked));
    assert!(h.core.status(&h.dp).last_error.contains("heartbeat at revision 12 but applied 10"));
}

#[test]
fn a_bad_mac_from_the_control_plane_changes_nothing_and_blocks() {
    // In a snapshot: the fresh table stays as it was.
    let mut h = Host::new();
    h.connect();
    h.healthy();
    let tx = h.transactions();
    let mut bad = snapshot(3, &[1], &[], pb::UnknownMacPolicy::Deny);
    if let Ev::Snapshot(s) = &mut bad {
        s.allow.push("52:54:00:zz:00:01".into());
    }
    let fx = h.send(vec![bad]);
    assert_eq!(fx, vec![Effect::Resync]);
    assert_eq!(h.core.mode(), Mode::Blocked);
    assert!(h.kernel().allow.is_empty());
    assert_eq!(h.transactions(), tx, "nothing was written");
    // In a delta: the leader's sets stay, and it closes.
    let mut h = Host::leader(&[1], 10);
    let mut bad = delta(11, &[2], &[]);
    if let Ev::Delta(d) = &mut bad {
        d.allow_add.push("not a mac".into());
    }
    assert_eq!(h.send(vec![bad]), vec![Effect::Resync]);
    assert_eq!((h.core.mode(), h.kernel().mode), (Mode::Blocked, Mode::Blocked));
    assert_eq!(h.kernel().allow, [m(1)].into_iter().collect());
    assert!(h.core.status(&h.dp).last_error.contains("bad MAC"));
}

#[test]
fn a_burst_of_deltas_is_one_transaction_and_a_policy_change_rewrites_the_mode_rules() {
    let mut h = Host::leader(&[1], 10);
    let tx = h.transactions();
    let mut with_policy = delta(13, &[], &[1]);
    if let Ev::Delta(d) = &mut with_policy {
        d.unknown_mac_policy = pb::UnknownMacPolicy::Allow as i32;
    }
    h.send(vec![delta(11, &[2], &[]), delta(12, &[3], &[]), delta(11, &[2], &[]), with_policy]);
    assert_eq!(h.core.sync(), &FilterSync::Applied { rev: 13 }, "a replayed revision is skipped");
    assert_eq!(h.kernel().allow, [m(2), m(3)].into_iter().collect());
    assert_eq!(h.kernel().unknown_mac_policy, UnknownMacPolicy::Allow);
    assert_eq!(h.transactions(), tx + 2, "one batch for the three deltas, one for the policy");
    assert_eq!(h.core.mode(), Mode::Leader);
}

/// A snapshot that names no policy (the protocol's zero value, e.g. from an older control plane) means deny, even
/// after one that said allow.
#[test]
fn a_snapshot_without_a_policy_denies_unknown_macs() {
    let mut h = Host::leader(&[1], 10);
    h.send(vec![snapshot(11, &[1], &[], pb::UnknownMacPolicy::Allow)]);
    assert_eq!(h.kernel().unknown_mac_policy, UnknownMacPolicy::Allow);
    h.send(vec![snapshot(12, &[1], &[], pb::UnknownMacPolicy::Unspecified)]);
    assert_eq!(h.core.sync(), &FilterSync::Applied { rev: 12 });
    assert_eq!(h.kernel().unknown_mac_policy, UnknownMacPolicy::Deny);
    assert_eq!(h.core.mode(), Mode::Leader);
}

#[test]
fn a_failed_kernel_batch_blocks_and_resyncs_and_a_failed_mode_switch_is_fatal() {
    let mut h = Host::leader(&[1], 10);
    h.dp.fail_next(Errno::ENOBUFS);
    let fx = h.send(vec![delta(11, &[2], &[])]);
    assert_eq!(fx, vec![Effect::Resync]);
    assert_eq!((h.core.mode(), h.kernel().mode), (Mode::Blocked, Mode::Blocked));
    assert_eq!(h.kernel().allow, [m(1)].into_iter().collect(), "the failed batch changed nothing");
    // The same error on the resync's snapshot is said once (and still blocks).
    h.connect();
    h.dp.fail_next(Errno::ENOBUFS);
    assert_eq!(h.send(vec![snapshot(11, &[1, 2], &[], pb::UnknownMacPolicy::Deny)]), vec![Effect::Resync]);
    assert_eq!(h.core.mode(), Mode::Blocked);
    // If even the switch of the mode fails, the table cannot be trusted: the process must exit.
    let mut h = Host::leader(&[1], 10);
    h.dp.fail_next(Errno::ENOMEM);
    let r = h.core.step(&mut h.dp, h.t0, Event::Shutdown);
    assert!(matches!(r, Err(CoreError::ModeSwitch { mode: Mode::Blocked, .. })), "{r:?}");
}

#[test]
fn a_guard_that_cannot_be_repaired_makes_the_leader_step_down_until_it_is_whole() {
    let mut h = Host::leader(&[1], 10);
    h.dp.state.lock().unwrap().guard_installed = false;
    h.dp.fail_next(Errno::EPERM);
    h.step(Event::GuardTouched(GuardEvent::Overflow));
    assert!(matches!(h.core.guard(), GuardState::Broken { error } if error.contains("EPERM")), "{:?}", h.core.guard());
    assert_eq!((h.core.mode(), h.kernel().mode), (Mode::Follower, Mode::Follower));
    assert!(matches!(h.core.reason(), Reason::GuardBroken(_)));
    assert!(!h.core.ready(), "not ready: /readyz fails");
    assert!(!h.core.may_lead(h.at(0.0)), "it resigns and does not campaign");
    assert_eq!(h.core.metrics.guard_ok.get(), 0);
    // The next read-back repairs it, and the agent may lead again.
    h.step_at(61.0, Event::Tick);
    assert_eq!(h.core.guard(), &GuardState::Intact);
    assert!(h.dp.state.lock().unwrap().guard_installed);
    h.session(61.0, 64.0, true);
    assert_eq!(h.core.mode(), Mode::Leader);
    assert_eq!(h.core.metrics.guard_ok.get(), 1);
}

/// A read-back slower than its period (a starved CPU: every `ipset save` a slow process) is next due a period after
/// it ended, not at once: the main loop keeps time for its inputs between read-backs (track record T21).
#[test]
fn a_read_back_slower_than_its_period_is_next_due_a_period_after_it_ended() {
    let period = Duration::from_millis(100);
    let delay = Duration::from_millis(400);
    let mut h = Host::with(|c| c.reconcile_every = period);
    h.dp.state.lock().unwrap().read_delay = delay;
    let start = Instant::now();
    h.step_at(0.1, Event::Tick);
    let next = h.core.readback().next;
    assert!(next >= start + delay + period, "due {:?} after the read-back began", next - start);
    // Ticks before then read nothing back: the next read-back is still the one planned.
    h.dp.state.lock().unwrap().read_delay = Duration::ZERO;
    h.step_at(0.2, Event::Tick);
    assert_eq!(h.core.readback().next, next);
    let later = (next - h.t0).as_secs_f64();
    h.step_at(later, Event::Tick);
    assert!(h.core.readback().next >= h.at(later) + period, "read back when due");
    assert!(h.core.readback().next > next, "read back when due");
}

#[test]
fn a_read_back_that_keeps_failing_blocks_after_the_bound_and_reopens_when_it_works() {
    let mut h = Host::leader(&[1], 10);
    h.dp.state.lock().unwrap().fail_reads = READBACK_FAILURE_BOUND;
    let mut t = 60.0; // the first read-back is due one period after the start
    h.session(t, t + 3.0, true);
    for failures in 1..READBACK_FAILURE_BOUND {
        h.step_at(t, Event::Tick);
        assert_eq!(h.core.readback().failures, failures);
        assert_eq!(h.core.mode(), Mode::Leader, "below the bound the table is kept");
        // The retry is due soon, not a whole period later.
        assert_eq!(h.core.readback().next, h.at(t) + READBACK_RETRY);
        t += READBACK_RETRY.as_secs_f64();
        h.session(t, t + 3.0, true);
    }
    h.step_at(t, Event::Tick);
    assert_eq!((h.core.mode(), h.kernel().mode), (Mode::Blocked, Mode::Blocked));
    assert_eq!(h.core.reason().cause(), Some("readback-failing"));
    // A tick before the retry is due changes nothing; the retry that succeeds reopens.
    h.step_at(t + 0.5, Event::Tick);
    assert_eq!(h.core.mode(), Mode::Blocked);
    t += READBACK_RETRY.as_secs_f64();
    h.session(t, t + 3.0, true);
    h.step_at(t, Event::Tick);
    assert_eq!(h.core.readback().failures, 0);
    assert_eq!(h.core.mode(), Mode::Leader);
    assert_eq!(h.core.readback().next, h.at(t) + Duration::from_secs(60), "back to the normal period");
}

#[test]
fn the_fence_deadline_closes_the_leader_and_may_end_the_process() {
    let mut h = Host::leader(&[1], 10);
    assert_eq!(h.core.fence_deadline(), Some(h.at(2.0)));
    assert!(h.step_at(2.0, Event::FenceDeadline).is_empty());
    assert_eq!((h.core.mode(), h.kernel().mode), (Mode::Blocked, Mode::Blocked));
    assert_eq!(h.core.reason().cause(), Some("partition"));
    assert!(!h.core.may_lead(h.at(2.0)));
    // A keep-alive that succeeds again opens again (still elected).
    h.session(2.5, 5.5, true);
    assert_eq!(h.core.mode(), Mode::Leader);
    let mut h = Host::leader(&[1], 10);
    h.core.cfg.exit_on_partition = true;
    let fx = h.step_at(2.0, Event::FenceDeadline);
    assert!(matches!(fx.as_slice(), [Effect::Exit(_)]), "{fx:?}");
    assert_eq!(h.kernel().mode, Mode::Blocked, "closed before the exit");
}

#[test]
fn only_a_leader_moves_the_kernel_lease() {
    let mut h = Host::new();
    h.connect();
    h.healthy();
    h.send(vec![snapshot(1, &[1], &[], pb::UnknownMacPolicy::Deny)]);
    h.session(0.0, 3.0, false);
    assert_eq!(h.core.mode(), Mode::Follower);
    h.session(1.0, 4.0, false);
    assert_eq!(h.dp.lease_until(), None, "a follower holds no kernel lease");
    h.session(1.5, 4.0, true);
    assert_eq!(h.dp.lease_until(), Some(h.at(3.0)), "elected: the lease first, then the leader rules");
    // Losing the election closes the marking rules (the lease may stay: it marks nothing without them).
    h.session(2.0, 5.0, false);
    assert_eq!(h.kernel().mode, Mode::Follower);
}

#[test]
fn losing_the_control_plane_beyond_the_bound_blocks() {
    let mut h = Host::leader(&[1], 10);
    let lost = StreamMsg::Lost { generation: h.generation, error: "stream from cp failed: reset".into() };
    h.step_at(1.0, Event::Stream(vec![lost]));
    h.session(20.0, 23.0, true);
    h.step_at(20.0, Event::Tick);
    assert_eq!(h.core.mode(), Mode::Leader, "within the bound the last state holds");
    h.session(31.0, 34.0, true);
    h.step_at(31.5, Event::Tick);
    assert_eq!((h.core.mode(), h.kernel().mode), (Mode::Blocked, Mode::Blocked));
    assert_eq!(h.core.reason().cause(), Some("controlplane-lost"));
    // Events of a replaced connection are ignored; the new connection's snapshot reopens.
    let stale = h.event(snapshot(99, &[], &[], pb::UnknownMacPolicy::Allow));
    h.connect();
    h.step(Event::Stream(vec![stale]));
    assert_eq!(h.core.sync(), &FilterSync::Applied { rev: 10 }, "the old connection's snapshot was ignored");
    h.send(vec![heartbeat(10)]);
    h.session(32.0, 35.0, true);
    assert_eq!(h.core.mode(), Mode::Leader);
    assert_eq!(h.core.status(&h.dp).resumes, 1, "resumed without a snapshot");
}

#[test]
fn unhealthy_dhcp_makes_a_follower_that_does_not_campaign() {
    let mut h = Host::leader(&[1], 10);
    h.step(Event::Dhcp(Health { healthy: false, detail: "nothing listens on udp/67".into() }));
    assert_eq!((h.core.mode(), h.kernel().mode), (Mode::Follower, Mode::Follower));
    assert!(!h.core.may_lead(h.at(0.0)));
    assert!(!h.core.ready());
    assert_eq!(h.kernel().allow, [m(1)].into_iter().collect(), "the sets stay warm");
}

#[test]
fn store_amnesia_closes_for_one_ttl() {
    let mut h = Host::leader(&[1], 10);
    let c = CoordState {
        expiry: Expiry::At(h.at(4.0)),
        session: 2,
        elected: true,
        error: None,
        amnesia: Some((h.at(1.0), "store amnesia: the revision went back".into())),
    };
    h.step_at(1.0, Event::Coord(c.clone()));
    assert_eq!((h.core.mode(), h.kernel().mode), (Mode::Blocked, Mode::Blocked));
    assert_eq!(h.core.reason().cause(), Some("store-amnesia"));
    h.step_at(3.9, Event::Coord(CoordState { expiry: Expiry::At(h.at(6.9)), ..c.clone() }));
    assert_eq!(h.core.mode(), Mode::Blocked, "still within one TTL of the amnesia");
    h.step_at(4.1, Event::Coord(CoordState { expiry: Expiry::At(h.at(7.1)), ..c }));
    assert_eq!(h.core.mode(), Mode::Leader);
}

#[test]
fn the_local_backend_refreshes_a_watchdog_lease_on_every_tick() {
    let mut h = Host::new();
    h.connect();
    h.healthy();
    h.send(vec![snapshot(1, &[1], &[], pb::UnknownMacPolicy::Deny)]);
    let local = CoordState { expiry: Expiry::Never, session: 1, elected: true, error: None, amnesia: None };
    h.step(Event::Coord(local));
    assert_eq!(h.core.mode(), Mode::Leader);
    assert_eq!(h.core.fence_deadline(), None);
    h.step_at(0.25, Event::Tick);
    assert_eq!(h.dp.lease_until(), Some(h.at(0.25) + LOCAL_LEASE));
}

#[test]
fn shutdown_blocks_and_a_link_change_reads_the_kernel_back() {
    let mut h = Host::leader(&[1], 10);
    h.dp.state.lock().unwrap().guard_installed = false;
    h.step(Event::LinkChanged);
    assert!(h.dp.state.lock().unwrap().guard_installed, "the read-back repaired the guard");
    assert_eq!(h.core.mode(), Mode::Leader);
    h.step(Event::Shutdown);
    assert_eq!((h.core.mode(), h.kernel().mode), (Mode::Blocked, Mode::Blocked));
    assert_eq!(h.core.reason(), &Reason::ShuttingDown);
    assert!(!h.core.may_lead(h.at(0.0)));
}

/// The dataplane's moment to write the lease again (ipset's whole seconds): a leader writes it for the same fence
/// deadline, never a later one; a follower writes nothing.
#[test]
fn the_lease_is_written_again_when_due_and_only_while_leading() {
    let mut h = Host::leader(&[1], 1);
    let before = h.transactions();
    h.step_at(0.95, Event::LeaseDue);
    assert_eq!(h.transactions(), before + 1, "written again");
    assert_eq!(h.dp.lease_until(), Some(h.at(2.0)), "for the same fence deadline (TTL - margin), not later");
    h.session(1.0, 4.0, false);
    assert_eq!(h.core.mode(), Mode::Follower);
    let before = h.transactions();
    h.step_at(1.5, Event::LeaseDue);
    assert_eq!(h.transactions(), before, "a follower writes no lease");
}

/// A discovery window gives unknown MACs DHCP until it closes: by the control plane's word, or by the agent's own
/// clock when its time is up (a control plane that went away leaves no window open), and a replaced stream forgets
/// it. The filter state's policy is untouched meanwhile.
#[test]
fn a_discovery_window_opens_unknown_macs_until_it_closes_by_itself() {
    let discovery = |ms: u64| Ev::Discovery(pb::DiscoveryWindow { open_for_ms: ms });
    let mut h = Host::leader(&[1], 10);
    assert_eq!(h.kernel().unknown_mac_policy, UnknownMacPolicy::Deny);
    h.send(vec![discovery(5_000)]);
    assert_eq!(h.kernel().unknown_mac_policy, UnknownMacPolicy::Allow, "open");
    assert_eq!(h.core.mode(), Mode::Leader);
    // a snapshot meanwhile keeps the window (the state's policy is deny)
    h.send(vec![snapshot(11, &[1], &[], pb::UnknownMacPolicy::Deny)]);
    assert_eq!(h.kernel().unknown_mac_policy, UnknownMacPolicy::Allow, "still open after a snapshot");
    h.session(2.0, 5.0, true);
    h.step_at(4.9, Event::Tick);
    assert_eq!(h.kernel().unknown_mac_policy, UnknownMacPolicy::Allow, "before its end");
    h.session(4.9, 8.0, true);
    h.step_at(5.0, Event::Tick);
    assert_eq!(h.kernel().unknown_mac_policy, UnknownMacPolicy::Deny, "closed by the agent's clock");
    // closed by the control plane
    h.send(vec![discovery(60_000)]);
    assert_eq!(h.kernel().unknown_mac_policy, UnknownMacPolicy::Allow);
    h.send(vec![discovery(0)]);
    assert_eq!(h.kernel().unknown_mac_policy, UnknownMacPolicy::Deny, "closed by the control plane");
    // forgotten with the stream it came on
    h.send(vec![discovery(60_000)]);
    assert_eq!(h.kernel().unknown_mac_policy, UnknownMacPolicy::Allow);
    h.connect();
    assert_eq!(h.kernel().unknown_mac_policy, UnknownMacPolicy::Deny, "a new stream starts closed");
    // a state whose policy is allow stays allow when a window closes
    h.send(vec![snapshot(12, &[1], &[], pb::UnknownMacPolicy::Allow), discovery(1_000), discovery(0)]);
    assert_eq!(h.kernel().unknown_mac_policy, UnknownMacPolicy::Allow);
}
