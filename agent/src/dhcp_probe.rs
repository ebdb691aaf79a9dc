//! Leadership confirmed by answers: is the local DHCP server actually answering?
//!
//! A bound socket, an active unit or a live pid says nothing about a server that is frozen, holds its socket in a
//! dead child, has no address range for the network, has run out of addresses or listens on the wrong interface.
//! The agent therefore asks the server itself, through the real filter path, every `interval`:
//!
//! - it sends a DHCPDISCOVER as its own probe identity (a locally administered chaddr, `02:49:47:…` by default)
//!   from a UDP socket bound to the provisioning interface, broadcast, carrying ironguard's packet mark
//!   (`SO_MARK`, which needs CAP_NET_ADMIN and which nothing on the wire can set). The kernel loops the broadcast
//!   back to this host's input hook, where the agent's table accepts it in Follower and Leader mode (never in
//!   Blocked), and a server on raw sockets (ISC dhcpd) sees the frame as it leaves;
//! - the agent's table counts every DHCPOFFER the server sends (output hook; on the reply side, offers to the
//!   probe, which it lets out and nothing else to that chaddr);
//! - a server that has sent no OFFER for `silence` although at least two probes went out in that time is not
//!   answering: the agent reports DHCP unhealthy, steps down if it leads and does not campaign.
//!
//! Real traffic counts as evidence too (an OFFER to any client), so a server busy with a boot storm that answers
//! the probe late is still answering. Why the probe is harmless: it is only ever a DISCOVER, never a REQUEST, so
//! neither dnsmasq nor ISC dhcpd writes a lease for it; the address they offer is the same one for every probe
//! (one chaddr per host), held only as an offer; no ACK to the probe's chaddr leaves the host, so nobody on the
//! network can take a lease by borrowing that identity; a follower's table accepts the probe only because it
//! carries the mark of a socket on this host.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsFd as _;
use std::time::{Duration, Instant};

use ironguard_dataplane::{MacAddr, ProbeCounts};
use nix::sys::socket::{setsockopt, sockopt};
use rand::Rng as _;

use crate::config::{AgentConfig, ProbeMode};

/// The OUI-like prefix of the default probe identities: `02` (locally administered, unicast), then "IG".
pub const PROBE_PREFIX: [u8; 3] = [0x02, 0x49, 0x47];

/// What the agent probes, resolved from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub interface: String,
    pub mac: MacAddr,
    pub interval: Duration,
    pub silence: Duration,
    pub mark: u32,
}

/// The default probe identity of an agent: the prefix and three bytes of a hash of its id, so that hosts of one
/// network differ.
pub fn default_mac(agent_id: &str) -> MacAddr {
    // FNV-1a: stable across releases and platforms (std's hasher is neither promised).
    let mut h: u32 = 0x811c_9dc5;
    for b in agent_id.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    let [_, a, b, c] = h.to_be_bytes();
    let [p0, p1, p2] = PROBE_PREFIX;
    MacAddr::from_octets([p0, p1, p2, a, b, c]).expect("a locally administered unicast address is valid")
}

/// The probe plan, or why there is none. `Err`: `mode = "on"` asked for something this host cannot do.
pub fn plan(cfg: &AgentConfig) -> Result<Option<Plan>, String> {
    let p = &cfg.dhcp_probe;
    if p.mode == ProbeMode::Off {
        return Ok(None);
    }
    let impossible = |why: String| if p.mode == ProbeMode::On { Err(why) } else { Ok(None) };
    let dp = &cfg.dataplane;
    if !dp.backends.contains(&ironguard_dataplane::Backend::Nftables) {
        return impossible(
            "[dhcp_probe] needs the nftables backend (its rules let the probe in and count offers)".into(),
        );
    }
    if dp.backends.contains(&ironguard_dataplane::Backend::DnsmasqHostsdir) {
        return impossible(
            "[dhcp_probe] cannot ask a dnsmasq that reads a hostsdir: it ignores every MAC the hostsdir does not list, \
             the probe's too"
                .into(),
        );
    }
    if !dp.ports.contains(&67) {
        return impossible(format!(
            "[dhcp_probe] asks a DHCPv4 server on udp/67; this host filters ports {:?} only",
            dp.ports
        ));
    }
    if !dp.hooks.contains(&ironguard_dataplane::HookKind::Input) && dp.egress_interfaces.is_empty() {
        return impossible(
            "[dhcp_probe] needs hooks = [\"input\"] (a server on this host) or egress_interfaces (a server on raw \
             sockets)"
                .into(),
        );
    }
    let interface = if !p.interface.is_empty() {
        p.interface.clone()
    } else if let Some(i) = dp.interfaces.first().or(dp.egress_interfaces.first()) {
        i.clone()
    } else {
        return impossible(
            "[dhcp_probe] needs an interface to send on: set [dhcp_probe] interface or [dataplane] interfaces".into(),
        );
    };
    let mac = if p.mac.is_empty() {
        default_mac(&cfg.agent.id)
    } else {
        p.mac.parse::<MacAddr>().map_err(|e| format!("[dhcp_probe] mac: {e}"))?
    };
    Ok(Some(Plan {
        interface,
        mac,
        interval: Duration::from_millis(p.interval_ms),
        silence: Duration::from_millis(p.silence_ms),
        mark: dp.mark,
    }))
}

/// The verdict on the local server from the probe's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// An OFFER left this host within `silence`.
    Answering,
    /// No OFFER yet since the agent started.
    NotYet,
    /// No OFFER for longer than `silence`, with at least two probes sent in that time.
    Silent,
    /// The counters could not be read, or the probe could not be sent, for longer than `silence`.
    Broken(String),
}

/// Follows the counters and the probes sent. Pure: the caller supplies the time.
#[derive(Debug)]
pub struct Tracker {
    silence: Duration,
    last: Option<ProbeCounts>,
    last_offer: Option<Instant>,
    /// Probes sent since the last OFFER (or since the start).
    unanswered: u32,
    /// The last failure to read the counters, and since when reads have failed.
    read_error: Option<(String, Instant)>,
    /// The last failure to send a probe, and since when sends have failed.
    send_error: Option<(String, Instant)>,
}

impl Tracker {
    pub fn new(silence: Duration) -> Self {
        Self { silence, last: None, last_offer: None, unanswered: 0, read_error: None, send_error: None }
    }

    /// New counter values. Offers that rose mean the server answered someone; counters that fell mean the table
    /// was built again (they restart from 0), which is no evidence either way.
    pub fn observe(&mut self, now: Instant, counts: Result<ProbeCounts, String>) {
        match counts {
            Ok(c) => {
                self.read_error = None;
                if let Some(prev) = self.last {
                    if c.offers > prev.offers {
                        self.last_offer = Some(now);
                        self.unanswered = 0;
                    }
                }
                self.last = Some(c);
            }
            Err(e) => failing(&mut self.read_error, format!("cannot read the probe counters: {e}"), now),
        }
    }

    /// A probe went out at `now` (`Err`: sending failed).
    pub fn sent(&mut self, now: Instant, result: Result<(), String>) {
        match result {
            Ok(()) => {
                self.send_error = None;
                self.unanswered = self.unanswered.saturating_add(1)
            }
            Err(e) => failing(&mut self.send_error, format!("cannot send the probe: {e}"), now),
        }
    }

    /// One failed read or send is not a verdict: a read interrupted by the ruleset changing under it (a leader
    /// rewrites its lease several times a second) or a send refused once for lack of buffers says nothing about the
    /// server. Failures that last `silence` are: the same bound as a server that stopped answering.
    pub fn verdict(&self, now: Instant) -> Verdict {
        for (e, since) in [&self.read_error, &self.send_error].into_iter().flatten() {
            if now.saturating_duration_since(*since) >= self.silence {
                return Verdict::Broken(e.clone());
            }
        }
        match self.last_offer {
            None => Verdict::NotYet,
            Some(t) if now.saturating_duration_since(t) > self.silence && self.unanswered >= 2 => Verdict::Silent,
            Some(_) => Verdict::Answering,
        }
    }
}

/// Records a failure: the newest reason, since the first of the run.
fn failing(slot: &mut Option<(String, Instant)>, reason: String, now: Instant) {
    let since = slot.as_ref().map_or(now, |(_, since)| *since);
    *slot = Some((reason, since));
}

impl Plan {
    /// The verdict in words, for the health detail (stable while the verdict is: no times or counts in it).
    pub fn describe(&self, v: &Verdict) -> String {
        let who = format!("probe {} on {}", self.mac, self.interface);
        match v {
            Verdict::Answering => format!("the DHCP server answers ({who})"),
            Verdict::NotYet => format!("the DHCP server has not answered a probe yet ({who})"),
            Verdict::Silent => format!(
                "the DHCP server sent no DHCPOFFER for more than {} ms although probes asked ({who}): it is frozen, \
                 down, has no address range for this network or none free, or listens on another interface",
                self.silence.as_millis()
            ),
            Verdict::Broken(e) => format!("{e} ({who})"),
        }
    }
}

/// The probe's socket: UDP, broadcast, bound to the provisioning interface, carrying ironguard's mark.
#[derive(Debug)]
pub struct Prober {
    sock: UdpSocket,
    chaddr: [u8; 6],
}

impl Prober {
    pub fn open(plan: &Plan) -> std::io::Result<Self> {
        let sock = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))?;
        sock.set_broadcast(true)?;
        setsockopt(&sock.as_fd(), sockopt::BindToDevice, &std::ffi::OsString::from(&plan.interface))
            .map_err(std::io::Error::from)?;
        setsockopt(&sock.as_fd(), sockopt::Mark, &plan.mark).map_err(std::io::Error::from)?;
        sock.set_nonblocking(true)?;
        Ok(Self { sock, chaddr: plan.mac.octets() })
    }

    /// Sends one DISCOVER to the broadcast address.
    pub fn send(&self) -> std::io::Result<()> {
        let xid: u32 = rand::rng().random();
        let packet = discover(self.chaddr, xid);
        self.sock.send_to(&packet, SocketAddrV4::new(Ipv4Addr::BROADCAST, 67)).map(|_| ())
    }
}

/// A BOOTP DHCPDISCOVER from `chaddr` with the broadcast flag, option 53 first, as a PXE ROM sends it (vendor
/// class `PXEClient`, architecture and machine id: a proxyDHCP server answers only those), 320 bytes (BOOTP's
/// minimum is 300).
pub fn discover(chaddr: [u8; 6], xid: u32) -> Vec<u8> {
    let mut p = vec![0u8; 320];
    p[0] = 1; // BOOTREQUEST
    p[1] = 1; // Ethernet
    p[2] = 6; // hardware address length
    p[4..8].copy_from_slice(&xid.to_be_bytes());
    p[10..12].copy_from_slice(&0x8000u16.to_be_bytes()); // broadcast: the reply must not need ARP
    p[28..34].copy_from_slice(&chaddr);
    p[236..240].copy_from_slice(&[99, 130, 83, 99]); // magic cookie
    p[240..243].copy_from_slice(&[53, 1, 1]); // DHCPDISCOVER, where the table's rule looks for it
    let mut at = 243;
    let vendor = b"PXEClient:Arch:00000:UNDI:002001";
    for (code, value) in [(60u8, &vendor[..]), (93, &[0, 0][..]), (94, &[1, 2, 1][..])] {
        p[at] = code;
        p[at + 1] = value.len() as u8;
        p[at + 2..at + 2 + value.len()].copy_from_slice(value);
        at += 2 + value.len();
    }
    // option 97: the machine id, type 0 and 16 bytes (the chaddr, then zeros)
    p[at..at + 3].copy_from_slice(&[97, 17, 0]);
    p[at + 3..at + 9].copy_from_slice(&chaddr);
    at += 19;
    p[at] = 255;
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(offers: u64) -> Result<ProbeCounts, String> {
        Ok(ProbeCounts { discovers: 0, offers })
    }

    #[test]
    fn silent_only_after_the_silence_and_two_unanswered_probes() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut t = Tracker::new(Duration::from_millis(1500));
        t.observe(t0, counts(0));
        assert_eq!(t.verdict(t0), Verdict::NotYet, "no offer seen yet: not answering, not silent");
        t.sent(t0, Ok(()));
        t.observe(ms(500), counts(1));
        assert_eq!(t.verdict(ms(500)), Verdict::Answering);
        // the server stops answering: still answering within the silence, whatever was sent
        t.sent(t0, Ok(()));
        t.observe(ms(1000), counts(1));
        t.sent(t0, Ok(()));
        assert_eq!(t.verdict(ms(1900)), Verdict::Answering);
        t.observe(ms(2100), counts(1));
        assert_eq!(t.verdict(ms(2100)), Verdict::Silent);
        // an offer to anyone (a real client) is evidence too
        t.observe(ms(2200), counts(7));
        assert_eq!(t.verdict(ms(2200)), Verdict::Answering);
    }

    #[test]
    fn a_quiet_period_without_probes_is_not_silence() {
        let t0 = Instant::now();
        let mut t = Tracker::new(Duration::from_millis(1500));
        t.observe(t0, counts(3));
        t.observe(t0 + Duration::from_millis(10), counts(4));
        t.sent(t0, Ok(()));
        // one probe unanswered for long: not enough (the probe may have been lost or the server busy once)
        assert_eq!(t.verdict(t0 + Duration::from_secs(10)), Verdict::Answering);
        t.sent(t0, Ok(()));
        assert_eq!(t.verdict(t0 + Duration::from_secs(10)), Verdict::Silent);
    }

    #[test]
    fn a_rebuilt_table_restarts_the_counters_without_counting_as_an_answer() {
        let t0 = Instant::now();
        let mut t = Tracker::new(Duration::from_millis(1000));
        t.observe(t0, counts(40));
        t.observe(t0, counts(41));
        t.sent(t0, Ok(()));
        t.sent(t0, Ok(()));
        t.observe(t0 + Duration::from_secs(2), counts(0));
        assert_eq!(t.verdict(t0 + Duration::from_secs(2)), Verdict::Silent);
        t.observe(t0 + Duration::from_secs(3), counts(1));
        assert_eq!(t.verdict(t0 + Duration::from_secs(3)), Verdict::Answering);
    }

    #[test]
    fn errors_that_last_the_silence_are_a_verdict_with_their_reason() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut t = Tracker::new(Duration::from_millis(1000));
        t.observe(t0, counts(0));
        t.sent(t0, Ok(()));
        t.observe(ms(100), counts(1));
        assert_eq!(t.verdict(ms(100)), Verdict::Answering);
        // one interrupted read (the ruleset changed under it): no verdict of its own
        t.observe(ms(200), Err("the ruleset kept changing".into()));
        assert_eq!(t.verdict(ms(200)), Verdict::Answering);
        // a read that works again clears it
        t.observe(ms(300), counts(2));
        assert_eq!(t.verdict(ms(1250)), Verdict::Answering);
        // failures that go on for the silence are Broken, with the newest reason
        t.observe(ms(400), Err("EINTR".into()));
        t.observe(ms(900), Err("EPERM".into()));
        assert_eq!(t.verdict(ms(1399)), Verdict::Answering);
        assert!(matches!(t.verdict(ms(1400)), Verdict::Broken(e) if e.contains("EPERM")));
        t.observe(ms(1500), counts(3));
        assert_eq!(t.verdict(ms(1500)), Verdict::Answering);
        // sending: the same
        t.sent(ms(1600), Err("ENOBUFS".into()));
        assert_eq!(t.verdict(ms(1600)), Verdict::Answering);
        t.sent(ms(2000), Err("ENETDOWN".into()));
        assert!(matches!(t.verdict(ms(2600)), Verdict::Broken(e) if e.contains("ENETDOWN")));
        t.sent(ms(2700), Ok(()));
        t.observe(ms(2700), counts(4));
        assert_eq!(t.verdict(ms(2700)), Verdict::Answering);
    }

    #[test]
    fn the_discover_is_what_the_table_matches() {
        let p = discover([2, 0x49, 0x47, 1, 2, 3], 0xdead_beef);
        assert_eq!(p.len(), 320);
        // chaddr at 28 (the table reads @th,288,48: 8 bytes of UDP header + 28)
        assert_eq!(&p[28..34], &[2, 0x49, 0x47, 1, 2, 3]);
        // option 53 = DISCOVER first after the cookie (@th,1984,24 = UDP header + 240)
        assert_eq!(&p[240..243], &[53, 1, 1]);
        assert_eq!(&p[4..8], &0xdead_beefu32.to_be_bytes());
        // a PXE ROM's vendor class right after it, and the end option inside the packet
        assert_eq!(&p[243..245], &[60, 32]);
        assert_eq!(&p[245..254], b"PXEClient");
        assert!(p[254..].contains(&255));
    }

    #[test]
    fn default_identities_are_locally_administered_and_differ_per_host() {
        let a = default_mac("pxe-a").octets();
        let b = default_mac("pxe-b").octets();
        assert_eq!(&a[..3], &PROBE_PREFIX);
        assert_ne!(a, b);
        assert_eq!(default_mac("pxe-a").octets(), a, "stable");
    }
}
