//! Sessions: a lease and the latest time, on this host's monotonic clock, at which it can still be alive.

use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// When a session's lease expires at the latest, as far as this host can tell.
///
/// A keep-alive sent at `t` and acknowledged extends the lease to at least `t + TTL` on the server; so `t + TTL`
/// (with `t` taken *before* sending) is a safe lower bound on the server's expiry, measured on the local monotonic
/// clock. The agents close their DHCP a margin before that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// The local backend: the session cannot expire.
    Never,
    /// Alive at least until this instant (unless renewed further).
    At(Instant),
    /// Gone: the lease expired or was revoked.
    Expired,
}

impl Expiry {
    /// Whether the session is still alive `margin` before its expiry.
    pub fn valid_with_margin(&self, margin: Duration, now: Instant) -> bool {
        match self {
            Expiry::Never => true,
            Expiry::At(t) => t.checked_sub(margin).is_some_and(|d| now < d),
            Expiry::Expired => false,
        }
    }

    /// The instant `margin` before expiry, if it expires.
    pub fn deadline(&self, margin: Duration) -> Option<Instant> {
        match self {
            Expiry::Never => None,
            Expiry::At(t) => Some(t.checked_sub(margin).unwrap_or(*t)),
            Expiry::Expired => Some(Instant::now()),
        }
    }
}

/// A lease kept alive in the background.
#[derive(Debug)]
pub struct Session {
    /// The backend's lease id (0 for the local backend).
    pub lease: i64,
    pub ttl: Duration,
    pub(crate) expiry: watch::Receiver<Expiry>,
    pub(crate) stop: CancellationToken,
    /// The local backend keeps the sending side here, so the estimate stays `Never` (not "closed").
    pub(crate) _hold: Option<watch::Sender<Expiry>>,
}

impl Session {
    /// The current expiry estimate.
    pub fn expiry(&self) -> Expiry {
        *self.expiry.borrow()
    }

    /// A receiver that changes whenever the estimate changes.
    pub fn watch(&self) -> watch::Receiver<Expiry> {
        self.expiry.clone()
    }

    /// Stops keeping the lease alive (the backend's revoke is separate).
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn margin_arithmetic() {
        let now = Instant::now();
        let e = Expiry::At(now + Duration::from_secs(3));
        assert!(e.valid_with_margin(Duration::from_secs(1), now));
        assert!(!e.valid_with_margin(Duration::from_secs(1), now + Duration::from_millis(2001)));
        assert!(Expiry::Never.valid_with_margin(Duration::from_secs(100), now));
        assert!(!Expiry::Expired.valid_with_margin(Duration::ZERO, now));
        assert_eq!(e.deadline(Duration::from_secs(1)), Some(now + Duration::from_secs(2)));
        assert_eq!(Expiry::Never.deadline(Duration::from_secs(1)), None);
    }
}
