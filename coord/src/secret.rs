//! A configured secret (a password): read from TOML as a plain string, but shown as `<redacted>` by `Debug` and
//! when a configuration is printed (`--print-config`, `print-config`), so that it never reaches a log line.

use serde::{Deserialize, Serialize};

/// What a set [`Secret`] looks like when printed.
pub const REDACTED: &str = "<redacted>";

#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Self::new(s)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { REDACTED })
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(if self.0.is_empty() { "" } else { REDACTED })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_never_printed() {
        let s: Secret = serde_json::from_str("\"hunter2\"").unwrap();
        assert_eq!(s.expose(), "hunter2");
        assert_eq!(format!("{s:?}"), REDACTED);
        assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{REDACTED}\""));
        assert_eq!(serde_json::to_string(&Secret::default()).unwrap(), "\"\"");
    }
}
