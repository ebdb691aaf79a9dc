//! The reply-side (netdev egress) dataplane in a kernel older than 6.16: a stock Debian 12 kernel (6.1) booted with
//! qemu runs `tests/netns/scripts/egress_guest.sh` (ISC dhcpd on raw sockets, udhcpc, the agent's hold, guard and run
//! commands with a control plane). Before 6.16 the kernel binds a netdev chain to a device, not to its name: a
//! provisioning bridge deleted and created again is left unfiltered unless the agent binds it again, which it does
//! on the link notification.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ironguard_netns_tests::shapes::require_tools;

/// Every check of `egress_guest.sh`.
const CHECKS: &[&str] = &[
    "control-no-firewall",
    "guard-alone-drops",
    "guard-bound",
    "leader-verdict",
    "leader-allowed",
    "leader-denied",
    "leader-unknown",
    "lease-element",
    "sigterm-closes",
    "policy-allow-unknown",
    "policy-allow-denied",
    "follower-serves-nobody",
    "blocked-serves-nobody",
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
    "single-retries-back-off",
];

/// Allow, deny and unknown with a real AF_PACKET server, leader, follower, blocked and policy allow, SIGTERM,
/// SIGKILL and SIGSTOP (the kernel lease), and a bridge rebuilt under a leading agent, in Linux 6.1: one of two
/// egress interfaces (the kernel unbinds it), and the only one (the kernel deletes both base chains; the agent stays
/// closed, retries with back-off without repeating its error, and builds them again when the interface is back).
#[test]
fn the_egress_dataplane_in_a_debian_6_1_kernel() {
    require_tools(&[("dhcpd", "isc-dhcp-server"), ("jq", "jq")]);
    let console = ironguard_netns_tests::guest::run_checks_in_debian_kernel("egress_guest.sh", CHECKS);
    assert!(console.contains("guest: kernel 6.1."), "the guest runs Debian 12's 6.1 kernel");
}
