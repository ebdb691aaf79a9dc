//! A token bucket per source address for `POST /v1/continue`, the one call anyone may make: each source gets
//! `burst` calls at once and `per_minute` a minute after that. IPv6 sources are counted per /64 (one host can hold
//! a whole /64); an IPv4-mapped IPv6 address counts as its IPv4 address. At most [`MAX_SOURCES`] sources are
//! tracked: when that many are busy, a new source is refused too (memory stays bounded whatever the sender).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use std::time::Instant;

/// Sources tracked at once.
pub const MAX_SOURCES: usize = 16_384;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Per-source token buckets.
#[derive(Debug)]
pub struct RateLimiter {
    per_sec: f64,
    burst: f64,
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

/// The key a source is counted under.
pub fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

impl RateLimiter {
    pub fn new(per_minute: u32, burst: u32) -> Self {
        Self {
            per_sec: f64::from(per_minute.max(1)) / 60.0,
            burst: f64::from(burst.max(1)),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one call's token for `ip`; `Err` holds how long until the next one.
    pub fn check(&self, ip: IpAddr) -> Result<(), Duration> {
        self.check_at(ip, Instant::now())
    }

    /// Whether `ip` has a token left, without taking it; `Err` holds how long until it has one.
    pub fn peek(&self, ip: IpAddr) -> Result<(), Duration> {
        self.peek_at(ip, Instant::now())
    }

    /// [`peek`](Self::peek) at `now`.
    pub fn peek_at(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        let buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let Some(b) = buckets.get(&source_key(ip)) else { return Ok(()) };
        let tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * self.per_sec).min(self.burst);
        if tokens >= 1.0 { Ok(()) } else { Err(Duration::from_secs_f64((1.0 - tokens) / self.per_sec)) }
    }

    /// [`check`](Self::check) at `now` (which never goes backwards).
    pub fn check_at(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        let key = source_key(ip);
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if !buckets.contains_key(&key) && buckets.len() >= MAX_SOURCES {
            // Sources whose buckets have refilled are no different from new ones: forget them.
            let (per_sec, burst) = (self.per_sec, self.burst);
            buckets.retain(|_, b| b.tokens + now.duration_since(b.at).as_secs_f64() * per_sec < burst);
            if buckets.len() >= MAX_SOURCES {
                return Err(Duration::from_secs_f64(1.0 / self.per_sec));
            }
        }
        let b = buckets.entry(key).or_insert(Bucket { tokens: self.burst, at: now });
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * self.per_sec).min(self.burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / self.per_sec))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_then_the_rate() {
        let r = RateLimiter::new(60, 3);
        let mut now = Instant::now();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        for _ in 0..3 {
            r.check_at(a, now).unwrap();
        }
        let wait = r.check_at(a, now).unwrap_err();
        assert!(wait > Duration::from_millis(900) && wait <= Duration::from_secs(1), "{wait:?}");
        r.check_at(b, now).expect("another source has its own bucket");
        now += Duration::from_secs(1);
        r.check_at(a, now).expect("one token a second at 60 a minute");
        assert!(r.check_at(a, now).is_err());
        now += Duration::from_secs(10);
        for _ in 0..3 {
            r.check_at(a, now).unwrap();
        }
        assert!(r.check_at(a, now).is_err(), "never more than the burst");
    }

    #[test]
    fn peeking_takes_nothing() {
        let r = RateLimiter::new(60, 2);
        let now = Instant::now();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        for _ in 0..5 {
            r.peek_at(a, now).expect("an unknown source has its burst");
        }
        r.check_at(a, now).unwrap();
        r.check_at(a, now).unwrap();
        assert!(r.peek_at(a, now).is_err(), "the burst is spent");
        r.peek_at(a, now + Duration::from_secs(1)).expect("one token a second later");
    }

    #[test]
    fn ipv6_counts_per_64_and_mapped_v4_as_v4() {
        let k = |s: &str| source_key(s.parse().unwrap());
        assert_eq!(k("2001:db8:1:2::1"), k("2001:db8:1:2:ffff::9"));
        assert_ne!(k("2001:db8:1:2::1"), k("2001:db8:1:3::1"));
        assert_eq!(k("::ffff:192.0.2.7"), k("192.0.2.7"));
    }

    #[test]
    fn the_table_is_bounded() {
        let r = RateLimiter::new(60, 1);
        let now = Instant::now();
        for i in 0..MAX_SOURCES as u32 {
            r.check_at(IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i)), now).unwrap();
        }
        let newcomer = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));
        assert!(r.check_at(newcomer, now).is_err(), "every tracked source is busy: refused");
        r.check_at(newcomer, now + Duration::from_secs(2)).expect("refilled sources are forgotten");
        assert!(r.buckets.lock().unwrap().len() <= 1);
    }
}
