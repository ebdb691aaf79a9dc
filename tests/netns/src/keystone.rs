//! A real OpenStack Keystone for end-to-end tests.
//!
//! [`RealKeystone::start`] serves Keystone (the release pinned in `tests/ironic/constraints.txt`, from the virtual
//! environment of `scripts/ironic-venv.sh`) with gunicorn on `127.0.0.1:`[`KEYSTONE_PORT`] inside a test namespace:
//! sqlite, fernet tokens. Its database and keys are made once per virtual environment (`keystone-manage db_sync`,
//! `fernet_setup`, `credential_setup`, `bootstrap`) and copied for each Keystone; the identities of the tests are
//! then created through Keystone's API (`tests/ironic/keystone_users.py`):
//!
//! - `admin` (password [`ADMIN_PASSWORD`]), project `admin`, role `admin`: an operator;
//! - `ironguard` ([`SERVICE_PASSWORD`]), project `service`, role `service`: the identity the inspector API
//!   validates tokens with;
//! - `viewer` ([`VIEWER_PASSWORD`]), role `reader` on project `admin` only: a valid token without an operator role.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::ironic::{venv, venv_bin};
use crate::{Netns, Proc, TempDir, run_ok, unique, wait_tcp_listen};

/// Where Keystone listens inside its namespace.
pub const KEYSTONE_PORT: u16 = 15000;
pub const ADMIN_PASSWORD: &str = "admin-secret-39";
pub const SERVICE_PASSWORD: &str = "ironguard-secret-39";
pub const VIEWER_PASSWORD: &str = "viewer-secret-39";

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../ironic")
}

fn url() -> String {
    format!("http://127.0.0.1:{KEYSTONE_PORT}/v3")
}

/// keystone.conf for the state in `state`.
fn config(state: &Path) -> String {
    let p = |name: &str| state.join(name).display().to_string();
    format!(
        "[DEFAULT]\nlog_file = {log}\n\n[database]\nconnection = sqlite:///{db}\n\n[token]\nprovider = fernet\n\
         expiration = 3600\n\n[fernet_tokens]\nkey_repository = {fernet}\n\n[fernet_receipts]\nkey_repository = \
         {receipts}\n\n[credential]\nkey_repository = {credential}\n",
        log = p("keystone.log"),
        db = p("keystone.sqlite"),
        fernet = p("fernet-keys"),
        receipts = p("fernet-receipts"),
        credential = p("credential-keys"),
    )
}

const STATE: [&str; 4] = ["keystone.sqlite", "fernet-keys", "fernet-receipts", "credential-keys"];

/// A bootstrapped Keystone's database and keys, made once and kept in the virtual environment (whose Keystone
/// version they belong to).
fn template() -> &'static Path {
    static T: OnceLock<PathBuf> = OnceLock::new();
    T.get_or_init(|| {
        let done = venv().join("ironguard-keystone-template");
        if done.is_dir() {
            return done;
        }
        let tmp = venv().join(unique("ironguard-keystone-template.part"));
        std::fs::create_dir_all(&tmp).expect("template dir");
        let conf = tmp.join("keystone.conf");
        std::fs::write(&conf, config(&tmp)).expect("write keystone.conf");
        let manage = |args: &[&str]| {
            run_ok(Command::new(venv_bin("keystone-manage")).arg("--config-file").arg(&conf).args(args));
        };
        manage(&["db_sync"]);
        manage(&["fernet_setup", "--keystone-user", "root", "--keystone-group", "root"]);
        manage(&["credential_setup", "--keystone-user", "root", "--keystone-group", "root"]);
        let u = url();
        manage(&[
            "bootstrap",
            "--bootstrap-password",
            ADMIN_PASSWORD,
            "--bootstrap-admin-url",
            &u,
            "--bootstrap-public-url",
            &u,
            "--bootstrap-internal-url",
            &u,
            "--bootstrap-region-id",
            "RegionOne",
        ]);
        // Renamed into place whole: a parallel test process sees no template or a complete one.
        if std::fs::rename(&tmp, &done).is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        assert!(done.is_dir(), "the Keystone template was not made");
        done
    })
}

fn copy_dir(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).expect("create dir");
        for e in std::fs::read_dir(from).expect("read dir") {
            let e = e.expect("dir entry");
            copy_dir(&e.path(), &to.join(e.file_name()));
        }
    } else {
        std::fs::copy(from, to).expect("copy");
    }
}

/// A running Keystone in a namespace. Killed with its namespace's other processes when dropped.
#[derive(Debug)]
pub struct RealKeystone {
    pub proc: Proc,
    /// The identity endpoint as seen from inside the namespace, `http://127.0.0.1:15000/v3`.
    pub url: String,
}

impl RealKeystone {
    pub fn start(ns: &Netns, dir: &TempDir) -> Self {
        let state = dir.join("keystone");
        std::fs::create_dir_all(&state).expect("Keystone's state dir");
        for name in STATE {
            copy_dir(&template().join(name), &state.join(name));
        }
        let conf = state.join("keystone.conf");
        std::fs::write(&conf, config(&state)).expect("write keystone.conf");
        let mut cmd = ns.cmd(venv_bin("gunicorn"));
        cmd.arg("--chdir")
            .arg(scripts())
            .args(["--bind", &format!("127.0.0.1:{KEYSTONE_PORT}"), "--workers", "2", "--timeout", "120"])
            .arg("keystone_wsgi:application")
            .env("OS_KEYSTONE_CONFIG_FILES", &conf)
            .env("PYTHONWARNINGS", "ignore");
        let proc = Proc::spawn("keystone", cmd, dir.join("keystone-gunicorn.log"));
        let me = Self { proc, url: url() };
        // Wait bounds for a process that never comes up, not measurements (Keystone imports as much as Ironic).
        let up = wait_tcp_listen(ns, KEYSTONE_PORT, Duration::from_secs(240))
            && crate::wait_for(Duration::from_secs(120), || {
                // Keystone's root answers 300 (its versions): any answer below 400 is Keystone serving.
                let r = crate::http::request(ns.name(), "GET", &me.url, &[], None, Duration::from_secs(10)).ok()?;
                (r.status < 400).then_some(())
            })
            .is_some();
        assert!(up, "Keystone did not start:\n{}\n{}", me.proc.log_text(), me.log_text());
        let out = ns
            .cmd(venv_bin("python"))
            .arg(scripts().join("keystone_users.py"))
            .args([me.url.as_str(), ADMIN_PASSWORD, SERVICE_PASSWORD, VIEWER_PASSWORD])
            .env("PYTHONWARNINGS", "ignore")
            .output()
            .expect("run keystone_users.py");
        assert!(
            out.status.success(),
            "keystone_users.py failed: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            me.log_text()
        );
        me
    }

    /// Keystone's own log (its configuration's `log_file`, beside gunicorn's).
    pub fn log_text(&self) -> String {
        let log = self.proc.log.parent().map(|d| d.join("keystone").join("keystone.log")).unwrap_or_default();
        std::fs::read_to_string(log).unwrap_or_default()
    }

    /// `openstack` run in `ns` with `user`'s password for project `admin` (the OpenStack client gets a token
    /// from this Keystone and sends it), then `args`: (success, standard output and error).
    pub fn openstack(&self, ns: &Netns, user: &str, password: &str, args: &[&str]) -> (bool, String) {
        let out = ns
            .cmd(venv_bin("openstack"))
            .args(["--os-auth-type", "password", "--os-auth-url", &self.url, "--os-username", user])
            .args(["--os-password", password, "--os-project-name", "admin"])
            .args(["--os-user-domain-id", "default", "--os-project-domain-id", "default"])
            .args(["--os-identity-api-version", "3"])
            .args(args)
            .env("PYTHONWARNINGS", "ignore")
            .output()
            .expect("run openstack");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    }
}
