//! The agent daemon and the control plane's filter service, end to end: the real binaries, the real kernel,
//! a real dnsmasq and real DHCP clients, all in network namespaces. The control plane runs on the PXE host
//! namespace's loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::pin::Pin;
use std::process::Output;
use std::time::{Duration, Instant};

use ironguard_netns_tests::*;
use ironguard_proto::v1::pxe_filter_client::PxeFilterClient;
use ironguard_proto::v1::{GetFilterStateRequest, UpdatePxeFiltersRequest};
use nix::sys::signal::Signal;
use tonic::transport::Channel;

const M1: &str = "52:54:00:31:00:01";
const M2: &str = "52:54:00:31:00:02";
const UNKNOWN: &str = "52:54:00:31:00:99";
const AGENT_ADMIN: &str = "127.0.0.1:9181";

type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Runs an async gRPC exchange against the control plane from inside the namespace.
fn grpc<T: Send + 'static>(
    ns: &Netns,
    url: String,
    f: impl FnOnce(PxeFilterClient<Channel>) -> BoxFut<T> + Send + 'static,
) -> T {
    in_netns(ns, move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let channel = pki::pki().operator_endpoint(&url).connect().await.expect("connect to the control plane");
            let client = PxeFilterClient::new(channel);
            f(client).await
        })
    })
}

fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "ironguardctl failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A PXE LAN with a control plane (policy deny) and a leader agent.
struct Site {
    // Dropped in this order: the processes (printing their logs if the test failed), then the LAN and its logs.
    agent: Proc,
    cp: ControlPlane,
    lan: PxeLan,
}

impl Site {
    fn new(nodes: usize, lost_after_secs: u64) -> Self {
        Self::with_agent_extra(nodes, lost_after_secs, "")
    }

    /// With extra agent configuration appended (e.g. `[guard]\nclaim = false\n`).
    fn with_agent_extra(nodes: usize, lost_after_secs: u64, extra: &str) -> Self {
        Self::with_agent_config(nodes, lost_after_secs, |toml| toml + extra)
    }

    /// With the agent's configuration (from [`agent_toml`]) edited by `edit`.
    fn with_agent_config(nodes: usize, lost_after_secs: u64, edit: impl FnOnce(String) -> String) -> Self {
        let lan = PxeLan::new(nodes);
        let cp = ControlPlane::start(&lan.pxe, &lan.dir, 9100, 9101, &["--unknown-mac-policy", "deny"]);
        let toml = edit(agent_toml("agent-1", &cp.url(), "br0", AGENT_ADMIN, lost_after_secs));
        let agent = start_agent(&lan.pxe, &lan.dir, &toml, None);
        let s = Self { lan, cp, agent };
        s.wait_verdict("LEADER", Duration::from_secs(30));
        s
    }

    /// The negative proof from node `i`: the kernel refuses `m` (read first) and one DISCOVER gets no offer.
    fn refused(&self, i: usize, m: &str) -> bool {
        no_dhcp(&self.lan.pxe, &self.lan.nodes[i], "eth0", mac(m)).is_none()
    }

    fn ctl(&self, args: &[&str]) -> Output {
        let mut full = vec!["--controlplane", "https://127.0.0.1:9100"];
        full.extend_from_slice(args);
        ctl(&self.lan.pxe, &full)
    }

    fn wait_verdict(&self, want: &str, timeout: Duration) {
        let got = wait_for(timeout, || (verdict(&self.lan.pxe) == want).then_some(()));
        assert!(
            got.is_some(),
            "verdict never became {want} (now {}):\n{}",
            verdict(&self.lan.pxe),
            self.agent.log_text()
        );
    }

    /// Waits until the kernel's allow_mac set holds `mac` (or not).
    fn wait_allowed(&self, mac: &str, present: bool) {
        let got = wait_for(Duration::from_secs(30), || {
            let out = ctl(&self.lan.pxe, &["chains", "--json", "--elements", "--netns", self.lan.pxe.name()]);
            let j: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            let set = j["owned"]["sets"].as_array()?.iter().find(|s| s["name"] == "allow_mac")?.clone();
            let has = set["members"].as_array()?.iter().any(|x| x == mac);
            (has == present).then_some(())
        });
        assert!(got.is_some(), "{mac} present={present} never reached the kernel:\n{}", self.agent.log_text());
    }
}

#[test]
fn update_pxe_filters_allow_gets_a_lease_and_deny_takes_it_away() {
    let site = Site::new(2, 30);
    assert!(site.refused(0, M1), "policy deny: an unknown MAC gets nothing");
    let out = ok(site.ctl(&["filters", "allow", M1]));
    assert!(out.contains("revision"), "{out}");
    site.wait_allowed(M1, true);
    assert!(dhcp(&site.lan.nodes[0], "eth0", mac(M1)).is_some(), "allowed through UpdatePxeFilters");
    ok(site.ctl(&["filters", "deny", M1]));
    site.wait_allowed(M1, false);
    assert!(site.refused(0, M1), "denied through UpdatePxeFilters");
    // The state shows why.
    let show = ok(site.ctl(&["filters", "show", "--json"]));
    let j: serde_json::Value = serde_json::from_str(&show).unwrap();
    assert!(show.contains(M1) && show.contains("api"), "{j}");
}

#[test]
fn malformed_macs_are_invalid_argument_and_change_nothing() {
    let site = Site::new(1, 30);
    let url = site.cp.url();
    let (before, err, after) = grpc(&site.lan.pxe, url, |mut c| {
        Box::pin(async move {
            c.update_pxe_filters(UpdatePxeFiltersRequest { allow: vec![M1.into()], ..Default::default() })
                .await
                .unwrap();
            let before = c.get_filter_state(GetFilterStateRequest::default()).await.unwrap().into_inner();
            let err = c
                .update_pxe_filters(UpdatePxeFiltersRequest {
                    allow: vec![M2.into(), "52:54:00:zz:00:01".into()],
                    deny: vec![UNKNOWN.into()],
                    ..Default::default()
                })
                .await
                .unwrap_err();
            let after = c.get_filter_state(GetFilterStateRequest::default()).await.unwrap().into_inner();
            (before, err, after)
        })
    });
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("52:54:00:zz:00:01"), "the error names the bad MAC: {}", err.message());
    assert_eq!(before, after, "nothing changed: same revision, same entries");
    // Other malformed input: multicast, broadcast, conflicting lists, and the CLI refusing before any RPC.
    let err = grpc(&site.lan.pxe, site.cp.url(), |mut c| {
        Box::pin(async move {
            let a = c
                .update_pxe_filters(UpdatePxeFiltersRequest {
                    deny: vec!["ff:ff:ff:ff:ff:ff".into()],
                    ..Default::default()
                })
                .await
                .unwrap_err();
            let b = c
                .update_pxe_filters(UpdatePxeFiltersRequest {
                    allow: vec![M2.into()],
                    deny: vec![M2.into()],
                    ..Default::default()
                })
                .await
                .unwrap_err();
            (a, b)
        })
    });
    assert_eq!(err.0.code(), tonic::Code::InvalidArgument);
    assert_eq!(err.1.code(), tonic::Code::InvalidArgument);
    let out = site.ctl(&["filters", "allow", "not-a-mac"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not-a-mac"));
}

#[test]
fn controlplane_kill9_and_restart_keeps_state_and_the_agent_resumes_without_a_full_reload() {
    let mut site = Site::new(2, 30);
    ok(site.ctl(&["filters", "allow", M1]));
    ok(site.ctl(&["filters", "deny", M2]));
    site.wait_allowed(M1, true);
    let before = grpc(&site.lan.pxe, site.cp.url(), |mut c| {
        Box::pin(async move { c.get_filter_state(GetFilterStateRequest::default()).await.unwrap().into_inner() })
    });
    let snapshots_before = metric(&site.lan.pxe, AGENT_ADMIN, "ironguard_agent_snapshots_applied").unwrap();
    assert_eq!(snapshots_before, 1.0);

    site.cp.kill9();
    // Meanwhile (within the bound): the last state holds — M1 served, M2 and unknown MACs not.
    let r = site.lan.dhcp_all(&[(0, mac(M2), Want::Nothing), (1, mac(UNKNOWN), Want::Nothing)]);
    assert_eq!(r, vec![None, None], "no lease wrongly granted while the control plane is down");
    assert!(dhcp(&site.lan.nodes[0], "eth0", mac(M1)).is_some());

    site.cp.restart(&site.lan.pxe, &site.lan.dir);
    let after = grpc(&site.lan.pxe, site.cp.url(), |mut c| {
        Box::pin(async move { c.get_filter_state(GetFilterStateRequest::default()).await.unwrap().into_inner() })
    });
    assert_eq!(before, after, "state and revision survive kill -9");
    // The agent reconnects and resumes from its applied revision: no second snapshot.
    let resumed = wait_for(Duration::from_secs(30), || {
        (metric(&site.lan.pxe, AGENT_ADMIN, "ironguard_agent_stream_resumes").unwrap_or(0.0) >= 1.0).then_some(())
    });
    assert!(resumed.is_some(), "agent did not resume:\n{}", site.agent.log_text());
    assert_eq!(metric(&site.lan.pxe, AGENT_ADMIN, "ironguard_agent_snapshots_applied").unwrap(), 1.0, "no full reload");
    assert!(site.agent.log_text().contains("resumed from the applied revision without a full reload"));
    // And new changes flow again.
    ok(site.ctl(&["filters", "allow", M2]));
    site.wait_allowed(M2, true);
    assert!(dhcp(&site.lan.nodes[1], "eth0", mac(M2)).is_some());
}

/// The store epoch: while the agent cannot reach it, the control plane's data directory is wiped and another
/// history written up to the agent's revision (the same number, another state: M1 denied). Back on its address, the
/// agent is not resumed from its revision with no deltas (it kept serving M1 before epochs): the other epoch gets it
/// a snapshot, and the kernel follows the new state.
#[test]
fn a_wiped_store_written_up_to_the_agents_revision_is_another_epoch_not_resumed() {
    let mut site = Site::new(2, 300);
    ok(site.ctl(&["filters", "allow", M1]));
    ok(site.ctl(&["filters", "allow", M2]));
    site.wait_allowed(M2, true);
    assert!(dhcp(&site.lan.nodes[0], "eth0", mac(M1)).is_some());
    assert_eq!(metric(&site.lan.pxe, AGENT_ADMIN, "ironguard_agent_snapshots_applied"), Some(1.0));
    let revision = |ns: &Netns, port: u16| {
        grpc(ns, format!("https://127.0.0.1:{port}"), |mut c| {
            Box::pin(async move { c.get_filter_state(GetFilterStateRequest::default()).await.unwrap().into_inner() })
        })
        .revision
    };
    let old = revision(&site.lan.pxe, 9100);

    // Wiped, and written afresh on another port, where the agent does not look.
    site.cp.kill9();
    std::fs::remove_dir_all(&site.cp.data_dir).unwrap();
    (site.cp.grpc_port, site.cp.admin_port) = (9102, 9103);
    site.cp.restart(&site.lan.pxe, &site.lan.dir);
    let other = ["--controlplane", "https://127.0.0.1:9102", "filters"];
    ok(ctl(&site.lan.pxe, &[&other[..], &["deny", M1]].concat()));
    ok(ctl(&site.lan.pxe, &[&other[..], &["allow", M2]].concat()));
    assert_eq!(revision(&site.lan.pxe, 9102), old, "the other history reached the agent's revision");
    assert!(dhcp(&site.lan.nodes[0], "eth0", mac(M1)).is_some(), "meanwhile the agent serves what it holds");

    // Back where the agent looks.
    site.cp.kill9();
    let mark = std::fs::read_to_string(site.lan.dir.join("controlplane-9100.log")).unwrap().len();
    (site.cp.grpc_port, site.cp.admin_port) = (9100, 9101);
    site.cp.restart(&site.lan.pxe, &site.lan.dir);
    let reloaded = wait_for(Duration::from_secs(30), || {
        (metric(&site.lan.pxe, AGENT_ADMIN, "ironguard_agent_snapshots_applied")? >= 2.0).then_some(())
    });
    assert!(reloaded.is_some(), "the agent took no snapshot of the other epoch:\n{}", site.agent.log_text());
    site.wait_allowed(M1, false);
    assert!(site.refused(0, M1), "the new state denies M1");
    assert!(dhcp(&site.lan.nodes[1], "eth0", mac(M2)).is_some(), "and allows M2");
    let log = site.cp.proc.log_text()[mark..].to_string();
    assert!(log.contains("the agent's state is of another store epoch"), "{log}");
    assert!(!log.contains("agent resumes from its revision"), "{log}");
}

#[test]
fn controlplane_gone_beyond_the_bound_blocks_and_coming_back_restores_the_leader() {
    let mut site = Site::new(1, 3);
    ok(site.ctl(&["filters", "allow", M1]));
    site.wait_allowed(M1, true);
    site.cp.kill9();
    let t = Instant::now();
    site.wait_verdict("BLOCKED", Duration::from_secs(30));
    let blocked_after = t.elapsed();
    assert!(blocked_after >= Duration::from_secs(2), "blocked only after the bound: {blocked_after:?}");
    assert!(site.refused(0, M1), "Blocked: no lease");
    let fc = metric(
        &site.lan.pxe,
        AGENT_ADMIN,
        "ironguard_agent_fail_closed_transitions_total{cause=\"controlplane-lost\"}",
    );
    assert_eq!(fc, Some(1.0));
    site.cp.restart(&site.lan.pxe, &site.lan.dir);
    site.wait_verdict("LEADER", Duration::from_secs(30));
    assert!(dhcp(&site.lan.nodes[0], "eth0", mac(M1)).is_some(), "leader again: lease");
}

#[test]
fn agent_sigterm_sigkill_and_restart() {
    let mut site = Site::new(1, 30);
    ok(site.ctl(&["filters", "allow", M1]));
    site.wait_allowed(M1, true);
    assert!(dhcp(&site.lan.nodes[0], "eth0", mac(M1)).is_some());

    // SIGTERM: Blocked first, then exit 0 (how fast: `ironguard-bench ha`, SIGTERM → exit).
    let t = Instant::now();
    site.agent.signal(Signal::SIGTERM);
    let st = site.agent.wait_exit(Duration::from_secs(30));
    assert!(st.is_some_and(|s| s.success()), "SIGTERM: exit 0 ({:?}):\n{}", t.elapsed(), site.agent.log_text());
    let log = site.agent.log_text();
    let (stopping, exiting) = (log.find("stopping: switching to Blocked"), log.find("Blocked; exiting"));
    assert!(stopping.is_some() && stopping < exiting, "Blocked, then exit:\n{log}");
    assert_eq!(verdict(&site.lan.pxe), "CLOSED");
    assert!(site.refused(0, M1), "after SIGTERM: no lease");

    let toml = agent_toml("agent-1", &site.cp.url(), "br0", AGENT_ADMIN, 30);
    site.agent = start_agent(&site.lan.pxe, &site.lan.dir, &toml, None);
    site.wait_verdict("LEADER", Duration::from_secs(30));
    assert!(dhcp(&site.lan.nodes[0], "eth0", mac(M1)).is_some(), "restarted agent serves again");

    site.agent.signal(Signal::SIGKILL);
    assert!(site.agent.wait_exit(Duration::from_secs(30)).is_some(), "the killed agent is reaped");
    assert_eq!(verdict(&site.lan.pxe), "CLOSED");
    assert!(site.refused(0, M1), "after SIGKILL: no lease (guard)");

    site.agent = start_agent(&site.lan.pxe, &site.lan.dir, &toml, None);
    site.wait_verdict("LEADER", Duration::from_secs(30));
    assert!(dhcp(&site.lan.nodes[0], "eth0", mac(M1)).is_some(), "restarted after SIGKILL: serves again");
}

/// The agent's link watch (rtnetlink notifications, read on the tokio runtime) wakes its health check on each
/// change of a link or an address by itself, so a downed provisioning link makes a leader step down at once rather
/// than at the next health period.
#[test]
fn each_link_and_address_change_wakes_the_link_watch() {
    let ns = Netns::new("linkwatch");
    let name = ns.name().to_string();
    let steps: Vec<Vec<&'static str>> = vec![
        vec!["link", "add", "lw0", "type", "bridge"],
        vec!["addr", "add", "10.93.0.1/24", "dev", "lw0"],
        vec!["link", "set", "lw0", "up"],
        vec!["link", "set", "lw0", "down"],
        vec!["addr", "del", "10.93.0.1/24", "dev", "lw0"],
        vec!["link", "del", "lw0"],
    ];
    let woken = in_netns(&ns, move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
            ironguard_agent::link::watch(tx);
            let mut woken = vec![];
            for step in steps {
                // Let the notifications of the previous step arrive, and forget them.
                tokio::time::sleep(Duration::from_millis(300)).await;
                while rx.try_recv().is_ok() {}
                let ip = tokio::process::Command::new("ip")
                    .args(["netns", "exec", &name, "ip"])
                    .args(&step)
                    .status()
                    .await
                    .expect("run ip");
                assert!(ip.success(), "ip {step:?} failed");
                let woke = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await;
                woken.push((step.join(" "), matches!(woke, Ok(Some(())))));
            }
            woken
        })
    });
    let missed: Vec<&String> = woken.iter().filter(|(_, w)| !w).map(|(s, _)| s).collect();
    assert!(missed.is_empty(), "these changes did not wake the link watch: {missed:?}");
}

#[test]
fn dnsmasq_stopped_the_agent_steps_down_and_says_why() {
    let mut site = Site::new(1, 30);
    ok(site.ctl(&["filters", "allow", M1]));
    site.wait_allowed(M1, true);
    assert!(http_get(&site.lan.pxe, &format!("http://{AGENT_ADMIN}/readyz")).is_some(), "ready while leading");

    site.lan.dnsmasq.proc.kill();
    site.wait_verdict("FOLLOWER", Duration::from_secs(30));
    assert!(http_get(&site.lan.pxe, &format!("http://{AGENT_ADMIN}/readyz")).is_none(), "/readyz fails");
    let seen = wait_for(Duration::from_secs(30), || {
        let out = ok(site.ctl(&["agents"]));
        out.contains("nothing listens on udp/67").then_some(out)
    });
    let out = seen.expect("ironguardctl agents shows why");
    assert!(out.contains("agent-1") && out.to_lowercase().contains("follower"), "{out}");

    site.lan.dnsmasq = Dnsmasq::start(&site.lan.pxe, &site.lan.dir, "br0", ("10.77.0.100", "10.77.0.250"), &[]);
    site.wait_verdict("LEADER", Duration::from_secs(30));
    assert!(dhcp(&site.lan.nodes[0], "eth0", mac(M1)).is_some());
}

#[test]
fn the_agent_runs_as_a_non_root_user_with_only_cap_net_admin() {
    let lan = PxeLan::new(1);
    let cp = ControlPlane::start(&lan.pxe, &lan.dir, 9100, 9101, &["--unknown-mac-policy", "deny"]);
    let setpriv = SETPRIV_NET_ADMIN_ONLY;
    let agent =
        start_agent(&lan.pxe, &lan.dir, &agent_toml("agent-np", &cp.url(), "br0", AGENT_ADMIN, 30), Some(&setpriv));
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.pid())).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    let cap = status.lines().find(|l| l.starts_with("CapEff:")).unwrap();
    assert_eq!(uid.split_whitespace().nth(1), Some("65534"), "{uid}");
    assert_eq!(cap.split_whitespace().nth(1), Some("0000000000001000"), "{cap}");
    ok(ctl(&lan.pxe, &["--controlplane", &cp.url(), "filters", "allow", M1]));
    let leader = wait_for(Duration::from_secs(30), || (verdict(&lan.pxe) == "LEADER").then_some(()));
    assert!(leader.is_some(), "{}", agent.log_text());
    let got = wait_for(Duration::from_secs(30), || dhcp(&lan.nodes[0], "eth0", mac(M1)));
    assert!(got.is_some(), "the unprivileged agent serves the allowed MAC:\n{}", agent.log_text());
    assert!(no_dhcp(&lan.pxe, &lan.nodes[0], "eth0", mac(UNKNOWN)).is_none());
}

/// The running agent holds the guard (`owner, persist` on this kernel): nobody else can delete or flush it, and
/// `nft flush ruleset` (Debian's nftables.service) leaves it and the agent's table alone.
#[test]
fn the_held_guard_refuses_tampering_and_survives_flush_ruleset() {
    let site = Site::new(1, 30);
    ok(site.ctl(&["filters", "allow", M1]));
    let j = chains_json(&site.lan.pxe);
    assert!(j["guard_held_by"].is_number() && j["guard_persistent"] == true, "held by the agent: {j}");
    assert_eq!(j["guard_holder"]["pid"], site.agent.pid(), "{j}");
    for args in [
        &["delete", "table", "inet", "ironguard_guard"][..],
        &["flush", "chain", "inet", "ironguard_guard", "input"][..],
        &["delete", "chain", "inet", "ironguard_guard", "input"][..],
    ] {
        let out = site.lan.pxe.nft(args);
        assert!(!out.status.success(), "nft {args:?} must be refused");
        assert!(String::from_utf8_lossy(&out.stderr).contains("Operation not permitted"), "{out:?}");
    }
    let out = site.lan.pxe.nft(&["flush", "ruleset"]);
    assert!(out.status.success(), "{out:?}");
    let v = verdict(&site.lan.pxe);
    assert!(LEADER_TABLES.contains(&v.as_str()), "both tables survived nft flush ruleset: {v}");
    assert!(wait_for(Duration::from_secs(30), || dhcp(&site.lan.nodes[0], "eth0", mac(M1))).is_some());
    assert!(site.refused(0, UNKNOWN));
}

/// A plain guard (`[guard] claim = false`, what kernels without `persist` get) is repaired the moment a change
/// notification shows it deleted, flushed or altered: with the periodic read-back an hour away, every repair is the
/// notification's, as the agent's log says. (How fast: `ironguard-bench ha`, guard tampering.)
#[test]
fn a_plain_guard_is_repaired_the_moment_it_is_touched() {
    let site = Site::with_agent_config(1, 30, |toml| {
        let hourly = toml.replacen("[reconcile]\ninterval_secs = 5\n", "[reconcile]\ninterval_secs = 3600\n", 1);
        assert_ne!(hourly, toml, "the read-back interval is in the agent's configuration");
        hourly + "\n[guard]\nclaim = false\n"
    });
    let repaired = |what: &str| {
        let t = std::time::Instant::now();
        let ok = wait_for(Duration::from_secs(30), || {
            let j = chains_json(&site.lan.pxe);
            let rules = &j["guard"]["chains"][0]["rules"];
            let only_drop = rules.as_array().is_some_and(|r| r.len() == 1)
                && rules[0]["comment"] == "ironguard-guard:drop-unmarked";
            (j["verdict"] == "LEADER" && only_drop).then_some(())
        });
        assert!(ok.is_some(), "the guard was not repaired after {what}:\n{}", site.agent.log_text());
        t.elapsed()
    };
    let mut took = vec![];
    for args in [
        &["delete", "table", "inet", "ironguard_guard"][..],
        &["flush", "chain", "inet", "ironguard_guard", "input"][..],
        &["add", "rule", "inet", "ironguard_guard", "input", "udp", "dport", "67", "accept"][..],
        &["flush", "ruleset"][..],
    ] {
        let out = site.lan.pxe.nft(args);
        assert!(out.status.success(), "nft {args:?}: {out:?}");
        took.push((args.join(" "), repaired(&args.join(" "))));
    }
    eprintln!("repaired after {took:?}");
    let repairs = metric(&site.lan.pxe, AGENT_ADMIN, "ironguard_agent_guard_repairs").unwrap_or(0.0);
    assert!(repairs >= 4.0, "every tampering was repaired by the agent ({repairs})\n{took:?}");
    let log = site.agent.log_text();
    let repair_lines: Vec<&str> = log.lines().filter(|l| l.contains("guard repaired")).collect();
    assert!(
        repair_lines.len() >= 4 && repair_lines.iter().all(|l| l.contains("change notification")),
        "every repair was triggered by a change notification, none by the read-back:\n{log}"
    );
}

#[test]
fn the_agent_notifies_systemd_ready_and_pings_the_watchdog() {
    use std::os::unix::net::UnixDatagram;
    let lan = PxeLan::new(1);
    let cp = ControlPlane::start(&lan.pxe, &lan.dir, 9100, 9101, &[]);
    // The notify socket lives in the filesystem, so it works across network namespaces.
    let path = lan.dir.join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let toml = agent_toml("agent-sd", &cp.url(), "br0", AGENT_ADMIN, 30);
    let _agent = start_agent_env(
        &lan.pxe,
        &lan.dir,
        &toml,
        None,
        &[("NOTIFY_SOCKET", path.to_str().unwrap()), ("WATCHDOG_USEC", "2000000")],
    );
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(30)
        && !(got.iter().any(|m: &String| m.contains("READY=1"))
            && got.iter().filter(|m| m.contains("WATCHDOG=1")).count() >= 2)
    {
        if let Ok(n) = sock.recv(&mut buf) {
            got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    assert!(got.iter().any(|m| m.contains("READY=1")), "READY=1 sent: {got:?}");
    assert!(got.iter().filter(|m| m.contains("WATCHDOG=1")).count() >= 2, "watchdog pings: {got:?}");
}
