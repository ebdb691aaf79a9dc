//! Who may call what on the gRPC API.
//!
//! | caller | proves itself with | may call |
//! |---|---|---|
//! | operator | a client certificate whose name is in `[grpc] operator_names`, or the bearer token of `operator_token_file` | everything: filter changes and reads, agents, inspections, rules |
//! | agent | any other client certificate signed by `client_ca_file`; its name is its agent id | `WatchFilters` and `ReportStatus`, as itself only |
//! | anyone | nothing (only with `insecure = true`) | agent calls as any agent; operator calls only when no token is configured |
//!
//! A refused call changes nothing: the check comes first in every handler. `UNAUTHENTICATED` says that
//! credentials are missing or wrong, `PERMISSION_DENIED` that the identity is known but not allowed.

use std::collections::BTreeSet;
use std::path::Path;

use tonic::{Request, Status};

use crate::listener::PeerInfo;
use crate::tls::GrpcConfig;

/// The caller of one request, as far as the connection and its metadata prove it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    Operator(String),
    Agent(String),
    Anonymous,
}

/// The authorization rules of one control plane.
#[derive(Clone)]
pub struct Authz {
    insecure: bool,
    operators: BTreeSet<String>,
    /// SHA-256 of the operator token (the token itself is not kept).
    token_digest: Option<[u8; 32]>,
}

impl std::fmt::Debug for Authz {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authz")
            .field("insecure", &self.insecure)
            .field("operators", &self.operators)
            .field("token", &self.token_digest.map(|_| "<set>"))
            .finish()
    }
}

fn digest(s: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, s);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Reads a token file: its content, trimmed; an empty or unreadable file is an error naming the file only.
pub fn read_token(path: &Path) -> anyhow::Result<String> {
    let t = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read the operator token file {}: {e}", path.display()))?;
    let t = t.trim().to_string();
    if t.len() < 16 {
        anyhow::bail!("the operator token in {} is shorter than 16 characters", path.display());
    }
    Ok(t)
}

impl Authz {
    pub fn new(cfg: &GrpcConfig) -> anyhow::Result<Self> {
        let token_digest = if cfg.operator_token_file.as_os_str().is_empty() {
            None
        } else {
            Some(digest(read_token(&cfg.operator_token_file)?.as_bytes()))
        };
        Ok(Self { insecure: cfg.insecure, operators: cfg.operator_names.iter().cloned().collect(), token_digest })
    }

    /// Anyone may do anything (tests of other things, and `insecure = true` without a token).
    pub fn open() -> Self {
        Self { insecure: true, operators: BTreeSet::new(), token_digest: None }
    }

    /// Whether operator calls need no credentials (logged at start).
    pub fn operator_calls_open(&self) -> bool {
        self.insecure && self.token_digest.is_none()
    }

    fn bearer<T>(&self, req: &Request<T>) -> Option<Result<(), ()>> {
        let v = req.metadata().get("authorization")?;
        let presented = v.to_str().ok().and_then(|s| s.strip_prefix("Bearer ")).map(str::trim);
        let want = self.token_digest?;
        // Digests are compared, every byte: how long the comparison takes reveals nothing about the token.
        Some(match presented {
            Some(t) if digest(t.as_bytes()).iter().zip(&want).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0 => Ok(()),
            _ => Err(()),
        })
    }

    /// Who is calling.
    pub fn caller<T>(&self, req: &Request<T>) -> Caller {
        if let Some(Ok(())) = self.bearer(req) {
            return Caller::Operator("token".into());
        }
        match req.extensions().get::<PeerInfo>().and_then(|p| p.identity.clone()) {
            Some(name) if self.operators.contains(&name) => Caller::Operator(name),
            Some(name) => Caller::Agent(name),
            None => Caller::Anonymous,
        }
    }

    /// `Ok` with the operator's name if the call is an operator's; the refusal otherwise.
    pub fn operator<T>(&self, req: &Request<T>, call: &str) -> Result<String, Status> {
        if let Some(Err(())) = self.bearer(req) {
            crate::refused!(
                "operator-token",
                peer(req),
                call,
                "refused: the operator token presented is not valid; the client must use the token in the control plane's [grpc] operator_token_file"
            );
            return Err(Status::unauthenticated(format!("{call}: the operator token is not valid")));
        }
        match self.caller(req) {
            Caller::Operator(name) => Ok(name),
            Caller::Anonymous if self.operator_calls_open() => Ok("anonymous".into()),
            Caller::Anonymous => {
                crate::refused!(
                    "no-credentials",
                    peer(req),
                    call,
                    "refused: an operator call without credentials; the client needs a certificate named in [grpc] operator_names or the operator token"
                );
                Err(Status::unauthenticated(format!(
                    "{call} needs an operator: a client certificate named in the control plane's [grpc] \
                     operator_names, or its operator token"
                )))
            }
            Caller::Agent(name) => {
                crate::refused!(
                    "agent-on-operator-call",
                    name,
                    call,
                    "refused: an agent's certificate on an operator call; operators use a certificate named in [grpc] operator_names"
                );
                Err(Status::permission_denied(format!(
                    "{call} needs an operator; the certificate {name:?} is an agent's (not in [grpc] operator_names)"
                )))
            }
        }
    }

    /// `Ok` if the caller may act as agent `agent_id`.
    pub fn agent<T>(&self, req: &Request<T>, call: &str, agent_id: &str) -> Result<(), Status> {
        match self.caller(req) {
            Caller::Agent(name) if name == agent_id => Ok(()),
            Caller::Anonymous if self.insecure => Ok(()),
            Caller::Agent(name) => {
                crate::refused!("agent-posing", name, call, agent = %agent_id, "refused: a certificate used for another agent id; each agent's certificate name must equal its [agent] id");
                Err(Status::permission_denied(format!(
                    "{call}: the certificate {name:?} may act as agent {name:?} only, not as {agent_id:?}"
                )))
            }
            Caller::Operator(name) => {
                crate::refused!("operator-as-agent", name, call, agent = %agent_id, "refused: an operator's credentials on an agent call; agents use their own certificate");
                Err(Status::permission_denied(format!("{call} is for agents; {name:?} is an operator")))
            }
            Caller::Anonymous => {
                crate::refused!("agent-without-certificate", peer(req), call, agent = %agent_id, "refused: an agent call without a client certificate; set the agent's [controlplane] cert_file and key_file");
                Err(Status::unauthenticated(format!("{call} needs the agent's client certificate")))
            }
        }
    }
}

/// The caller's address, for refusal logs.
fn peer<T>(req: &Request<T>) -> String {
    match req.extensions().get::<PeerInfo>().and_then(|p| p.remote) {
        Some(a) => a.ip().to_string(),
        None => "unknown".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(identity: Option<&str>, token: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        r.extensions_mut().insert(PeerInfo { remote: None, identity: identity.map(str::to_string) });
        if let Some(t) = token {
            r.metadata_mut().insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        r
    }

    fn authz(insecure: bool, token: Option<&str>) -> Authz {
        Authz { insecure, operators: ["ops".to_string()].into(), token_digest: token.map(|t| digest(t.as_bytes())) }
    }

    #[test]
    fn operators_by_name_or_token() {
        let a = authz(false, Some("0123456789abcdef"));
        assert_eq!(a.operator(&req(Some("ops"), None), "X").unwrap(), "ops");
        assert_eq!(a.operator(&req(None, Some("0123456789abcdef")), "X").unwrap(), "token");
        assert_eq!(a.operator(&req(None, Some("wrong")), "X").unwrap_err().code(), tonic::Code::Unauthenticated);
        assert_eq!(a.operator(&req(Some("ops"), Some("wrong")), "X").unwrap_err().code(), tonic::Code::Unauthenticated);
        assert_eq!(a.operator(&req(None, None), "X").unwrap_err().code(), tonic::Code::Unauthenticated);
        let e = a.operator(&req(Some("agent-1"), None), "UpdatePxeFilters").unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(!e.message().contains("0123456789abcdef"));
    }

    #[test]
    fn agents_act_as_themselves_only() {
        let a = authz(false, None);
        assert!(a.agent(&req(Some("agent-1"), None), "W", "agent-1").is_ok());
        assert_eq!(
            a.agent(&req(Some("agent-1"), None), "W", "agent-2").unwrap_err().code(),
            tonic::Code::PermissionDenied
        );
        assert_eq!(a.agent(&req(Some("ops"), None), "W", "ops").unwrap_err().code(), tonic::Code::PermissionDenied);
        assert_eq!(a.agent(&req(None, None), "W", "agent-1").unwrap_err().code(), tonic::Code::Unauthenticated);
    }

    #[test]
    fn insecure_mode() {
        let open = authz(true, None);
        assert!(open.operator(&req(None, None), "X").is_ok());
        assert!(open.agent(&req(None, None), "W", "anyone").is_ok());
        let with_token = authz(true, Some("0123456789abcdef"));
        assert!(with_token.operator(&req(None, None), "X").is_err(), "a configured token is required");
        assert!(with_token.operator(&req(None, Some("0123456789abcdef")), "X").is_ok());
    }
}
