//! A private MariaDB for end-to-end tests: the database several Ironic conductors share in production.
//!
//! [`MariaDb::start`] initialises a data directory of its own under the test's [`TempDir`] (`mariadb-install-db`),
//! runs Debian's `mariadbd` on it with networking off and a unix socket in that directory (a path-named socket is
//! reachable from every network namespace, so conductors in three namespaces share it without a network), creates
//! the database `ironic` and its user, and kills the server and removes its files on drop. It never touches the
//! host's MariaDB service or its files (`--no-defaults`: no `/etc/mysql` configuration is read).
//!
//! [`MariaDb::ironic_schema`] creates Ironic's schema (`ironic-dbsync create_schema`), as an operator does once
//! before the first conductor starts.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{Proc, SETUP_DEADLINE, TempDir, run_ok, secrets, unique, wait_for};

const MARIADBD: &str = "/usr/sbin/mariadbd";
const INSTALL_DB: &str = "/usr/bin/mariadb-install-db";
const CLIENT: &str = "/usr/bin/mariadb";

/// Options of the server and of `mariadb-install-db` (which starts it in bootstrap mode with the same ones): small
/// and unsafe on power loss, which a test's throw-away database does not mind.
const SERVER_OPTS: &[&str] = &[
    "--innodb-buffer-pool-size=32M",
    "--innodb-log-file-size=8M",
    "--innodb-flush-log-at-trx-commit=0",
    "--innodb-doublewrite=0",
    "--skip-log-bin",
    "--skip-name-resolve",
];

/// A running private `mariadbd` with the database `ironic`.
#[derive(Debug)]
pub struct MariaDb {
    proc: Proc,
    /// The server's unix socket.
    pub socket: PathBuf,
    /// The `ironic` user's password (registered as a secret: no daemon may log it).
    password: String,
    /// Where the data, socket and logs live (removed on drop).
    dir: PathBuf,
    /// How long initialising and starting took (install-db, server ready, database and user created).
    pub setup: Duration,
}

impl MariaDb {
    /// A fresh server with an empty database `ironic` owned by the user `ironic`.
    pub fn start(dir: &TempDir) -> Self {
        for p in [MARIADBD, INSTALL_DB, CLIENT] {
            assert!(Path::new(p).exists(), "{p} is missing: scripts/install-deps.sh installs mariadb-server");
        }
        let t = Instant::now();
        // A short path: a unix socket's path must fit in 108 bytes.
        let root = dir.join(&unique("mdb"));
        let data = root.join("data");
        std::fs::create_dir_all(&root).expect("MariaDB dir");
        let log = root.join("install.log");
        let mut install = Command::new(INSTALL_DB);
        install
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args(["--user=root", "--auth-root-authentication-method=socket", "--skip-test-db"])
            .args(SERVER_OPTS);
        let out = install.output().expect("run mariadb-install-db");
        std::fs::write(&log, [&out.stdout[..], &out.stderr[..]].concat()).expect("write install.log");
        assert!(
            out.status.success(),
            "mariadb-install-db failed ({}):\n{}",
            out.status,
            std::fs::read_to_string(&log).unwrap_or_default()
        );

        let socket = root.join("mysqld.sock");
        let mut cmd = Command::new(MARIADBD);
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--pid-file={}", root.join("mysqld.pid").display()))
            .args(["--user=root", "--skip-networking", "--max-connections=500"])
            .args(SERVER_OPTS);
        // Its error log goes to stderr, which Proc keeps (and prints if the test fails).
        let proc = Proc::spawn("mariadbd", cmd, root.join("mariadbd.log"));
        let password = unique("ironic-db-pw");
        secrets::register(&password);
        let mut me = Self { proc, socket, password, dir: root, setup: Duration::ZERO };
        let up = wait_for(SETUP_DEADLINE, || me.sql_as_root("SELECT 1").status.success().then_some(()));
        assert!(up.is_some(), "mariadbd did not start:\n{}", me.proc.log_text());
        let setup = format!(
            "CREATE DATABASE ironic CHARACTER SET utf8mb3; \
             CREATE USER 'ironic'@'localhost' IDENTIFIED BY '{pw}'; \
             GRANT ALL PRIVILEGES ON ironic.* TO 'ironic'@'localhost';",
            pw = me.password
        );
        let out = me.sql_as_root(&setup);
        assert!(out.status.success(), "creating the ironic database failed: {}", String::from_utf8_lossy(&out.stderr));
        me.setup = t.elapsed();
        me
    }

    /// Runs SQL as MariaDB's root (socket authentication: the test runs as root).
    pub fn sql_as_root(&self, sql: &str) -> std::process::Output {
        Command::new(CLIENT)
            .arg("--no-defaults")
            .arg(format!("--socket={}", self.socket.display()))
            .args(["-uroot", "--batch", "--skip-column-names", "-e", sql])
            .output()
            .expect("run the mariadb client")
    }

    /// Runs a query in the `ironic` database as root; its standard output.
    pub fn query(&self, sql: &str) -> String {
        let out = self.sql_as_root(&format!("USE ironic; {sql}"));
        assert!(out.status.success(), "query {sql:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The SQLAlchemy URL Ironic's `[database] connection` takes (PyMySQL over the unix socket).
    pub fn ironic_url(&self) -> String {
        format!("mysql+pymysql://ironic:{}@localhost/ironic?unix_socket={}", self.password, self.socket.display())
    }

    /// Creates Ironic's schema in the database (`ironic-dbsync create_schema`); returns how long it took.
    pub fn ironic_schema(&self) -> Duration {
        let t = Instant::now();
        let conf = self.dir.join("dbsync.conf");
        std::fs::write(&conf, format!("[database]\nconnection = {}\n", self.ironic_url())).expect("write dbsync.conf");
        run_ok(
            Command::new(crate::ironic::venv_bin("ironic-dbsync")).arg("--config-file").arg(&conf).arg("create_schema"),
        );
        t.elapsed()
    }
}

impl Drop for MariaDb {
    fn drop(&mut self) {
        self.proc.kill();
        if !std::thread::panicking() && std::env::var_os("IRONGUARD_KEEP_TEST_DIRS").is_none_or(|v| v != "1") {
            let _ = std::fs::remove_dir_all(self.dir.join("data"));
        }
    }
}
