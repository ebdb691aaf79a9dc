//! The gRPC connection to the control plane (`ironguard.v1.PxeFilter` and `ironguard.v1.Inspection` over one
//! channel), with bounded waits and errors that name the control plane's URL.

use std::time::Duration;

use ironguard_proto::v1::inspection_client::InspectionClient;
use ironguard_proto::v1::pxe_filter_client::PxeFilterClient;
use ironguard_proto::v1::{
    ContinueRequest, ContinueResponse, DataRequest, DataResponse, DeleteRulesResponse, DropQuarantinedRequest,
    DropQuarantinedResponse, ExplainMacRequest, FilterState, GetFilterStateRequest, InspectionStatus,
    ListAgentsRequest, ListAgentsResponse, ListQuarantinedRequest, ListQuarantinedResponse, ListRequest, ListResponse,
    ListRulesRequest, MacExplanation, NodeRequest, RequestAccepted, Rule, RuleRequest, StartRequest, StartResponse,
    UpdatePxeFiltersRequest, UpdatePxeFiltersResponse,
};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

/// Where the control plane is and how long to wait for it.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: String,
    /// Bound on establishing the connection (name resolution, TCP, HTTP/2 handshake).
    pub connect_timeout: Duration,
    /// Bound on each call once connected.
    pub rpc_timeout: Duration,
    /// TLS files and the operator token.
    pub auth: ironguard_proto::client::ClientAuth,
}

impl Target {
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
    pub const DEFAULT_RPC_TIMEOUT: Duration = Duration::from_secs(10);

    /// The control plane at `url`, with the default timeouts.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            rpc_timeout: Self::DEFAULT_RPC_TIMEOUT,
            auth: Default::default(),
        }
    }
}

/// Why talking to the control plane failed. Every message names the control plane's URL.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    #[error("{url:?} is not a valid control plane URL: {reason} (e.g. {example})", example = crate::cli::DEFAULT_CONTROLPLANE)]
    InvalidUrl { url: String, reason: String },
    /// The TLS files or the token cannot be used (unreadable, mismatched, missing).
    #[error("cannot set up the connection to {url}: {message}")]
    Credentials { url: String, message: String },
    /// The TLS handshake failed on a certificate: an unknown CA, a wrong server name, a refused client certificate.
    #[error("the TLS handshake with the control plane at {url} failed: {message} ({hint})")]
    Tls { url: String, message: String, hint: &'static str },
    /// The server answered UNAUTHENTICATED: no credentials, or wrong ones.
    #[error(
        "the control plane at {url} refused {rpc} without valid credentials: {message} (give an operator certificate with --cert-file/--key-file, or --token-file)"
    )]
    Unauthenticated { url: String, rpc: &'static str, message: String },
    /// The server answered PERMISSION_DENIED: the identity is known but not allowed.
    #[error("the control plane at {url} does not allow {rpc} for these credentials: {message}")]
    Forbidden { url: String, rpc: &'static str, message: String },
    #[error("cannot reach the control plane at {url}")]
    Unreachable {
        url: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("cannot reach the control plane at {url}: no connection within {timeout:?}")]
    ConnectTimeout { url: String, timeout: Duration },
    /// The server answered INVALID_ARGUMENT; `message` is its explanation.
    #[error("the control plane at {url} rejected {rpc}: {message}")]
    Rejected { url: String, rpc: &'static str, message: String },
    /// The server answered NOT_FOUND (an unknown node, a node never inspected); `message` is its explanation.
    #[error("the control plane at {url} found nothing for {rpc}: {message}")]
    NotFound { url: String, rpc: &'static str, message: String },
    /// The server answered FAILED_PRECONDITION (a provision or inspection state that forbids the request).
    #[error("the control plane at {url} refused {rpc} (failed precondition): {message}")]
    Refused { url: String, rpc: &'static str, message: String },
    #[error("the control plane at {url} did not answer {rpc} within {timeout:?}")]
    NoAnswer { url: String, rpc: &'static str, timeout: Duration },
    #[error("{rpc} to the control plane at {url} failed: {}", status_text(status))]
    Failed { url: String, rpc: &'static str, status: Status },
}

impl ControlPlaneError {
    /// Classifies a failed call: INVALID_ARGUMENT, NOT_FOUND and FAILED_PRECONDITION are the server refusing the
    /// request (its message says why), anything else a failure.
    pub fn from_status(url: &str, rpc: &'static str, status: Status) -> Self {
        let (url, message) = (url.to_string(), status.message().to_string());
        match status.code() {
            Code::InvalidArgument => Self::Rejected { url, rpc, message },
            Code::NotFound => Self::NotFound { url, rpc, message },
            Code::FailedPrecondition => Self::Refused { url, rpc, message },
            Code::Unauthenticated => Self::Unauthenticated { url, rpc, message },
            Code::PermissionDenied => Self::Forbidden { url, rpc, message },
            _ => Self::Failed { url, rpc, status },
        }
    }
}

/// `Unavailable: <message>: <underlying error>`, the underlying error left out when the message already says it.
/// (`Status`'s own `Display` spells the code as a sentence and quotes the message.)
fn status_text(status: &Status) -> String {
    let mut text = format!("{:?}", status.code());
    if !status.message().is_empty() {
        text = format!("{text}: {}", status.message());
    }
    match std::error::Error::source(status).map(ToString::to_string) {
        Some(source) if !status.message().contains(&source) => text = format!("{text}: {source}"),
        _ => {}
    }
    text
}

/// The endpoint for `url`, which must be `http://` or `https://` and name a host; TLS for `https://`.
fn endpoint(url: &str, auth: &ironguard_proto::client::ClientAuth) -> Result<Endpoint, ControlPlaneError> {
    let invalid = |reason: String| ControlPlaneError::InvalidUrl { url: url.to_string(), reason };
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(invalid("it must start with http:// or https://".to_string()));
    }
    let endpoint = Endpoint::from_shared(url.to_string()).map_err(|e| {
        // The transport error only says "transport error"; its source says what is wrong with the URI.
        invalid(std::error::Error::source(&e).map_or_else(|| e.to_string(), ToString::to_string))
    })?;
    if endpoint.uri().host().is_none_or(str::is_empty) {
        return Err(invalid("it names no host".to_string()));
    }
    auth.endpoint(url).map_err(|e| ControlPlaneError::Credentials { url: url.to_string(), message: e.to_string() })
}

/// A failed connection: a certificate problem, said plainly with what to check, or the transport error.
fn connect_error(url: &str, source: tonic::transport::Error) -> ControlPlaneError {
    let mut chain = vec![];
    let mut cur: Option<&dyn std::error::Error> = Some(&source);
    while let Some(e) = cur {
        chain.push(e.to_string());
        cur = e.source();
    }
    let text = chain.join(": ");
    let hint = if text.contains("UnknownIssuer") || text.contains("unknown issuer") {
        Some("the control plane's certificate is not signed by the CA of --ca-file")
    } else if text.contains("NotValidForName") || text.contains("not valid for name") {
        Some("the control plane's certificate does not carry this host name; see --tls-server-name")
    } else if text.contains("Expired") || text.contains("expired") {
        Some("a certificate has expired")
    } else if text.contains("certificate") || text.contains("CertificateRequired") || text.contains("BadCertificate") {
        Some("check --ca-file, --cert-file and --key-file")
    } else {
        None
    };
    match hint {
        Some(hint) => {
            ControlPlaneError::Tls { url: url.to_string(), message: chain.last().cloned().unwrap_or_default(), hint }
        }
        None => ControlPlaneError::Unreachable { url: url.to_string(), source },
    }
}

/// Adds the operator's bearer token, if any, to every call.
#[derive(Debug, Clone)]
pub struct Bearer(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

type Authed = tonic::service::interceptor::InterceptedService<Channel, Bearer>;

/// Largest answer accepted from the control plane. tonic's default (4 MiB) is below what `GetData` may return:
/// the server accepts 2 MiB of introspection data and its processing hooks may add to it.
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// Connected `PxeFilter` and `Inspection` clients, sharing one channel.
#[derive(Debug, Clone)]
pub struct ControlPlane {
    url: String,
    rpc_timeout: Duration,
    client: PxeFilterClient<Authed>,
    inspection: InspectionClient<Authed>,
}

impl ControlPlane {
    /// Connects now, so that an unreachable control plane is reported as such, not as a failed call.
    pub async fn connect(target: &Target) -> Result<Self, ControlPlaneError> {
        let url = target.url.clone();
        let endpoint =
            endpoint(&url, &target.auth)?.connect_timeout(target.connect_timeout).timeout(target.rpc_timeout);
        let bearer = Bearer(
            target
                .auth
                .bearer()
                .map_err(|e| ControlPlaneError::Credentials { url: url.clone(), message: e.to_string() })?,
        );
        // `connect_timeout` bounds the TCP connect; the outer bound also covers name resolution and the handshake.
        let channel = tokio::time::timeout(target.connect_timeout, endpoint.connect())
            .await
            .map_err(|_| ControlPlaneError::ConnectTimeout { url: url.clone(), timeout: target.connect_timeout })?
            .map_err(|source| connect_error(&url, source))?;
        Ok(Self {
            url,
            rpc_timeout: target.rpc_timeout,
            client: PxeFilterClient::with_interceptor(channel.clone(), bearer.clone()),
            inspection: InspectionClient::with_interceptor(channel, bearer).max_decoding_message_size(MAX_ANSWER_BYTES),
        })
    }

    /// The URL this client talks to, for messages.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub async fn filter_state(&mut self, request: GetFilterStateRequest) -> Result<FilterState, ControlPlaneError> {
        let answer = self.client.get_filter_state(request).await;
        self.answer("GetFilterState", answer)
    }

    pub async fn update_filters(
        &mut self,
        request: UpdatePxeFiltersRequest,
    ) -> Result<UpdatePxeFiltersResponse, ControlPlaneError> {
        let answer = self.client.update_pxe_filters(request).await;
        self.answer("UpdatePxeFilters", answer)
    }

    pub async fn explain_mac(&mut self, mac: &str) -> Result<MacExplanation, ControlPlaneError> {
        let answer = self.client.explain_mac(ExplainMacRequest { mac: mac.to_string() }).await;
        self.answer("ExplainMac", answer)
    }

    pub async fn list_agents(&mut self) -> Result<ListAgentsResponse, ControlPlaneError> {
        let answer = self.client.list_agents(ListAgentsRequest {}).await;
        self.answer("ListAgents", answer)
    }

    /// Opens `network`'s discovery window for `seconds` (`OpenDiscovery`).
    pub async fn open_discovery(
        &mut self,
        network: &str,
        seconds: u64,
    ) -> Result<ironguard_proto::v1::DiscoveryWindows, ControlPlaneError> {
        let r = ironguard_proto::v1::OpenDiscoveryRequest { network: network.to_string(), seconds };
        let answer = self.client.open_discovery(r).await;
        self.answer("OpenDiscovery", answer)
    }

    pub async fn close_discovery(
        &mut self,
        network: &str,
    ) -> Result<ironguard_proto::v1::DiscoveryWindows, ControlPlaneError> {
        let r = ironguard_proto::v1::CloseDiscoveryRequest { network: network.to_string() };
        let answer = self.client.close_discovery(r).await;
        self.answer("CloseDiscovery", answer)
    }

    pub async fn list_discovery(&mut self) -> Result<ironguard_proto::v1::DiscoveryWindows, ControlPlaneError> {
        let answer = self.client.list_discovery(ironguard_proto::v1::ListDiscoveryRequest {}).await;
        self.answer("ListDiscovery", answer)
    }

    pub async fn start_inspection(&mut self, request: StartRequest) -> Result<StartResponse, ControlPlaneError> {
        let answer = self.inspection.start(request).await;
        self.answer("Start", answer)
    }

    /// The inspection status of `node` (`Get`).
    pub async fn inspection(&mut self, node: &str) -> Result<InspectionStatus, ControlPlaneError> {
        let answer = self.inspection.get(NodeRequest { node: node.to_string() }).await;
        self.answer("Get", answer)
    }

    pub async fn list_inspections(&mut self, request: ListRequest) -> Result<ListResponse, ControlPlaneError> {
        let answer = self.inspection.list(request).await;
        self.answer("List", answer)
    }

    pub async fn abort_inspection(&mut self, node: &str) -> Result<RequestAccepted, ControlPlaneError> {
        let answer = self.inspection.abort(NodeRequest { node: node.to_string() }).await;
        self.answer("Abort", answer)
    }

    pub async fn reapply_inspection(&mut self, node: &str) -> Result<RequestAccepted, ControlPlaneError> {
        let answer = self.inspection.reapply(NodeRequest { node: node.to_string() }).await;
        self.answer("Reapply", answer)
    }

    /// Hands the ramdisk's introspection data to the control plane (`Continue`), which finds its node.
    pub async fn continue_inspection(
        &mut self,
        data_json: String,
        node_uuid: Option<String>,
    ) -> Result<ContinueResponse, ControlPlaneError> {
        let request = ContinueRequest { data_json, node_uuid: node_uuid.unwrap_or_default() };
        let answer = self.inspection.r#continue(request).await;
        self.answer("Continue", answer)
    }

    /// The stored data of `node`: processed (what the hooks made of it), or as the ramdisk sent it.
    pub async fn inspection_data(&mut self, node: &str, unprocessed: bool) -> Result<DataResponse, ControlPlaneError> {
        let answer = self.inspection.get_data(DataRequest { node: node.to_string(), unprocessed }).await;
        self.answer("GetData", answer)
    }

    /// Stores an introspection rule (ironic-inspector's JSON); returns it as stored (uuid filled in).
    pub async fn create_rule(&mut self, rule_json: String) -> Result<Rule, ControlPlaneError> {
        let answer = self.inspection.create_rule(Rule { rule_json }).await;
        self.answer("CreateRule", answer)
    }

    /// Every rule, full, in the order they apply.
    pub async fn list_rules(&mut self) -> Result<Vec<Rule>, ControlPlaneError> {
        let answer = self.inspection.list_rules(ListRulesRequest {}).await;
        self.answer("ListRules", answer).map(|r| r.rules)
    }

    pub async fn get_rule(&mut self, uuid: &str) -> Result<Rule, ControlPlaneError> {
        let answer = self.inspection.get_rule(RuleRequest { uuid: uuid.to_string() }).await;
        self.answer("GetRule", answer)
    }

    pub async fn delete_rule(&mut self, uuid: &str) -> Result<DeleteRulesResponse, ControlPlaneError> {
        let answer = self.inspection.delete_rule(RuleRequest { uuid: uuid.to_string() }).await;
        self.answer("DeleteRule", answer)
    }

    pub async fn delete_all_rules(&mut self) -> Result<DeleteRulesResponse, ControlPlaneError> {
        let answer = self.inspection.delete_all_rules(ListRulesRequest {}).await;
        self.answer("DeleteAllRules", answer)
    }

    /// The queued requests that could not be read and were moved to quarantine, oldest first.
    pub async fn list_quarantined(&mut self) -> Result<ListQuarantinedResponse, ControlPlaneError> {
        let answer = self.inspection.list_quarantined(ListQuarantinedRequest {}).await;
        self.answer("ListQuarantined", answer)
    }

    /// Forgets the quarantine record of request `id`.
    pub async fn drop_quarantined(&mut self, id: u64) -> Result<DropQuarantinedResponse, ControlPlaneError> {
        let answer = self.inspection.drop_quarantined(DropQuarantinedRequest { id }).await;
        self.answer("DropQuarantined", answer)
    }

    fn answer<T>(&self, rpc: &'static str, answer: Result<tonic::Response<T>, Status>) -> Result<T, ControlPlaneError> {
        answer.map(tonic::Response::into_inner).map_err(|status| {
            if timed_out(&status) {
                ControlPlaneError::NoAnswer { url: self.url.clone(), rpc, timeout: self.rpc_timeout }
            } else {
                ControlPlaneError::from_status(&self.url, rpc, status)
            }
        })
    }
}

/// Whether the call failed because `Endpoint::timeout` expired (tonic reports that as a CANCELLED status whose
/// source chain holds [`tonic::TimeoutExpired`]).
fn timed_out(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if e.is::<tonic::TimeoutExpired>() {
            return true;
        }
        source = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_argument_is_a_rejection_carrying_the_servers_message() {
        let err = ControlPlaneError::from_status(
            "http://cp:9100",
            "UpdatePxeFilters",
            Status::invalid_argument(r#"invalid MAC address "01:00:5e:00:00:01": multicast"#),
        );
        assert!(matches!(err, ControlPlaneError::Rejected { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            r#"the control plane at http://cp:9100 rejected UpdatePxeFilters: invalid MAC address "01:00:5e:00:00:01": multicast"#
        );
    }

    #[test]
    fn other_codes_are_failures_naming_the_code() {
        let err = ControlPlaneError::from_status("http://cp:9100", "ListAgents", Status::unavailable("not the leader"));
        assert!(matches!(err, ControlPlaneError::Failed { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "ListAgents to the control plane at http://cp:9100 failed: Unavailable: not the leader"
        );
    }

    #[test]
    fn not_found_and_failed_precondition_carry_the_servers_message() {
        let err = ControlPlaneError::from_status(
            "http://cp:9100",
            "Start",
            Status::not_found("node n1 is not known to Ironic"),
        );
        assert!(matches!(err, ControlPlaneError::NotFound { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "the control plane at http://cp:9100 found nothing for Start: node n1 is not known to Ironic"
        );
        let err = ControlPlaneError::from_status(
            "http://cp:9100",
            "Start",
            Status::failed_precondition("node n1 is in provision state active"),
        );
        assert!(matches!(err, ControlPlaneError::Refused { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "the control plane at http://cp:9100 refused Start (failed precondition): node n1 is in provision state \
             active"
        );
    }

    #[test]
    fn failures_show_the_underlying_error_once() {
        let status = Status::from_error(Box::new(std::io::Error::other("connection reset")));
        let err = ControlPlaneError::from_status("http://cp:9100", "GetFilterState", status);
        assert_eq!(
            err.to_string(),
            "GetFilterState to the control plane at http://cp:9100 failed: Unknown: connection reset"
        );
        let err = ControlPlaneError::from_status("http://cp:9100", "ListAgents", Status::new(Code::Internal, ""));
        assert_eq!(err.to_string(), "ListAgents to the control plane at http://cp:9100 failed: Internal");
    }

    #[test]
    fn urls_must_be_http_or_https_with_a_host() {
        for (url, reason) in [
            ("127.0.0.1:9100", "it must start with http:// or https://"),
            ("cp.example:9100", "it must start with http:// or https://"),
            ("http://:9100", "it names no host"),
        ] {
            let err = endpoint(url, &Default::default()).unwrap_err();
            assert!(matches!(err, ControlPlaneError::InvalidUrl { .. }), "{url}: {err:?}");
            assert_eq!(
                err.to_string(),
                format!("{url:?} is not a valid control plane URL: {reason} (e.g. http://127.0.0.1:9100)")
            );
        }
        for url in ["http://", "http://a b:9100"] {
            let err = endpoint(url, &Default::default()).unwrap_err();
            assert!(err.to_string().starts_with(&format!("{url:?} is not a valid control plane URL: ")), "{err}");
        }
        assert!(endpoint("http://cp.example:9100", &Default::default()).is_ok());
        let err = endpoint("https://[::1]:9100", &Default::default()).unwrap_err();
        assert!(matches!(err, ControlPlaneError::Credentials { .. }), "TLS needs a CA: {err}");
        let dir = std::env::temp_dir().join(format!("ig-ctl-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_pem = params.self_signed(&rcgen::KeyPair::generate().unwrap()).unwrap().pem();
        std::fs::write(dir.join("ca.pem"), ca_pem).unwrap();
        let ca = ironguard_proto::client::ClientAuth { ca_file: dir.join("ca.pem"), ..Default::default() };
        let r = endpoint("https://[::1]:9100", &ca);
        assert!(r.is_ok(), "{:?}", r.err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_silent_server_fails_within_the_call_timeout() {
        // Accepts TCP connections and never answers: connecting succeeds, the call must not hang.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let target = Target { rpc_timeout: Duration::from_millis(200), ..Target::new(url.clone()) };
        let mut controlplane = ControlPlane::connect(&target).await.unwrap();
        // The call's own timeout ends it (a generous outer deadline only keeps a hang from hanging the test).
        let err = tokio::time::timeout(Duration::from_secs(60), controlplane.list_agents())
            .await
            .expect("the call ends by its own timeout")
            .unwrap_err();
        assert!(matches!(err, ControlPlaneError::NoAnswer { .. }), "{err:?}");
        assert_eq!(err.to_string(), format!("the control plane at {url} did not answer ListAgents within 200ms"));
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable_and_the_error_names_the_url() {
        // Bind and drop a listener to get a local port nobody listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("http://127.0.0.1:{port}");
        let err = ControlPlane::connect(&Target::new(url.clone())).await.unwrap_err();
        assert!(
            matches!(err, ControlPlaneError::Unreachable { .. } | ControlPlaneError::ConnectTimeout { .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains(&url), "{err}");
    }
}
