//! The Ironic client against the fake Ironic over real HTTP: authentication, microversions, pagination.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::http::{HeaderMap, StatusCode};
use fake_ironic::{FakeIronic, FakeIronicConfig, Node};
use ironguard_ironic::{Ironic, IronicConfig, IronicError};

async fn fake(config: FakeIronicConfig) -> FakeIronic {
    let f = FakeIronic::start_with("127.0.0.1:0".parse().unwrap(), config).await.unwrap();
    f.add_node(Node::new("55555555-5555-5555-5555-555555555555"));
    f
}

#[tokio::test]
async fn http_basic_auth() {
    let f = fake(FakeIronicConfig {
        require_basic_auth: Some(("ironguard".into(), "s3cret".into())),
        ..Default::default()
    })
    .await;
    let ok = Ironic::new(IronicConfig {
        url: f.url(),
        auth_type: "http_basic".into(),
        username: "ironguard".into(),
        password: "s3cret".into(),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        ok.get_node("55555555-5555-5555-5555-555555555555").await.unwrap().uuid,
        "55555555-5555-5555-5555-555555555555"
    );
    let bad = Ironic::new(IronicConfig {
        url: f.url(),
        auth_type: "http_basic".into(),
        username: "ironguard".into(),
        password: "wrong".into(),
        retries: 0,
        ..Default::default()
    })
    .unwrap();
    let e = bad.get_node("55555555-5555-5555-5555-555555555555").await.unwrap_err();
    assert!(matches!(e, IronicError::Http { status: 401, .. }), "{e}");
}

/// A minimal Keystone: POST /v3/auth/tokens answers, for password "kspw" in project "baremetal", the n-th token
/// of `tokens` (the last one from then on) in X-Subject-Token. Returns its URL and the count of tokens issued.
async fn keystone(tokens: &'static [&'static str]) -> (String, Arc<AtomicUsize>) {
    let issued = Arc::new(AtomicUsize::new(0));
    let n = issued.clone();
    let app = axum::Router::new().route(
        "/v3/auth/tokens",
        axum::routing::post(move |body: String| async move {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let pw = v["auth"]["identity"]["password"]["user"]["password"].as_str().unwrap_or_default().to_string();
            let project = v["auth"]["scope"]["project"]["name"].as_str().unwrap_or_default().to_string();
            let mut h = HeaderMap::new();
            if pw == "kspw" && project == "baremetal" {
                let i = n.fetch_add(1, Ordering::SeqCst);
                h.insert("X-Subject-Token", tokens[i.min(tokens.len() - 1)].parse().unwrap());
                (StatusCode::CREATED, h, "{}")
            } else {
                (StatusCode::UNAUTHORIZED, h, "{}")
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v3", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    (url, issued)
}

#[tokio::test]
async fn keystone_password_auth() {
    let f = fake(FakeIronicConfig { require_token: Some("tok-1".into()), ..Default::default() }).await;
    let (ks, _) = keystone(&["tok-1"]).await;
    let pwfile = std::env::temp_dir().join(format!("ig-kspw-{}", std::process::id()));
    std::fs::write(&pwfile, "kspw\n").unwrap();
    let c = Ironic::new(IronicConfig {
        url: f.url(),
        auth_type: "password".into(),
        auth_url: ks.clone(),
        username: "ironguard".into(),
        password_file: pwfile.display().to_string(),
        project_name: "baremetal".into(),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        c.get_node("55555555-5555-5555-5555-555555555555").await.unwrap().uuid,
        "55555555-5555-5555-5555-555555555555"
    );
    assert!(f.calls().iter().any(|c| c.path.starts_with("/v1/nodes")), "the call reached Ironic with the token");
    let bad = Ironic::new(IronicConfig {
        url: f.url(),
        auth_type: "password".into(),
        auth_url: ks,
        username: "ironguard".into(),
        password: "nope".into(),
        project_name: "baremetal".into(),
        ..Default::default()
    })
    .unwrap();
    assert!(matches!(bad.get_node("55555555-5555-5555-5555-555555555555").await.unwrap_err(), IronicError::Auth(_)));
    std::fs::remove_file(&pwfile).unwrap();
}

/// A token Ironic no longer accepts (expired, revoked) is renewed once on 401 and the call goes through; a fresh
/// token that is refused too is an error, not a loop.
#[tokio::test]
async fn an_expired_keystone_token_is_renewed_once() {
    const NODE: &str = "55555555-5555-5555-5555-555555555555";
    let f = fake(FakeIronicConfig { require_token: Some("tok-2".into()), ..Default::default() }).await;
    let client = |ks: String| {
        Ironic::new(IronicConfig {
            url: f.url(),
            auth_type: "password".into(),
            auth_url: ks,
            username: "ironguard".into(),
            password: "kspw".into(),
            project_name: "baremetal".into(),
            retries: 3,
            retry_backoff_ms: 10,
            ..Default::default()
        })
        .unwrap()
    };
    let (ks, issued) = keystone(&["tok-expired", "tok-2"]).await;
    let c = client(ks);
    assert_eq!(c.get_node(NODE).await.unwrap().uuid, NODE);
    assert_eq!(issued.load(Ordering::SeqCst), 2, "one token, then one renewal after the 401");
    assert_eq!(c.get_node(NODE).await.unwrap().uuid, NODE);
    assert_eq!(issued.load(Ordering::SeqCst), 2, "the renewed token is kept");

    let (ks, issued) = keystone(&["tok-expired"]).await;
    let e = client(ks).get_node(NODE).await.unwrap_err();
    assert!(matches!(e, IronicError::Http { status: 401, .. }), "{e}");
    assert_eq!(issued.load(Ordering::SeqCst), 2, "renewed once, not in a loop");
}

#[tokio::test]
async fn microversion_is_negotiated_down_and_lists_follow_next() {
    let f = fake(FakeIronicConfig { max_version: "1.46".into(), max_limit: 100, ..Default::default() }).await;
    f.populate(250, 2, "manageable");
    let c = Ironic::new(IronicConfig { url: f.url(), page_size: 100, ..Default::default() }).unwrap();
    assert_eq!(c.microversion().await.unwrap(), "1.46");
    let nodes = c.list_nodes(&["manageable"], "uuid").await.unwrap();
    assert_eq!(nodes.len(), 250);
    let ports = c.list_ports(None).await.unwrap();
    assert_eq!(ports.len(), 500);
    let mut macs: Vec<&str> = ports.iter().map(|p| p.address.as_str()).collect();
    macs.sort();
    macs.dedup();
    assert_eq!(macs.len(), 500, "every port exactly once across pages");
    assert!(
        f.calls()
            .iter()
            .filter(|c| c.path.starts_with("/v1/ports"))
            .all(|c| c.path.contains("fields=") && c.path.contains("limit=100"))
    );
    // An Ironic older than ironguard needs is refused clearly.
    let old = fake(FakeIronicConfig { max_version: "1.6".into(), ..Default::default() }).await;
    let c = Ironic::new(IronicConfig { url: old.url(), ..Default::default() }).unwrap();
    let e = c.get_node("x").await.unwrap_err();
    assert!(e.to_string().contains("1.6") && e.to_string().contains("1.8"), "{e}");
}

/// Ironic's `next` link drops `provision_state` and `node_uuid` (the fake builds it as Ironic 39 does): lists
/// carry their filters to every page and re-check them, so nodes in other states and ports of other nodes never
/// come back.
#[tokio::test]
async fn filters_hold_on_every_page() {
    let f = fake(FakeIronicConfig::default()).await;
    let uuids = f.populate(40, 3, "manageable");
    for u in uuids.iter().step_by(3) {
        f.set_provision_state(u, "inspect wait").unwrap();
    }
    let c = Ironic::new(IronicConfig { url: f.url(), page_size: 4, ..Default::default() }).unwrap();
    let nodes = c.list_nodes(&["inspect wait"], "uuid").await.unwrap();
    let want: Vec<&String> = uuids.iter().step_by(3).collect();
    assert_eq!(nodes.iter().map(|n| &n.uuid).collect::<Vec<_>>(), want);
    assert!(nodes.iter().all(|n| n.provision_state.as_deref() == Some("inspect wait")));
    let ports = c.list_ports(Some(&uuids[7])).await.unwrap();
    assert_eq!(ports.len(), 3);
    assert!(ports.iter().all(|p| p.node_uuid == uuids[7]));
    let pages = f.calls().iter().filter(|c| c.path.starts_with("/v1/nodes?")).count();
    assert!(pages >= 4, "several pages were asked for ({pages})");
    assert!(
        f.calls()
            .iter()
            .filter(|c| c.path.starts_with("/v1/nodes?") || c.path.starts_with("/v1/ports?"))
            .all(|c| c.path.contains("provision_state=inspect") || c.path.contains("node_uuid=")),
        "every page repeats the filter"
    );
}

/// A list reply without its collection is an error, not an empty list (which would drop every `ironic` deny).
#[tokio::test]
async fn a_list_reply_without_its_collection_is_an_error() {
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { r#"{"default_version": {"version": "1.80"}}"# }))
        .route("/v1/ports", axum::routing::get(|| async { r#"{"error": "maintenance window"}"# }));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    let c = Ironic::new(IronicConfig { url, ..Default::default() }).unwrap();
    let e = c.list_ports(None).await.unwrap_err();
    assert!(matches!(e, IronicError::Protocol { .. }) && e.to_string().contains("\"ports\""), "{e}");
}

#[tokio::test]
async fn node_patch_ports_boot_device_and_power() {
    let f = fake(FakeIronicConfig::default()).await;
    let c = Ironic::new(IronicConfig { url: f.url(), ..Default::default() }).unwrap();
    let uuid = "55555555-5555-5555-5555-555555555555";
    c.patch_node(uuid, &serde_json::json!([{"op": "add", "path": "/extra/inspected_by", "value": "ironguard"}]))
        .await
        .unwrap();
    assert_eq!(f.node(uuid).unwrap().extra["inspected_by"], "ironguard");
    let p = c.create_port(uuid, "52:54:00:77:00:01").await.unwrap();
    assert_eq!(c.list_ports(Some(uuid)).await.unwrap().len(), 1);
    let dup = c.create_port(uuid, "52:54:00:77:00:01").await.unwrap_err();
    assert!(dup.to_string().contains("409"), "a duplicate address is refused: {dup}");
    c.delete_port(&p.uuid).await.unwrap();
    assert!(c.list_ports(Some(uuid)).await.unwrap().is_empty());
    c.set_boot_device(uuid, "pxe", false).await.unwrap();
    c.set_power(uuid, "power on").await.unwrap();
    assert_eq!((f.boot_device(uuid).as_deref(), f.power_state(uuid).as_deref()), (Some("pxe"), Some("power on")));
    let v = c.validate(uuid, "power").await.unwrap();
    assert_eq!(v.result, Some(true));
    assert!(matches!(c.get_node("missing").await.unwrap_err(), IronicError::NotFound { .. }));
}

/// A TLS front for the fake Ironic: terminates TLS with a certificate for 127.0.0.1 signed by a fresh CA and
/// forwards the bytes. Returns the `https://` URL and the CA certificate (PEM).
async fn tls_front(backend: std::net::SocketAddr) -> (String, String) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap().signed_by(&key, &ca).unwrap();
    let server = rustls::ServerConfig::builder_with_provider(ironguard_ironic::crypto_provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                let Ok(mut back) = tokio::net::TcpStream::connect(backend).await else { return };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut back).await;
            });
        }
    });
    (url, ca.pem())
}

/// `ca_file`: Ironic's certificate is trusted when its CA is in the bundle (with other CAs beside it), and a
/// certificate from another CA is refused with an error that says so.
#[tokio::test]
async fn ironic_over_tls_with_a_ca_bundle() {
    const NODE: &str = "55555555-5555-5555-5555-555555555555";
    let f = fake(FakeIronicConfig::default()).await;
    let (url, ca_pem) = tls_front(f.local_addr()).await;
    let (_, other_ca) = tls_front(f.local_addr()).await;
    let dir = std::env::temp_dir().join(format!("ig-ca-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bundle = dir.join("bundle.pem");
    std::fs::write(&bundle, format!("{other_ca}{ca_pem}")).unwrap();
    let wrong = dir.join("wrong.pem");
    std::fs::write(&wrong, &other_ca).unwrap();
    let empty = dir.join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let client = |ca: &std::path::Path| {
        Ironic::new(IronicConfig {
            url: url.clone(),
            ca_file: ca.display().to_string(),
            retries: 0,
            ..Default::default()
        })
    };
    assert_eq!(client(&bundle).unwrap().get_node(NODE).await.unwrap().uuid, NODE);
    let e = client(&wrong).unwrap().get_node(NODE).await.unwrap_err().to_string();
    assert!(e.contains("UnknownIssuer") || e.contains("certificate"), "names the certificate problem: {e}");
    let e = client(&empty).unwrap_err().to_string();
    assert!(e.contains("no PEM certificate"), "{e}");
    let e = client(&dir.join("missing.pem")).unwrap_err().to_string();
    assert!(e.contains("cannot read"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A port on 127.0.0.1 nobody listens on (connection refused).
fn refused_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    format!("http://127.0.0.1:{port}")
}

/// An HA Ironic with no VIP: `url` refuses, then answers 503 (a proxy with no backend); the request moves to the
/// next endpoint at once, and later requests stay on the one that answered. With every endpoint down, each got a
/// try and the error says so.
#[tokio::test]
async fn a_request_moves_to_the_next_ironic_endpoint_and_stays_there() {
    let f = fake(FakeIronicConfig::default()).await;
    let health = ironguard_ironic::IronicHealth::default();
    let ironic = Ironic::new(IronicConfig {
        url: refused_url(),
        fallback_urls: vec![format!("{}/", f.url())],
        retries: 0,
        ..Default::default()
    })
    .unwrap()
    .with_health(health.clone());
    let node = ironic.get_node("55555555-5555-5555-5555-555555555555").await.unwrap();
    assert_eq!(node.uuid, "55555555-5555-5555-5555-555555555555");
    assert_eq!(health.failovers.get(), 1, "one move, although retries = 0");
    assert_eq!(ironic.endpoint(), f.url(), "the endpoint that answered is the one in use");
    let before = health.requests.get();
    ironic.get_node("55555555-5555-5555-5555-555555555555").await.unwrap();
    assert_eq!(health.requests.get(), before + 1, "the next request goes straight to it");
    assert_eq!(health.failovers.get(), 1);

    // 503 from the endpoint in use (e.g. haproxy with no backend up): the next one is asked.
    let unavailable = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let busy = format!("http://{}", unavailable.local_addr().unwrap());
    let app = axum::Router::new().fallback(|| async { (StatusCode::SERVICE_UNAVAILABLE, "no server is available") });
    tokio::spawn(async move { axum::serve(unavailable, app).await });
    let health = ironguard_ironic::IronicHealth::default();
    let ironic =
        Ironic::new(IronicConfig { url: busy.clone(), fallback_urls: vec![f.url()], retries: 0, ..Default::default() })
            .unwrap()
            .with_health(health.clone());
    ironic.get_node("55555555-5555-5555-5555-555555555555").await.unwrap();
    assert_eq!((health.failovers.get(), ironic.endpoint()), (1, f.url().as_str()));

    // Every endpoint down: each gets its try, and the error names the last failure.
    let ironic = Ironic::new(IronicConfig {
        url: refused_url(),
        fallback_urls: vec![refused_url(), busy],
        retries: 0,
        retry_backoff_ms: 1,
        ..Default::default()
    })
    .unwrap();
    let e = ironic.get_node("55555555-5555-5555-5555-555555555555").await.unwrap_err();
    assert!(matches!(e, IronicError::Exhausted { attempts: 3, .. }), "{e}");
    assert!(e.to_string().contains("503"), "the last endpoint's answer: {e}");
}

#[test]
fn fallback_urls_are_checked() {
    let c = IronicConfig { fallback_urls: vec!["http://b:6385".into()], ..Default::default() };
    assert!(c.validate().unwrap_err().contains("needs url"));
    let c = IronicConfig { url: "http://a:6385".into(), fallback_urls: vec!["b:6385".into()], ..Default::default() };
    assert!(c.validate().unwrap_err().contains("\"b:6385\""));
}
