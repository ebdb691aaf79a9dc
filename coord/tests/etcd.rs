//! The etcd backend against a real etcd started on loopback for this test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use ironguard_coord::etcd::EtcdCoordinator;
use ironguard_coord::{Coordinator, EtcdConfig, Expiry};
use ironguard_netns_tests::{EtcdProcess, EtcdRelease, on_both_etcd_releases as on_both};
use tokio_util::sync::CancellationToken;

async fn coord(e: &EtcdProcess) -> EtcdCoordinator {
    let cfg = EtcdConfig { endpoints: vec![e.url.clone()], prefix: "/t".into(), ..Default::default() };
    for _ in 0..50 {
        if let Ok(c) = EtcdCoordinator::connect(&cfg).await {
            if c.get_prefix("x").await.is_ok() {
                return c;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("cannot connect to etcd at {}", e.url);
}

// Each runs on Debian 12's etcd 3.4 and on Debian 13's 3.5 (issue 24).
on_both!(check_sessions_elections_and_lease_expiry: sessions_elections_and_lease_expiry, sessions_elections_and_lease_expiry_on_etcd_3_5);
on_both!(check_unreachable_etcd_lets_the_session_expire_on_the_local_clock: unreachable_etcd_lets_the_session_expire_on_the_local_clock, unreachable_etcd_lets_the_session_expire_on_the_local_clock_on_etcd_3_5);
on_both!(check_a_wedged_etcd_ends_every_call_by_its_bound_and_a_campaign_by_its_cancel: a_wedged_etcd_ends_every_call_by_its_bound_and_a_campaign_by_its_cancel, a_wedged_etcd_ends_every_call_by_its_bound_and_a_campaign_by_its_cancel_on_etcd_3_5);
on_both!(check_members_locks_and_watch: members_locks_and_watch, members_locks_and_watch_on_etcd_3_5);
on_both!(check_a_lock_waits_longer_than_the_request_timeout: a_lock_waits_longer_than_the_request_timeout, a_lock_waits_longer_than_the_request_timeout_on_etcd_3_5);

async fn check_sessions_elections_and_lease_expiry(release: EtcdRelease) {
    let e = EtcdProcess::start_loopback_release("elect", release);
    let c = coord(&e).await;
    let before = Instant::now();
    let a = c.session(Duration::from_secs(3)).await.unwrap();
    // The expiry estimate is at most TTL after the request was sent, and moves forward with keep-alives.
    let Expiry::At(t0) = a.expiry() else { panic!("{:?}", a.expiry()) };
    assert!(t0 <= before + Duration::from_secs(3) + Duration::from_millis(200));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let Expiry::At(t1) = a.expiry() else { panic!() };
    assert!(t1 > t0, "keep-alive extended the lease estimate");

    let la = c.campaign("net1", "agent-a", &a, CancellationToken::new()).await.unwrap();
    assert_eq!(c.leader("net1").await.unwrap().as_deref(), Some("agent-a"));
    // b waits behind a.
    let b = c.session(Duration::from_secs(3)).await.unwrap();
    let c2 = c.clone();
    let bl =
        tokio::spawn(async move { c2.campaign("net1", "agent-b", &b, CancellationToken::new()).await.map(|l| (l, b)) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!bl.is_finished());
    // a stops keeping its lease alive (as if partitioned): b is elected only after a's lease expires.
    a.stop();
    let stopped = Instant::now();
    let Expiry::At(a_expiry) = a.expiry() else { panic!() };
    // A generous deadline for the election; how soon it comes is not this test's business.
    let (lb, _b) = tokio::time::timeout(Duration::from_secs(60), bl).await.unwrap().unwrap().unwrap();
    let elected = Instant::now();
    assert!(elected >= a_expiry, "b elected {:?} before a's lease could expire", a_expiry - elected);
    assert!(
        a_expiry <= stopped + Duration::from_secs(3),
        "a's estimate never reaches past TTL from its last keep-alive"
    );
    assert_eq!(c.leader("net1").await.unwrap().as_deref(), Some("agent-b"));
    c.resign(&lb).await.unwrap();
    assert_eq!(c.leader("net1").await.unwrap(), None);
    drop(la);

    // A cancelled candidate withdraws its key.
    let s = c.session(Duration::from_secs(3)).await.unwrap();
    let _l = c.campaign("net2", "x", &s, CancellationToken::new()).await.unwrap();
    let s2 = c.session(Duration::from_secs(3)).await.unwrap();
    let cancel = CancellationToken::new();
    let c3 = c.clone();
    let cc = cancel.clone();
    let t = tokio::spawn(async move { c3.campaign("net2", "y", &s2, cc).await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(200)).await;
    cancel.cancel();
    assert!(t.await.unwrap().is_err());
    assert_eq!(c.get_prefix("election/net2/").await.unwrap().len(), 1, "only the leader's candidacy remains");
}

async fn check_unreachable_etcd_lets_the_session_expire_on_the_local_clock(release: EtcdRelease) {
    let mut e = EtcdProcess::start_loopback_release("down", release);
    let c = coord(&e).await;
    let s = c.session(Duration::from_secs(3)).await.unwrap();
    let mut w = s.watch();
    e.stop();
    let killed = Instant::now();
    // The last estimate before it expired, and when the expiry was seen (a generous deadline: the local clock, not
    // etcd, ends the session; how soon after its estimate is the keep-alive period's business).
    let (last, expired) = tokio::time::timeout(Duration::from_secs(60), async {
        let mut last = None;
        loop {
            match *w.borrow() {
                Expiry::Expired => return (last, Instant::now()),
                Expiry::At(t) => last = Some(t),
                Expiry::Never => {}
            }
            w.changed().await.unwrap();
        }
    })
    .await
    .expect("the session must expire without etcd");
    let last = last.expect("the session had an expiry estimate");
    assert!(last <= killed + Duration::from_secs(3), "the estimate never reaches past TTL from the last keep-alive");
    assert!(expired >= last, "the session expires at its estimate, not before: {:?} early", last - expired);
}

/// Awaits `f`, failing if it does not end: a deadline for something stuck, not a figure.
async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not end while etcd is wedged"))
}

/// A wedged etcd (frozen: it accepts connections and answers nothing): every call ends by its bound with an error,
/// a campaign still waiting for its first answer ends when cancelled (`Cancelled`, not the error its call would
/// have ended with), and one waiting behind the leader ends too.
async fn check_a_wedged_etcd_ends_every_call_by_its_bound_and_a_campaign_by_its_cancel(release: EtcdRelease) {
    let e = EtcdProcess::start_loopback_release("wedged", release);
    coord(&e).await;
    let cfg = EtcdConfig {
        endpoints: vec![e.url.clone()],
        prefix: "/t".into(),
        request_timeout_ms: 300,
        retries: 2,
        ..Default::default()
    };
    let c = EtcdCoordinator::connect(&cfg).await.unwrap();
    let a = c.session(Duration::from_secs(3)).await.unwrap();
    let la = c.campaign("net", "agent-a", &a, CancellationToken::new()).await.unwrap();
    let b = c.session(Duration::from_secs(3)).await.unwrap();
    let waiting = CancellationToken::new();
    let (c2, w2) = (c.clone(), waiting.clone());
    let behind = tokio::spawn(async move { c2.campaign("net", "agent-b", &b, w2).await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!behind.is_finished(), "b waits behind a");
    e.freeze();
    let r = bounded("confirm", c.confirm(&la, Duration::from_secs(2))).await;
    assert!(r.is_err(), "{r:?}");
    let r = bounded("session", c.session(Duration::from_secs(3))).await;
    assert!(r.is_err());
    let r = bounded("watch setup", c.watch_prefix("members/", 0)).await;
    assert!(r.is_err());
    let r = bounded("resign", c.resign(&la)).await;
    assert!(r.is_err(), "{r:?}");
    // Uncancelled, a new campaign ends with the error of its first call.
    let r = bounded("campaign", c.campaign("net", "agent-c", &a, CancellationToken::new())).await;
    assert!(matches!(r, Err(ironguard_coord::CoordError::Etcd { .. })), "{r:?}");
    // Cancelled while its first call waits: Cancelled, not that error.
    let cancel = CancellationToken::new();
    let (c3, k3) = (c.clone(), cancel.clone());
    let pending = tokio::spawn(async move { c3.campaign("net", "agent-d", &a, k3).await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(100)).await;
    cancel.cancel();
    let r = bounded("cancelled campaign", pending).await.unwrap();
    assert!(matches!(r, Err(ironguard_coord::CoordError::Cancelled)), "{r:?}");
    // The campaign that was waiting behind the leader (in its watch) ends too: by its bound (the connection's
    // keep-alive fails, and the look at the election that follows gets no answer) or by the cancel.
    waiting.cancel();
    let r = bounded("waiting campaign", behind).await.unwrap();
    assert!(r.is_err(), "{r:?}");
    e.thaw();
}

async fn check_members_locks_and_watch(release: EtcdRelease) {
    let e = EtcdProcess::start_loopback_release("kv", release);
    let c = coord(&e).await;
    let s = c.session(Duration::from_secs(3)).await.unwrap();
    let rev = c.put("members/n/a", b"{}".to_vec(), Some(&s)).await.unwrap();
    let mut w = c.watch_prefix("members/n/", rev).await.unwrap();
    c.put("members/n/b", b"{}".to_vec(), Some(&s)).await.unwrap();
    use futures::StreamExt as _;
    let evs = tokio::time::timeout(Duration::from_secs(5), w.next()).await.unwrap().unwrap().unwrap();
    assert!(matches!(&evs[0], ironguard_coord::KvEvent::Put(kv) if kv.key == "members/n/b"), "{evs:?}");
    assert_eq!(c.get_prefix("members/n/").await.unwrap().len(), 2);
    // Revoking the lease removes the members.
    ironguard_coord::etcd::revoke(&c, &s).await.unwrap();
    assert_eq!(c.get_prefix("members/n/").await.unwrap().len(), 0);
    // Locks exclude.
    let s1 = c.session(Duration::from_secs(3)).await.unwrap();
    let s2 = c.session(Duration::from_secs(3)).await.unwrap();
    let g = c.lock("node-1", &s1, CancellationToken::new()).await.unwrap();
    let cancel = CancellationToken::new();
    let c2 = c.clone();
    let cc = cancel.clone();
    let t = tokio::spawn(async move { c2.lock("node-1", &s2, cc).await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!t.is_finished(), "the lock is held");
    c.unlock(&g).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), t).await.unwrap().unwrap().unwrap();
    drop(cancel);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_client_certificates_and_user_password() {
    let tls = ironguard_netns_tests::TlsFiles::generate();
    let e = EtcdProcess::start_loopback_tls("tls", &tls);
    let base = EtcdConfig {
        endpoints: vec![e.url.clone()],
        prefix: "/t".into(),
        ca_file: tls.ca.display().to_string(),
        cert_file: tls.client_cert.display().to_string(),
        key_file: tls.client_key.display().to_string(),
        ..Default::default()
    };
    let c = EtcdCoordinator::connect(&base).await.expect("TLS with a client certificate");
    c.put("hello", b"world".to_vec(), None).await.unwrap();
    assert_eq!(c.get_prefix("hello").await.unwrap()[0].value, b"world");

    // Without the client certificate the server refuses.
    let no_cert = EtcdConfig { cert_file: String::new(), key_file: String::new(), retries: 1, ..base.clone() };
    let refused = match EtcdCoordinator::connect(&no_cert).await {
        Ok(c) => c.get_prefix("hello").await.is_err(),
        Err(_) => true,
    };
    assert!(refused, "a client without a certificate must be refused");

    // Role-based access: enable auth with a root user, then only the right password works.
    let etcdctl = |args: &[&str]| {
        let out = std::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args([
                "--endpoints",
                &e.url,
                "--cacert",
                &base.ca_file,
                "--cert",
                &base.cert_file,
                "--key",
                &base.key_file,
            ])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    etcdctl(&["user", "add", "root:rootpw"]);
    etcdctl(&["auth", "enable"]);
    let pwfile = tls.dir.join("pw");
    std::fs::write(&pwfile, "rootpw\n").unwrap();
    let with_user = EtcdConfig { username: "root".into(), password_file: pwfile.display().to_string(), ..base.clone() };
    // etcd checks the password with bcrypt at each authentication: on a loaded machine that can outlast the request
    // timeout (one connect did in a CI run, beside two Debian roots and two qemu guests); an agent retries, so does this.
    let mut connected = EtcdCoordinator::connect(&with_user).await;
    for _ in 0..3 {
        if connected.is_ok() {
            break;
        }
        connected = EtcdCoordinator::connect(&with_user).await;
    }
    let c = connected.expect("user and password from a file");
    c.put("authed", b"1".to_vec(), None).await.unwrap();
    let wrong = EtcdConfig { username: "root".into(), password: "nope".into(), retries: 1, ..base.clone() };
    let denied = match EtcdCoordinator::connect(&wrong).await {
        Ok(c) => c.put("x", b"1".to_vec(), None).await.is_err(),
        Err(_) => true,
    };
    assert!(denied, "a wrong password must be refused");
}

/// A coordinator whose requests time out after `timeout_ms` (etcd up first): for the lock tests, whose holders keep
/// a lock many times that long.
async fn short_timeout_coord(e: &EtcdProcess, timeout_ms: u64) -> EtcdCoordinator {
    coord(e).await;
    let cfg = EtcdConfig {
        endpoints: vec![e.url.clone()],
        prefix: "/t".into(),
        request_timeout_ms: timeout_ms,
        ..Default::default()
    };
    EtcdCoordinator::connect(&cfg).await.unwrap()
}

/// A lock held longer than the request timeout (here 3 s against 1 s: the reboot throttle's quantum against the
/// connection's bound) is waited for, not failed: the waiter gets it after the release. Waiters queue in order; a
/// waiter cancelled leaves no key behind (the next one is not stuck behind it); a waiter whose session ends gets
/// an error, not the lock; the lock key is tied to the session's lease. (The timeout was 400 ms: on a machine
/// loaded three times over, a waiter's requests outlasted it and its retries, and the waiter gave up before the
/// test saw its key.)
async fn check_a_lock_waits_longer_than_the_request_timeout(release: EtcdRelease) {
    let e = EtcdProcess::start_loopback_release("lockwait", release);
    let c = short_timeout_coord(&e, 1000).await;
    let holder = c.session(Duration::from_secs(5)).await.unwrap();
    let g = c.lock("reboot-throttle", &holder, CancellationToken::new()).await.unwrap();
    assert!(g.key.ends_with(&format!("/{:x}", holder.lease)), "{}", g.key);
    let keys = c.get_prefix("lock/reboot-throttle/").await.unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");

    // A waiter that gives up (cancelled) leaves nothing behind.
    let quitter = c.session(Duration::from_secs(5)).await.unwrap();
    let q = CancellationToken::new();
    let (c1, q1) = (c.clone(), q.clone());
    let quitting = tokio::spawn(async move { c1.lock("reboot-throttle", &quitter, q1).await.map(|_| ()) });
    // A waiter whose session ends gets an error.
    let doomed = c.session(Duration::from_secs(5)).await.unwrap();
    let doomed_lease = doomed.lease;
    let c2 = c.clone();
    let dying = tokio::spawn(async move { c2.lock("reboot-throttle", &doomed, CancellationToken::new()).await });
    // The waiter that must get it.
    let waiter = c.session(Duration::from_secs(5)).await.unwrap();
    let waiter_lease = waiter.lease;
    let c3 = c.clone();
    let got = tokio::spawn(async move {
        let g = c3.lock("reboot-throttle", &waiter, CancellationToken::new()).await;
        (g, std::time::Instant::now(), waiter)
    });
    // Until every waiter has its key (a deadline for something stuck; a waiter that ended meanwhile fails at once).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let keys = c.get_prefix("lock/reboot-throttle/").await.unwrap().len();
        if keys == 4 {
            break;
        }
        let ended = [
            ("the quitter", quitting.is_finished()),
            ("the doomed", dying.is_finished()),
            ("the waiter", got.is_finished()),
        ];
        assert!(
            ended.iter().all(|(_, done)| !done),
            "a waiter ended before it was cancelled or the lock released ({keys} keys): {ended:?}"
        );
        assert!(std::time::Instant::now() < deadline, "holder and three waiters: {keys} keys after 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    q.cancel();
    let r = bounded("cancelled lock", quitting).await.unwrap();
    assert!(matches!(r, Err(ironguard_coord::CoordError::Cancelled)), "{r:?}");
    c.revoke_lease(doomed_lease).await.unwrap();
    let r = bounded("lock of an ended session", dying).await.unwrap();
    assert!(r.is_err(), "a waiter without a lease never holds the lock: {r:?}");
    // Held for 3 s, many times the request timeout: the waiter is still waiting, not failed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!got.is_finished(), "the lock is held: the waiter waits");
    let keys: Vec<String> = c.get_prefix("lock/reboot-throttle/").await.unwrap().into_iter().map(|kv| kv.key).collect();
    assert_eq!(keys.len(), 2, "the holder and the one waiter left: {keys:?}");
    let released = std::time::Instant::now();
    c.unlock(&g).await.unwrap();
    let (g2, at, waiter) = bounded("lock after the release", got).await.unwrap();
    let g2 = g2.expect("the waiter gets the lock after the release, not an error");
    assert!(at >= released, "not before the release");
    assert!(g2.key.ends_with(&format!("/{waiter_lease:x}")), "{}", g2.key);
    // Tied to the lease: revoking the session frees the lock.
    ironguard_coord::etcd::revoke(&c, &waiter).await.unwrap();
    assert!(c.get_prefix("lock/reboot-throttle/").await.unwrap().is_empty());
    let next = c.session(Duration::from_secs(5)).await.unwrap();
    bounded("lock after the holder's lease ended", c.lock("reboot-throttle", &next, CancellationToken::new()))
        .await
        .unwrap();
}

/// A three-member cluster on loopback addresses of a namespace of its own (ports 2379 and 2380 on each address).
fn cluster(release: EtcdRelease) -> (ironguard_netns_tests::Netns, Vec<EtcdProcess>) {
    let ns = ironguard_netns_tests::Netns::new("coord-cluster");
    let hosts = ["127.0.0.11", "127.0.0.12", "127.0.0.13"];
    let initial: Vec<String> = hosts.iter().enumerate().map(|(i, h)| format!("m{i}=http://{h}:2380")).collect();
    let token = format!("coord-cluster-{}", std::process::id());
    let members: Vec<EtcdProcess> = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| EtcdProcess::launch_member(ns.name(), h, &format!("m{i}"), &initial.join(","), &token, release))
        .collect();
    for m in &members {
        m.wait_up(Duration::from_secs(60));
    }
    (ns, members)
}

/// Which member leads etcd now, as the members that answer say; None while none does.
async fn etcd_leader(members: &[EtcdProcess]) -> Option<usize> {
    let mut ids = Vec::new();
    let mut leader = None;
    for m in members {
        // Bounded as a whole: a frozen member accepts the connection and answers nothing.
        let status = async {
            let mut c = etcd_client::Client::connect([m.url.as_str()], None).await.ok()?;
            c.status().await.ok()
        };
        let s = tokio::time::timeout(Duration::from_secs(1), status).await.ok().flatten();
        ids.push(s.as_ref().and_then(|s| s.header()).map(|h| h.member_id()));
        leader = leader.or(s.map(|s| s.leader()).filter(|l| *l != 0));
    }
    ids.iter().position(|id| id.is_some() && *id == leader)
}

/// Samples `session`'s expiry every 50 ms for `d`: Err if it ever expired.
async fn never_expires(session: &ironguard_coord::Session, d: Duration) -> Result<(), String> {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if session.expiry() == Expiry::Expired {
            return Err("the session expired".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// A session on a three-member cluster keeps its lease while etcd keeps its quorum: its keep-alives go to every
/// member at once, and a member that stops answering (`frozen`: the etcd leader paused, its connections stay open,
/// its requests hang) or dies (`killed`) costs nothing; etcd elects another leader, and the expiry estimate moves
/// on past the fault (issue 24). Each fault on a cluster of its own: a leader frozen and then thawed can, in the
/// seconds after, revoke leases from its stale lease table (etcd 3.4.23 and 3.5.16: the lease is then gone for every
/// member, and the session rightly ends; track record O30), which would judge the next fault on a session etcd
/// itself ended.
fn a_session_outlives_an_etcd_leader(release: EtcdRelease, fault: &'static str) {
    // The coordinator's own account (its lanes), shown with a failure.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("ironguard_coord=debug"))
        .with_test_writer()
        .try_init();
    let (ns, mut members) = cluster(release);
    let urls: Vec<String> = members.iter().map(|m| m.url.clone()).collect();
    ironguard_netns_tests::in_netns(&ns, move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let cfg = EtcdConfig { endpoints: urls, prefix: "/t".into(), ..Default::default() };
            let c = EtcdCoordinator::connect(&cfg).await.unwrap();
            let ttl = Duration::from_secs(5);
            let s = c.session(ttl).await.unwrap();
            let mut leader = None;
            for _ in 0..100 {
                leader = etcd_leader(&members).await;
                if leader.is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let leader = leader.expect("an etcd leader before the fault");
            let Expiry::At(before) = s.expiry() else { panic!("{:?} before the fault", s.expiry()) };
            if fault == "frozen" {
                members[leader].freeze();
            } else {
                members[leader].stop();
            }
            let held = never_expires(&s, 2 * ttl).await;
            if fault == "frozen" {
                members[leader].thaw();
            }
            held.unwrap_or_else(|e| panic!("etcd leader member {leader} {fault}: {e}"));
            let Expiry::At(after) = s.expiry() else { panic!("{:?}", s.expiry()) };
            assert!(after >= before + ttl, "the estimate did not move on after the etcd leader was {fault}");
            assert_ne!(etcd_leader(&members).await, None, "no etcd leader after the fault");
            drop(members);
        })
    });
}

#[test]
fn a_session_outlives_a_silent_etcd_leader_on_etcd_3_4() {
    a_session_outlives_an_etcd_leader(EtcdRelease::Debian12, "frozen");
}

#[test]
fn a_session_outlives_a_silent_etcd_leader_on_etcd_3_5() {
    a_session_outlives_an_etcd_leader(EtcdRelease::Debian13, "frozen");
}

#[test]
fn a_session_outlives_a_dead_etcd_leader_on_etcd_3_4() {
    a_session_outlives_an_etcd_leader(EtcdRelease::Debian12, "killed");
}

#[test]
fn a_session_outlives_a_dead_etcd_leader_on_etcd_3_5() {
    a_session_outlives_an_etcd_leader(EtcdRelease::Debian13, "killed");
}

/// A waiter that gives up while etcd answers nothing (frozen) cannot delete its key then; left there, the key would
/// keep every later waiter of the lock queued behind it for as long as the waiter's session lives (T46: a cancelled
/// waiter's key outlived its delete on a loaded machine). The delete is retried until it lands: once etcd answers
/// again, the key goes while the session still lives, and the next waiter gets the lock when it is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_while_etcd_is_frozen_leaves_no_key_once_etcd_answers() {
    let e = EtcdProcess::start_loopback_release("lockquit", EtcdRelease::Debian13);
    let c = short_timeout_coord(&e, 400).await;
    let holder = c.session(Duration::from_secs(60)).await.unwrap();
    let g = c.lock("quit", &holder, CancellationToken::new()).await.unwrap();
    let quitter = c.session(Duration::from_secs(60)).await.unwrap();
    let q = CancellationToken::new();
    let (c1, q1) = (c.clone(), q.clone());
    let quitting = tokio::spawn(async move {
        let r = c1.lock("quit", &quitter, q1).await.map(|_| ());
        (r, quitter)
    });
    let keys = || async { c.get_prefix("lock/quit/").await.unwrap().len() };
    for _ in 0..100 {
        if keys().await == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(keys().await, 2, "the holder's key and the waiter's");

    e.freeze();
    q.cancel();
    let (r, quitter) = bounded("a lock cancelled while etcd is frozen", quitting).await.unwrap();
    assert!(matches!(r, Err(ironguard_coord::CoordError::Cancelled)), "{r:?}");
    e.thaw();
    let mut left = keys().await;
    for _ in 0..200 {
        if left == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = keys().await;
    }
    assert_eq!(left, 1, "the waiter that gave up left its key behind once etcd answered again");
    assert_ne!(quitter.expiry(), Expiry::Expired, "the key went by its delete, not with the waiter's lease");

    // The next waiter is not queued behind it: it gets the lock once the holder releases it.
    let next = c.session(Duration::from_secs(60)).await.unwrap();
    let c2 = c.clone();
    let waiting =
        tokio::spawn(async move { c2.lock("quit", &next, CancellationToken::new()).await.map(|g| (g, next)) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the lock is held");
    c.unlock(&g).await.unwrap();
    let (g2, _next) = bounded("the lock after its release", waiting).await.unwrap().unwrap();
    c.unlock(&g2).await.unwrap();
}
