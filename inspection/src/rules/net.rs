//! The `in-net` operator's addresses and networks, as Python's `netaddr` reads them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde_json::Value;

use super::python;

/// An IP network: `192.0.2.0/24`, `192.0.2.1/24` (host bits allowed), `192.0.2.0/255.255.255.0`,
/// `2001:db8::/32`, or a bare address (a network of one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Network {
    address: IpAddr,
    prefix: u8,
}

impl Network {
    /// Parses a network as `netaddr.IPNetwork` does; the error is `netaddr`'s message.
    pub(super) fn parse(text: &str) -> Result<Network, String> {
        let invalid = || format!("invalid IPNetwork {text}");
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let address: IpAddr = address.parse().map_err(|_| invalid())?;
        let max = if address.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
                p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(invalid)?
            }
            Some(mask) if address.is_ipv4() => mask_prefix(mask).ok_or_else(invalid)?,
            Some(_) => return Err(invalid()),
        };
        Ok(Network { address, prefix })
    }

    /// Whether `address` is inside (an address of the other IP version never is).
    pub(super) fn contains(&self, address: IpAddr) -> bool {
        match (self.address, address) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// The prefix length of a dotted IPv4 netmask (`255.255.255.0`) or hostmask (`0.0.0.255`).
fn mask_prefix(mask: &str) -> Option<u8> {
    let bits = u32::from(mask.parse::<Ipv4Addr>().ok()?);
    let ones = u8::try_from(bits.leading_ones()).ok()?;
    if bits.checked_shl(u32::from(ones)).unwrap_or(0) == 0 {
        return Some(ones);
    }
    let host_bits = u8::try_from(bits.trailing_ones()).ok()?;
    if bits.checked_shr(u32::from(host_bits)).unwrap_or(0) == 0 {
        return Some(32 - host_bits);
    }
    None
}

/// The address a condition's field holds, as `netaddr.IPAddress` reads it: a string, or an integer
/// (IPv4 up to 2^32 - 1, IPv6 beyond).
pub(super) fn address(field: &Value) -> Result<IpAddr, String> {
    match field {
        Value::String(s) => {
            s.parse().map_err(|_| format!("failed to detect a valid IP address from {}", python::repr_str(s)))
        }
        Value::Number(_) | Value::Bool(_) => {
            let n = python::to_int(field)?;
            if let Ok(v4) = u32::try_from(n) {
                Ok(IpAddr::V4(Ipv4Addr::from(v4)))
            } else if let Ok(v6) = u128::try_from(n) {
                Ok(IpAddr::V6(Ipv6Addr::from(v6)))
            } else {
                Err(format!("IP address {} is out of range", python::repr(field)))
            }
        }
        other => Err(format!("cannot read an IP address from {}", python::repr(other))),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn contains(net: &str, ip: &str) -> bool {
        Network::parse(net).unwrap().contains(ip.parse().unwrap())
    }

    #[test]
    fn networks() {
        assert!(contains("192.0.2.1/24", "192.0.2.4"));
        assert!(!contains("192.0.2.1/24", "192.1.2.4"));
        assert!(contains("192.0.2.0/255.255.255.0", "192.0.2.200"));
        assert!(contains("192.0.2.0/0.0.0.255", "192.0.2.200"));
        assert!(contains("0.0.0.0/0", "203.0.113.9"));
        assert!(contains("192.0.2.7", "192.0.2.7"));
        assert!(!contains("192.0.2.7", "192.0.2.8"));
        assert!(contains("2001:db8::/32", "2001:db8:1::5"));
        assert!(!contains("2001:db8::/32", "2001:db9::5"));
        assert!(!contains("::/0", "192.0.2.1"));
        assert!(!contains("0.0.0.0/0", "::ffff:192.0.2.1"));
        for bad in ["foo", "192.0.2.0/33", "2001:db8::/129", "192.0.2.0/255.0.255.0", "192.0.2.0/", "2001:db8::/ffff::"]
        {
            assert_eq!(Network::parse(bad), Err(format!("invalid IPNetwork {bad}")), "{bad}");
        }
    }

    #[test]
    fn addresses() {
        assert_eq!(address(&json!("192.0.2.1")), Ok("192.0.2.1".parse().unwrap()));
        assert_eq!(address(&json!(3_221_225_985_u32)), Ok("192.0.2.1".parse().unwrap()));
        assert_eq!(address(&json!(4_294_967_296_u64)), Ok("::1:0:0".parse().unwrap()));
        assert!(address(&json!("not an ip")).is_err());
        assert!(address(&json!(null)).is_err());
        assert!(address(&json!(-1)).is_err());
    }
}
