//! [`FakeIronicConfig`]: what a fake Ironic advertises and enforces.

/// Configuration of a [`crate::FakeIronic`]; [`Default`] is a noauth Ironic at microversion 1.81 with
/// `max_limit` 1000, serving the hardware types fake-hardware, ipmi and redfish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeIronicConfig {
    /// The lowest microversion accepted (`X-OpenStack-Ironic-API-Minimum-Version`), "1.1".
    pub min_version: String,
    /// The highest microversion accepted (`X-OpenStack-Ironic-API-Maximum-Version`), "1.81".
    pub max_version: String,
    /// Ironic's `[api] max_limit`: the default and largest page size of list calls, 1000.
    pub max_limit: usize,
    /// When set, `/v1/...` requests need `Authorization: Basic` with this user and password (or the token below).
    pub require_basic_auth: Option<(String, String)>,
    /// When set, `/v1/...` requests need `X-Auth-Token` equal to this (or the basic credentials above).
    pub require_token: Option<String>,
    /// The hardware types ("drivers") a conductor serves: creating a node with another driver, or changing a
    /// node's driver to another one, is Ironic's 400 "No valid host was found". `["fake-hardware", "ipmi",
    /// "redfish"]`.
    pub enabled_drivers: Vec<String>,
}

impl Default for FakeIronicConfig {
    fn default() -> Self {
        FakeIronicConfig {
            min_version: "1.1".to_owned(),
            max_version: "1.81".to_owned(),
            max_limit: 1000,
            require_basic_auth: None,
            require_token: None,
            enabled_drivers: ["fake-hardware", "ipmi", "redfish"].map(String::from).to_vec(),
        }
    }
}
