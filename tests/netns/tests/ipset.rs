//! The ipset backend (iptables-legacy and `hash:mac` ipsets) on this machine's kernel, which has no `hash:mac` set
//! type (CONFIG_IP_SET_HASH_MAC is not set): the agent must refuse the backend with a message that says why. The
//! backend's dataplane tests run in a stock Debian 12 kernel under qemu: `debian_kernel.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;

use ironguard_netns_tests::shapes::require_tools;
use ironguard_netns_tests::*;

fn hash_mac_supported(ns: &Netns) -> bool {
    let ok = ns.cmd("ipset").args(["create", "ig-probe", "hash:mac"]).output().expect("run ipset");
    let _ = ns.cmd("ipset").args(["destroy", "ig-probe"]).output();
    ok.status.success()
}

/// On a kernel without `hash:mac` the agent refuses the ipset backend and names the missing kernel option; on one
/// with it, the backend opens (its sets and chains appear).
#[test]
fn the_ipset_backend_needs_hash_mac_and_says_so() {
    require_tools(&[("ipset", "ipset"), ("iptables-legacy", "iptables")]);
    let ns = Netns::new("ipsk");
    let dir = TempDir::new("ipsk");
    let out = ns
        .cmd(bin("ironguard-agent"))
        .args(["hold", "--backend", "ipset", "--mode", "follower", "--ready-file"])
        .arg(dir.join("ready"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ironguard-agent hold");
    if hash_mac_supported(&ns) {
        let ready = wait_for(DEADLINE, || dir.join("ready").exists().then_some(()));
        assert!(ready.is_some(), "hold --backend ipset did not start on a kernel with hash:mac");
        let sets = run_ok(ns.cmd("ipset").args(["list", "-n"]));
        assert!(String::from_utf8_lossy(&sets.stdout).contains("ironguard-allow"));
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(out.id() as i32), nix::sys::signal::Signal::SIGTERM);
        let _ = out.wait_with_output();
    } else {
        let out = out.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "must refuse: {err}");
        assert!(err.contains("no hash:mac ipset type") && err.contains("CONFIG_IP_SET_HASH_MAC"), "{err}");
        let sets = run_ok(ns.cmd("ipset").args(["list", "-n"]));
        assert!(String::from_utf8_lossy(&sets.stdout).trim().is_empty(), "nothing was created");
    }
}
