//! The ipset backend (iptables-legacy and `hash:mac` ipsets) against real kernels.
//!
//! The kernel of the CI machine has no `hash:mac` set type (CONFIG_IP_SET_HASH_MAC is not set), so the dataplane
//! tests run inside a stock Debian 12 kernel booted with qemu (`scripts/guest-kernel.sh`): the guest mounts this
//! machine's root read-only and runs `tests/netns/scripts/ipset_guest.sh` with the workspace's binaries — real
//! x_tables and ipset, iptables-legacy, dnsmasq, a DHCP relay, udhcpc, the agent (hold and run) and the control
//! plane. On this machine's own kernel the agent must refuse the backend with a message that says why.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::Duration;

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
        let ready = wait_for(Duration::from_secs(10), || dir.join("ready").exists().then_some(()));
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

/// Every check of `ipset_guest.sh`, in a Debian 12 kernel under qemu.
const CHECKS: &[&str] = &[
    "control-no-firewall",
    "control-relayed",
    "guard-alone-drops",
    "guard-status",
    "leader-allowed",
    "leader-denied",
    "leader-unknown",
    "lease-element",
    "relayed-allowed-node-unknown-relay",
    "sigterm-closes",
    "relayed-denied-node-allowed-relay",
    "policy-allow-unknown",
    "policy-allow-denied",
    "follower-serves-nobody",
    "follower-unknown",
    "blocked-serves-nobody",
    "before-kill",
    "sigkill-lease-expired",
    "sigkill-closed",
    "sigstop-closed",
    "sigcont-serves",
    "agent-leads",
    "agent-allowed",
    "agent-denied",
    "agent-unknown",
    "tamper-guard-repaired",
    "tamper-unknown-still-closed",
    "tamper-allow-set-repaired",
    "agent-sigterm-closes",
];

/// The ipset backend's dataplane tests (allow, deny and unknown with real clients, relayed DHCP, leader, follower,
/// policy allow, SIGTERM, SIGKILL, SIGSTOP, the agent with a control plane, tampering repaired) in a stock Debian 12
/// kernel, which has `hash:mac`.
#[test]
fn the_ipset_backend_in_a_debian_kernel() {
    require_tools(&[("ipset", "ipset"), ("iptables-legacy", "iptables")]);
    ironguard_netns_tests::guest::run_checks_in_debian_kernel("ipset_guest.sh", CHECKS);
}
