//! Inspections end to end: the real control plane (embedded store, and etcd), the fake Ironic as a process, a real
//! agent and dnsmasq, real DHCP clients — and worker deaths at the worst moments.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant, SystemTime};

use ironguard_netns_tests::ironic_site::dhcp_becomes;
use ironguard_netns_tests::*;
use ironguard_proto::v1::inspection_client::InspectionClient;
use ironguard_proto::v1::{ContinueRequest, NodeRequest, StartRequest};
use nix::sys::signal::Signal;
use tonic::transport::Channel;

const NODE: &str = "44444444-4444-4444-4444-444444444444";
const NODE_MAC: &str = "52:54:00:44:00:04";
const AGENT_ADMIN: &str = "127.0.0.1:9181";

type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;

fn grpc<T: Send + 'static>(ns: &Netns, f: impl FnOnce(InspectionClient<Channel>) -> BoxFut<T> + Send + 'static) -> T {
    in_netns(ns, move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let mut last = None;
            for _ in 0..50 {
                match pki::pki().operator_endpoint("https://127.0.0.1:9100").connect().await {
                    Ok(c) => return f(InspectionClient::new(c)).await,
                    Err(e) => last = Some(e),
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("cannot reach the control plane: {last:?}")
        })
    })
}

struct Site {
    // Dropped in this order: the processes (printing their logs if the test failed), then the namespaces and the
    // directory holding those logs.
    _agent: Proc,
    cp: ControlPlane,
    ironic: FakeIronicProc,
    etcd: Option<EtcdProcess>,
    lan: PxeLan,
}

fn cp_config_with(dir: &TempDir, etcd: Option<&str>, inspection_extra: &str) -> std::path::PathBuf {
    let p = dir.join("controlplane.toml");
    let etcd = etcd.map(|u| format!("[etcd]\nendpoints = [\"{u}\"]\n")).unwrap_or_default();
    std::fs::write(
        &p,
        format!(
            "[filter]\nunknown_mac_policy = \"deny\"\n\n[ironic]\nurl = \"http://127.0.0.1:6385\"\nretries = 2\nretry_backoff_ms = 50\n\n\
             [inspection]\nworkers = 2\ntake_timeout_ms = 200\nrequest_lease_ms = 2000\nallow_timeout_secs = 15\n{inspection_extra}\n\
             [sync]\nironic_sync_secs = 0\nironic_inspection = false\ntimeout_check_secs = 1\n\n{etcd}"
        ),
    )
    .unwrap();
    p
}

impl Site {
    fn new(with_etcd: bool, env: &[(&str, &str)]) -> Self {
        Self::with_config(with_etcd, env, "")
    }

    fn with_config(with_etcd: bool, env: &[(&str, &str)], inspection_extra: &str) -> Self {
        let lan = PxeLan::new(1);
        let ironic = FakeIronicProc::start(&lan.pxe, &lan.dir, 6385);
        ironic.add_node(NODE, "manageable", &[mac(NODE_MAC)]);
        let etcd = with_etcd.then(|| EtcdProcess::start_in("insp", lan.pxe.name(), "127.0.0.1", 2379, 2380));
        let cfg = cp_config_with(&lan.dir, etcd.as_ref().map(|e| e.url.as_str()), inspection_extra);
        let cp = ControlPlane::start_env(&lan.pxe, &lan.dir, 9100, 9101, &["--config", cfg.to_str().unwrap()], env);
        let agent = start_agent(&lan.pxe, &lan.dir, &agent_toml("agent-i", &cp.url(), "br0", AGENT_ADMIN, 30), None);
        let leader = wait_for(DEADLINE, || (verdict(&lan.pxe) == "LEADER").then_some(()));
        assert!(leader.is_some(), "{}", agent.log_text());
        Self { lan, ironic, cp, _agent: agent, etcd }
    }

    fn state(&self) -> (String, String) {
        grpc(&self.lan.pxe, |mut c| {
            Box::pin(async move {
                match c.get(NodeRequest { node: NODE.into() }).await {
                    Ok(r) => {
                        let r = r.into_inner();
                        (r.state, r.error)
                    }
                    Err(e) => ("unreachable".into(), e.message().to_string()),
                }
            })
        })
    }

    fn wait_state(&self, want: &str, timeout: Duration) -> (String, String) {
        let t = Instant::now();
        loop {
            let s = self.state();
            if s.0 == want {
                return s;
            }
            assert!(t.elapsed() < timeout, "never reached {want}: {s:?}\n{}", self.cp.proc.log_text());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn start(&self) {
        grpc(&self.lan.pxe, |mut c| {
            Box::pin(async move {
                c.start(StartRequest { node: NODE.into(), manage_boot: true, ..Default::default() }).await.unwrap()
            })
        });
    }

    fn continue_(&self) -> Result<String, tonic::Status> {
        let mac: ironguard_dataplane::MacAddr = NODE_MAC.parse().expect("NODE_MAC");
        let data = ironguard_netns_tests::ironic::ipa_inventory(&[mac], "10.1.39.10").to_string();
        grpc(&self.lan.pxe, move |mut c| {
            Box::pin(async move {
                c.r#continue(ContinueRequest { node_uuid: String::new(), data_json: data })
                    .await
                    .map(|r| r.into_inner().node)
            })
        })
    }

    /// The node's DHCP: closed (the kernel refuses its MAC, then one DISCOVER gets nothing), waited for.
    fn dhcp_closed(&self) -> bool {
        dhcp_becomes(&self.lan.pxe, &self.lan.nodes[0], mac(NODE_MAC), false, DEADLINE)
    }

    /// Every key etcd holds (the test's etcd, from the PXE host's namespace).
    fn etcd_keys(&self) -> Vec<String> {
        let e = self.etcd.as_ref().expect("a site with etcd");
        let out =
            run_ok(self.lan.pxe.cmd("etcdctl").args(["--endpoints", &e.url, "get", "", "--prefix", "--keys-only"]));
        String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.is_empty()).map(String::from).collect()
    }

    /// The ids (hex) of the leases etcd holds.
    fn etcd_leases(&self) -> Vec<String> {
        let e = self.etcd.as_ref().expect("a site with etcd");
        let out = run_ok(self.lan.pxe.cmd("etcdctl").args(["--endpoints", &e.url, "lease", "list"]));
        String::from_utf8_lossy(&out.stdout).lines().skip(1).map(|l| l.trim().to_string()).collect()
    }

    fn power_calls(&self, target: &str) -> Vec<SystemTime> {
        // The fake records bodies nowhere; the power state after each call tells on/off apart, so count the calls and
        // read the final state where it matters.
        let _ = target;
        self.ironic
            .calls()
            .into_iter()
            .filter(|(m, p, _)| m == "PUT" && p.contains("/states/power"))
            .map(|(_, _, t)| t)
            .collect()
    }
}

/// Samples the kernel's allow_mac set in the PXE namespace until `mac` is present; returns when the last read that
/// found it absent began. That read proves the MAC was absent at some moment at or after that time, however late
/// the sampler ran; a time taken after a read that found it present would only bound the insertion from above, and a
/// sampler starved beside a CPU hog took it after the power-on call although the MAC was in the kernel first (T31).
fn watch_allow(ns: &Netns, mac: ironguard_dataplane::MacAddr) -> std::thread::JoinHandle<Option<SystemTime>> {
    let path = format!("/run/netns/{}", ns.name());
    std::thread::spawn(move || {
        let f = std::fs::File::open(&path).unwrap();
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let t = Instant::now();
        let mut absent_at = None;
        while t.elapsed() < Duration::from_secs(30) {
            let began = SystemTime::now();
            if ironguard_dataplane::set_members("allow_mac").is_ok_and(|m| m.contains(&mac)) {
                return absent_at;
            }
            absent_at = Some(began);
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    })
}

#[test]
fn full_flow_allow_before_power_on_then_denied_at_once() {
    let site = Site::new(false, &[]);
    assert!(
        no_dhcp(&site.lan.pxe, &site.lan.nodes[0], "eth0", mac(NODE_MAC)).is_none(),
        "not allowed before the inspection"
    );
    let watcher = watch_allow(&site.lan.pxe, mac(NODE_MAC));
    site.start();
    site.wait_state("waiting", Duration::from_secs(20));
    let absent_at = watcher.join().unwrap().expect("absent at first, then in the leader's kernel");
    let powered = site.power_calls("power on");
    assert_eq!(powered.len(), 1, "one power-on call");
    assert!(
        absent_at < powered[0],
        "the MAC was still absent from the leader's kernel {:?} after the power-on call",
        absent_at.duration_since(powered[0]).unwrap_or_default()
    );
    assert_eq!(site.ironic.power_state(NODE).as_deref(), Some("power on"));
    assert!(dhcp(&site.lan.nodes[0], "eth0", mac(NODE_MAC)).is_some(), "the node being inspected gets a lease");
    assert_eq!(site.continue_().unwrap(), NODE);
    let (_, err) = site.wait_state("finished", Duration::from_secs(20));
    assert_eq!(err, "");
    // Removed by the inspection's end, not by any timeout (none would fire within the deadline). How fast a
    // filter change reaches the kernel: `ironguard-bench filters`.
    let gone = wait_for(DEADLINE, || {
        in_netns(&site.lan.pxe, || ironguard_dataplane::set_members("allow_mac").map(|m| m.is_empty()).unwrap_or(false))
            .then_some(())
    });
    assert!(gone.is_some(), "the allow is removed");
    assert!(site.dhcp_closed(), "denied again once finished");
    let off = wait_for(DEADLINE, || (site.ironic.power_state(NODE).as_deref() == Some("power off")).then_some(()));
    assert!(off.is_some(), "powered off after processing");
}

#[test]
fn abort_closes_dhcp_for_the_node() {
    let site = Site::new(false, &[]);
    site.start();
    site.wait_state("waiting", Duration::from_secs(20));
    assert!(dhcp(&site.lan.nodes[0], "eth0", mac(NODE_MAC)).is_some());
    grpc(&site.lan.pxe, |mut c| Box::pin(async move { c.abort(NodeRequest { node: NODE.into() }).await.unwrap() }));
    let (_, err) = site.wait_state("error", Duration::from_secs(20));
    assert_eq!(err, "inspection aborted");
    assert!(site.dhcp_closed(), "no lease after abort");
}

#[test]
fn timeout_closes_dhcp_for_the_node() {
    let site = Site::with_config(false, &[], "timeout_secs = 3\n");
    site.start();
    site.wait_state("waiting", Duration::from_secs(20));
    assert!(dhcp(&site.lan.nodes[0], "eth0", mac(NODE_MAC)).is_some());
    let (_, err) = site.wait_state("error", Duration::from_secs(20));
    assert!(err.contains("timed out"), "{err}");
    assert!(site.dhcp_closed(), "no lease after the timeout");
    let off = wait_for(DEADLINE, || (site.ironic.power_state(NODE).as_deref() == Some("power off")).then_some(()));
    assert!(off.is_some(), "powered off after the timeout");
}

#[test]
fn worker_killed_after_the_task_before_consuming_goes_to_error_not_twice() {
    let mut site = Site::new(false, &[("IRONGUARD_TEST_CRASH", "after-task:process")]);
    site.start();
    site.wait_state("waiting", Duration::from_secs(20));
    let _ = site.continue_();
    // The worker stops right after the processing task; kill the process there.
    kill_at_crash_point(&mut site.cp);
    site.cp.env.clear();
    site.cp.restart(&site.lan.pxe, &site.lan.dir);
    // Redelivered after its lease (2 s): déjà vu of a strict transition → error, task not repeated.
    let (_, err) = site.wait_state("error", Duration::from_secs(20));
    assert!(err.contains("not repeated"), "{err}");
    assert!(site.dhcp_closed(), "no allow left behind");
}

#[test]
fn worker_killed_before_the_transition_runs_the_task_once() {
    let mut site = Site::new(false, &[("IRONGUARD_TEST_CRASH", "before-transition:process")]);
    site.start();
    site.wait_state("waiting", Duration::from_secs(20));
    let before = site.power_calls("").len();
    let _ = site.continue_();
    kill_at_crash_point(&mut site.cp);
    site.cp.env.clear();
    site.cp.restart(&site.lan.pxe, &site.lan.dir);
    let (_, err) = site.wait_state("finished", Duration::from_secs(20));
    assert_eq!(err, "");
    assert_eq!(site.power_calls("").len(), before + 1, "the processing task (power off) ran exactly once");
}

/// Waits until the control plane's worker reports it stopped at the crash point, then SIGKILLs the process.
fn kill_at_crash_point(cp: &mut ControlPlane) {
    let reached = wait_for(DEADLINE, || cp.proc.log_text().contains("IRONGUARD_TEST_CRASH").then_some(()));
    assert!(reached.is_some(), "the crash point was not reached:\n{}", cp.proc.log_text());
    cp.proc.signal(Signal::SIGKILL);
    assert!(cp.proc.wait_exit(SETUP_DEADLINE).is_some());
}

fn restart_mid_inspection(with_etcd: bool) {
    let mut site = Site::new(with_etcd, &[]);
    site.start();
    site.wait_state("waiting", Duration::from_secs(20));
    site.cp.proc.signal(Signal::SIGKILL);
    assert!(site.cp.proc.wait_exit(SETUP_DEADLINE).is_some(), "the killed control plane is reaped");
    site.cp.restart(&site.lan.pxe, &site.lan.dir);
    assert_eq!(site.state().0, "waiting", "the inspection survives the restart");
    assert_eq!(site.continue_().unwrap(), NODE);
    site.wait_state("finished", Duration::from_secs(20));
    // The agent reconnects with back-off, possibly after the inspection already finished: wait for it.
    let resumed = wait_for(DEADLINE, || {
        (metric(&site.lan.pxe, AGENT_ADMIN, "ironguard_agent_stream_resumes").unwrap_or(0.0) >= 1.0).then_some(())
    });
    assert!(resumed.is_some(), "the agent resumed its stream from the restarted control plane");
}

/// Before: after an etcd outage longer than a worker session's TTL (10 s) every node lock failed with "requested
/// lease not found", read as "locked by another worker", and requests cycled every 200 ms forever. Now a worker whose
/// session is gone opens a new one and takes the work again.
#[test]
fn workers_renew_their_sessions_after_an_etcd_outage_longer_than_their_ttl() {
    let mut site = Site::new(true, &[]);
    site.start();
    site.wait_state("waiting", Duration::from_secs(20));
    assert_eq!(site.continue_().unwrap(), NODE);
    site.wait_state("finished", Duration::from_secs(20));
    // The worker saves "finished", then consumes the request and releases the node's lock: etcd goes down only
    // after that, so that no request is left behind holding a lock of the old session.
    let idle = wait_for(DEADLINE, || {
        let keys = site.etcd_keys();
        (!keys.iter().any(|k| k.contains("/queue/") || k.contains("/lock/"))).then_some(())
    });
    assert!(idle.is_some(), "the request was consumed and the lock released: {:?}", site.etcd_keys());
    let old_leases = site.etcd_leases();
    let etcd = site.etcd.as_mut().unwrap();
    etcd.stop();
    // Longer than a worker session's TTL (10 s): the workers' sessions expire on their own clocks.
    std::thread::sleep(Duration::from_secs(13));
    etcd.restart();
    // etcd restores its leases with a fresh TTL when it comes back; the workers' leases, no longer kept alive,
    // expire one TTL later. Only then does a lock with an old session fail ("requested lease not found").
    let expired = wait_for(DEADLINE, || {
        let now = site.etcd_leases();
        old_leases.iter().all(|l| !now.contains(l)).then_some(())
    });
    assert!(expired.is_some(), "the leases from before the outage expired: {old_leases:?} {:?}", site.etcd_leases());
    site.start();
    site.wait_state("waiting", Duration::from_secs(30));
    assert_eq!(site.continue_().unwrap(), NODE);
    site.wait_state("finished", Duration::from_secs(20));
    let log = site.cp.proc.log_text();
    // Two workers opened a session each at start; each opened a new one after the outage.
    let opened = log.matches("worker session opened").count();
    assert!(opened >= 4, "the workers did not renew their sessions ({opened} opened):\n{log}");
    let cycles = log.matches("node is locked by another worker").count();
    assert!(cycles < 20, "requests cycled {cycles} times on a lock they could never get:\n{log}");
}

#[test]
fn control_plane_restarted_mid_inspection_embedded() {
    restart_mid_inspection(false);
}

#[test]
fn control_plane_restarted_mid_inspection_etcd() {
    restart_mid_inspection(true);
}

#[test]
fn ironics_own_inspection_opens_dhcp_for_its_node() {
    let lan = PxeLan::new(1);
    let ironic = FakeIronicProc::start(&lan.pxe, &lan.dir, 6385);
    ironic.add_node(NODE, "manageable", &[mac(NODE_MAC)]);
    let cfg = lan.dir.join("cp.toml");
    std::fs::write(
        &cfg,
        "[filter]\nunknown_mac_policy = \"deny\"\n[ironic]\nurl = \"http://127.0.0.1:6385\"\n[sync]\nironic_sync_secs = 0\nironic_inspection = true\nironic_inspection_period_ms = 500\n",
    )
    .unwrap();
    let cp = ControlPlane::start(&lan.pxe, &lan.dir, 9100, 9101, &["--config", cfg.to_str().unwrap()]);
    let _agent = start_agent(&lan.pxe, &lan.dir, &agent_toml("agent-o", &cp.url(), "br0", AGENT_ADMIN, 30), None);
    assert!(wait_for(DEADLINE, || (verdict(&lan.pxe) == "LEADER").then_some(())).is_some());
    assert!(no_dhcp(&lan.pxe, &lan.nodes[0], "eth0", mac(NODE_MAC)).is_none());
    ironic.set_provision_state(NODE, "inspect wait");
    let t = Instant::now();
    let lease = wait_for(DEADLINE, || dhcp(&lan.nodes[0], "eth0", mac(NODE_MAC)));
    assert!(lease.is_some(), "Ironic's inspection opened DHCP for its node");
    eprintln!("lease {:?} after the node entered inspect wait", t.elapsed());
    ironic.set_provision_state(NODE, "manageable");
    let closed = dhcp_becomes(&lan.pxe, &lan.nodes[0], mac(NODE_MAC), false, DEADLINE);
    assert!(closed, "denied again once Ironic is done");
}
