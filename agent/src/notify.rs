//! systemd's service notifications (`sd_notify(3)`: `READY=1`, `WATCHDOG=1`, `STOPPING=1`) to `$NOTIFY_SOCKET`,
//! sent without ever waiting. A datagram to a receiver whose queue is full blocks; the watchdog ping is sent from
//! the main loop, so a systemd that stopped reading its notification socket would otherwise stop the loop, and
//! with it the lease fence's second line and every repair. A notification that cannot go at once is dropped:
//! the watchdog then lapses, which is what a watchdog is for.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::net::UnixDatagram;

use tracing::debug;

/// What the agent tells systemd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notification {
    /// The agent's table is in place (Blocked): `Type=notify` units count as started.
    Ready,
    /// The main loop runs (`WatchdogSec=`).
    Watchdog,
    /// The agent is closing and exiting.
    Stopping,
}

impl Notification {
    fn message(self) -> &'static [u8] {
        match self {
            Notification::Ready => b"READY=1\n",
            Notification::Watchdog => b"WATCHDOG=1\n",
            Notification::Stopping => b"STOPPING=1\n",
        }
    }
}

/// Sends `n` to `$NOTIFY_SOCKET` if it is set; never waits (see the module documentation).
pub fn notify(n: Notification) {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else { return };
    if let Err(e) = send(&socket, n.message()) {
        debug!(notification = ?n, error = %e, "cannot notify systemd");
    }
}

/// One datagram to `socket` (a path, or `@name` for the abstract namespace), without blocking: a full queue is
/// `WouldBlock`.
fn send(socket: &OsStr, message: &[u8]) -> io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    sock.set_nonblocking(true)?;
    let sent = match socket.as_bytes().strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt as _;
            sock.send_to_addr(message, &std::os::unix::net::SocketAddr::from_abstract_name(name)?)?
        }
        None => sock.send_to(message, socket)?,
    };
    if sent == message.len() { Ok(()) } else { Err(io::Error::new(io::ErrorKind::WriteZero, "incomplete datagram")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unique(tag: &str) -> String {
        format!("ironguard-notify-{tag}-{}-{:x}", std::process::id(), rand::random::<u64>())
    }

    #[test]
    fn a_notification_reaches_a_path_or_an_abstract_socket() {
        let path = std::env::temp_dir().join(unique("path"));
        let rx = UnixDatagram::bind(&path).expect("bind");
        send(path.as_os_str(), Notification::Watchdog.message()).expect("send");
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"WATCHDOG=1\n");
        let _ = std::fs::remove_file(&path);

        use std::os::linux::net::SocketAddrExt as _;
        let name = unique("abstract");
        let rx = UnixDatagram::bind_addr(&std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap())
            .expect("bind abstract");
        send(OsStr::new(&format!("@{name}")), Notification::Ready.message()).expect("send");
        let n = rx.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"READY=1\n");
    }

    /// A receiver that stops reading (a wedged systemd): once its queue is full, a notification fails at once
    /// instead of waiting for room.
    #[test]
    fn a_full_queue_is_an_error_not_a_wait() {
        let path = std::env::temp_dir().join(unique("full"));
        let _rx = UnixDatagram::bind(&path).expect("bind");
        let mut sent = 0u32;
        let err = loop {
            match send(path.as_os_str(), Notification::Watchdog.message()) {
                Ok(()) => sent += 1,
                Err(e) => break e,
            }
            assert!(sent < 1_000_000, "the queue never filled");
        };
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "{err}");
        assert!(sent > 0, "the first notifications went through");
        let _ = std::fs::remove_file(&path);
    }
}
