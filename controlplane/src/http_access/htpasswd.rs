//! `http_basic`: users and bcrypt hashes from an Apache htpasswd file, as Ironic standalone reads it.
//!
//! Only bcrypt entries (`$2y$`, `$2a$`, `$2b$`, what `htpasswd -B` writes) are accepted; any other line is a
//! startup error naming its line number (never its hash). The file is checked on every call (one `stat`) and read
//! again when its modification time, size or inode changes; a file that has become unreadable or invalid refuses
//! every call (500) until it is fixed, rather than keep serving users that were meant to be removed.
//!
//! bcrypt is slow on purpose, so successful verifications are cached for [`CACHE_TTL`] under a keyed hash of
//! user and password (never the password), the cache is emptied when the file changes, and at most
//! [`MAX_CONCURRENT_VERIFICATIONS`] run at once on the blocking pool. An unknown user costs one bcrypt
//! verification too, so that timing does not tell which users exist.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::http::{HeaderValue, StatusCode};
use tokio::sync::Semaphore;
use tracing::{error, info, warn};

use super::{CacheKeyer, Refusal};

/// How long a successful verification is remembered.
pub const CACHE_TTL: Duration = Duration::from_secs(60);
/// Verifications running at once (each is one bcrypt on the blocking pool).
pub const MAX_CONCURRENT_VERIFICATIONS: usize = 4;
/// Cached verifications kept at most.
const CACHE_ENTRIES: usize = 1024;
/// The `WWW-Authenticate` challenge of a 401.
pub const CHALLENGE: &str = "Basic realm=\"ironguard\"";

/// An htpasswd file that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HtpasswdError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path} line {line}: expected user:hash")]
    Malformed { path: String, line: usize },
    #[error("{path} line {line} (user {user:?}): only bcrypt entries ($2y$, $2a$, $2b$; htpasswd -B) are supported")]
    NotBcrypt { path: String, line: usize, user: String },
    #[error("{path} line {line} (user {user:?}): the bcrypt entry is malformed")]
    BadBcrypt { path: String, line: usize, user: String },
    #[error("{path} line {line}: user {user:?} already appears on line {first}")]
    Duplicate { path: String, line: usize, user: String, first: usize },
}

/// The users of one version of the file: name → bcrypt hash.
#[derive(Clone, PartialEq, Eq)]
pub struct Users(HashMap<String, String>);

impl std::fmt::Debug for Users {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The names only: a hash is a secret too (it can be attacked offline).
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl Users {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Parses htpasswd text; `path` names the file in errors. Blank lines and `#` comments are skipped.
pub fn parse(path: &str, text: &str) -> Result<Users, HtpasswdError> {
    let mut users = HashMap::new();
    let mut lines_of: HashMap<String, usize> = HashMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let entry = raw.trim();
        if entry.is_empty() || entry.starts_with('#') {
            continue;
        }
        let Some((user, hash)) = entry.split_once(':') else {
            return Err(HtpasswdError::Malformed { path: path.into(), line });
        };
        if user.is_empty() || hash.is_empty() {
            return Err(HtpasswdError::Malformed { path: path.into(), line });
        }
        if !["$2y$", "$2a$", "$2b$"].iter().any(|p| hash.starts_with(p)) {
            return Err(HtpasswdError::NotBcrypt { path: path.into(), line, user: user.into() });
        }
        if !well_formed_bcrypt(hash) {
            return Err(HtpasswdError::BadBcrypt { path: path.into(), line, user: user.into() });
        }
        if let Some(first) = lines_of.get(user) {
            return Err(HtpasswdError::Duplicate { path: path.into(), line, user: user.into(), first: *first });
        }
        lines_of.insert(user.to_string(), line);
        users.insert(user.to_string(), hash.to_string());
    }
    Ok(Users(users))
}

/// `$2y$NN$` + 22 characters of salt + 31 of hash, in bcrypt's base64 alphabet, with a cost of 4 to 31.
fn well_formed_bcrypt(hash: &str) -> bool {
    let b = hash.as_bytes();
    b.len() == 60
        && b[6] == b'$'
        && hash[4..6].parse::<u32>().is_ok_and(|c| (4..=31).contains(&c))
        && b[7..].iter().all(|c| c.is_ascii_alphanumeric() || *c == b'.' || *c == b'/')
}

/// Reads and parses the file at `path`.
pub fn load(path: &Path) -> Result<Users, HtpasswdError> {
    let name = path.display().to_string();
    let text =
        std::fs::read_to_string(path).map_err(|e| HtpasswdError::Read { path: name.clone(), reason: e.to_string() })?;
    parse(&name, &text)
}

/// What identifies one version of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> std::io::Result<Stamp> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(path)?;
    Ok(Stamp { modified: m.modified().ok(), len: m.len(), inode: m.ino() })
}

#[derive(Debug)]
struct Loaded {
    /// `None`: the file could not even be stat'ed.
    stamp: Option<Stamp>,
    users: Result<Arc<Users>, HtpasswdError>,
}

/// Verifies `Authorization: Basic` credentials against the file.
pub struct HtpasswdAuth {
    path: PathBuf,
    loaded: Mutex<Loaded>,
    cache: Mutex<HashMap<[u8; 32], Instant>>,
    keyer: CacheKeyer,
    slots: Semaphore,
    challenge: HeaderValue,
}

impl std::fmt::Debug for HtpasswdAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HtpasswdAuth").field("path", &self.path).finish_non_exhaustive()
    }
}

impl HtpasswdAuth {
    /// Reads the file; an unreadable or invalid one is an error.
    pub fn open(path: &str) -> Result<Self, HtpasswdError> {
        let path = PathBuf::from(path);
        let st = stamp(&path)
            .map_err(|e| HtpasswdError::Read { path: path.display().to_string(), reason: e.to_string() })?;
        let users = Arc::new(load(&path)?);
        info!(file = %path.display(), users = users.len(), "inspector API: HTTP basic authentication users loaded");
        Ok(Self {
            path,
            loaded: Mutex::new(Loaded { stamp: Some(st), users: Ok(users) }),
            cache: Mutex::new(HashMap::new()),
            keyer: CacheKeyer::new(),
            slots: Semaphore::new(MAX_CONCURRENT_VERIFICATIONS),
            challenge: HeaderValue::from_static(CHALLENGE),
        })
    }

    pub fn challenge(&self) -> &HeaderValue {
        &self.challenge
    }

    /// The users of the current file, reading it again if it changed.
    fn users(&self) -> Result<Arc<Users>, HtpasswdError> {
        let now = stamp(&self.path).ok();
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if now != loaded.stamp || now.is_none() {
            let users = match now {
                Some(_) => load(&self.path).map(Arc::new),
                None => {
                    Err(HtpasswdError::Read { path: self.path.display().to_string(), reason: "cannot stat".into() })
                }
            };
            let changed = now != loaded.stamp;
            match &users {
                Ok(u) => info!(file = %self.path.display(), users = u.len(), "inspector API: htpasswd file reloaded"),
                // Logged once per version of the file, not once per request.
                Err(e) if changed => {
                    error!(error = %e, "inspector API: the htpasswd file is unusable; refusing every operator call")
                }
                Err(_) => {}
            }
            *loaded = Loaded { stamp: now, users };
            self.cache.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
        loaded.users.clone()
    }

    /// Ok when `password` is `user`'s; a 401 otherwise (500 when the file is unusable).
    pub async fn verify(&self, user: &str, password: &[u8]) -> Result<(), Refusal> {
        let users = self.users().map_err(|_| {
            Refusal::status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Authentication is unavailable: see the control plane's log",
            )
        })?;
        let key = self.keyer.key(&[user.as_bytes(), password]);
        if self.cached(&key) {
            return Ok(());
        }
        // An unknown user is checked against some other entry (its result ignored), so it costs as much.
        let (hash, known) = match users.0.get(user) {
            Some(h) => (h.clone(), true),
            None => match users.0.values().next() {
                Some(h) => (h.clone(), false),
                None => (String::new(), false),
            },
        };
        let ok = if hash.is_empty() {
            false
        } else {
            let _permit = self.slots.acquire().await.map_err(|_| {
                Refusal::status(StatusCode::SERVICE_UNAVAILABLE, "Authentication is unavailable: shutting down")
            })?;
            let password = password.to_vec();
            let matched = tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash).unwrap_or(false))
                .await
                .unwrap_or(false);
            matched && known
        };
        if ok {
            self.remember(key);
            return Ok(());
        }
        if known {
            crate::refused!(
                "basic-password",
                user,
                "inspector API: HTTP basic authentication failed: wrong password (401); check the client's password against the htpasswd file"
            );
        } else {
            // Not the name: a mistyped password sometimes lands in the user field.
            crate::refused!(
                "basic-user",
                "unknown user",
                "inspector API: HTTP basic authentication failed: unknown user (401); add the user to the htpasswd file or fix the client"
            );
        }
        Err(Refusal::unauthorized("Incorrect username or password", &self.challenge))
    }

    fn cached(&self, key: &[u8; 32]) -> bool {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.get(key).is_some_and(|until| *until > Instant::now())
    }

    fn remember(&self, key: [u8; 32]) {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if cache.len() >= CACHE_ENTRIES {
            cache.retain(|_, until| *until > now);
            if cache.len() >= CACHE_ENTRIES {
                warn!("inspector API: the HTTP basic verification cache is full; emptied");
                cache.clear();
            }
        }
        cache.insert(key, now + CACHE_TTL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(pw: &str) -> String {
        bcrypt::hash(pw, 4).unwrap()
    }

    #[test]
    fn parses_bcrypt_entries_and_names_bad_lines() {
        let h = hash("secret");
        let text = format!("# operators\n\nalice:{h}\nbob:{}\n", h.replacen("$2b$", "$2y$", 1));
        let users = parse("f", &text).unwrap();
        assert_eq!(users.len(), 2);
        assert!(!format!("{users:?}").contains(&h[7..]), "Debug shows names only: {users:?}");
        let md5 = "carol:$apr1$abcdefgh$0123456789abcdefghijkl";
        let e = parse("f", &format!("alice:{h}\n{md5}\n")).unwrap_err();
        assert_eq!(e, HtpasswdError::NotBcrypt { path: "f".into(), line: 2, user: "carol".into() });
        assert!(!e.to_string().contains("apr1$abcdefgh"), "the hash is never in the message: {e}");
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = parse("f", "carol:{SHA}fEqNCco3Yq9h5ZUglD3CZJT4lBs=\n").unwrap_err();
        assert!(matches!(e, HtpasswdError::NotBcrypt { line: 1, .. }), "{e}");
        assert!(matches!(parse("f", "just-a-name\n").unwrap_err(), HtpasswdError::Malformed { line: 1, .. }));
        assert!(matches!(parse("f", "x:$2y$05$short\n").unwrap_err(), HtpasswdError::BadBcrypt { line: 1, .. }));
        let e = parse("f", &format!("a:{h}\n\na:{h}\n")).unwrap_err();
        assert!(matches!(e, HtpasswdError::Duplicate { line: 3, first: 1, .. }), "{e}");
    }

    #[tokio::test]
    async fn verifies_caches_and_reloads() {
        let dir = std::env::temp_dir().join(format!("ig-htpasswd-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("htpasswd");
        std::fs::write(&file, format!("alice:{}\n", hash("right"))).unwrap();
        let auth = HtpasswdAuth::open(file.to_str().unwrap()).unwrap();
        auth.verify("alice", b"right").await.unwrap();
        auth.verify("alice", b"right").await.unwrap();
        let e = auth.verify("alice", b"wrong").await.unwrap_err();
        assert_eq!(e.status, StatusCode::UNAUTHORIZED);
        assert_eq!(e.challenge.unwrap(), CHALLENGE);
        assert_eq!(auth.verify("mallory", b"right").await.unwrap_err().status, StatusCode::UNAUTHORIZED);
        // A new password: the cached success is forgotten with the old file.
        std::fs::write(&file, format!("alice:{}\nbob:{}\n", hash("new"), hash("bobs"))).unwrap();
        assert_eq!(auth.verify("alice", b"right").await.unwrap_err().status, StatusCode::UNAUTHORIZED);
        auth.verify("alice", b"new").await.unwrap();
        auth.verify("bob", b"bobs").await.unwrap();
        // An invalid file refuses everyone, then works again once fixed.
        std::fs::write(&file, "alice:plaintext-password-oops\n").unwrap();
        assert_eq!(auth.verify("alice", b"new").await.unwrap_err().status, StatusCode::INTERNAL_SERVER_ERROR);
        std::fs::write(&file, format!("alice:{}\n", hash("new"))).unwrap();
        auth.verify("alice", b"new").await.unwrap();
        std::fs::remove_file(&file).unwrap();
        assert_eq!(auth.verify("alice", b"new").await.unwrap_err().status, StatusCode::INTERNAL_SERVER_ERROR);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
