//! What this machine's kernel cannot show, in stock Debian 12 (6.1) and Debian 13 (6.12) kernels booted with qemu
//! (`scripts/guest-kernel.sh`; the guest mounts this machine's root read-only and runs a script from
//! `tests/netns/scripts/` with the workspace's binaries). One boot per kernel: the ipset backend, the observation
//! sets and the egress dataplane one after another (`kernel_guest.sh`, each part in PID and mount namespaces of its
//! own); the two kernels' guests run side by side. (A boot costs the emulated CPU about 12 s before the first check:
//! two boots per kernel cost two more of them.)
//!
//! * The ipset backend (`ipset_guest.sh`): this machine's kernel has no `hash:mac` set type
//!   (CONFIG_IP_SET_HASH_MAC is not set). Real x_tables and ipset, iptables-legacy, dnsmasq, a DHCP relay, udhcpc,
//!   the agent (hold and run) and the control plane.
//! * The reply-side (netdev egress) dataplane before Linux 6.16 (`egress_guest.sh`): such kernels bind a netdev
//!   chain to a device, not to its name, so a provisioning bridge deleted and created again is left unfiltered
//!   unless the agent binds it again, which it does on the link notification. ISC dhcpd on raw sockets, udhcpc,
//!   the agent's hold, guard and run commands with a control plane.
//! * The observation sets (`seen_guest.sh`): the dynamic sets with a per-element counter and the `update` rules of
//!   the agent's table load in Linux 6.1 and record requests, requests let through and answers per MAC.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ironguard_netns_tests::guest::{GuestKernel, run_checks_in_kernel};
use ironguard_netns_tests::shapes::require_tools;

/// Every check of `ipset_guest.sh`.
const IPSET_CHECKS: &[&str] = &[
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

/// Every check of `egress_guest.sh`.
const EGRESS_CHECKS: &[&str] = &[
    "control-no-firewall",
    "guard-alone-drops",
    "guard-bound",
    "leader-verdict",
    "leader-allowed",
    "leader-denied",
    "leader-unknown",
    "lease-element",
    "sigterm-closes",
    "before-kill",
    "sigkill-closed",
    "sigstop-fenced",
    "sigstop-closed",
    "sigcont-serves",
    "kernel-forgets-recreated-device",
    "unwatched-recreated-device-open",
    "agent-leads",
    "agent-allowed",
    "agent-denied",
    "agent-unknown",
    "agent-rebinds-recreated-device",
    "recreated-leads",
    "recreated-unknown",
    "recreated-denied",
    "recreated-allowed",
    "agent-sigterm-closes",
    "single-leads",
    "single-agent-survives-absent-device",
    "single-rebuilt-and-bound",
    "single-unknown",
    "single-allowed",
    "single-errors-said-once",
];

/// Every check of `seen_guest.sh`.
const SEEN_CHECKS: &[&str] = &[
    "control-no-firewall",
    "table-loaded",
    "leader-allowed",
    "leader-denied",
    "allowed-requests",
    "allowed-passed",
    "allowed-answers",
    "denied-requests",
    "denied-not-passed",
    "denied-not-answered",
];

/// Boots `kernel` once with `parts` of `kernel_guest.sh` (each with its checks, prefixed by the part's name) and
/// asserts every check of each, that every part ran to its end, and that the guest ran that kernel.
fn parts_in(kernel: GuestKernel, parts: &[(&str, &[&str])]) {
    let checks: Vec<String> =
        parts.iter().flat_map(|(part, checks)| checks.iter().map(move |c| format!("{part}/{c}"))).collect();
    let checks: Vec<&str> = checks.iter().map(String::as_str).collect();
    let names: Vec<&str> = parts.iter().map(|(part, _)| *part).collect();
    let console = run_checks_in_kernel(kernel, "kernel_guest.sh", &names, &checks);
    for part in names {
        assert!(console.contains(&format!("guest: part {part} done")), "the {part} part did not run to its end");
    }
}

/// In a stock Debian 12 kernel (6.1), one boot:
/// * the ipset backend's dataplane tests (allow, deny and unknown with real clients, relayed DHCP, leader, follower,
///   policy allow, SIGTERM, SIGKILL, SIGSTOP, the agent with a control plane, tampering repaired): 6.1 has `hash:mac`;
/// * the observation sets: a leader's table with them loads, and a real dnsmasq and udhcpc leave an allowed MAC in
///   all three sets and a denied one in `seen_requests` only;
/// * the egress dataplane: allow, deny and unknown with a real AF_PACKET server under a leader, SIGTERM, SIGKILL and
///   SIGSTOP (the kernel lease; follower, blocked and policy allow write the same rules and are tested on this
///   machine's kernel), and a bridge rebuilt under a leading agent, in Linux 6.1: one of two egress interfaces (the
///   kernel unbinds it), and the only one (the kernel deletes both base chains; the agent stays closed, retries with
///   back-off without repeating its error, and builds them again when the interface is back).
#[test]
fn the_ipset_backend_observation_sets_and_egress_in_a_debian_6_1_kernel() {
    require_tools(&[("ipset", "ipset"), ("iptables-legacy", "iptables"), ("dhcpd", "isc-dhcp-server"), ("jq", "jq")]);
    let egress = [EGRESS_CHECKS, &["single-retries-back-off"]].concat();
    parts_in(GuestKernel::Debian12, &[("ipset", IPSET_CHECKS), ("seen", SEEN_CHECKS), ("egress", &egress)]);
}

/// The same in Debian 13's kernel (6.12, the kernel a new site most likely runs). 6.12 is also before Linux 6.16, so
/// the egress chains must be bound again when the bridge is recreated; it keeps a netdev base chain whose last device
/// is gone (bound to none; 6.1 deletes it): nothing fails while the bridge is away, so the agent must not retry at
/// all.
#[test]
fn the_ipset_backend_observation_sets_and_egress_in_a_debian_6_12_kernel() {
    require_tools(&[("ipset", "ipset"), ("iptables-legacy", "iptables"), ("dhcpd", "isc-dhcp-server"), ("jq", "jq")]);
    let egress = [EGRESS_CHECKS, &["single-chains-kept-no-retries"]].concat();
    parts_in(GuestKernel::Debian13, &[("ipset", IPSET_CHECKS), ("seen", SEEN_CHECKS), ("egress", &egress)]);
}
