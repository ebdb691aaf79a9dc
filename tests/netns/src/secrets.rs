//! Secrets the suite hands to daemons (private keys, tokens, passwords), registered as they are made, and the
//! check that no daemon ever writes one to its log: [`Proc`](crate::Proc) runs [`found_in`] on its log when it is
//! dropped, so every end-to-end test checks it for every daemon it started.

use std::sync::Mutex;

static SECRETS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Registers a secret (at least 8 characters, so that it cannot match by chance).
pub fn register(secret: &str) {
    if secret.len() >= 8 {
        SECRETS.lock().unwrap_or_else(|e| e.into_inner()).push(secret.to_string());
    }
}

/// Registers a PEM private key: each line of its base64 body is a secret of its own (a log could hold one line).
pub fn register_pem_key(pem: &str) {
    for line in pem.lines().filter(|l| !l.starts_with("-----") && l.len() >= 16) {
        register(line);
    }
}

/// What in `log` gives a secret away: a private key's PEM header or a registered secret (named by its first
/// characters only).
pub fn found_in(log: &str) -> Option<String> {
    if log.contains("PRIVATE KEY-----") {
        return Some("a PEM private key".into());
    }
    let secrets = SECRETS.lock().unwrap_or_else(|e| e.into_inner());
    secrets.iter().find(|s| log.contains(s.as_str())).map(|s| format!("a secret starting {:?}", &s[..4]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registered_secret_is_found_and_nothing_else() {
        register("s3cret-token-for-the-check");
        register("short");
        assert!(found_in("log line with s3cret-token-for-the-check in it").is_some());
        assert!(found_in("-----BEGIN PRIVATE KEY-----").is_some());
        assert!(found_in("nothing here; short is too short to count").is_none());
    }
}
