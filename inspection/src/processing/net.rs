//! Addresses as the hooks read them: MACs (oslo `is_valid_mac`), IPs with an IPv6 `%scope`, and CIDRs
//! (Python's strict `ipaddress.ip_network`).
use std::net::IpAddr;

/// True for `aa:bb:cc:dd:ee:ff` in any case (colon-separated, six octets), as oslo's `netutils.is_valid_mac`.
pub(crate) fn is_valid_mac(mac: &str) -> bool {
    let bytes = mac.as_bytes();
    bytes.len() == 17
        && bytes.iter().enumerate().all(|(i, b)| if i % 3 == 2 { *b == b':' } else { b.is_ascii_hexdigit() })
}

/// Parses an IP address, dropping an IPv6 `%scope` suffix first.
pub(crate) fn parse_ip(text: &str) -> Option<IpAddr> {
    let text = text.split('%').next().unwrap_or(text);
    text.parse().ok()
}

/// An IP network: the address has no host bits set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// `10.0.0.0/24`, `2001:db8::/64`, or a bare address (a host network), refusing host bits like Python's
    /// `ipaddress.ip_network(x)` (strict).
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let network: IpAddr = addr.trim().parse().map_err(|_| format!("{text:?} is not an IP network"))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.trim().parse::<u8>() {
                Ok(p) if p <= max => p,
                _ => return Err(format!("{text:?} has an invalid prefix length")),
            },
        };
        let cidr = Self { network, prefix };
        if cidr.masked(network) != Some(network) {
            return Err(format!("{text:?} has host bits set"));
        }
        Ok(cidr)
    }

    /// True if `ip` is in this network (never across address families).
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        self.masked(ip) == Some(self.network)
    }

    fn masked(&self, ip: IpAddr) -> Option<IpAddr> {
        match (self.network, ip) {
            (IpAddr::V4(_), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                Some(IpAddr::V4((u32::from(ip) & mask).into()))
            }
            (IpAddr::V6(_), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                Some(IpAddr::V6((u128::from(ip) & mask).into()))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_are_colon_separated_six_octets() {
        assert!(is_valid_mac("52:54:00:12:34:56"));
        assert!(is_valid_mac("52:54:00:AB:CD:EF"));
        assert!(!is_valid_mac("52-54-00-12-34-56"));
        assert!(!is_valid_mac("52:54:00:12:34"));
        assert!(!is_valid_mac("52:54:00:12:34:5g"));
        assert!(!is_valid_mac(""));
    }

    #[test]
    fn ips_drop_the_scope() {
        assert_eq!(parse_ip("fe80::1%eth0"), "fe80::1".parse().ok());
        assert_eq!(parse_ip("192.0.2.1"), "192.0.2.1".parse().ok());
        assert_eq!(parse_ip("not-an-ip"), None);
    }

    #[test]
    fn cidrs_are_strict_and_family_aware() {
        let v4 = Cidr::parse("10.10.10.0/24").expect("v4");
        assert!(v4.contains("10.10.10.7".parse().expect("ip")));
        assert!(!v4.contains("10.10.11.7".parse().expect("ip")));
        assert!(!v4.contains("::1".parse().expect("ip")));
        let v6 = Cidr::parse("2001:db8::/64").expect("v6");
        assert!(v6.contains("2001:db8::5".parse().expect("ip")));
        assert!(Cidr::parse("0.0.0.0/0").expect("all").contains("192.0.2.1".parse().expect("ip")));
        assert!(Cidr::parse("192.0.2.1").expect("host").contains("192.0.2.1".parse().expect("ip")));
        assert!(Cidr::parse("10.10.10.1/24").is_err());
        assert!(Cidr::parse("10.10.10.0/33").is_err());
        assert!(Cidr::parse("physnet").is_err());
    }
}
