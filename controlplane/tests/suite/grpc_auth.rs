//! The gRPC API over TLS with client identities, in-process against the fake Ironic: every operator call is refused
//! without credentials, with a certificate from another CA, with an expired certificate, with an agent's
//! certificate and with a wrong token — and nothing changes in the filter state or in Ironic; an agent's
//! certificate watches and reports as itself only; the operator's certificate and token are accepted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use fake_ironic::{FakeIronic, Node, Port};
use ironguard_controlplane::ControlPlaneConfig;
use ironguard_proto::client::ClientAuth;
use ironguard_proto::v1::inspection_client::InspectionClient;
use ironguard_proto::v1::pxe_filter_client::PxeFilterClient;
use ironguard_proto::v1::{
    AgentStatus, CloseDiscoveryRequest, DropQuarantinedRequest, ExplainMacRequest, GetFilterStateRequest,
    ListAgentsRequest, ListDiscoveryRequest, ListQuarantinedRequest, ListRulesRequest, NodeRequest,
    OpenDiscoveryRequest, Rule, StartRequest, UpdatePxeFiltersRequest, WatchFiltersRequest,
};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use tonic::Code;
use tonic::transport::Channel;

const N1: &str = "11111111-1111-1111-1111-111111111111";
const MAC1: &str = "52:54:00:aa:00:01";
const SERVER: &str = "controlplane.ironguard.test";
const TOKEN: &str = "an-operator-token-0123456789";
/// The longest a test connection or call may wait for an answer.
const CALL_BOUND: Duration = Duration::from_secs(30);

struct Ca(Issuer<'static, KeyPair>);

impl Ca {
    fn new(dir: &Path, stem: &str) -> (Self, PathBuf) {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, stem);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let pem = p.self_signed(&key).unwrap().pem();
        let path = dir.join(format!("{stem}.pem"));
        std::fs::write(&path, pem).unwrap();
        (Self(Issuer::new(p, key)), path)
    }

    /// (cert, key) files `stem.pem`/`stem.key` for `name`; `expired` makes one that ended in 2021.
    fn leaf(&self, dir: &Path, stem: &str, name: &str, server: bool, expired: bool) -> (PathBuf, PathBuf) {
        let mut p = CertificateParams::new(vec![name.to_string()]).unwrap();
        p.distinguished_name.push(DnType::CommonName, name);
        p.extended_key_usages =
            vec![if server { ExtendedKeyUsagePurpose::ServerAuth } else { ExtendedKeyUsagePurpose::ClientAuth }];
        if expired {
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &self.0).unwrap();
        let (c, k) = (dir.join(format!("{stem}.pem")), dir.join(format!("{stem}.key")));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }
}

struct Site {
    ironic: FakeIronic,
    url: String,
    dir: PathBuf,
    ca: PathBuf,
    certs: std::collections::HashMap<&'static str, (PathBuf, PathBuf)>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Site {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Site {
    async fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("ig-grpc-auth-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (ca, ca_file) = Ca::new(&dir, "ca");
        let (other, _) = Ca::new(&dir, "other-ca");
        let mut certs = std::collections::HashMap::new();
        certs.insert("server", ca.leaf(&dir, "server", SERVER, true, false));
        certs.insert("operator", ca.leaf(&dir, "operator", "operator", false, false));
        certs.insert("agent-1", ca.leaf(&dir, "agent-1", "agent-1", false, false));
        certs.insert("operator-expired", ca.leaf(&dir, "operator-expired", "operator", false, true));
        certs.insert("operator-other-ca", other.leaf(&dir, "operator-other-ca", "operator", false, false));
        std::fs::write(dir.join("token"), format!("{TOKEN}\n")).unwrap();

        let ironic = FakeIronic::start("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let mut n = Node::new(N1);
        n.provision_state = "manageable".into();
        ironic.add_node(n);
        ironic.add_port(Port { address: MAC1.into(), node_uuid: N1.into(), ..Default::default() }).unwrap();
        let mut c = ControlPlaneConfig::default();
        c.server.grpc_listen = Some("127.0.0.1:0".parse().unwrap());
        c.server.admin_listen = "127.0.0.1:0".parse().unwrap();
        c.store.data_dir = dir.join("store");
        c.grpc.tls_cert_file = certs["server"].0.clone();
        c.grpc.tls_key_file = certs["server"].1.clone();
        c.grpc.client_ca_file = ca_file.clone();
        c.grpc.operator_names = vec!["operator".into()];
        c.grpc.operator_token_file = dir.join("token");
        c.ironic.url = ironic.url();
        c.ironic.retries = 0;
        c.sync.ironic_sync_secs = 0;
        c.sync.ironic_inspection = false;
        c.inspection.allow_timeout_secs = 2;
        let server = ironguard_controlplane::serve(&c).await.unwrap();
        let url = format!("https://127.0.0.1:{}", server.grpc_addr.port());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(server.run(async move {
            let _ = rx.await;
        }));
        Self { ironic, url, dir, ca: ca_file, certs, stop: Some(tx) }
    }

    fn auth(&self, cert: Option<&str>, token: Option<&str>) -> ClientAuth {
        let (cert_file, key_file) = cert.map(|c| self.certs[c].clone()).unwrap_or_default();
        let token_file = token.map(|t| {
            let f = self.dir.join(format!("client-token-{}", t.len()));
            std::fs::write(&f, t).unwrap();
            f
        });
        ClientAuth {
            ca_file: self.ca.clone(),
            cert_file,
            key_file,
            server_name: SERVER.into(),
            token_file: token_file.unwrap_or_default(),
        }
    }

    /// A channel with these credentials, or the connection error (a refused handshake).
    async fn channel(
        &self,
        auth: &ClientAuth,
    ) -> Result<(Channel, Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>), String> {
        // Every wait is bounded (T32): a connection or a call that gets no answer is an error with the codes, not
        // a test that hangs until nextest stops it without a word.
        let endpoint = auth.endpoint(&self.url).unwrap().connect_timeout(Duration::from_secs(3)).timeout(CALL_BOUND);
        let ch = match tokio::time::timeout(CALL_BOUND, endpoint.connect()).await {
            Ok(ch) => ch.map_err(|e| format!("{e:?}"))?,
            Err(_) => return Err(format!("no connection within {CALL_BOUND:?}")),
        };
        Ok((ch, auth.bearer().unwrap()))
    }

    /// The filter state as the operator sees it: (revision, allow count).
    async fn state(&self) -> (u64, u64) {
        let (ch, _) = self.channel(&self.auth(Some("operator"), None)).await.unwrap();
        let s = PxeFilterClient::new(ch).get_filter_state(GetFilterStateRequest::default()).await.unwrap().into_inner();
        (s.revision, s.allow_count)
    }
}

fn with<T>(msg: T, bearer: &Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Some(b) = bearer {
        r.metadata_mut().insert("authorization", b.clone());
    }
    r
}

/// Every operator call with `auth`: the status codes, in order (`Ok` as "OK").
async fn operator_calls(site: &Site, auth: &ClientAuth) -> Result<Vec<Code>, String> {
    let (ch, bearer) = site.channel(auth).await?;
    let mut f = PxeFilterClient::new(ch.clone());
    let mut i = InspectionClient::new(ch);
    let code = |r: Result<(), tonic::Status>| r.map_or_else(|s| s.code(), |_| Code::Ok);
    let allow = UpdatePxeFiltersRequest { allow: vec!["52:54:00:bb:00:01".into()], ..Default::default() };
    Ok(vec![
        code(f.update_pxe_filters(with(allow, &bearer)).await.map(|_| ())),
        code(f.get_filter_state(with(GetFilterStateRequest::default(), &bearer)).await.map(|_| ())),
        code(f.list_agents(with(ListAgentsRequest::default(), &bearer)).await.map(|_| ())),
        code(f.explain_mac(with(ExplainMacRequest { mac: "52:54:00:bb:00:01".into() }, &bearer)).await.map(|_| ())),
        code(
            i.start(with(StartRequest { node: N1.into(), manage_boot: true, ..Default::default() }, &bearer))
                .await
                .map(|_| ()),
        ),
        code(i.abort(with(NodeRequest { node: N1.into() }, &bearer)).await.map(|_| ())),
        code(
            i.create_rule(with(
                Rule { rule_json: r#"{"actions": [{"action": "fail", "message": "x"}]}"#.into() },
                &bearer,
            ))
            .await
            .map(|_| ()),
        ),
        code(i.list_rules(with(ListRulesRequest {}, &bearer)).await.map(|_| ())),
        code(i.delete_all_rules(with(ListRulesRequest {}, &bearer)).await.map(|_| ())),
        code(f.open_discovery(with(open_window(), &bearer)).await.map(|_| ())),
        code(f.list_discovery(with(ListDiscoveryRequest {}, &bearer)).await.map(|_| ())),
        code(f.close_discovery(with(CloseDiscoveryRequest { network: "n".into() }, &bearer)).await.map(|_| ())),
        code(i.list_quarantined(with(ListQuarantinedRequest {}, &bearer)).await.map(|_| ())),
        code(i.drop_quarantined(with(DropQuarantinedRequest { id: 1 }, &bearer)).await.map(|_| ())),
    ])
}

fn open_window() -> OpenDiscoveryRequest {
    OpenDiscoveryRequest { network: "n".into(), seconds: 600 }
}

/// The discovery windows open, as the operator lists them.
async fn windows(site: &Site) -> usize {
    let (ch, _) = site.channel(&site.auth(Some("operator"), None)).await.unwrap();
    PxeFilterClient::new(ch).list_discovery(ListDiscoveryRequest {}).await.unwrap().into_inner().windows.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_calls_need_an_operator_and_refusals_change_nothing() {
    let site = Site::new("refused").await;
    let before = site.state().await;
    let calls_before = site.ironic.calls().len();

    // No credentials at all: the TLS connection works (the token is optional), every call is UNAUTHENTICATED.
    let codes = operator_calls(&site, &site.auth(None, None)).await.unwrap();
    assert!(codes.iter().all(|c| *c == Code::Unauthenticated), "no credentials: {codes:?}");
    // A wrong token.
    let codes = operator_calls(&site, &site.auth(None, Some("not-the-token-0123456789"))).await.unwrap();
    assert!(codes.iter().all(|c| *c == Code::Unauthenticated), "wrong token: {codes:?}");
    // An agent's certificate: known, not allowed.
    let codes = operator_calls(&site, &site.auth(Some("agent-1"), None)).await.unwrap();
    assert!(codes.iter().all(|c| *c == Code::PermissionDenied), "agent certificate: {codes:?}");
    // A certificate from another CA, or an expired one: the handshake itself is refused (no call gets through).
    for cert in ["operator-other-ca", "operator-expired"] {
        match operator_calls(&site, &site.auth(Some(cert), None)).await {
            Err(_) => {}
            Ok(codes) => assert!(
                codes
                    .iter()
                    .all(|c| matches!(c, Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded)),
                "{cert}: calls must fail at the handshake: {codes:?}"
            ),
        }
    }

    // Nothing changed: the filter state, no discovery window, and Ironic (no call at all, so no power or boot
    // device).
    assert_eq!(site.state().await, before, "the filter state changed");
    assert_eq!(windows(&site).await, 0, "a refused caller opened a discovery window");
    let calls: Vec<String> =
        site.ironic.calls()[calls_before..].iter().map(|c| format!("{} {}", c.method, c.path)).collect();
    assert!(calls.is_empty(), "Ironic was called: {calls:?}");

    // The operator, by certificate and by token: accepted (the rule is created, listed, deleted).
    let codes = operator_calls(&site, &site.auth(Some("operator"), None)).await.unwrap();
    assert_eq!(codes[0], Code::Ok, "UpdatePxeFilters by the operator: {codes:?}");
    assert_eq!(codes[3], Code::Ok, "ExplainMac by the operator: {codes:?}");
    assert_eq!(&codes[6..9], &[Code::Ok, Code::Ok, Code::Ok], "{codes:?}");
    assert_eq!(&codes[9..12], &[Code::Ok, Code::Ok, Code::Ok], "discovery open, list, close: {codes:?}");
    // The quarantine is empty: listed, and nothing to drop (the operator got past the check to the store).
    assert_eq!(&codes[12..], &[Code::Ok, Code::NotFound], "quarantine list, drop: {codes:?}");
    let codes = operator_calls(&site, &site.auth(None, Some(TOKEN))).await.unwrap();
    assert_eq!(codes[0], Code::Ok, "by token: {codes:?}");
    assert!(site.state().await.0 > before.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_watches_and_reports_as_itself_only() {
    let site = Site::new("agents").await;
    let (ch, _) = site.channel(&site.auth(Some("agent-1"), None)).await.unwrap();
    let mut c = PxeFilterClient::new(ch);
    let watch = |id: &str| WatchFiltersRequest { agent_id: id.into(), network: "n".into(), ..Default::default() };
    let mut stream = c.watch_filters(watch("agent-1")).await.expect("watch as itself").into_inner();
    assert!(stream.message().await.unwrap().is_some(), "the first event (a snapshot) arrives");
    let e = c.watch_filters(watch("agent-2")).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("agent-1") && e.message().contains("agent-2"), "{}", e.message());
    let report = |id: &str| AgentStatus { agent_id: id.into(), network: "n".into(), ..Default::default() };
    c.report_status(report("agent-1")).await.expect("report as itself");
    assert_eq!(c.report_status(report("agent-2")).await.unwrap_err().code(), Code::PermissionDenied);
    // Without a certificate, no agent call at all; the operator is not an agent either.
    let (ch, _) = site.channel(&site.auth(None, None)).await.unwrap();
    let e = PxeFilterClient::new(ch).report_status(report("agent-1")).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    let (ch, _) = site.channel(&site.auth(Some("operator"), None)).await.unwrap();
    let e = PxeFilterClient::new(ch).report_status(report("operator")).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    // The operator's view shows only the agent that reported as itself.
    let (ch, _) = site.channel(&site.auth(Some("operator"), None)).await.unwrap();
    let agents = PxeFilterClient::new(ch).list_agents(ListAgentsRequest::default()).await.unwrap().into_inner();
    let ids: Vec<&str> = agents.agents.iter().filter_map(|a| a.status.as_ref()).map(|s| s.agent_id.as_str()).collect();
    assert_eq!(ids, ["agent-1"]);
}

#[test]
fn without_tls_the_control_plane_refuses_to_start_unless_insecure() {
    let mut c = ControlPlaneConfig::default();
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("needs TLS") && e.contains("insecure = true"), "{e}");
    assert_eq!(c.grpc_listen().to_string(), "127.0.0.1:9100", "loopback until TLS is configured");
    c.grpc.insecure = true;
    c.validate().unwrap();
    c.grpc.tls_cert_file = "/etc/ironguard/grpc.pem".into();
    c.grpc.tls_key_file = "/etc/ironguard/grpc.key".into();
    c.grpc.client_ca_file = "/etc/ironguard/ca.pem".into();
    assert!(c.validate().unwrap_err().to_string().contains("contradictory"));
    c.grpc.insecure = false;
    c.validate().unwrap();
    assert_eq!(c.grpc_listen().to_string(), "0.0.0.0:9100");
    c.grpc.tls_key_file = PathBuf::new();
    assert!(c.validate().unwrap_err().to_string().contains("go together"));
}
