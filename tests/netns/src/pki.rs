//! The test PKI: one CA per test process, the control plane's server certificate (name [`SERVER_NAME`]), an
//! operator certificate (name [`OPERATOR`]) and one certificate per agent id, made on demand with rcgen. Every
//! control plane, agent and `ironguardctl` the harness starts speaks TLS with these, so the end-to-end suites run
//! with TLS and client identities on, as production does.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

/// The name in the control plane's certificate; clients verify it (`server_name`).
pub const SERVER_NAME: &str = "controlplane.ironguard.test";
/// The operator certificate's name, given to every control plane with `--grpc-operator`.
pub const OPERATOR: &str = "operator";

/// Paths of one certificate and its key.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub struct Pki {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub server: CertFiles,
    pub operator: CertFiles,
    issuer: Issuer<'static, KeyPair>,
    agents: Mutex<BTreeSet<String>>,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").field("dir", &self.dir).finish_non_exhaustive()
    }
}

/// A CA: its certificate (PEM) and its issuer (to sign with).
pub fn make_ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().expect("CA key");
    let cert = params.self_signed(&key).expect("CA certificate");
    (cert.pem(), Issuer::new(params, key))
}

/// A leaf certificate for `name` (DNS SAN and CN), for a server or a client, signed by `issuer`: (cert, key) PEM.
pub fn make_leaf(issuer: &Issuer<'static, KeyPair>, name: &str, server: bool) -> (String, String) {
    let mut sans = vec![name.to_string()];
    if server {
        sans.push("localhost".into());
    }
    let mut params = CertificateParams::new(sans).expect("leaf params");
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages =
        vec![if server { ExtendedKeyUsagePurpose::ServerAuth } else { ExtendedKeyUsagePurpose::ClientAuth }];
    if server {
        params.subject_alt_names.push(rcgen::SanType::IpAddress(std::net::IpAddr::from([127, 0, 0, 1])));
    }
    let key = KeyPair::generate().expect("leaf key");
    let cert = params.signed_by(&key, issuer).expect("leaf certificate");
    let key = key.serialize_pem();
    crate::secrets::register_pem_key(&key);
    (cert.pem(), key)
}

fn write(dir: &Path, stem: &str, (cert, key): (String, String)) -> CertFiles {
    let files = CertFiles { cert: dir.join(format!("{stem}.pem")), key: dir.join(format!("{stem}.key")) };
    std::fs::write(&files.cert, cert).expect("write certificate");
    std::fs::write(&files.key, key).expect("write key");
    files
}

/// This process's PKI (made on first use, under /tmp).
pub fn pki() -> &'static Pki {
    static PKI: OnceLock<Pki> = OnceLock::new();
    PKI.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("ig-pki-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("PKI directory");
        let (ca_pem, issuer) = make_ca("ironguard test CA");
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, ca_pem).expect("write CA");
        let server = write(&dir, "server", make_leaf(&issuer, SERVER_NAME, true));
        let operator = write(&dir, "operator", make_leaf(&issuer, OPERATOR, false));
        Pki { dir, ca, server, operator, issuer, agents: Mutex::new(BTreeSet::new()) }
    })
}

impl Pki {
    /// The certificate of agent `id` (its name is the id).
    pub fn agent(&self, id: &str) -> CertFiles {
        let stem = format!("agent-{id}");
        let mut made = self.agents.lock().unwrap_or_else(|e| e.into_inner());
        if made.insert(id.to_string()) {
            write(&self.dir, &stem, make_leaf(&self.issuer, id, false))
        } else {
            CertFiles { cert: self.dir.join(format!("{stem}.pem")), key: self.dir.join(format!("{stem}.key")) }
        }
    }

    /// A client certificate of any name (e.g. an agent posing as another, in tests of refusals).
    pub fn client(&self, name: &str) -> CertFiles {
        self.agent(name)
    }

    /// The control plane's command-line flags for TLS with client identities and the operator.
    pub fn controlplane_args(&self) -> Vec<String> {
        vec![
            "--grpc-tls-cert".into(),
            self.server.cert.display().to_string(),
            "--grpc-tls-key".into(),
            self.server.key.display().to_string(),
            "--grpc-client-ca".into(),
            self.ca.display().to_string(),
            "--grpc-operator".into(),
            OPERATOR.into(),
        ]
    }

    /// The `[controlplane]` TLS lines of agent `id`'s configuration.
    pub fn agent_toml(&self, id: &str) -> String {
        let c = self.agent(id);
        format!(
            "ca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\nserver_name = \"{SERVER_NAME}\"\n",
            self.ca.display(),
            c.cert.display(),
            c.key.display()
        )
    }

    /// `ironguardctl`'s environment for the operator's certificate.
    pub fn operator_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("IRONGUARD_CA_FILE", self.ca.display().to_string()),
            ("IRONGUARD_CERT_FILE", self.operator.cert.display().to_string()),
            ("IRONGUARD_KEY_FILE", self.operator.key.display().to_string()),
            ("IRONGUARD_TLS_SERVER_NAME", SERVER_NAME.to_string()),
        ]
    }

    /// A gRPC endpoint to `url` (`https://`) as the operator.
    pub fn operator_endpoint(&self, url: &str) -> tonic::transport::Endpoint {
        let auth = ironguard_proto::client::ClientAuth {
            ca_file: self.ca.clone(),
            cert_file: self.operator.cert.clone(),
            key_file: self.operator.key.clone(),
            server_name: SERVER_NAME.into(),
            token_file: PathBuf::new(),
        };
        auth.endpoint(url).expect("operator endpoint")
    }
}
