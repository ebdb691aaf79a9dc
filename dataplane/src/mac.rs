//! MAC addresses as ironguard accepts them: unicast, non-zero, written `aa:bb:cc:dd:ee:ff` (any case) or
//! `aa-bb-cc-dd-ee-ff`. Anything else is rejected with an error that quotes the input.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A unicast Ethernet address that may appear in an allow or deny set.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MacAddr([u8; 6]);

/// Why a string is not an acceptable MAC address. The message always quotes the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid MAC address {input:?}: {reason}")]
pub struct MacError {
    /// The rejected input, verbatim (truncated to 64 characters so a huge payload cannot flood a log).
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl MacAddr {
    /// Builds an address from its octets, applying the same checks as parsing.
    pub fn from_octets(octets: [u8; 6]) -> Result<Self, MacError> {
        Self::check(octets).map_err(|reason| MacError { input: Self(octets).to_string(), reason })
    }

    /// The six octets, in wire order.
    pub fn octets(&self) -> [u8; 6] {
        self.0
    }

    fn check(octets: [u8; 6]) -> Result<Self, &'static str> {
        if octets == [0; 6] {
            return Err("the all-zero address is not a node's address");
        }
        if octets == [0xff; 6] {
            return Err("the broadcast address is not a node's address");
        }
        if octets[0] & 0x01 != 0 {
            return Err("multicast addresses (first octet odd) are not a node's address");
        }
        Ok(Self(octets))
    }
}

impl FromStr for MacAddr {
    type Err = MacError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |reason| MacError { input: input.chars().take(64).collect(), reason };
        if input.len() != 17 {
            return Err(err("expected 6 hexadecimal octets separated by ':' or '-' (17 characters)"));
        }
        let bytes = input.as_bytes();
        let sep = bytes[2];
        if sep != b':' && sep != b'-' {
            return Err(err("octets must be separated by ':' or '-'"));
        }
        let mut octets = [0u8; 6];
        for (i, octet) in octets.iter_mut().enumerate() {
            let start = i * 3;
            if i > 0 && bytes[start - 1] != sep {
                return Err(err("octets must all be separated by the same ':' or '-'"));
            }
            let hi = hex_value(bytes[start]).ok_or_else(|| err("not a hexadecimal digit"))?;
            let lo = hex_value(bytes[start + 1]).ok_or_else(|| err("not a hexadecimal digit"))?;
            *octet = hi << 4 | lo;
        }
        Self::check(octets).map_err(err)
    }
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3], o[4], o[5])
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for MacAddr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_colon_and_dash_in_any_case() {
        let want = MacAddr([0x52, 0x54, 0x00, 0xab, 0xcd, 0xef]);
        for s in ["52:54:00:ab:cd:ef", "52:54:00:AB:CD:EF", "52-54-00-ab-cd-EF", "52:54:00:aB:Cd:eF"] {
            assert_eq!(s.parse::<MacAddr>().unwrap(), want, "{s}");
        }
        assert_eq!(want.to_string(), "52:54:00:ab:cd:ef");
    }

    #[test]
    fn rejects_malformed_input_and_quotes_it() {
        for s in [
            "",
            "52:54:00:ab:cd",
            "52:54:00:ab:cd:ef:00",
            "52:54:00:ab:cd:eg",
            "52:54-00:ab:cd:ef",
            "52.54.00.ab.cd.ef",
            "5254.00ab.cdef",
            "525400abcdef",
            " 52:54:00:ab:cd:e",
            "52:54:00:ab:cd:éf",
            "52:54:00:ab:cd:+f",
        ] {
            let err = s.parse::<MacAddr>().unwrap_err();
            assert!(err.to_string().contains(&format!("{s:?}")), "{err} should quote {s:?}");
        }
    }

    #[test]
    fn rejects_zero_broadcast_and_multicast() {
        for (s, why) in [
            ("00:00:00:00:00:00", "all-zero"),
            ("ff:ff:ff:ff:ff:ff", "broadcast"),
            ("01:00:5e:00:00:01", "multicast"),
            ("33:33:00:00:00:01", "multicast"),
        ] {
            let err = s.parse::<MacAddr>().unwrap_err();
            assert!(err.to_string().contains(why), "{err}");
        }
        assert!(MacAddr::from_octets([0x01, 0, 0, 0, 0, 1]).is_err());
        assert!(MacAddr::from_octets([0x02, 0, 0, 0, 0, 1]).is_ok());
    }

    #[test]
    fn long_input_is_truncated_in_the_error() {
        let s = "x".repeat(10_000);
        let err = s.parse::<MacAddr>().unwrap_err();
        assert!(err.input.len() <= 64);
    }

    #[test]
    fn serde_round_trip() {
        let mac: MacAddr = "52:54:00:00:00:01".parse().unwrap();
        let json = serde_json::to_string(&mac).unwrap();
        assert_eq!(json, "\"52:54:00:00:00:01\"");
        assert_eq!(serde_json::from_str::<MacAddr>(&json).unwrap(), mac);
        assert!(serde_json::from_str::<MacAddr>("\"nope\"").is_err());
    }
}
