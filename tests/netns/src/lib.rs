//! Harness for ironguard's privileged end-to-end tests.
//!
//! Every test builds its own topology from uniquely named network namespaces ([`Netns`]) joined by veth pairs,
//! starts a real dnsmasq ([`Dnsmasq`]) in a "PXE host" namespace and real DHCP clients (busybox `udhcpc`, see
//! [`dhcp`]) in "node" namespaces, and runs the real ironguard binaries ([`bin`]). Nothing touches the host's
//! own firewall: all nftables state lives inside the test namespaces, which are deleted (with every process in
//! them) when the test ends, whether it passed or panicked.
//!
//! These tests need root (for `ip netns`) and the tools the README's test command installs. When either is
//! missing they fail with a message naming what is missing; they never skip.
#![forbid(unsafe_code)]
// A test harness: a failed set-up step must abort the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs::File;
use std::io::Read as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use ironguard_dataplane::MacAddr;

pub mod etcd;
pub mod faults;
pub mod guest;
pub mod ha;
pub mod http;
pub mod ironic;
pub mod ironic_ha;
pub mod ironic_site;
pub mod keystone;
pub mod mariadb;
pub mod pki;
pub mod secrets;
pub mod shapes;
pub mod site_round;
pub use etcd::{EtcdProcess, EtcdRelease, TlsFiles};
pub use ironic::{RealIronic, ipa_inventory};

static COUNTER: AtomicU32 = AtomicU32::new(0);

pub(crate) fn unique(tag: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("ig-{tag}-{}-{n}", std::process::id())
}

/// Fails the test unless it runs as root with every tool the end-to-end tests use. Called by every harness
/// constructor, so a test cannot silently run without its real parts.
pub fn require_privileges() {
    static CHECK: OnceLock<Result<(), String>> = OnceLock::new();
    let r = CHECK.get_or_init(|| {
        if !nix::unistd::geteuid().is_root() {
            return Err("end-to-end tests need root (ip netns, nftables). Run the README's test command as root.".into());
        }
        let mut missing = vec![];
        for tool in ["ip", "nft", "dnsmasq", "busybox", "setpriv", "ss", "curl"] {
            let found = Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !found {
                missing.push(tool);
            }
        }
        if !missing.is_empty() {
            return Err(format!(
                "missing tools for the end-to-end tests: {}. The README's test command installs them (nftables, dnsmasq-base, busybox, util-linux, iproute2).",
                missing.join(", ")
            ));
        }
        Ok(())
    });
    if let Err(e) = r {
        panic!("cannot set up the end-to-end test: {e}");
    }
}

/// A command prefix running a program as uid/gid 65534 holding CAP_NET_ADMIN and no other capability.
pub const SETPRIV_NET_ADMIN_ONLY: [&str; 7] = [
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
    "--inh-caps=-all,+net_admin",
    "--ambient-caps=-all,+net_admin",
    "--bounding-set=-all,+net_admin",
];

/// Path of a workspace binary (built by `cargo build --workspace` before the tests run): next to the running
/// executable (a benchmark in target/<profile>/) or one directory up (a test in target/<profile>/deps/).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("exe dir");
    for candidate in [dir.join(name), dir.parent().map(|p| p.join(name)).unwrap_or_default()] {
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "{name} is missing next to {}: build the workspace binaries first (cargo build --workspace --bins)",
        exe.display()
    );
}

/// Whether the file `binary` holds the bytes of `marker` (e.g. a string only a test hook puts there).
pub fn binary_holds(binary: &Path, marker: &str) -> bool {
    let grep = Command::new("grep").args(["-q", "-a", "-F", "--", marker]).arg(binary).status();
    match grep.unwrap_or_else(|e| panic!("cannot run grep: {e}")).code() {
        Some(0) => true,
        Some(1) => false,
        other => panic!("grep {marker} {}: exit status {other:?}", binary.display()),
    }
}

/// Runs a command to completion; panics with its output if it fails.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A temporary directory removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(unique(tag));
        std::fs::create_dir_all(&p).expect("create temp dir");
        // World-writable: some tests run ironguard as an unprivileged user that writes its ready file here.
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o1777)).expect("chmod temp dir");
        Self(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // `IRONGUARD_KEEP_TEST_DIRS=1` keeps the directories (the daemons' logs) for a look afterwards.
        if std::env::var_os("IRONGUARD_KEEP_TEST_DIRS").is_some_and(|v| v == "1") {
            eprintln!("kept {}", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A uniquely named network namespace, deleted with all its processes on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    pub fn new(tag: &str) -> Self {
        require_privileges();
        let name = unique(tag);
        run_ok(Command::new("ip").args(["netns", "add", &name]));
        let ns = Self { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// A command that runs inside this namespace.
    pub fn cmd(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    /// `ip ARGS` inside the namespace (`ip -n NAME ARGS`: ip enters the namespace itself, one program instead of two
    /// and no mount namespace of `ip netns exec`); panics on failure.
    pub fn ip(&self, args: &[&str]) -> Output {
        run_ok(Command::new("ip").args(["-n", &self.name]).args(args))
    }

    /// `nft ARGS` inside the namespace.
    pub fn nft(&self, args: &[&str]) -> Output {
        self.cmd("nft").args(args).output().expect("run nft")
    }

    /// Pids of every process in the namespace.
    pub fn pids(&self) -> Vec<i32> {
        let out = Command::new("ip").args(["netns", "pids", &self.name]).output().expect("ip netns pids");
        String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for pid in self.pids() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// Connects `a_if` in `a` to `b_if` in `b` with a veth pair (created directly in the namespaces, so interface
/// names never collide between tests).
pub fn veth(a: &Netns, a_if: &str, b: &Netns, b_if: &str) {
    run_ok(Command::new("ip").args([
        "link",
        "add",
        a_if,
        "netns",
        a.name(),
        "type",
        "veth",
        "peer",
        "name",
        b_if,
        "netns",
        b.name(),
    ]));
    a.ip(&["link", "set", a_if, "up"]);
    b.ip(&["link", "set", b_if, "up"]);
}

/// A child process killed (SIGKILL) and reaped on drop; its output goes to a log file shown on failure.
#[derive(Debug)]
pub struct Proc {
    pub child: Option<Child>,
    pub what: String,
    pub log: PathBuf,
}

impl Proc {
    /// Spawns `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(what: &str, mut cmd: Command, log: PathBuf) -> Self {
        let f = File::options().create(true).append(true).open(&log).expect("open log");
        let f2 = f.try_clone().expect("clone log fd");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f)
            .stderr(f2)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what} ({cmd:?}): {e}"));
        Self { child: Some(child), what: what.to_string(), log }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig);
    }

    /// Waits for the process to exit, up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                return Some(st);
            }
            if Instant::now() > deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// True while the process runs.
    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        if !thread::panicking() {
            // "No secret in any log line of the suite": every daemon's log is checked when it is dropped.
            if let Some(found) = secrets::found_in(&self.log_text()) {
                panic!("{} logged a secret ({found}); its log: {}", self.what, self.log.display());
            }
        }
        if thread::panicking() {
            eprintln!("---- log of {} ({}) ----\n{}", self.what, self.log.display(), self.log_text());
        }
    }
}

/// How long the harness waits for a process it started to be ready (listening, leading, exited after SIGKILL): a
/// deadline for something that is stuck, generous because a busy machine (eight tests beside a CPU hog on two
/// cores) starts a debug build slowly. Never a measurement.
pub const SETUP_DEADLINE: Duration = Duration::from_secs(60);

/// How long a test waits for what the system under test does by itself (a filter change reaching the kernel, a
/// leader elected, a state reached): a deadline for something stuck, not a measurement (the benchmarks measure).
pub const DEADLINE: Duration = Duration::from_secs(30);

/// The state letter of a process (`/proc/PID/stat`'s third field: `T` once SIGSTOP took effect), None if it is
/// gone. `kill` returns before the signal takes effect on a process running on another CPU.
pub fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// Polls `f` until it returns `Some`, up to `timeout`: after 10 ms at first, then every 100 ms at most.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    // 10 ms at first, then longer up to 100 ms: most checks start a process or read a whole ruleset, and a check
    // every 10 ms through a long wait kept a core busy for nothing.
    let mut pause = Duration::from_millis(10);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        thread::sleep(pause);
        pause = (pause * 3 / 2).min(Duration::from_millis(100));
    }
}

/// A real dnsmasq serving DHCP in a namespace.
#[derive(Debug)]
pub struct Dnsmasq {
    pub proc: Proc,
}

impl Dnsmasq {
    /// Starts dnsmasq on `iface` in `ns` with a DHCP range, and waits until it listens on UDP 67.
    pub fn start(ns: &Netns, dir: &TempDir, iface: &str, range: (&str, &str), extra: &[&str]) -> Self {
        let spec = format!("{},{},255.255.255.0,1h", range.0, range.1);
        Self::start_range(ns, dir, &format!("dnsmasq-{iface}"), iface, &spec, extra)
    }

    /// Starts dnsmasq on `iface` in `ns` with the whole `--dhcp-range` given (`START,END,NETMASK,LEASE`), its lease,
    /// pid and log files named after `tag` in `dir`, and waits until it listens on UDP 67.
    pub fn start_range(ns: &Netns, dir: &TempDir, tag: &str, iface: &str, range: &str, extra: &[&str]) -> Self {
        let mut cmd = ns.cmd("dnsmasq");
        cmd.args([
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--port=0",
            "--user=root",
            "--log-facility=-",
            "--log-dhcp",
            "--no-ping",
            "--dhcp-authoritative",
        ])
        .arg(format!("--interface={iface}"))
        .arg(format!("--dhcp-range={range}"))
        .arg(format!("--dhcp-leasefile={}", dir.join(&format!("{tag}.leases")).display()))
        .arg(format!("--pid-file={}", dir.join(&format!("{tag}.pid")).display()))
        .args(extra);
        let proc = Proc::spawn(tag, cmd, dir.join(&format!("{tag}.log")));
        let mut d = Self { proc };
        d.wait_listening(ns);
        d
    }

    fn wait_listening(&mut self, ns: &Netns) {
        let ok = wait_for(SETUP_DEADLINE, || port_bound(ns, Transport::Udp, 67).then_some(()));
        assert!(
            ok.is_some() && self.proc.running(),
            "dnsmasq did not start listening on udp/67:\n{}",
            self.proc.log_text()
        );
    }
}

/// A lease obtained by a DHCP client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub ip: Ipv4Addr,
    pub server_id: Ipv4Addr,
}

fn udhcpc_script() -> &'static Path {
    static SCRIPT: OnceLock<PathBuf> = OnceLock::new();
    SCRIPT.get_or_init(|| {
        let p = std::env::temp_dir().join(format!("ig-udhcpc-{}.sh", std::process::id()));
        std::fs::write(&p, "#!/bin/sh\n[ \"$1\" = bound ] && echo \"LEASE $ip $serverid\"\nexit 0\n")
            .expect("write script");
        run_ok(Command::new("chmod").arg("755").arg(&p));
        p
    })
}

/// What a DHCP client run is meant to show. It sets only how long the client waits; what it got is reported
/// either way, and the test asserts on that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// A lease: up to [`DHCP_TRIES`] DISCOVERs 1 s apart, ending at the first offer, so the long window costs
    /// nothing unless the test fails (a busy machine may answer a DISCOVER late).
    Lease,
    /// No lease, for a MAC whose refusal has already been read where it is decided (the kernel's rules, see
    /// [`assert_kernel_refuses`]; or the DHCP server's own configuration): one DISCOVER, and
    /// [`REFUSED_WAIT_SECS`] for an offer that must not come. The state read first is the proof; the packet shows
    /// that traffic agrees with it.
    Nothing,
}

/// DISCOVERs (1 s apart) a client that wants a lease sends before it gives up.
pub const DHCP_TRIES: u32 = 10;
/// How long a client that must get nothing ([`Want::Nothing`]) waits for an offer to its single DISCOVER.
pub const REFUSED_WAIT_SECS: u32 = 1;

/// Gives `iface` in `node` the address `mac` without taking the link down: a link that goes down and up again is
/// not forwarded by the bridge on the other side until the kernel has processed the carrier change (up to a
/// second later), and a DISCOVER sent meanwhile is lost. veth devices take a new address while up.
pub fn set_mac_up(node: &Netns, iface: &str, mac: MacAddr) {
    node.ip(&["link", "set", iface, "address", &mac.to_string()]);
    node.ip(&["link", "set", iface, "up"]);
}

/// Sets `iface`'s MAC in `node` and starts a busybox udhcpc (it listens before it sends); collect the result with
/// [`DhcpAttempt::finish`].
pub fn dhcp_start(node: &Netns, iface: &str, mac: MacAddr, want: Want) -> DhcpAttempt {
    set_mac_up(node, iface, mac);
    let (tries, wait) = match want {
        Want::Lease => (DHCP_TRIES, 1),
        Want::Nothing => (1, REFUSED_WAIT_SECS),
    };
    let child = node
        .cmd("busybox")
        .args(["udhcpc", "-i", iface, "-f", "-q", "-n", "-t", &tries.to_string(), "-T", &wait.to_string(), "-A", "1"])
        .arg("-s")
        .arg(udhcpc_script())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn udhcpc");
    DhcpAttempt { child, mac }
}

/// A DHCP client run in progress.
#[derive(Debug)]
pub struct DhcpAttempt {
    child: Child,
    pub mac: MacAddr,
}

impl DhcpAttempt {
    /// Waits for the client; `Some(lease)` if it got one.
    pub fn finish(self) -> Option<Lease> {
        let out = self.child.wait_with_output().expect("wait udhcpc");
        let text = String::from_utf8_lossy(&out.stdout);
        let lease = text.lines().find_map(|l| {
            let mut f = l.strip_prefix("LEASE ")?.split_whitespace();
            Some(Lease { ip: f.next()?.parse().ok()?, server_id: f.next()?.parse().ok()? })
        });
        if out.status.success() != lease.is_some() {
            panic!(
                "udhcpc exit status {} disagrees with its output:\n{text}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        lease
    }
}

/// One DHCP exchange with a fixed MAC that should get a lease: `Some(lease)`, or `None` after [`DHCP_TRIES`]
/// DISCOVERs.
pub fn dhcp(node: &Netns, iface: &str, mac: MacAddr) -> Option<Lease> {
    dhcp_start(node, iface, mac, Want::Lease).finish().or_else(|| dhcp_again(node, iface, mac))
}

/// A client that wanted a lease and got none runs once more, as a real client (a PXE ROM, dhclient) would. On a
/// busy machine busybox udhcpc was seen to miss all three ACKs that dnsmasq logged sending for its REQUESTs, then
/// give up (track-record T18): the filter had let the exchange through, which is what the tests check. Said on
/// stderr, so that it shows in the test's output.
fn dhcp_again(node: &Netns, iface: &str, mac: MacAddr) -> Option<Lease> {
    eprintln!("dhcp: {mac} got no lease from its first client run; one more run (a real client retries)");
    dhcp_start(node, iface, mac, Want::Lease).finish()
}

/// One DISCOVER from a MAC that must get nothing ([`Want::Nothing`]): `None` unless an offer came anyway. Read the
/// state that refuses it first ([`assert_kernel_refuses`]).
pub fn dhcp_refused(node: &Netns, iface: &str, mac: MacAddr) -> Option<Lease> {
    dhcp_start(node, iface, mac, Want::Nothing).finish()
}

/// How the kernel of `pxe` treats DHCP from `mac`: its tables read back and judged by the rule that decides (the
/// judgement `ironguardctl explain --local` shows). A read that meets a ruleset changing under it is repeated; any
/// other failed read fails the test.
pub fn kernel_decision(pxe: &Netns, mac: MacAddr) -> ironguard_dataplane::MacDecision {
    ironguard_dataplane::decide(kernel_inputs(pxe, mac))
}

/// What the kernel of `pxe` holds that decides for `mac` (its tables read back; a read that meets a ruleset changing
/// under it is repeated, any other failed read fails the test).
fn kernel_inputs(pxe: &Netns, mac: MacAddr) -> ironguard_dataplane::MacInputs {
    in_netns(pxe, move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match ironguard_dataplane::observe(true) {
                Ok(o) => return o.mac_inputs(mac),
                Err(ironguard_dataplane::NftError::Unstable(_)) if Instant::now() < deadline => {}
                Err(e) => panic!("reading the kernel's tables failed: {e}"),
            }
        }
    })
}

/// Whether the kernel of `pxe` refuses `mac` by its filter: the MAC is out of the allow set and nothing else lets it
/// through. [`kernel_decision`] alone also reads "refused" while a leader's kernel lease has lapsed for a moment (a
/// keep-alive late on a busy machine: fenced, as it must be), and that leader serves the MAC again once it renews.
pub fn kernel_filter_refuses(pxe: &Netns, mac: MacAddr) -> bool {
    let inputs = kernel_inputs(pxe, mac);
    !inputs.in_allow && !ironguard_dataplane::decide(inputs).served
}

/// Fails the test unless the kernel of `pxe` refuses DHCP from `mac` now (see [`kernel_decision`]).
pub fn assert_kernel_refuses(pxe: &Netns, mac: MacAddr) {
    let d = kernel_decision(pxe, mac);
    assert!(!d.served, "the kernel of {} lets {mac} through: {} ({})", pxe.name(), d.rule, d.why);
}

/// The negative proof on the PXE host `pxe`: its kernel refuses `mac` (read first), and one DISCOVER from `node`'s
/// `iface` gets no offer. `None` unless an offer came anyway.
pub fn no_dhcp(pxe: &Netns, node: &Netns, iface: &str, mac: MacAddr) -> Option<Lease> {
    assert_kernel_refuses(pxe, mac);
    dhcp_refused(node, iface, mac)
}

/// Parses a MAC literal (tests only).
pub fn mac(s: &str) -> MacAddr {
    s.parse().expect("valid MAC")
}

/// A PXE host namespace with a bridge `br0` (10.77.0.1/24) serving DHCP with a real dnsmasq, and `n` node
/// namespaces, each with an `eth0` on that bridge.
#[derive(Debug)]
pub struct PxeLan {
    pub dnsmasq: Dnsmasq,
    pub nodes: Vec<Netns>,
    pub pxe: Netns,
    pub dir: TempDir,
}

impl PxeLan {
    pub const SERVER: &'static str = "10.77.0.1";

    pub fn new(n: usize) -> Self {
        let dir = TempDir::new("lan");
        let pxe = Netns::new("pxe");
        pxe.ip(&["link", "add", "br0", "type", "bridge", "forward_delay", "0"]);
        pxe.ip(&["addr", "add", "10.77.0.1/24", "dev", "br0"]);
        pxe.ip(&["link", "set", "br0", "up"]);
        let mut nodes = Vec::new();
        for i in 0..n {
            let node = Netns::new("node");
            let port = format!("p{i}");
            veth(&node, "eth0", &pxe, &port);
            pxe.ip(&["link", "set", &port, "master", "br0"]);
            nodes.push(node);
        }
        let dnsmasq = Dnsmasq::start(&pxe, &dir, "br0", ("10.77.0.100", "10.77.0.250"), &[]);
        Self { dnsmasq, nodes, pxe, dir }
    }

    /// Runs one DHCP client per (node index, MAC, what it should get) at the same time; results in the same order.
    /// For a client that must get nothing, the PXE host's kernel is read first and must refuse it.
    pub fn dhcp_all(&self, clients: &[(usize, MacAddr, Want)]) -> Vec<Option<Lease>> {
        for (_, m, want) in clients {
            if *want == Want::Nothing {
                assert_kernel_refuses(&self.pxe, *m);
            }
        }
        let attempts: Vec<DhcpAttempt> =
            clients.iter().map(|(i, m, want)| dhcp_start(&self.nodes[*i], "eth0", *m, *want)).collect();
        let got: Vec<Option<Lease>> = attempts.into_iter().map(DhcpAttempt::finish).collect();
        got.into_iter()
            .zip(clients)
            .map(|(lease, (i, m, want))| match (lease, want) {
                (None, Want::Lease) => dhcp_again(&self.nodes[*i], "eth0", *m),
                (lease, _) => lease,
            })
            .collect()
    }
}

/// An `ironguard-agent hold` process in a namespace, waited on until its table is in place.
pub fn start_hold(ns: &Netns, dir: &TempDir, args: &[&str]) -> Proc {
    start_hold_as(ns, dir, args, None)
}

/// Like [`start_hold`], optionally wrapped in another command (e.g. `setpriv ...` to drop privileges).
pub fn start_hold_as(ns: &Netns, dir: &TempDir, args: &[&str], wrapper: Option<&[&str]>) -> Proc {
    let ready = dir.join(&unique("ready"));
    let mut cmd = match wrapper {
        Some(w) => {
            let mut c = ns.cmd(w[0]);
            c.args(&w[1..]).arg(bin("ironguard-agent"));
            c
        }
        None => ns.cmd(bin("ironguard-agent")),
    };
    cmd.arg("hold").args(args).arg("--ready-file").arg(&ready).env("RUST_LOG", "info");
    let log = dir.join(&unique("agent-log"));
    let mut p = Proc::spawn("ironguard-agent hold", cmd, log);
    let ok = wait_for(SETUP_DEADLINE, || {
        if !p.running() {
            return Some(false);
        }
        ready.exists().then_some(true)
    });
    assert_eq!(ok, Some(true), "ironguard-agent hold did not become ready:\n{}", p.log_text());
    p
}

/// `ironguardctl chains --netns NS --json`, parsed.
pub fn chains_json(ns: &Netns) -> serde_json::Value {
    let out = run_ok(Command::new(bin("ironguardctl")).args(["chains", "--json", "--netns", ns.name()]));
    serde_json::from_slice(&out.stdout).expect("ironguardctl chains --json prints JSON")
}

/// The verdict string of `ironguardctl chains --json` (`LEADER`, `FENCED`, `FOLLOWER`, `BLOCKED`, `CLOSED`,
/// `UNGUARDED`), computed as that command computes it (`ironguard_dataplane::observe`, then
/// [`ironguard_dataplane::Observed::verdict`]) by a thread inside the namespace. The wait loops ask it thousands of
/// times a run, and starting `ironguardctl` for each cost about 8 ms of CPU (5% of the test pool under perf); the
/// command itself is run by [`chains_json`] and the tests of `ironguardctl chains`. A read that the ruleset changed
/// under is made again, as the command's user would run it again.
pub fn verdict(ns: &Netns) -> String {
    let observed = in_netns(ns, || {
        let mut tries = 0;
        loop {
            match ironguard_dataplane::observe(false) {
                Err(ironguard_dataplane::NftError::Unstable(_)) if tries < 100 => tries += 1,
                other => return other.map(|o| o.verdict()),
            }
        }
    });
    let verdict = observed.unwrap_or_else(|e| panic!("reading the kernel's tables in {}: {e}", ns.name()));
    serde_json::to_value(verdict).expect("a verdict is JSON").as_str().expect("a verdict is a string").to_string()
}

/// Waits (up to [`DEADLINE`]) until `ns` reads LEADER: the leader's tables with a live kernel lease. A single read
/// may catch a leader without its lease (FENCED): a lease write that reaches the kernel late is dropped until the
/// next refresh, and on a busy machine that happens.
pub fn wait_serving_leader(ns: &Netns) -> bool {
    wait_for(DEADLINE, || (verdict(ns) == "LEADER").then_some(())).is_some()
}

/// The verdicts of a host holding the leader's tables: LEADER, or FENCED while its lease is dropped (see
/// [`wait_serving_leader`]).
pub const LEADER_TABLES: [&str; 2] = ["LEADER", "FENCED"];

/// Runs `f` on a thread that has entered `ns`, so in-process netlink sockets live in that namespace.
pub fn in_netns<T: Send + 'static>(ns: &Netns, f: impl FnOnce() -> T + Send + 'static) -> T {
    in_named_netns(ns.name(), f)
}

/// [`in_netns`] by the namespace's name.
pub fn in_named_netns<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{name}");
    thread::spawn(move || {
        let fd = File::open(&path).expect("open netns");
        nix::sched::setns(fd, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// `GET url` inside the namespace: the body if the server answered 2xx within 2 s ([`http::get_ok`]).
pub fn http_get(ns: &Netns, url: &str) -> Option<String> {
    http::get_ok(ns.name(), url, Duration::from_secs(2))
}

/// The value of a Prometheus metric (first sample whose name and labels start with `name`).
pub fn metric(ns: &Netns, admin: &str, name: &str) -> Option<f64> {
    let body = http_get(ns, &format!("http://{admin}/metrics"))?;
    body.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (k, v) = l.rsplit_once(' ')?;
        k.starts_with(name).then(|| v.parse().ok())?
    })
}

/// `ironguardctl ARGS` inside a namespace (so it reaches a control plane on that namespace's loopback).
pub fn ctl(ns: &Netns, args: &[&str]) -> Output {
    ctl_cmd(ns).args(args).output().expect("run ironguardctl")
}

/// `ironguardctl` in `ns` as the operator (the test PKI's operator certificate, by environment), talking to
/// `https://127.0.0.1:9100` unless `--controlplane` says otherwise.
pub fn ctl_cmd(ns: &Netns) -> Command {
    let mut c = ns.cmd(bin("ironguardctl"));
    c.envs(pki::pki().operator_env()).env("IRONGUARD_CONTROLPLANE", "https://127.0.0.1:9100");
    c
}

/// Waits until a TCP port listens in the namespace.
pub fn wait_tcp_listen(ns: &Netns, port: u16, timeout: Duration) -> bool {
    wait_for(timeout, || port_bound(ns, Transport::Tcp, port).then_some(())).is_some()
}

/// A transport of [`port_bound`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Udp,
}

/// Whether a socket in `ns` waits on local `port`: a listening TCP socket, or an unconnected UDP one (what
/// `ss -Hl[tu]n 'sport = :PORT'` lists). Read from the kernel's socket tables as the namespace sees them
/// (`/proc/thread-self/net/{tcp,tcp6,udp,udp6}`, from a thread inside it): the wait loops ask this hundreds of times
/// a run, and `ip netns exec NS ss` started two programs each time.
pub fn port_bound(ns: &Netns, transport: Transport, port: u16) -> bool {
    let (tables, state) = match transport {
        Transport::Tcp => (["tcp", "tcp6"], "0A"),
        Transport::Udp => (["udp", "udp6"], "07"),
    };
    in_netns(ns, move || {
        tables.iter().any(|t| {
            let text = std::fs::read_to_string(format!("/proc/thread-self/net/{t}")).unwrap_or_default();
            socket_table_has(&text, port, state)
        })
    })
}

/// Whether a `/proc/net/{tcp,udp}[6]` table has a socket on local `port` in `state` (hexadecimal, as the table
/// writes it).
fn socket_table_has(table: &str, port: u16, state: &str) -> bool {
    table.lines().skip(1).any(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let local_port = f.get(1).and_then(|a| a.rsplit_once(':')).and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
        local_port == Some(port) && f.get(3) == Some(&state)
    })
}

/// An `ironguard-controlplane` process in a namespace, on that namespace's loopback.
#[derive(Debug)]
pub struct ControlPlane {
    pub proc: Proc,
    pub data_dir: PathBuf,
    pub grpc_port: u16,
    pub admin_port: u16,
    pub extra: Vec<String>,
    pub host: String,
    /// Environment for the next (re)start (e.g. `IRONGUARD_TEST_CRASH`).
    pub env: Vec<(String, String)>,
    ns_name: String,
}

impl ControlPlane {
    /// Starts a control plane with its own data directory under `dir`; waits until gRPC listens.
    pub fn start(ns: &Netns, dir: &TempDir, grpc_port: u16, admin_port: u16, extra: &[&str]) -> Self {
        Self::start_on(ns, dir, "127.0.0.1", grpc_port, admin_port, extra)
    }

    /// Like [`ControlPlane::start`], with environment variables for the process (and its restarts).
    pub fn start_env(
        ns: &Netns,
        dir: &TempDir,
        grpc_port: u16,
        admin_port: u16,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let mut cp = Self {
            proc: Proc { child: None, what: String::new(), log: PathBuf::new() },
            data_dir: dir.join(&format!("cp-{grpc_port}")),
            grpc_port,
            admin_port,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            host: "127.0.0.1".into(),
            ns_name: ns.name().to_string(),
        };
        cp.spawn(ns, dir);
        cp
    }

    /// Like [`ControlPlane::start`], with gRPC on `host` (e.g. a management bridge address).
    pub fn start_on(ns: &Netns, dir: &TempDir, host: &str, grpc_port: u16, admin_port: u16, extra: &[&str]) -> Self {
        let data_dir = dir.join(&format!("cp-{grpc_port}"));
        let mut cp = Self {
            env: Vec::new(),
            host: host.to_string(),
            proc: Proc { child: None, what: String::new(), log: PathBuf::new() },
            data_dir,
            grpc_port,
            admin_port,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            ns_name: ns.name().to_string(),
        };
        cp.spawn(ns, dir);
        cp
    }

    /// `http://127.0.0.1:PORT`, as seen from the namespace.
    /// `https://HOST:PORT`, as seen from the namespace (TLS with the test PKI; `--grpc-insecure` in the extra
    /// arguments makes it `http://`).
    pub fn url(&self) -> String {
        let scheme = if self.insecure() { "http" } else { "https" };
        format!("{scheme}://{}:{}", self.host, self.grpc_port)
    }

    fn insecure(&self) -> bool {
        self.extra.iter().any(|a| a == "--grpc-insecure")
            || self.env.iter().any(|(k, v)| k == "IRONGUARD_CP_GRPC_INSECURE" && v == "true")
    }

    /// The test PKI's TLS arguments, unless the extra arguments bring their own (or ask for plaintext).
    fn tls_args(&self) -> Vec<String> {
        if self.insecure() || self.extra.iter().any(|a| a == "--grpc-tls-cert") {
            vec![]
        } else {
            pki::pki().controlplane_args()
        }
    }

    pub fn admin(&self) -> String {
        format!("127.0.0.1:{}", self.admin_port)
    }

    fn spawn(&mut self, ns: &Netns, dir: &TempDir) {
        assert_eq!(ns.name(), self.ns_name);
        let exe = bin("ironguard-controlplane");
        if self.env.iter().any(|(k, _)| k == "IRONGUARD_TEST_CRASH") {
            assert!(
                binary_holds(&exe, "IRONGUARD_TEST_CRASH"),
                "{} was built without the test-hooks feature, so it ignores IRONGUARD_TEST_CRASH: build it with the \
                 tests (cargo build --workspace --all-targets), not with cargo build --bins alone",
                exe.display()
            );
        }
        let mut cmd = ns.cmd(exe);
        cmd.arg("--grpc-listen")
            .arg(format!("{}:{}", self.host, self.grpc_port))
            .arg("--admin-listen")
            .arg(format!("127.0.0.1:{}", self.admin_port))
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(self.tls_args())
            .args(&self.extra)
            .env("RUST_LOG", "info");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let log = dir.join(&format!("controlplane-{}.log", self.grpc_port));
        self.proc = Proc::spawn("ironguard-controlplane", cmd, log);
        assert!(
            wait_tcp_listen(ns, self.grpc_port, SETUP_DEADLINE),
            "control plane did not listen:\n{}",
            self.proc.log_text()
        );
    }

    /// `kill -9`, then start again on the same data directory and ports.
    pub fn kill9(&mut self) {
        self.proc.signal(nix::sys::signal::Signal::SIGKILL);
        self.proc.wait_exit(SETUP_DEADLINE);
    }

    pub fn restart(&mut self, ns: &Netns, dir: &TempDir) {
        self.spawn(ns, dir);
    }
}

/// An `ironguard-agent run` in a namespace, with a configuration file written from `toml`; waits until its
/// admin endpoint answers.
pub fn start_agent(ns: &Netns, dir: &TempDir, toml: &str, wrapper: Option<&[&str]>) -> Proc {
    start_agent_env(ns, dir, toml, wrapper, &[])
}

/// Like [`start_agent`], with extra environment variables (e.g. `NOTIFY_SOCKET`).
pub fn start_agent_env(ns: &Netns, dir: &TempDir, toml: &str, wrapper: Option<&[&str]>, env: &[(&str, &str)]) -> Proc {
    let cfg = dir.join(&unique("agent-config"));
    // Every agent keeps its state (lease id, what it saw of etcd) in the test's directory, never in the host's
    // /run/ironguard where agents of parallel tests would share it.
    let toml = if toml.contains("state_dir") {
        toml.to_string()
    } else {
        toml.replacen("[agent]\n", &format!("[agent]\nstate_dir = \"{}\"\n", dir.path().display()), 1)
    };
    std::fs::write(&cfg, &toml).expect("write agent config");
    let admin = toml
        .lines()
        .find_map(|l| l.trim().strip_prefix("listen = \"").and_then(|r| r.strip_suffix('"')))
        .expect("the agent config names [admin] listen")
        .to_string();
    let mut cmd = match wrapper {
        Some(w) => {
            let mut c = ns.cmd(w[0]);
            c.args(&w[1..]).arg(bin("ironguard-agent"));
            c
        }
        None => ns.cmd(bin("ironguard-agent")),
    };
    cmd.arg("--config").arg(&cfg).arg("run").env("RUST_LOG", "info,ironguard_agent=debug");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut p = Proc::spawn("ironguard-agent run", cmd, dir.join(&unique("agent-log")));
    let ok = wait_for(SETUP_DEADLINE, || {
        if !p.running() {
            return Some(false);
        }
        http_get(ns, &format!("http://{admin}/healthz")).map(|_| true)
    });
    assert_eq!(ok, Some(true), "ironguard-agent run did not start:\n{}", p.log_text());
    p
}

/// A minimal agent configuration for tests: the control plane at `cp_url`, filtering `iface`, admin on `admin`.
pub fn agent_toml(id: &str, cp_url: &str, iface: &str, admin: &str, lost_after_secs: u64) -> String {
    let tls = if cp_url.starts_with("https://") { pki::pki().agent_toml(id) } else { "insecure = true\n".into() };
    format!(
        "[agent]\nid = \"{id}\"\nnetwork = \"test\"\n\n[controlplane]\n{tls}endpoints = [\"{cp_url}\"]\nlost_after_secs = {lost_after_secs}\nmax_backoff_ms = 500\nconnect_timeout_ms = 500\nsilence_timeout_secs = 4\nreport_interval_ms = 500\n\n[dhcp_health]\ninterval_ms = 200\n\n[reconcile]\ninterval_secs = 5\n\n[admin]\nlisten = \"{admin}\"\n\n[dataplane]\ninterfaces = [\"{iface}\"]\n"
    )
}

/// A `fake-ironic` process (the Ironic test double) in a namespace, driven through its `/_fake` admin API.
#[derive(Debug)]
pub struct FakeIronicProc {
    pub proc: Proc,
    pub url: String,
    ns: String,
}

impl FakeIronicProc {
    pub fn start(ns: &Netns, dir: &TempDir, port: u16) -> Self {
        let mut cmd = ns.cmd(bin("fake-ironic"));
        cmd.args(["--listen", &format!("127.0.0.1:{port}")]).env("RUST_LOG", "info");
        let proc = Proc::spawn("fake-ironic", cmd, dir.join(&format!("fake-ironic-{port}.log")));
        assert!(wait_tcp_listen(ns, port, SETUP_DEADLINE), "fake-ironic did not listen:\n{}", proc.log_text());
        Self { proc, url: format!("http://127.0.0.1:{port}"), ns: ns.name().to_string() }
    }

    /// One call to the fake's API; panics unless it answers 2xx within 5 s.
    fn curl(&self, method: &str, path: &str, body: Option<&serde_json::Value>) -> String {
        let url = format!("{}{path}", self.url);
        let data = body.map(|b| b.to_string().into_bytes());
        let headers: &[(&str, &str)] = if body.is_some() { &[("Content-Type", "application/json")] } else { &[] };
        match http::request(&self.ns, method, &url, headers, data.as_deref(), Duration::from_secs(5)) {
            Ok(r) if (200..300).contains(&r.status) => r.body,
            Ok(r) => panic!("{method} {url}: {} {}", r.status, r.body),
            Err(e) => panic!("{method} {url}: {e}"),
        }
    }

    /// Adds a node (`{"uuid": ..., "provision_state": ...}`) and one port per MAC.
    pub fn add_node(&self, uuid: &str, provision_state: &str, macs: &[MacAddr]) {
        self.curl("POST", "/_fake/nodes", Some(&serde_json::json!({"uuid": uuid, "provision_state": provision_state, "driver_info": {"ipmi_address": "10.1.2.3"}})));
        for m in macs {
            self.curl("POST", "/_fake/ports", Some(&serde_json::json!({"address": m.to_string(), "node_uuid": uuid})));
        }
    }

    /// Raw HTTP to the fake's Ironic API, as [`RealIronic::rest`] to the real one.
    pub fn rest(&self) -> ironic::RestClient {
        ironic::RestClient { ns: self.ns.clone(), url: self.url.clone() }
    }

    /// Arms a fault: the next `count` requests (0: all) whose method and path start match get `status`.
    pub fn add_fault(&self, method: &str, path_prefix: &str, status: u16, count: u32) {
        self.curl(
            "POST",
            "/_fake/faults",
            Some(&serde_json::json!({"method": method, "path_prefix": path_prefix, "status": status, "count": count, "latency_ms": 0})),
        );
    }

    pub fn set_provision_state(&self, uuid: &str, state: &str) {
        self.curl(
            "PUT",
            &format!("/_fake/nodes/{uuid}/provision_state"),
            Some(&serde_json::json!({"provision_state": state})),
        );
    }

    /// The recorded calls: (method, path, time).
    pub fn calls(&self) -> Vec<(String, String, std::time::SystemTime)> {
        let v: serde_json::Value = serde_json::from_str(&self.curl("GET", "/_fake/calls", None)).expect("calls json");
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|c| {
                        let at = &c["at"];
                        let secs = at["secs_since_epoch"].as_u64()?;
                        let nanos = at["nanos_since_epoch"].as_u64().unwrap_or(0);
                        let t = std::time::UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_nanos(nanos);
                        Some((c["method"].as_str()?.to_string(), c["path"].as_str()?.to_string(), t))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn power_state(&self, uuid: &str) -> Option<String> {
        let v: serde_json::Value =
            serde_json::from_str(&self.curl("GET", &format!("/_fake/nodes/{uuid}"), None)).ok()?;
        v["power_state"].as_str().map(String::from)
    }
}

/// Samples one of the agent's kernel sets in a namespace every millisecond or so, until stopped: every MAC ever
/// seen in it, how many reads succeeded, and how many failed (a failed read is reported, never counted as empty).
#[derive(Debug)]
pub struct SetWatcher {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: thread::JoinHandle<SetWatch>,
}

/// What a [`SetWatcher`] saw.
#[derive(Debug, Default, Clone)]
pub struct SetWatch {
    pub seen: std::collections::BTreeSet<MacAddr>,
    pub samples: u64,
    pub read_errors: u64,
    pub last_error: Option<String>,
}

impl SetWatcher {
    pub fn start(ns: &Netns, set: &'static str) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let path = format!("/run/netns/{}", ns.name());
        let handle = thread::spawn(move || {
            let f = File::open(&path).expect("open netns");
            nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            let mut w = SetWatch::default();
            while !flag.load(Ordering::Relaxed) {
                match ironguard_dataplane::set_members(set) {
                    Ok(m) => {
                        w.samples += 1;
                        w.seen.extend(m);
                    }
                    Err(e) => {
                        w.read_errors += 1;
                        w.last_error = Some(e.to_string());
                    }
                }
                thread::sleep(Duration::from_millis(1));
            }
            w
        });
        Self { stop, handle }
    }

    pub fn stop(self) -> SetWatch {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("set watcher thread")
    }
}

/// One read of whether a host serves (leader rules and a live kernel lease): when the read began, when it ended.
#[derive(Debug, Clone, Copy)]
pub struct ServingSample {
    pub before: Instant,
    pub after: Instant,
    pub serving: bool,
}

/// Reads whether `ns` serves ([`ironguard_dataplane::ServingReader`]) about every millisecond until stopped. A read
/// error fails the test (it is never taken for "closed"); a read the ruleset changed under is made again.
#[derive(Debug)]
pub struct ServingSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    last_began: std::sync::Arc<std::sync::Mutex<Option<Instant>>>,
    handle: thread::JoinHandle<Vec<ServingSample>>,
}

impl ServingSampler {
    pub fn start(ns: &Netns) -> Self {
        let path = format!("/run/netns/{}", ns.name());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let last_began = std::sync::Arc::new(std::sync::Mutex::new(None));
        let (flag, seen) = (stop.clone(), last_began.clone());
        let handle = thread::spawn(move || {
            let f = File::open(&path).expect("open netns");
            nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            let mut reader = ironguard_dataplane::ServingReader::open().expect("a netlink socket in the namespace");
            let mut out = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let before = Instant::now();
                let serving = match reader.serving() {
                    // The ruleset changed during the read: read again at once (no sample, not "closed").
                    Err(ironguard_dataplane::NftError::Unstable(_)) => continue,
                    r => r.expect("reading the kernel's state failed"),
                };
                out.push(ServingSample { before, after: Instant::now(), serving });
                *seen.lock().expect("sampler progress") = Some(before);
                thread::sleep(Duration::from_millis(1));
            }
            out
        });
        Self { stop, last_began, handle }
    }

    /// Stops once a read that began after `t` is done (waiting up to [`DEADLINE`] for it) and returns every read.
    pub fn finish_after(self, t: Instant) -> Vec<ServingSample> {
        let _ = wait_for(DEADLINE, || {
            self.last_began.lock().expect("sampler progress").is_some_and(|b| b > t).then_some(())
        });
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("serving sampler")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_socket_on_its_port_and_state_only() {
        let udp = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
                   1234: 00000000:0043 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4242 2 0000000000000000 0\n";
        assert!(socket_table_has(udp, 67, "07"));
        assert!(!socket_table_has(udp, 68, "07"));
        assert!(!socket_table_has(udp, 67, "0A"));
        let tcp6 = "  sl  local_address                         remote_address                        st\n\
                    0: 00000000000000000000000001000000:2382 00000000000000000000000000000000:0000 0A\n\
                    1: 00000000000000000000000001000000:2383 00000000000000000000000001000000:9C40 01\n";
        assert!(socket_table_has(tcp6, 0x2382, "0A"));
        assert!(!socket_table_has(tcp6, 0x2383, "0A"), "an established connection is not a listener");
        assert!(!socket_table_has("", 67, "07"));
    }
}
