//! Is the local DHCP service healthy? An agent leads only while it is: a leader whose dnsmasq is down would hold
//! the pass rule for a service that answers nobody, while another host could serve.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

use crate::config::DhcpHealthSection;

/// The outcome of one check, with the reason in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub healthy: bool,
    pub detail: String,
}

/// Runs every configured check; all must pass. Each ends within its bound (`systemctl` within
/// `systemd_timeout_ms`), so the health never stays at an old value while a check hangs.
pub async fn check(cfg: &DhcpHealthSection) -> Health {
    let mut details = vec![];
    let mut healthy = true;
    if cfg.udp_port != 0 {
        match udp_listeners(cfg.udp_port) {
            Ok(0) => {
                healthy = false;
                details.push(format!("nothing listens on udp/{}", cfg.udp_port));
            }
            Ok(n) => details.push(format!("{n} socket(s) listening on udp/{}", cfg.udp_port)),
            Err(e) => {
                healthy = false;
                details.push(format!("cannot read /proc/net/udp: {e}"));
            }
        }
    }
    if !cfg.systemd_unit.is_empty() {
        let mut systemctl = Command::new("systemctl");
        systemctl.args(["is-active", "--quiet", &cfg.systemd_unit]);
        let bound = Duration::from_millis(cfg.systemd_timeout_ms);
        match succeeds_within(systemctl, bound).await {
            Ok(true) => details.push(format!("unit {} active", cfg.systemd_unit)),
            Ok(false) => {
                healthy = false;
                details.push(format!("unit {} not active", cfg.systemd_unit));
            }
            Err(e) => {
                healthy = false;
                details.push(format!("systemctl is-active {}: {e}", cfg.systemd_unit));
            }
        }
    }
    if !cfg.pid_file.is_empty() {
        match pid_alive(Path::new(&cfg.pid_file)) {
            Ok(pid) => details.push(format!("pid {pid} from {} runs", cfg.pid_file)),
            Err(e) => {
                healthy = false;
                details.push(e);
            }
        }
    }
    if details.is_empty() {
        details.push("no health check configured".into());
    }
    Health { healthy, detail: details.join("; ") }
}

/// Runs `command` (no input, output discarded) and says whether it exits with success within `bound`. One that
/// is still running then is killed (and reaped by tokio) and its hang is the error.
async fn succeeds_within(mut command: Command, bound: Duration) -> Result<bool, String> {
    command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).kill_on_drop(true);
    let mut child = command.spawn().map_err(|e| format!("cannot run it: {e}"))?;
    match tokio::time::timeout(bound, child.wait()).await {
        Ok(Ok(status)) => Ok(status.success()),
        Ok(Err(e)) => Err(format!("cannot wait for it: {e}")),
        Err(_) => {
            let _ = child.start_kill();
            Err(format!("no answer within {} ms (systemd_timeout_ms); killed it, health unknown", bound.as_millis()))
        }
    }
}

/// Number of sockets bound to UDP `port` in this network namespace (IPv4 and IPv6).
fn udp_listeners(port: u16) -> std::io::Result<usize> {
    let mut n = 0;
    for file in ["/proc/self/net/udp", "/proc/self/net/udp6"] {
        let text = match std::fs::read_to_string(file) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && file.ends_with('6') => continue,
            Err(e) => return Err(e),
        };
        n += count_port(&text, port);
    }
    Ok(n)
}

/// Counts entries of a /proc/net/udp table whose local port is `port`.
fn count_port(table: &str, port: u16) -> usize {
    let want = format!(":{port:04X}");
    table.lines().skip(1).filter(|l| l.split_whitespace().nth(1).is_some_and(|local| local.ends_with(&want))).count()
}

fn pid_alive(path: &Path) -> Result<i32, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read pid file {}: {e}", path.display()))?;
    let pid: i32 = text.trim().parse().map_err(|_| format!("pid file {} holds {:?}", path.display(), text.trim()))?;
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) | Err(nix::errno::Errno::EPERM) => Ok(pid),
        Err(_) => Err(format!("pid {pid} from {} is not running", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_net_udp() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
 1: 00000000:0043 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1234 2 0000000000000000 0\n\
 2: 0100007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1235 2 0000000000000000 0\n";
        assert_eq!(count_port(table, 67), 1);
        assert_eq!(count_port(table, 53), 1);
        assert_eq!(count_port(table, 4011), 0);
    }

    #[tokio::test]
    async fn missing_pid_file_is_unhealthy_with_a_reason() {
        let h = check(&DhcpHealthSection {
            udp_port: 0,
            pid_file: "/nonexistent/dnsmasq.pid".into(),
            ..Default::default()
        })
        .await;
        assert!(!h.healthy);
        assert!(h.detail.contains("/nonexistent/dnsmasq.pid"), "{}", h.detail);
    }

    /// A command that hangs (a wedged systemctl or systemd) is an error naming the bound, and is killed; one that
    /// answers is taken at its word.
    #[tokio::test]
    async fn a_command_that_hangs_is_killed_and_is_no_answer() {
        let bound = Duration::from_millis(100);
        let mut hang = Command::new("sleep");
        hang.arg("600");
        let e = succeeds_within(hang, bound).await.unwrap_err();
        assert!(e.contains("no answer within 100 ms") && e.contains("systemd_timeout_ms"), "{e}");
        assert_eq!(succeeds_within(Command::new("true"), bound * 50).await, Ok(true));
        assert_eq!(succeeds_within(Command::new("false"), bound * 50).await, Ok(false));
        let e = succeeds_within(Command::new("/nonexistent/systemctl"), bound).await.unwrap_err();
        assert!(e.contains("cannot run it"), "{e}");
    }
}
