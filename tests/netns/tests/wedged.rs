//! Nothing waits for ever: each dependency of the agent wedged (it accepts, and never answers), with the real
//! binaries in a namespace. A control-plane replica that accepts TCP and never speaks TLS, and one that completes
//! TLS and never answers, first in the agent's list: the agent gives each up within its bound and follows the
//! real replica behind them. A `systemctl` that hangs: the DHCP health is unknown with a reason naming the
//! bound, and the agent does not lead until systemctl answers again. (A wedged etcd: `ha.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::net::TcpListener;
use std::process::{Child, ChildStdin, Stdio};

use ironguard_netns_tests::*;

const AGENT_ADMIN: &str = "127.0.0.1:9181";

/// A TLS server (`openssl s_server`, HTTP/2 offered by ALPN, the control plane's certificate) that completes the
/// handshake and then answers nothing: its input is a pipe that stays open and empty.
struct SilentTls {
    child: Child,
    _input: ChildStdin,
}

impl SilentTls {
    fn start(ns: &Netns, dir: &TempDir, port: u16) -> Self {
        let p = pki::pki();
        let log = std::fs::File::create(dir.join("silent-tls.log")).unwrap();
        let mut child = ns
            .cmd("openssl")
            .args(["s_server", "-quiet", "-alpn", "h2", "-accept", &format!("127.0.0.1:{port}"), "-cert"])
            .arg(&p.server.cert)
            .arg("-key")
            .arg(&p.server.key)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("openssl s_server (Debian's openssl package)");
        let input = child.stdin.take().unwrap();
        assert!(wait_tcp_listen(ns, port, SETUP_DEADLINE), "openssl s_server did not listen");
        Self { child, _input: input }
    }
}

impl Drop for SilentTls {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP listener in `ns` that accepts every connection and never reads or writes (the kernel completes the
/// handshake; nothing more happens).
fn silent_tcp(ns: &Netns, port: u16) {
    let listener = in_netns(ns, move || TcpListener::bind(("127.0.0.1", port)).expect("bind"));
    std::thread::spawn(move || {
        let mut held = vec![];
        while let Ok((s, _)) = listener.accept() {
            held.push(s);
        }
    });
}

/// The position of the first line of `log` that contains every one of `words`.
fn line_with(log: &str, words: &[&str]) -> Option<usize> {
    log.lines().position(|l| words.iter().all(|w| l.contains(w)))
}

#[test]
fn replicas_that_accept_and_never_answer_are_passed_over_for_the_next() {
    let lan = PxeLan::new(1);
    let cp = ControlPlane::start(&lan.pxe, &lan.dir, 9100, 9101, &[]);
    silent_tcp(&lan.pxe, 9200);
    let _tls = SilentTls::start(&lan.pxe, &lan.dir, 9201);
    let (tcp, tls, real) = ("https://127.0.0.1:9200", "https://127.0.0.1:9201", cp.url());
    let toml = agent_toml("agent-1", &real, "br0", AGENT_ADMIN, 30)
        .replace(&format!("endpoints = [\"{real}\"]"), &format!("endpoints = [\"{tcp}\", \"{tls}\", \"{real}\"]"))
        .replace("[dhcp_health]\n", "request_timeout_ms = 1000\n\n[dhcp_health]\n");
    assert!(toml.contains(tls), "{toml}");
    let agent = start_agent(&lan.pxe, &lan.dir, &toml, None);
    // It follows the real replica (the third), and leads.
    let leads = wait_for(DEADLINE, || (verdict(&lan.pxe) == "LEADER").then_some(()));
    let log = agent.log_text();
    assert!(leads.is_some(), "the agent never led: {}\n{log}", verdict(&lan.pxe));
    // In order: the replica that never completes TLS given up at its connect bound, the one that never answers
    // the call at its request bound, then the stream from the real one.
    let gave_up_tcp = line_with(&log, &[tcp, "within", "connect_timeout_ms"]).expect("the TCP-only replica given up");
    let gave_up_tls = line_with(&log, &[tls, "within", "_timeout_ms"]).expect("the silent TLS replica given up");
    let watching = line_with(&log, &["watching filters", &real]).expect("the real replica followed");
    assert!(gave_up_tcp < gave_up_tls && gave_up_tls < watching, "out of order:\n{log}");
    assert!(
        line_with(&log, &["watching filters", tcp]).is_none() && line_with(&log, &["watching filters", tls]).is_none()
    );
}

#[test]
fn a_systemctl_that_hangs_makes_dhcp_health_unknown_and_the_agent_does_not_lead() {
    let lan = PxeLan::new(1);
    // A `systemctl` first on the agent's PATH that never answers; replaced later by one that says "active".
    let bin_dir = lan.dir.join("systemctl-bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let install = |script: &str| {
        let tmp = bin_dir.join(".systemctl.new");
        let mut f = std::fs::File::create(&tmp).unwrap();
        f.write_all(script.as_bytes()).unwrap();
        f.sync_all().unwrap();
        drop(f);
        std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        std::fs::rename(&tmp, bin_dir.join("systemctl")).unwrap();
    };
    install("#!/bin/sh\nexec sleep 3600\n");
    let cp = ControlPlane::start(&lan.pxe, &lan.dir, 9100, 9101, &[]);
    let toml = agent_toml("agent-1", &cp.url(), "br0", AGENT_ADMIN, 30)
        .replace("[dhcp_health]\n", "[dhcp_health]\nsystemd_unit = \"dnsmasq.service\"\nsystemd_timeout_ms = 300\n");
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let agent = start_agent_env(&lan.pxe, &lan.dir, &toml, None, &[("PATH", &path)]);
    // The agent has its state from the control plane; only the health check holds it back, and it says why in
    // the status it reports.
    let why = wait_for(DEADLINE, || {
        let out = ctl(&lan.pxe, &["agents", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let detail = v["agents"][0]["dhcp"]["detail"].as_str()?.to_string();
        detail.contains("no answer within 300 ms").then_some(detail)
    });
    let why = why.unwrap_or_else(|| panic!("no timeout in the reported DHCP health:\n{}", agent.log_text()));
    assert!(why.contains("systemctl is-active dnsmasq.service") && why.contains("systemd_timeout_ms"), "{why}");
    assert_eq!(verdict(&lan.pxe), "FOLLOWER", "unknown health: not leading");
    // Each hung systemctl is killed at the bound: never more than the one of the check under way.
    let hung = lan
        .pxe
        .pids()
        .into_iter()
        .filter(|p| std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.starts_with(b"sleep\x003600")))
        .count();
    assert!(hung <= 1, "{hung} hung systemctl processes left running");
    assert_eq!(metric(&lan.pxe, AGENT_ADMIN, "ironguard_agent_dhcp_healthy"), Some(0.0));
    // systemctl answers again (the unit is active): the agent leads — the check was not stuck.
    install("#!/bin/sh\nexit 0\n");
    let leads = wait_for(DEADLINE, || (verdict(&lan.pxe) == "LEADER").then_some(()));
    assert!(leads.is_some(), "the agent did not lead once systemctl answered:\n{}", agent.log_text());
}
