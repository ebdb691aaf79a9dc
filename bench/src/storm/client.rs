//! One simulated PXE client as a state machine without I/O: the shell ([`super::sim`]) feeds it the time and the
//! replies meant for it and sends what it returns.
//!
//! Acquiring follows a PXE ROM (PXE 2.1, 2.2.1): a DISCOVER, then again after timeouts of 4, 8, 16 and 32 s, `secs`
//! counting from the first; the first OFFER is taken and REQUESTed (broadcast, naming its server), and the timeout
//! of the attempt covers the whole exchange, so a REQUEST left unanswered sends the client back to DISCOVER when it
//! ends. After the last timeout it gives up. Each DISCOVER opens a new exchange with a fresh `xid`, so an `xid`
//! answered by two servers means two servers answered the same DISCOVER. A NAK sends it back to DISCOVER at once.
//!
//! Renewing follows RFC 2131 4.4.5, with the timers compressed: a bound client REQUESTs its address from the
//! server that leased it (unicast, `ciaddr` set), and when that goes unanswered for the first timeout, it rebinds:
//! the same REQUEST broadcast to any server, again after each later timeout. A NAK ends its lease and sends it to
//! DISCOVER; after the last timeout it keeps its address, unanswered (until its lease would expire).

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use super::wire::{ClientMessage, MessageType, Reply};

/// The timeouts of the successive attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule(Vec<Duration>);

impl std::fmt::Display for Schedule {
    /// As [`Schedule::parse`] reads it: `4,8,16,32`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs: Vec<String> = self.secs().iter().map(f64::to_string).collect();
        f.write_str(&secs.join(","))
    }
}

impl Schedule {
    /// A PXE ROM's: 4, 8, 16 and 32 s.
    pub fn firmware() -> Self {
        Self([4, 8, 16, 32].map(Duration::from_secs).to_vec())
    }

    /// Timeouts in seconds, e.g. `4,8,16,32`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let timeouts = s
            .split(',')
            .map(|t| match t.trim().parse::<f64>() {
                Ok(v) if v > 0.0 && v.is_finite() && v <= 3600.0 => Ok(Duration::from_secs_f64(v)),
                _ => Err(format!("`{t}` is not a timeout in seconds (0 < t ≤ 3600)")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self(timeouts))
    }

    /// Every timeout together: how long a client tries before it gives up.
    pub fn total(&self) -> Duration {
        self.0.iter().sum()
    }

    fn timeout(&self, attempt: usize) -> Option<Duration> {
        self.0.get(attempt).copied()
    }

    /// The timeouts in seconds, for the report.
    pub fn secs(&self) -> Vec<f64> {
        self.0.iter().map(Duration::as_secs_f64).collect()
    }
}

/// An address a server acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub ip: Ipv4Addr,
    pub server: Ipv4Addr,
    pub server_mac: [u8; 6],
}

/// Where a client is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Nothing sent yet.
    Idle,
    /// DISCOVER sent, waiting for an offer.
    Selecting,
    /// REQUEST sent for an offered address.
    Requesting {
        ip: Ipv4Addr,
        server: Ipv4Addr,
    },
    Bound,
    /// Asking the server that leased it to extend the lease.
    Renewing,
    /// Asking any server to extend the lease.
    Rebinding,
    /// Acquiring: no lease after the last timeout.
    GaveUp,
    /// Renewing: no answer after the last timeout; it keeps its address until its lease would expire.
    Unanswered,
}

/// What a step did, besides what it sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// An ACK: bound to `lease`, `after` the acquisition or renewal began.
    Bound { lease: Lease, after: Duration },
    /// A NAK of the current exchange (the client is DISCOVERing again).
    Naked { server: Ipv4Addr },
    /// The last timeout ended: [`Phase::GaveUp`] or [`Phase::Unanswered`].
    Exhausted,
}

/// What a step returns: something to send, and what happened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Step {
    pub send: Option<ClientMessage>,
    pub event: Option<Event>,
}

/// One client.
#[derive(Debug, Clone)]
pub struct Client {
    pub mac: [u8; 6],
    phase: Phase,
    lease: Option<Lease>,
    /// The current exchange.
    xid: u32,
    attempt: usize,
    /// When the current acquisition or renewal began: `secs` and the time to lease count from here.
    began: Instant,
    /// When the current attempt's timeout ends.
    deadline: Instant,
}

impl Client {
    pub fn new(mac: [u8; 6], now: Instant) -> Self {
        Self { mac, phase: Phase::Idle, lease: None, xid: 0, attempt: 0, began: now, deadline: now }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    pub fn lease(&self) -> Option<Lease> {
        self.lease
    }

    /// How many attempts the current acquisition or renewal has begun (1 after its first message).
    pub fn attempts(&self) -> usize {
        self.attempt + 1
    }

    /// When [`Client::tick`] next has something to do (None: nothing until a reply or a new phase).
    pub fn deadline(&self) -> Option<Instant> {
        match self.phase {
            Phase::Selecting | Phase::Requesting { .. } | Phase::Renewing | Phase::Rebinding => Some(self.deadline),
            Phase::Idle | Phase::Bound | Phase::GaveUp | Phase::Unanswered => None,
        }
    }

    /// Done with the current phase: bound, given up or unanswered.
    pub fn settled(&self) -> bool {
        matches!(self.phase, Phase::Bound | Phase::GaveUp | Phase::Unanswered)
    }

    fn secs(&self, now: Instant) -> u16 {
        u16::try_from(now.saturating_duration_since(self.began).as_secs()).unwrap_or(u16::MAX)
    }

    /// Powers on: the first DISCOVER, with exchange `xid`.
    pub fn start(&mut self, now: Instant, xid: u32, schedule: &Schedule) -> Step {
        self.began = now;
        self.attempt = 0;
        self.lease = None;
        self.discover(now, xid, schedule)
    }

    fn discover(&mut self, now: Instant, xid: u32, schedule: &Schedule) -> Step {
        match schedule.timeout(self.attempt) {
            Some(t) => {
                self.xid = xid;
                self.phase = Phase::Selecting;
                self.deadline = now + t;
                Step { send: Some(ClientMessage::discover(self.mac, xid, self.secs(now))), event: None }
            }
            None => {
                self.phase = Phase::GaveUp;
                Step { send: None, event: Some(Event::Exhausted) }
            }
        }
    }

    /// Renews its lease (as at T1): a REQUEST unicast to the server that leased it. Nothing unless bound.
    pub fn renew(&mut self, now: Instant, xid: u32, schedule: &Schedule) -> Step {
        let (Phase::Bound, Some(lease), Some(t)) = (self.phase, self.lease, schedule.timeout(0)) else {
            return Step::default();
        };
        self.began = now;
        self.attempt = 0;
        self.xid = xid;
        self.phase = Phase::Renewing;
        self.deadline = now + t;
        let to = (lease.server, lease.server_mac);
        Step { send: Some(ClientMessage::renew(self.mac, xid, 0, lease.ip, to)), event: None }
    }

    /// The time has come to `now`: when the attempt's timeout has ended, the next attempt (with exchange `xid`).
    pub fn tick(&mut self, now: Instant, xid: u32, schedule: &Schedule) -> Step {
        if self.deadline().is_none_or(|d| now < d) {
            return Step::default();
        }
        self.attempt += 1;
        match self.phase {
            Phase::Selecting | Phase::Requesting { .. } => self.discover(now, xid, schedule),
            Phase::Renewing | Phase::Rebinding => match (schedule.timeout(self.attempt), self.lease) {
                (Some(t), Some(lease)) => {
                    self.xid = xid;
                    self.phase = Phase::Rebinding;
                    self.deadline = now + t;
                    Step { send: Some(ClientMessage::rebind(self.mac, xid, self.secs(now), lease.ip)), event: None }
                }
                _ => {
                    self.phase = Phase::Unanswered;
                    Step { send: None, event: Some(Event::Exhausted) }
                }
            },
            Phase::Idle | Phase::Bound | Phase::GaveUp | Phase::Unanswered => Step::default(),
        }
    }

    /// A reply for this client (its `chaddr`) arrived at `now`; `xid` is the exchange a NAK sends it to.
    /// Replies to an earlier exchange, or that the phase does not expect, change nothing.
    pub fn on_reply(&mut self, r: &Reply, now: Instant, xid: u32, schedule: &Schedule) -> Step {
        if r.xid != self.xid || r.chaddr != self.mac {
            return Step::default();
        }
        match (self.phase, r.kind) {
            (Phase::Selecting, MessageType::Offer) => {
                self.phase = Phase::Requesting { ip: r.yiaddr, server: r.server };
                let m = ClientMessage::select(self.mac, self.xid, self.secs(now), r.server, r.yiaddr);
                Step { send: Some(m), event: None }
            }
            (Phase::Requesting { ip, server }, MessageType::Ack) if r.yiaddr == ip && r.server == server => {
                self.bound(r, now)
            }
            (Phase::Renewing | Phase::Rebinding, MessageType::Ack) if Some(r.yiaddr) == self.lease.map(|l| l.ip) => {
                self.bound(r, now)
            }
            (Phase::Requesting { .. } | Phase::Renewing | Phase::Rebinding, MessageType::Nak) => {
                self.lease = None;
                let step = self.discover(now, xid, schedule);
                Step { send: step.send, event: Some(step.event.unwrap_or(Event::Naked { server: r.server })) }
            }
            _ => Step::default(),
        }
    }

    fn bound(&mut self, r: &Reply, now: Instant) -> Step {
        let lease = Lease { ip: r.yiaddr, server: r.server, server_mac: r.server_mac };
        self.lease = Some(lease);
        self.phase = Phase::Bound;
        Step { send: None, event: Some(Event::Bound { lease, after: now.saturating_duration_since(self.began) }) }
    }

    /// Gives its address back (a RELEASE to the server that leased it), if it holds one.
    pub fn release(&mut self, xid: u32) -> Option<ClientMessage> {
        let lease = self.lease.take()?;
        self.phase = Phase::Idle;
        Some(ClientMessage::release(self.mac, xid, lease.ip, (lease.server, lease.server_mac)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x02, 0x50, 0, 0, 1, 1];
    const A: Ipv4Addr = Ipv4Addr::new(10, 80, 0, 1);
    const B: Ipv4Addr = Ipv4Addr::new(10, 80, 0, 2);
    const A_MAC: [u8; 6] = [0x02, 0xaa, 0, 0, 0, 1];
    const IP: Ipv4Addr = Ipv4Addr::new(10, 80, 1, 7);

    fn reply(kind: MessageType, xid: u32, yiaddr: Ipv4Addr, server: Ipv4Addr) -> Reply {
        Reply { kind, xid, chaddr: MAC, yiaddr, server, server_mac: A_MAC }
    }

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn the_firmware_schedule_sends_at_0_4_12_28_and_gives_up_at_60_with_secs_rising() {
        let sch = Schedule::firmware();
        assert_eq!(sch.total(), s(60));
        let t0 = Instant::now();
        let mut c = Client::new(MAC, t0);
        let mut sent = vec![];
        let first = c.start(t0, 1, &sch).send.expect("a DISCOVER");
        sent.push((0, first.secs, first.xid));
        let mut last_event = None;
        // Every 100 ms for 70 s.
        for k in 1..=700u64 {
            let now = t0 + Duration::from_millis(100 * k);
            let step = c.tick(now, 1 + k as u32, &sch);
            if let Some(m) = step.send {
                assert_eq!(m.kind, MessageType::Discover);
                sent.push((k / 10, m.secs, m.xid));
            }
            if step.event.is_some() {
                last_event = Some((k / 10, step.event));
            }
        }
        let at: Vec<(u64, u16)> = sent.iter().map(|(t, secs, _)| (*t, *secs)).collect();
        assert_eq!(at, vec![(0, 0), (4, 4), (12, 12), (28, 28)], "DISCOVERs at 0, 4, 12, 28 s, secs rising");
        let xids: std::collections::BTreeSet<u32> = sent.iter().map(|s| s.2).collect();
        assert_eq!(xids.len(), 4, "a fresh xid per DISCOVER");
        assert_eq!(last_event, Some((60, Some(Event::Exhausted))));
        assert_eq!(c.phase(), Phase::GaveUp);
        assert!(c.settled() && c.deadline().is_none());
    }

    #[test]
    fn an_offer_is_requested_and_an_ack_binds_after_the_time_it_took() {
        let sch = Schedule::firmware();
        let t0 = Instant::now();
        let mut c = Client::new(MAC, t0);
        c.start(t0, 9, &sch);
        // An offer to another exchange or to another client changes nothing.
        assert_eq!(c.on_reply(&reply(MessageType::Offer, 8, IP, A), t0, 0, &sch), Step::default());
        let other = Reply { chaddr: [2, 0, 0, 0, 0, 9], ..reply(MessageType::Offer, 9, IP, A) };
        assert_eq!(c.on_reply(&other, t0, 0, &sch), Step::default());
        let req = c.on_reply(&reply(MessageType::Offer, 9, IP, A), t0 + s(1), 0, &sch).send.expect("a REQUEST");
        assert_eq!(
            (req.kind, req.xid, req.requested, req.server_id, req.secs),
            (MessageType::Request, 9, Some(IP), Some(A), 1)
        );
        assert_eq!(req.unicast_to, None, "broadcast while selecting");
        // A second server's offer to the same exchange is not taken.
        assert_eq!(
            c.on_reply(&reply(MessageType::Offer, 9, Ipv4Addr::new(10, 80, 2, 1), B), t0, 0, &sch),
            Step::default()
        );
        // An ACK from another server or for another address does not bind.
        assert_eq!(c.on_reply(&reply(MessageType::Ack, 9, IP, B), t0, 0, &sch), Step::default());
        let step = c.on_reply(&reply(MessageType::Ack, 9, IP, A), t0 + Duration::from_millis(1500), 0, &sch);
        let lease = Lease { ip: IP, server: A, server_mac: A_MAC };
        assert_eq!(step.event, Some(Event::Bound { lease, after: Duration::from_millis(1500) }));
        assert_eq!((c.phase(), c.lease()), (Phase::Bound, Some(lease)));
        assert_eq!(c.tick(t0 + s(100), 10, &sch), Step::default(), "bound: no timer");
    }

    #[test]
    fn an_unanswered_request_goes_back_to_discover_when_the_attempt_ends() {
        let sch = Schedule::firmware();
        let t0 = Instant::now();
        let mut c = Client::new(MAC, t0);
        c.start(t0, 1, &sch);
        c.on_reply(&reply(MessageType::Offer, 1, IP, A), t0, 0, &sch);
        assert_eq!(c.tick(t0 + Duration::from_millis(3999), 2, &sch), Step::default());
        let m = c.tick(t0 + s(4), 2, &sch).send.expect("DISCOVER again");
        assert_eq!((m.kind, m.xid, m.secs), (MessageType::Discover, 2, 4));
        // The late ACK of the first exchange binds nothing.
        assert_eq!(c.on_reply(&reply(MessageType::Ack, 1, IP, A), t0 + s(5), 3, &sch), Step::default());
        assert_eq!(c.phase(), Phase::Selecting);
    }

    #[test]
    fn a_nak_sends_the_client_back_to_discover_at_once() {
        let sch = Schedule::firmware();
        let t0 = Instant::now();
        let mut c = Client::new(MAC, t0);
        c.start(t0, 1, &sch);
        c.on_reply(&reply(MessageType::Offer, 1, IP, A), t0, 0, &sch);
        let step = c.on_reply(&reply(MessageType::Nak, 1, Ipv4Addr::UNSPECIFIED, B), t0 + s(2), 5, &sch);
        assert_eq!(step.event, Some(Event::Naked { server: B }));
        let m = step.send.expect("DISCOVER");
        assert_eq!((m.kind, m.xid, m.secs), (MessageType::Discover, 5, 2));
        // Its attempt goes on: the timer is the attempt's.
        assert_eq!(c.deadline(), Some(t0 + s(2) + s(4)));
    }

    #[test]
    fn renewing_unanswered_rebinds_and_a_nak_ends_the_lease() {
        let sch = Schedule::firmware();
        let t0 = Instant::now();
        let mut c = Client::new(MAC, t0);
        c.start(t0, 1, &sch);
        c.on_reply(&reply(MessageType::Offer, 1, IP, A), t0, 0, &sch);
        c.on_reply(&reply(MessageType::Ack, 1, IP, A), t0, 0, &sch);
        let t1 = t0 + s(10);
        let m = c.renew(t1, 2, &sch).send.expect("a renewing REQUEST");
        assert_eq!(
            (m.kind, m.ciaddr, m.unicast_to, m.server_id),
            (MessageType::Request, Some(IP), Some((A, A_MAC)), None)
        );
        let m = c.tick(t1 + s(4), 3, &sch).send.expect("rebinding");
        assert_eq!((m.ciaddr, m.unicast_to, m.xid, m.secs), (Some(IP), None, 3, 4));
        assert_eq!(c.phase(), Phase::Rebinding);
        let step = c.on_reply(&reply(MessageType::Nak, 3, Ipv4Addr::UNSPECIFIED, B), t1 + s(5), 4, &sch);
        assert_eq!(step.event, Some(Event::Naked { server: B }));
        assert_eq!(step.send.map(|m| m.kind), Some(MessageType::Discover));
        assert_eq!(c.lease(), None, "a NAK ends the lease");
        // The new server's address: bound after the renewal began.
        let new_ip = Ipv4Addr::new(10, 80, 5, 1);
        c.on_reply(&reply(MessageType::Offer, 4, new_ip, B), t1 + s(5), 0, &sch);
        let step = c.on_reply(&reply(MessageType::Ack, 4, new_ip, B), t1 + s(6), 0, &sch);
        assert!(matches!(step.event, Some(Event::Bound { lease, after }) if lease.ip == new_ip && after == s(6)));
    }

    #[test]
    fn a_renewal_acked_keeps_the_address_and_one_never_answered_ends_unanswered() {
        let sch = Schedule::parse("1,2").expect("schedule");
        let t0 = Instant::now();
        let mut c = Client::new(MAC, t0);
        c.start(t0, 1, &sch);
        c.on_reply(&reply(MessageType::Offer, 1, IP, A), t0, 0, &sch);
        c.on_reply(&reply(MessageType::Ack, 1, IP, A), t0, 0, &sch);
        c.renew(t0, 2, &sch);
        // An ACK for another address is not a renewal.
        assert_eq!(
            c.on_reply(&reply(MessageType::Ack, 2, Ipv4Addr::new(10, 80, 9, 9), A), t0, 0, &sch),
            Step::default()
        );
        assert!(matches!(c.on_reply(&reply(MessageType::Ack, 2, IP, A), t0, 0, &sch).event, Some(Event::Bound { .. })));
        c.renew(t0, 3, &sch);
        assert!(c.tick(t0 + s(1), 4, &sch).send.is_some(), "rebinding");
        assert_eq!(c.tick(t0 + s(3), 5, &sch).event, Some(Event::Exhausted));
        assert_eq!(c.phase(), Phase::Unanswered);
        assert_eq!(c.lease().map(|l| l.ip), Some(IP), "it keeps its address");
        // Releasing gives it back to the server that leased it.
        let m = c.release(6).expect("a RELEASE");
        assert_eq!((m.kind, m.ciaddr, m.server_id), (MessageType::Release, Some(IP), Some(A)));
        assert_eq!(c.release(7), None);
    }

    #[test]
    fn schedules_parse_from_seconds() {
        assert_eq!(Schedule::parse("4,8,16,32"), Ok(Schedule::firmware()));
        assert_eq!(Schedule::firmware().to_string(), "4,8,16,32");
        assert_eq!(Schedule::parse(&Schedule::parse("0.5,1").unwrap().to_string()), Schedule::parse("0.5,1"));
        assert_eq!(Schedule::parse("0.5, 1").map(|s| s.total()), Ok(Duration::from_millis(1500)));
        for bad in ["", "4,,8", "0", "-1", "x", "1e9"] {
            assert!(Schedule::parse(bad).is_err(), "{bad:?}");
        }
    }
}
