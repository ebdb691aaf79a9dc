//! A real etcd for tests: a single-member cluster on loopback (or inside a namespace), removed on drop, of either
//! release a site may run ([`EtcdRelease`]).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Which etcd server: Debian 12's package (3.4, on PATH: scripts/install-deps.sh) or Debian 13's (3.5, fetched and
/// cached by scripts/etcd-release.sh, which the README's test command runs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EtcdRelease {
    /// etcd 3.4.23 (Debian 12's etcd-server).
    #[default]
    Debian12,
    /// etcd 3.5.16 (Debian 13's etcd-server).
    Debian13,
}

impl EtcdRelease {
    /// The server's `major.minor`, as its version call reports it.
    pub fn minor(self) -> &'static str {
        match self {
            EtcdRelease::Debian12 => "3.4",
            EtcdRelease::Debian13 => "3.5",
        }
    }

    /// The etcd binary. Debian 13's comes from scripts/etcd-release.sh (run here when it is not cached yet, so that
    /// a single test run by hand finds it too).
    pub fn binary(self) -> String {
        match self {
            EtcdRelease::Debian12 => "etcd".into(),
            EtcdRelease::Debian13 => {
                static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
                BIN.get_or_init(|| {
                    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/etcd-release.sh");
                    let out = Command::new(&script).stderr(Stdio::inherit()).output().expect("run etcd-release.sh");
                    assert!(
                        out.status.success(),
                        "{} failed: Debian 13's etcd 3.5 cannot be fetched ({:?})",
                        script.display(),
                        out.status
                    );
                    String::from_utf8_lossy(&out.stdout).trim().to_string()
                })
                .clone()
            }
        }
    }
}

/// Two tokio tests of one body: `$body(release)` on Debian 12's etcd 3.4 (the test `$on_34`) and on Debian 13's 3.5
/// (`$on_35`), for the etcd-backed tests that run on both releases a site may run.
#[macro_export]
macro_rules! on_both_etcd_releases {
    ($body:ident: $on_34:ident, $on_35:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $on_34() {
            $body($crate::EtcdRelease::Debian12).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $on_35() {
            $body($crate::EtcdRelease::Debian13).await
        }
    };
}

/// A running etcd.
#[derive(Debug)]
pub struct EtcdProcess {
    child: Option<Child>,
    pub dir: PathBuf,
    /// Client URL, e.g. `http://127.0.0.1:23790`.
    pub url: String,
    args: Vec<String>,
    netns: Option<String>,
    host: String,
    port: u16,
    /// The etcd binary ([`EtcdRelease::binary`]).
    binary: String,
}

/// Sets the value that follows `flag` in `args`.
fn set_arg(args: &mut [String], flag: &str, value: &str) {
    let i = args.iter().position(|a| a == flag).unwrap_or_else(|| panic!("no {flag} in {args:?}"));
    args[i + 1] = value.to_string();
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

impl EtcdProcess {
    /// Starts etcd on 127.0.0.1 with free ports, in this process's network namespace.
    pub fn start_loopback(tag: &str) -> Self {
        Self::start(tag, None, "127.0.0.1", free_port(), free_port())
    }

    /// [`EtcdProcess::start_loopback`] of the given release.
    pub fn start_loopback_release(tag: &str, release: EtcdRelease) -> Self {
        let mut e = Self::prepare(tag, None, "127.0.0.1", free_port(), free_port());
        e.binary = release.binary();
        e.spawn();
        e
    }

    /// [`EtcdProcess::start_loopback_release`] with etcd's own limits (`--max-txn-ops` 128, as a site runs it),
    /// not the raised one the other tests use.
    pub fn start_loopback_release_default_limits(tag: &str, release: EtcdRelease) -> Self {
        let mut e = Self::prepare(tag, None, "127.0.0.1", free_port(), free_port());
        let i = e.args.iter().position(|a| a == "--max-txn-ops").expect("prepare sets --max-txn-ops");
        e.args.drain(i..i + 2);
        e.binary = release.binary();
        e.spawn();
        e
    }

    /// Starts etcd on 127.0.0.1 serving clients over TLS and requiring client certificates signed by `tls.ca`.
    pub fn start_loopback_tls(tag: &str, tls: &TlsFiles) -> Self {
        let (client, peer) = (free_port(), free_port());
        let mut e = Self::prepare(tag, None, "127.0.0.1", client, peer);
        e.url = format!("https://127.0.0.1:{client}");
        let mut args = e.args.clone();
        set_arg(&mut args, "--listen-client-urls", &e.url);
        set_arg(&mut args, "--advertise-client-urls", &e.url);
        args.extend(
            [
                "--cert-file",
                &tls.server_cert.display().to_string(),
                "--key-file",
                &tls.server_key.display().to_string(),
                "--trusted-ca-file",
                &tls.ca.display().to_string(),
                "--client-cert-auth",
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        e.args = args;
        e.spawn();
        e
    }

    /// Starts etcd listening on `host` inside the named namespace (ports may be fixed: the namespace is private).
    pub fn start_in(tag: &str, netns: &str, host: &str, client_port: u16, peer_port: u16) -> Self {
        Self::start_in_release(tag, netns, host, client_port, peer_port, EtcdRelease::Debian12)
    }

    /// [`EtcdProcess::start_in`] of the given release.
    pub fn start_in_release(
        tag: &str,
        netns: &str,
        host: &str,
        client_port: u16,
        peer_port: u16,
        release: EtcdRelease,
    ) -> Self {
        let mut e = Self::prepare(tag, Some(netns.to_string()), host, client_port, peer_port);
        e.binary = release.binary();
        e.spawn();
        e
    }

    /// Launches member `name` of the cluster `initial_cluster` (`m0=http://10.90.0.21:2380,m1=…`; every member is
    /// given the same `token`), listening on `host` (ports 2379 and 2380) inside the named namespace; not waited for
    /// ([`EtcdProcess::launch`]).
    pub fn launch_member(
        netns: &str,
        host: &str,
        name: &str,
        initial_cluster: &str,
        token: &str,
        release: EtcdRelease,
    ) -> Self {
        let tag = format!("{token}-{name}");
        let mut e = Self::prepare(&tag, Some(netns.to_string()), host, 2379, 2380);
        e.binary = release.binary();
        set_arg(&mut e.args, "--name", name);
        set_arg(&mut e.args, "--initial-cluster", initial_cluster);
        e.args.extend(["--initial-cluster-state", "new", "--initial-cluster-token", token].map(String::from));
        // etcd 3.4 runs without pre-vote by default: a member cut off and back disrupts the cluster's leader (its
        // term went up while it was alone). `IRONGUARD_ETCD_PRE_VOTE=1` runs the members with it, as
        // docs/operations.md recommends for 3.4 (3.5 has it on by default).
        if std::env::var_os("IRONGUARD_ETCD_PRE_VOTE").is_some_and(|v| v == "1") {
            e.args.push("--pre-vote=true".into());
        }
        e.launch();
        e
    }

    fn start(tag: &str, netns: Option<String>, host: &str, client: u16, peer: u16) -> Self {
        let mut e = Self::prepare(tag, netns, host, client, peer);
        e.spawn();
        e
    }

    fn prepare(tag: &str, netns: Option<String>, host: &str, client: u16, peer: u16) -> Self {
        let found = Command::new("sh")
            .args(["-c", "command -v etcd"])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(found, "etcd is missing: the README's test command installs etcd-server");
        let dir = std::env::temp_dir().join(crate::unique(&format!("etcd-{tag}")));
        let _ = std::fs::remove_dir_all(&dir);
        let url = format!("http://{host}:{client}");
        let peer_url = format!("http://{host}:{peer}");
        let args = vec![
            "--name".into(),
            "t".into(),
            "--data-dir".into(),
            dir.display().to_string(),
            "--listen-client-urls".into(),
            url.clone(),
            "--advertise-client-urls".into(),
            url.clone(),
            "--listen-peer-urls".into(),
            peer_url.clone(),
            "--initial-advertise-peer-urls".into(),
            peer_url.clone(),
            "--initial-cluster".into(),
            format!("t={peer_url}"),
            "--max-txn-ops".into(),
            "1024".into(),
        ];
        Self { child: None, dir, url, args, netns, host: host.to_string(), port: client, binary: "etcd".into() }
    }

    fn spawn(&mut self) {
        self.launch();
        self.wait_up(Duration::from_secs(15));
    }

    /// Starts the etcd process (on its data, if it has some) without waiting for it to serve: a member of a cluster
    /// serves only once a quorum of members runs.
    pub fn launch(&mut self) {
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, &self.binary]);
                c
            }
            None => Command::new(&self.binary),
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(format!("{}.log", self.dir.display()))
            .expect("etcd log");
        let child = cmd.args(&self.args).stdout(Stdio::null()).stderr(log).spawn().expect("start etcd");
        self.child = Some(child);
    }

    /// Waits until etcd serves (in a namespace: its `/health` says so, which needs a leader) or `within` has passed,
    /// which fails the test.
    pub fn wait_up(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let up = match &self.netns {
                Some(ns) => crate::http::get_ok(ns, &format!("{}/health", self.url), Duration::from_secs(1)).is_some(),
                None => std::net::TcpStream::connect((self.host.as_str(), self.port)).is_ok(),
            };
            if up {
                break;
            }
            assert!(Instant::now() < deadline, "etcd did not start; see {}.log", self.dir.display());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops etcd (SIGKILL), keeping its data.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Freezes etcd (SIGSTOP): its listening sockets stay open and the kernel still accepts connections, but
    /// nothing answers — a wedged etcd, unlike a stopped one, which refuses at once.
    /// Returns once every thread of etcd has stopped: a signal is only queued when `kill` returns, and on a busy
    /// machine a thread still running could answer a request sent after this.
    pub fn freeze(&self) {
        self.signal(nix::sys::signal::Signal::SIGSTOP);
        let pid = self.child.as_ref().expect("etcd runs").id();
        let stopped = || -> Option<bool> {
            let mut all = true;
            for t in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
                let stat = std::fs::read_to_string(t.ok()?.path().join("stat")).ok()?;
                // "pid (comm) S ...": the state follows the last ')'.
                let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
                all &= matches!(state, 'T' | 't');
            }
            Some(all)
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while stopped() != Some(true) {
            assert!(std::time::Instant::now() < deadline, "etcd (pid {pid}) did not stop on SIGSTOP");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Lets a frozen etcd run again (SIGCONT).
    pub fn thaw(&self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        let child = self.child.as_ref().expect("etcd runs");
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("a pid"));
        nix::sys::signal::kill(pid, sig).expect("signal etcd");
    }

    /// Starts it again on the same data and ports.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// Replaces it by an empty etcd on the same address (its data lost: a rebuilt cluster, same endpoints).
    /// The value that follows `flag` in this member's arguments.
    fn arg(&self, flag: &str) -> String {
        let i = self.args.iter().position(|a| a == flag).unwrap_or_else(|| panic!("no {flag} in {:?}", self.args));
        self.args[i + 1].clone()
    }

    /// Replaces this (stopped) member's data with the snapshot at `snapshot`, as an operator restores a cluster from
    /// a backup: `etcdutl snapshot restore` (Debian 13's etcd 3.5) or `etcdctl snapshot restore` (3.4), with the
    /// member's own name, the cluster and its token, so that the cluster keeps its id. `bump`: `--bump-revision`
    /// and `--mark-compacted` (3.5 only), so that revisions go on past any seen before. Not started.
    pub fn restore_from(&mut self, snapshot: &std::path::Path, bump: Option<u64>) -> Result<(), String> {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
        let mut cmd = if self.binary == "etcd" {
            let mut c = Command::new("etcdctl");
            c.env("ETCDCTL_API", "3");
            c
        } else {
            Command::new(std::path::Path::new(&self.binary).with_file_name("etcdutl"))
        };
        cmd.arg("snapshot").arg("restore").arg(snapshot);
        cmd.args(["--data-dir", &self.dir.display().to_string()]);
        cmd.args(["--name", &self.arg("--name"), "--initial-cluster", &self.arg("--initial-cluster")]);
        cmd.args(["--initial-advertise-peer-urls", &self.arg("--initial-advertise-peer-urls")]);
        if self.args.iter().any(|a| a == "--initial-cluster-token") {
            cmd.args(["--initial-cluster-token", &self.arg("--initial-cluster-token")]);
        }
        if let Some(b) = bump {
            if self.binary == "etcd" {
                return Err("etcd 3.4's snapshot restore has no --bump-revision".into());
            }
            cmd.args(["--bump-revision", &b.to_string(), "--mark-compacted"]);
        }
        let out = cmd.output().map_err(|e| format!("snapshot restore: {e}"))?;
        if !out.status.success() {
            return Err(format!("snapshot restore: {}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(())
    }

    pub fn replace_with_empty(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
        self.spawn();
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(format!("{}.log", self.dir.display()));
    }
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl.
#[derive(Debug)]
pub struct TlsFiles {
    pub dir: crate::TempDir,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl TlsFiles {
    pub fn generate() -> Self {
        let dir = crate::TempDir::new("tls");
        let p = |n: &str| dir.join(n);
        let sh = |script: &str| {
            let st = Command::new("sh").arg("-c").arg(script).current_dir(dir.path()).stderr(Stdio::null()).status();
            assert!(st.is_ok_and(|s| s.success()), "openssl failed: {script}");
        };
        sh("openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=test-ca");
        std::fs::write(p("server.ext"), "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
            .expect("ext");
        sh("openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=etcd");
        sh(
            "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile server.ext",
        );
        std::fs::write(p("client.ext"), "extendedKeyUsage=clientAuth\n").expect("ext");
        sh("openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=ironguard");
        sh(
            "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2 -extfile client.ext",
        );
        Self {
            ca: p("ca.pem"),
            server_cert: p("server.pem"),
            server_key: p("server.key"),
            client_cert: p("client.pem"),
            client_key: p("client.key"),
            dir,
        }
    }
}
