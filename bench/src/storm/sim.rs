//! The storm's I/O shell: one raw `AF_PACKET` socket on the clients' link writes every client's frames, each from
//! its own MAC (the guard matches the Ethernet source and `chaddr`, so one shared MAC would not do), reads the
//! servers' replies and drives the [`Client`] state machines. It answers the ARP requests a server sends before it
//! unicasts an ACK to a renewing client's address. A [`Ledger`] keeps every offer and acknowledgement seen, the
//! judge of double offers and duplicate addresses.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, bind, recv, send, setsockopt, socket, sockopt,
};

use super::client::{Client, Event, Lease, Phase, Schedule, Step};
use super::wire::{self, Incoming, MessageType, Reply};

/// A raw socket on one link of a network namespace.
#[derive(Debug)]
pub struct PacketSocket(OwnedFd);

impl PacketSocket {
    /// A raw socket on `iface` of the calling thread's network namespace. It keeps that namespace whatever thread
    /// uses it later: open it inside the clients' namespace (`in_netns`) and hand it to the storm.
    pub fn open(iface: &str) -> anyhow::Result<Self> {
        let fd = socket(AddressFamily::Packet, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::EthAll)
            .context("AF_PACKET socket (needs CAP_NET_RAW)")?;
        // Hundreds of replies can arrive while the clients are being sent for: room for all of them.
        setsockopt(&fd, sockopt::RcvBufForce, &(16 << 20)).context("SO_RCVBUFFORCE")?;
        // The link's own AF_PACKET address (its index) as the kernel lists it; binding to it keeps the socket's
        // protocol (every frame) and makes it the link every send goes out on.
        let link = nix::ifaddrs::getifaddrs()
            .context("getifaddrs")?
            .find_map(|a| {
                let link = a.address.as_ref()?.as_link_addr()?;
                (a.interface_name == iface).then_some(*link)
            })
            .with_context(|| format!("no link {iface} here"))?;
        bind(fd.as_raw_fd(), &link).with_context(|| format!("binding the raw socket to {iface}"))?;
        Ok(Self(fd))
    }

    fn send(&self, frame: &[u8]) -> anyhow::Result<()> {
        // A full transmit queue clears within microseconds: retry for up to a second before calling it a failure.
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            match send(self.0.as_raw_fd(), frame, MsgFlags::empty()) {
                Ok(_) => return Ok(()),
                Err(Errno::EAGAIN | Errno::ENOBUFS | Errno::EINTR) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err(e) => return Err(e).context("sending a frame"),
            }
        }
    }

    /// One frame into `buf`: its length, or None when none came within `wait` (zero: none is waiting now).
    fn recv(&self, buf: &mut [u8], wait: Duration) -> anyhow::Result<Option<usize>> {
        let flags = if wait.is_zero() {
            MsgFlags::MSG_DONTWAIT
        } else {
            // At least a millisecond: a zero timeout would mean "wait for ever".
            let tv = nix::sys::time::TimeVal::new(
                wait.as_secs() as _,
                wait.subsec_micros().max(u32::from(wait.as_secs() == 0) * 1000) as _,
            );
            setsockopt(&self.0, sockopt::ReceiveTimeout, &tv).context("SO_RCVTIMEO")?;
            MsgFlags::empty()
        };
        match recv(self.0.as_raw_fd(), buf, flags) {
            Ok(n) => Ok(Some(n)),
            Err(Errno::EAGAIN | Errno::EINTR) => Ok(None),
            Err(e) => Err(e).context("reading a frame"),
        }
    }
}

/// Every offer and acknowledgement the clients saw, from any server, answered in time or not.
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    /// xid → the servers that offered in that exchange.
    offers: HashMap<u32, BTreeSet<Ipv4Addr>>,
    /// Address → the clients a server acknowledged it to.
    holders: HashMap<Ipv4Addr, BTreeSet<[u8; 6]>>,
}

impl Ledger {
    fn record(&mut self, r: &Reply) {
        match r.kind {
            MessageType::Offer => {
                self.offers.entry(r.xid).or_default().insert(r.server);
            }
            MessageType::Ack => {
                self.holders.entry(r.yiaddr).or_default().insert(r.chaddr);
            }
            _ => {}
        }
    }

    /// Exchanges (one DISCOVER each) that more than one server offered to: two servers answering at once.
    pub fn double_offers(&self) -> usize {
        self.offers.values().filter(|s| s.len() > 1).count()
    }

    /// Addresses acknowledged to more than one client.
    pub fn duplicates(&self) -> usize {
        self.holders.values().filter(|m| m.len() > 1).count()
    }

    /// Exchanges answered with an offer.
    pub fn offered_exchanges(&self) -> usize {
        self.offers.len()
    }
}

/// What one phase (the storm, or the renewal after it) did.
#[derive(Debug, Clone, Default)]
pub struct PhaseReport {
    /// Clients that took part.
    pub clients: usize,
    /// Clients bound at the end.
    pub bound: usize,
    /// Renewal: clients whose address was extended (an ACK for the address they held).
    pub kept: usize,
    /// From the start of each bound client's acquisition (its first DISCOVER) or renewal to its ACK.
    pub time_to_lease: Vec<Duration>,
    /// Clients that made more than one attempt (a DISCOVER again, or rebinding after renewing), leased or not.
    pub retried: usize,
    /// NAKs received, and the clients that got one.
    pub naks: usize,
    pub naked_clients: usize,
    /// Clients that got no lease after the last timeout.
    pub gave_up: usize,
    /// Renewal: clients no server answered; they keep their address until their lease expires.
    pub unanswered: usize,
    /// Messages sent: DISCOVERs and REQUESTs.
    pub discovers: usize,
    pub requests: usize,
    /// Clients bound per server.
    pub by_server: BTreeMap<Ipv4Addr, usize>,
    /// Every ACK that bound a client: when, and from which server.
    pub acks: Vec<(Instant, Ipv4Addr)>,
    /// When the phase began.
    pub began: Option<Instant>,
}

/// How a phase begins for a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Begin {
    Acquire,
    Renew,
}

/// The simulated clients on one link.
#[derive(Debug)]
pub struct Fleet {
    socket: PacketSocket,
    clients: Vec<Client>,
    schedule: Schedule,
    by_xid: HashMap<u32, usize>,
    /// Bound clients by address, for ARP.
    by_ip: HashMap<Ipv4Addr, usize>,
    pub ledger: Ledger,
    rng: u64,
    buf: Vec<u8>,
}

impl Fleet {
    pub fn new(socket: PacketSocket, macs: &[[u8; 6]], schedule: Schedule) -> Self {
        let now = Instant::now();
        let seed =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
                ^ u64::from(std::process::id()) << 32;
        Self {
            socket,
            clients: macs.iter().map(|m| Client::new(*m, now)).collect(),
            schedule,
            by_xid: HashMap::new(),
            by_ip: HashMap::new(),
            ledger: Ledger::default(),
            rng: seed,
            buf: vec![0u8; 9216],
        }
    }

    #[cfg(test)]
    pub fn clients(&self) -> &[Client] {
        &self.clients
    }

    /// A random xid no exchange of this fleet has used (splitmix64).
    fn next_xid(&mut self) -> u32 {
        loop {
            self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.rng;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            let xid = (z ^ (z >> 31)) as u32;
            if xid != 0 && !self.by_xid.contains_key(&xid) {
                return xid;
            }
        }
    }

    /// When client i of n acts in a phase spread over `spread`: at `spread` · i / n after `t0`.
    fn start_of(t0: Instant, spread: Duration, i: usize, n: usize) -> Instant {
        t0 + spread.mul_f64(i as f64 / n.max(1) as f64)
    }

    /// The storm: every client powers on, client i at `spread` · i / n after the start, and acquires a lease on
    /// the firmware's schedule. `bound` counts the clients bound so far (for a fault injected mid-storm).
    pub fn acquire(&mut self, spread: Duration, bound: &AtomicUsize) -> anyhow::Result<PhaseReport> {
        let (t0, n) = (Instant::now(), self.clients.len());
        let starts = (0..n).map(|i| Some(Self::start_of(t0, spread, i, n))).collect();
        self.drive(Begin::Acquire, starts, bound)
    }

    /// Every bound client renews (as at T1: client i at `spread` · i / n, as it powered on), rebinding when its
    /// server does not answer.
    pub fn renew(&mut self, spread: Duration, bound: &AtomicUsize) -> anyhow::Result<PhaseReport> {
        let (t0, n) = (Instant::now(), self.clients.len());
        let starts = (0..n)
            .map(|i| (self.clients[i].phase() == Phase::Bound).then(|| Self::start_of(t0, spread, i, n)))
            .collect();
        self.drive(Begin::Renew, starts, bound)
    }

    /// Every client holding an address gives it back to the server that leased it, client i at `spread` · i / n
    /// (nothing is answered, so a burst that overflowed the server's socket would leave leases behind unseen).
    pub fn release(&mut self, spread: Duration) -> anyhow::Result<usize> {
        let (t0, n) = (Instant::now(), self.clients.len());
        let mut sent = 0;
        for i in 0..n {
            let xid = self.next_xid();
            if let Some(m) = self.clients[i].release(xid) {
                std::thread::sleep(Self::start_of(t0, spread, i, n).saturating_duration_since(Instant::now()));
                self.socket.send(&m.frame())?;
                sent += 1;
            }
        }
        self.by_ip.clear();
        Ok(sent)
    }

    fn drive(
        &mut self,
        begin: Begin,
        starts: Vec<Option<Instant>>,
        bound: &AtomicUsize,
    ) -> anyhow::Result<PhaseReport> {
        bound.store(0, Ordering::Relaxed);
        let t0 = Instant::now();
        let held: Vec<Option<Lease>> = self.clients.iter().map(Client::lease).collect();
        let mut report =
            PhaseReport { clients: starts.iter().flatten().count(), began: Some(t0), ..Default::default() };
        let mut started = vec![false; self.clients.len()];
        let mut naked = vec![false; self.clients.len()];
        // A stuck run still ends: NAKs restart an attempt, so bound the whole phase.
        let last_start = starts.iter().flatten().max().copied().unwrap_or(t0);
        let limit = last_start + 2 * self.schedule.total() + Duration::from_secs(10);
        loop {
            let now = Instant::now();
            let mut next = now + Duration::from_millis(50);
            let mut pending = 0;
            for i in 0..self.clients.len() {
                let Some(at) = starts[i] else { continue };
                if !started[i] {
                    if now < at {
                        next = next.min(at);
                        pending += 1;
                        continue;
                    }
                    started[i] = true;
                    let xid = self.next_xid();
                    let step = match begin {
                        Begin::Acquire => self.clients[i].start(now, xid, &self.schedule),
                        Begin::Renew => self.clients[i].renew(now, xid, &self.schedule),
                    };
                    self.apply(i, step, now, &mut report, &mut naked, bound)?;
                } else if self.clients[i].deadline().is_some_and(|d| d <= now) {
                    let xid = self.next_xid();
                    let step = self.clients[i].tick(now, xid, &self.schedule);
                    self.apply(i, step, now, &mut report, &mut naked, bound)?;
                }
                if let Some(d) = self.clients[i].deadline() {
                    next = next.min(d);
                }
                if !self.clients[i].settled() {
                    pending += 1;
                }
            }
            if pending == 0 || now > limit {
                break;
            }
            self.read_all(next.saturating_duration_since(Instant::now()), &mut report, &mut naked, bound)?;
        }
        // Late replies already waiting still go to the ledger.
        self.read_all(Duration::ZERO, &mut report, &mut naked, bound)?;
        for (i, c) in self.clients.iter().enumerate() {
            if starts[i].is_none() {
                continue;
            }
            if c.attempts() > 1 {
                report.retried += 1;
            }
            match c.phase() {
                Phase::Bound => {
                    report.bound += 1;
                    if begin == Begin::Renew && c.lease().map(|l| l.ip) == held[i].map(|l| l.ip) {
                        report.kept += 1;
                    }
                }
                Phase::Unanswered => report.unanswered += 1,
                // Given up, or still trying when the phase was cut short.
                _ => report.gave_up += 1,
            }
        }
        report.naked_clients = naked.iter().filter(|n| **n).count();
        Ok(report)
    }

    /// Waits up to `wait` for a frame, then handles it and every frame waiting after it.
    fn read_all(
        &mut self,
        wait: Duration,
        report: &mut PhaseReport,
        naked: &mut [bool],
        bound: &AtomicUsize,
    ) -> anyhow::Result<()> {
        let mut buf = std::mem::take(&mut self.buf);
        let mut wait = wait;
        let result = (|| {
            while let Some(n) = self.socket.recv(&mut buf, std::mem::take(&mut wait))? {
                let now = Instant::now();
                match wire::parse(&buf[..n]) {
                    Some(Incoming::Reply(r)) => {
                        let Some(&i) = self.by_xid.get(&r.xid) else { continue };
                        if self.clients[i].mac != r.chaddr {
                            continue;
                        }
                        self.ledger.record(&r);
                        let xid = self.next_xid();
                        let step = self.clients[i].on_reply(&r, now, xid, &self.schedule);
                        self.apply(i, step, now, report, naked, bound)?;
                    }
                    Some(Incoming::Arp(req)) => {
                        let holder = self.by_ip.get(&req.target).map(|&i| &self.clients[i]);
                        if let Some(c) = holder.filter(|c| c.lease().is_some_and(|l| l.ip == req.target)) {
                            self.socket.send(&wire::arp_reply(&req, c.mac))?;
                        }
                    }
                    None => {}
                }
            }
            Ok(())
        })();
        self.buf = buf;
        result
    }

    fn apply(
        &mut self,
        i: usize,
        step: Step,
        now: Instant,
        report: &mut PhaseReport,
        naked: &mut [bool],
        bound: &AtomicUsize,
    ) -> anyhow::Result<()> {
        if let Some(m) = step.send {
            self.by_xid.insert(m.xid, i);
            match m.kind {
                MessageType::Discover => report.discovers += 1,
                MessageType::Request => report.requests += 1,
                _ => {}
            }
            self.socket.send(&m.frame())?;
        }
        match step.event {
            Some(Event::Bound { lease, after }) => {
                report.time_to_lease.push(after);
                *report.by_server.entry(lease.server).or_default() += 1;
                report.acks.push((now, lease.server));
                self.by_ip.insert(lease.ip, i);
                bound.fetch_add(1, Ordering::Relaxed);
            }
            // A NAKed client holds no address: ARP for its old one goes unanswered (`read_all` checks the lease).
            Some(Event::Naked { .. }) => {
                report.naks += 1;
                naked[i] = true;
            }
            Some(Event::Exhausted) | None => {}
        }
        Ok(())
    }
}

/// What one whole storm did: the storm, the renewal after it, and the ledger's verdicts over both.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub storm: PhaseReport,
    pub renewal: Option<PhaseReport>,
    pub double_offers: usize,
    pub duplicates: usize,
    /// DISCOVERs answered with an offer (exchanges).
    pub offered: usize,
}

/// How a storm runs.
#[derive(Debug, Clone)]
pub struct StormConfig {
    pub schedule: Schedule,
    /// Client i powers on at `spread` · i / n (and renews and releases at that offset too).
    pub spread: Duration,
    /// Renew every bound client after the storm.
    pub renew: bool,
    /// Release every address at the end (so that the next storm on the same servers starts from free pools).
    pub release: bool,
}

/// Runs a storm of one client per MAC on `socket`: acquire, then (if asked) renew and release. `bound` counts the
/// clients bound so far in the current phase.
pub fn run(socket: PacketSocket, macs: &[[u8; 6]], cfg: &StormConfig, bound: &AtomicUsize) -> anyhow::Result<Outcome> {
    let mut fleet = Fleet::new(socket, macs, cfg.schedule.clone());
    let storm = fleet.acquire(cfg.spread, bound)?;
    let renewal = if cfg.renew { Some(fleet.renew(cfg.spread, bound)?) } else { None };
    if cfg.release {
        fleet.release(cfg.spread)?;
    }
    Ok(Outcome {
        storm,
        renewal,
        double_offers: fleet.ledger.double_offers(),
        duplicates: fleet.ledger.duplicates(),
        offered: fleet.ledger.offered_exchanges(),
    })
}
