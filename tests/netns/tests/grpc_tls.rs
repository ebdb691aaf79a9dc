//! The gRPC API's TLS with real processes: certificates rotated on disk and reloaded on SIGHUP while an agent's
//! stream stays open; `ironguardctl`'s errors for an unknown CA, a refused call and a wrong token; and no secret
//! (private key, token) in any log line of the control plane, the agent or `ironguardctl`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use ironguard_netns_tests::pki::{self, OPERATOR, SERVER_NAME, make_ca, make_leaf};
use ironguard_netns_tests::*;

const AGENT_ADMIN: &str = "127.0.0.1:9181";
const TOKEN: &str = "rotation-test-operator-token-0123456789";

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

/// `ironguardctl` with explicit credentials (no environment from the harness).
fn ctl_with(ns: &Netns, url: &str, creds: &[(&str, &Path)], args: &[&str]) -> std::process::Output {
    let mut c = ns.cmd(bin("ironguardctl"));
    c.arg("--controlplane").arg(url).arg("--tls-server-name").arg(SERVER_NAME).arg("--config").arg("/dev/null");
    for (flag, path) in creds {
        c.arg(flag).arg(path);
    }
    c.args(args).output().unwrap()
}

fn text(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The agent's applied revision, as the control plane reports it.
fn applied(lan: &PxeLan, url: &str, creds: &[(&str, &Path)]) -> u64 {
    let out = ctl_with(&lan.pxe, url, creds, &["agents", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    v["agents"][0]["applied_revision"].as_u64().unwrap_or(0)
}

fn revision(out: &std::process::Output) -> u64 {
    // "allow: 1 MACs sent, 1 changed; revision 7"
    text(out).rsplit("revision ").next().and_then(|r| r.trim().parse().ok()).unwrap_or_else(|| panic!("{}", text(out)))
}

#[test]
fn certificates_rotate_on_sighup_while_streams_stay_open() {
    let lan = PxeLan::new(1);
    let p = pki::pki();
    // The control plane's own copies of its certificate, key and client CA, rotated below.
    let tls = lan.dir.join("tls");
    std::fs::create_dir_all(&tls).unwrap();
    let (cert, key, client_ca, token) =
        (tls.join("grpc.pem"), tls.join("grpc.key"), tls.join("clients.pem"), tls.join("token"));
    std::fs::copy(&p.server.cert, &cert).unwrap();
    std::fs::copy(&p.server.key, &key).unwrap();
    std::fs::copy(&p.ca, &client_ca).unwrap();
    ironguard_netns_tests::secrets::register(TOKEN);
    write(&token, &format!("{TOKEN}\n"));
    let args: Vec<String> = [
        "--grpc-tls-cert",
        cert.to_str().unwrap(),
        "--grpc-tls-key",
        key.to_str().unwrap(),
        "--grpc-client-ca",
        client_ca.to_str().unwrap(),
        "--grpc-operator",
        OPERATOR,
        "--grpc-operator-token-file",
        token.to_str().unwrap(),
        "--unknown-mac-policy",
        "deny",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let cp = ControlPlane::start(&lan.pxe, &lan.dir, 9100, 9101, &args);
    let url = cp.url();
    assert!(url.starts_with("https://"), "{url}");
    let agent = start_agent(&lan.pxe, &lan.dir, &agent_toml("agent-1", &url, "br0", AGENT_ADMIN, 30), None);
    assert!(wait_for(DEADLINE, || (verdict(&lan.pxe) == "LEADER").then_some(())).is_some());
    let ca1 = p.ca.clone();
    let op1 = [
        ("--ca-file", ca1.as_path()),
        ("--cert-file", p.operator.cert.as_path()),
        ("--key-file", p.operator.key.as_path()),
    ];
    let out = ctl_with(&lan.pxe, &url, &op1, &["filters", "allow", "52:54:00:77:00:01"]);
    assert!(out.status.success(), "{}", text(&out));
    let r1 = revision(&out);
    assert!(wait_for(DEADLINE, || (applied(&lan, &url, &op1) >= r1).then_some(())).is_some());
    let resumes = metric(&lan.pxe, AGENT_ADMIN, "ironguard_agent_stream_resumes").unwrap_or(0.0);

    // Refusals, with what to do next: no credentials, a wrong token, an agent's certificate.
    let out = ctl_with(&lan.pxe, &url, &[("--ca-file", ca1.as_path())], &["filters", "show"]);
    assert!(!out.status.success() && text(&out).contains("without valid credentials"), "{}", text(&out));
    let bad_token = tls.join("bad-token");
    write(&bad_token, "not-the-operator-token-000000");
    let out =
        ctl_with(&lan.pxe, &url, &[("--ca-file", ca1.as_path()), ("--token-file", bad_token.as_path())], &["agents"]);
    assert!(!out.status.success() && text(&out).contains("the operator token is not valid"), "{}", text(&out));
    let a = p.agent("agent-1");
    let as_agent = [("--ca-file", ca1.as_path()), ("--cert-file", a.cert.as_path()), ("--key-file", a.key.as_path())];
    let out = ctl_with(&lan.pxe, &url, &as_agent, &["filters", "allow", "52:54:00:77:00:09"]);
    assert!(!out.status.success() && text(&out).contains("does not allow"), "{}", text(&out));
    let out = ctl_with(&lan.pxe, &url, &[("--ca-file", ca1.as_path()), ("--token-file", token.as_path())], &["agents"]);
    assert!(out.status.success(), "the token is an operator's: {}", text(&out));

    // Rotation: a new CA signs the server's new certificate and a new operator certificate; clients of both CAs
    // are trusted during the roll-over. Written in place, then SIGHUP.
    let (ca2_pem, ca2) = make_ca("rotated CA");
    let ca2_file = tls.join("ca2.pem");
    write(&ca2_file, &ca2_pem);
    let (server_pem, server_key) = make_leaf(&ca2, SERVER_NAME, true);
    write(&cert, &server_pem);
    write(&key, &server_key);
    write(&client_ca, &format!("{}{ca2_pem}", std::fs::read_to_string(&ca1).unwrap()));
    let (op2_pem, op2_key) = make_leaf(&ca2, OPERATOR, false);
    let (op2_cert, op2_keyf) = (tls.join("op2.pem"), tls.join("op2.key"));
    write(&op2_cert, &op2_pem);
    write(&op2_keyf, &op2_key);
    cp.proc.signal(nix::sys::signal::Signal::SIGHUP);
    let reloaded = wait_for(DEADLINE, || cp.proc.log_text().contains("reloaded").then_some(()));
    assert!(reloaded.is_some(), "{}", cp.proc.log_text());

    // A new connection trusting only the old CA is refused, and ironguardctl says why.
    let out = ctl_with(&lan.pxe, &url, &op1, &["filters", "show"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("not signed by the CA of --ca-file"), "{}", text(&out));
    // With the new CA and the new operator certificate: accepted.
    let op2 =
        [("--ca-file", ca2_file.as_path()), ("--cert-file", op2_cert.as_path()), ("--key-file", op2_keyf.as_path())];
    let out = ctl_with(&lan.pxe, &url, &op2, &["filters", "allow", "52:54:00:77:00:02"]);
    assert!(out.status.success(), "{}", text(&out));
    let r2 = revision(&out);
    // The agent's stream, opened before the rotation, is still the one delivering: it applies the new revision
    // without reconnecting.
    assert!(wait_for(DEADLINE, || (applied(&lan, &url, &op2) >= r2).then_some(())).is_some(), "{}", agent.log_text());
    assert_eq!(metric(&lan.pxe, AGENT_ADMIN, "ironguard_agent_stream_resumes").unwrap_or(0.0), resumes, "no reconnect");
    assert_eq!(metric(&lan.pxe, AGENT_ADMIN, "ironguard_agent_stream_connected"), Some(1.0));

    // No secret in any log: no private key, no token.
    let keys: Vec<String> = [&p.server.key, &p.operator.key, &a.key, &key, &op2_keyf]
        .iter()
        .map(|k| std::fs::read_to_string(k).unwrap())
        .collect();
    for (what, log) in [("control plane", cp.proc.log_text()), ("agent", agent.log_text())] {
        assert!(!log.contains("PRIVATE KEY"), "{what} logged a private key");
        assert!(!log.contains(TOKEN) && !log.contains("not-the-operator-token"), "{what} logged a token");
        for k in &keys {
            let body: String = k.lines().filter(|l| !l.starts_with("-----")).collect();
            assert!(!log.contains(&body[..40.min(body.len())]), "{what} logged key material");
        }
    }
}
