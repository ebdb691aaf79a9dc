//! A real OpenStack Ironic 39 for end-to-end tests.
//!
//! [`RealIronic::start`] runs the single-process `ironic` (API and conductor, `rpc_transport = none`) from the
//! cached virtual environment of `scripts/ironic-venv.sh`, standalone: `noauth`, the `fake-hardware` driver (fake
//! power, management, boot and deploy; `agent` inspection without managed boot, so Ironic only sets PXE and powers
//! on, and relies on a PXE filter such as ironguard), and sqlite. It listens inside a test namespace. The helpers
//! talk to its REST API with curl from inside that namespace: enroll nodes and ports, drive provision states
//! (`manage`, `inspect`, `provide`, `active`, `abort`) and post `/v1/continue_inspection` as the ramdisk would.
//!
//! [`RealIronic::start_conductor`] runs the same process as one conductor of several, as production sites do
//! (Metal3's HA mode, kolla): `rpc_transport = json-rpc` (noauth, like the API), the database a shared MariaDB
//! ([`crate::mariadb::MariaDb`]), and the conductor's name its own address, which is what the other conductors' API
//! connects to for JSON-RPC (Ironic resolves a conductor's `host` to reach it; Metal3 sets it to the address too).
//!
//! When the virtual environment is missing it is made on first use (PyPI); when that fails the test fails.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ironguard_dataplane::MacAddr;
use serde_json::{Value, json};

use crate::{Netns, Proc, TempDir, run_ok, unique, wait_tcp_listen};

/// The Ironic release the tests run against (pinned with every dependency in `tests/ironic/constraints.txt`).
pub const IRONIC_VERSION: &str = "39.0.0";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The virtual environment with Ironic and the OpenStack clients (made by `scripts/ironic-venv.sh` if needed).
pub fn venv() -> &'static Path {
    static VENV: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let r = VENV.get_or_init(|| {
        let out = Command::new("bash")
            .arg(repo_root().join("scripts/ironic-venv.sh"))
            .output()
            .map_err(|e| format!("cannot run scripts/ironic-venv.sh: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "scripts/ironic-venv.sh failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    });
    match r {
        Ok(p) => p,
        Err(e) => panic!("cannot set up the real Ironic: {e}"),
    }
}

/// A program of the virtual environment (`ironic`, `baremetal`, `openstack`, `python`).
pub fn venv_bin(name: &str) -> PathBuf {
    venv().join("bin").join(name)
}

/// An empty Ironic database with the current schema, made once (kept in the virtual environment, whose Ironic
/// version it belongs to) and copied for each Ironic.
fn template_db() -> &'static Path {
    static DB: OnceLock<PathBuf> = OnceLock::new();
    DB.get_or_init(|| {
        let db = venv().join("ironguard-template.sqlite");
        if db.is_file() {
            return db;
        }
        let tmp = std::env::temp_dir().join(unique("ironic-template"));
        std::fs::create_dir_all(&tmp).expect("template dir");
        let conf = tmp.join("dbsync.conf");
        let fresh = tmp.join("ironic.sqlite");
        std::fs::write(&conf, format!("[database]\nconnection = sqlite:///{}\n", fresh.display())).expect("write conf");
        run_ok(Command::new(venv_bin("ironic-dbsync")).arg("--config-file").arg(&conf).arg("create_schema"));
        // Copied next to its final name, then renamed: a parallel test process never sees half a file.
        let part = venv().join(format!("ironguard-template.sqlite.{}", std::process::id()));
        std::fs::copy(&fresh, &part).expect("copy the template");
        std::fs::rename(&part, &db).expect("place the template");
        let _ = std::fs::remove_dir_all(&tmp);
        db
    })
}

/// How an Ironic shares its work: alone, or as one conductor of several.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deployment {
    /// `rpc_transport = none` and a private sqlite database (a copy of the template).
    Alone,
    /// `rpc_transport = json-rpc` on the API's address and `rpc_port`, the database at `db_url` (SQLAlchemy URL,
    /// e.g. [`crate::mariadb::MariaDb::ironic_url`], whose schema already exists), and the conductor named by the
    /// API's address.
    Conductor { db_url: String, rpc_port: u16 },
}

/// A running Ironic 39 in a namespace. Killed with its namespace's other processes when dropped.
#[derive(Debug)]
pub struct RealIronic {
    pub proc: Proc,
    /// `http://HOST:PORT` as seen from inside the namespace.
    pub url: String,
    pub conf: PathBuf,
    /// The conductor's name (`[DEFAULT] host`), as `baremetal conductor list` and a node's `conductor` show it.
    pub conductor: String,
    /// How long the process took to answer its API (start to `GET /` 200).
    pub startup: Duration,
    ns: String,
    log: PathBuf,
    port: u16,
}

impl RealIronic {
    /// Ironic on `127.0.0.1:port` in `ns`.
    pub fn start(ns: &Netns, dir: &TempDir, port: u16) -> Self {
        Self::start_with(ns, dir, "127.0.0.1", port, "")
    }

    /// Ironic on `host:port` in `ns`; `extra_conf` is appended to its configuration (later sections and options
    /// win, e.g. `[api]\nmax_limit = 5\n` or `[fake]\npower_delay = 3\n`).
    pub fn start_with(ns: &Netns, dir: &TempDir, host: &str, port: u16, extra_conf: &str) -> Self {
        Self::launch(ns, dir, host, port, &Deployment::Alone, extra_conf)
    }

    /// One conductor of several (API and conductor in one process, as [`RealIronic::start_with`]) on `host:port`
    /// in `ns`, sharing the database at `db_url` and reaching the others by JSON-RPC on `rpc_port`.
    pub fn start_conductor(
        ns: &Netns,
        dir: &TempDir,
        host: &str,
        port: u16,
        db_url: &str,
        rpc_port: u16,
        extra_conf: &str,
    ) -> Self {
        Self::launch(ns, dir, host, port, &Deployment::Conductor { db_url: db_url.to_string(), rpc_port }, extra_conf)
    }

    /// Starts `ironic` and waits until its API answers.
    pub fn launch(ns: &Netns, dir: &TempDir, host: &str, port: u16, deployment: &Deployment, extra_conf: &str) -> Self {
        let t = Instant::now();
        let tag = match deployment {
            Deployment::Alone => format!("ironic-{port}"),
            Deployment::Conductor { .. } => format!("ironic-{host}-{port}"),
        };
        let state = dir.join(&tag);
        std::fs::create_dir_all(state.join("locks")).expect("ironic state dir");
        let conf = state.join("ironic.conf");
        let (conductor, text) = match deployment {
            Deployment::Alone => {
                let db = state.join("ironic.sqlite");
                std::fs::copy(template_db(), &db).expect("copy the template database");
                let db_url = format!("sqlite:///{}", db.display());
                (
                    "ironguard-test".to_string(),
                    config(host, port, "none", "ironguard-test", &db_url, &state, extra_conf),
                )
            }
            Deployment::Conductor { db_url, rpc_port } => {
                let rpc = format!("[json_rpc]\nhost_ip = {host}\nport = {rpc_port}\n\n{extra_conf}");
                // A conductor on another JSON-RPC port than 8089 registers as `host:port` (Ironic's
                // `prepare_host`), which is how the others then reach it.
                let name = if *rpc_port == 8089 { host.to_string() } else { format!("{host}:{rpc_port}") };
                (name, config(host, port, "json-rpc", host, db_url, &state, &rpc))
            }
        };
        std::fs::write(&conf, text).expect("write ironic.conf");
        let mut cmd = ns.cmd(venv_bin("ironic"));
        cmd.arg("--config-file").arg(&conf);
        let log = dir.join(&format!("{tag}.log"));
        let proc = Proc::spawn("ironic", cmd, log.clone());
        let mut me = Self {
            proc,
            url: format!("http://{host}:{port}"),
            conf,
            conductor,
            startup: Duration::ZERO,
            ns: ns.name().to_string(),
            log,
            port,
        };
        me.wait_up(ns, t);
        me
    }

    /// Waits until the API answers; `startup` is the time since `t`.
    fn wait_up(&mut self, ns: &Netns, t: Instant) {
        // Wait bounds for a process that never comes up, not measurements: Ironic imports hundreds of modules, and
        // beside a CPU hog and the rest of the suite it took over 60 s to listen (T22).
        let up = wait_tcp_listen(ns, self.port, Duration::from_secs(240))
            && crate::wait_for(Duration::from_secs(60), || (self.api("GET", "/", None).0 == 200).then_some(()))
                .is_some();
        assert!(up, "Ironic did not start:\n{}", self.proc.log_text());
        self.startup = t.elapsed();
    }

    /// Stops this Ironic as its service manager would (SIGTERM; SIGKILL after 30 s) and starts it again with the
    /// same configuration, state and log; returns once its API answers (`startup` is then the time from the stop).
    pub fn restart(&mut self, ns: &Netns) {
        assert_eq!(ns.name(), self.ns, "restart Ironic in its own namespace");
        let t = Instant::now();
        self.proc.signal(nix::sys::signal::Signal::SIGTERM);
        if self.proc.wait_exit(Duration::from_secs(30)).is_none() {
            self.proc.kill();
        }
        let mut cmd = ns.cmd(venv_bin("ironic"));
        cmd.arg("--config-file").arg(&self.conf);
        self.proc = Proc::spawn("ironic", cmd, self.log.clone());
        self.wait_up(ns, t);
    }

    /// The namespace this Ironic runs in.
    pub fn ns_name(&self) -> &str {
        &self.ns
    }

    /// `baremetal ARGS -f json` from this Ironic's namespace (noauth, newest microversion): the parsed output;
    /// panics unless the command succeeds.
    pub fn baremetal_json(&self, args: &[&str]) -> Value {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(venv_bin("baremetal"))
            .args(["--os-auth-type", "none", "--os-endpoint", &self.url, "--os-baremetal-api-version", "latest"])
            .args(args)
            .args(["-f", "json"])
            .env("PYTHONWARNINGS", "ignore")
            .output()
            .expect("run baremetal");
        assert!(
            out.status.success(),
            "baremetal {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("baremetal -f json prints JSON")
    }

    /// One API call with the newest microversion; (HTTP status, JSON body or Null).
    pub fn api(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        self.rest().api(method, path, body, Some("latest"))
    }

    /// One API call: (status, response headers, body text).
    pub fn raw(&self, method: &str, path: &str, body: Option<&Value>, version: Option<&str>) -> (u16, String, String) {
        self.rest().raw(method, path, body, version)
    }

    /// Raw HTTP to this Ironic from inside its namespace.
    pub fn rest(&self) -> RestClient {
        RestClient { ns: self.ns.clone(), url: self.url.clone() }
    }

    /// Like [`RealIronic::api`]; panics unless Ironic answers 2xx.
    pub fn api_ok(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let (status, v) = self.api(method, path, body);
        assert!((200..300).contains(&status), "Ironic answered {status} to {method} {path}: {v}");
        v
    }

    /// Enrolls a `fake-hardware` node with a BMC address and one port per MAC (the first is the PXE port);
    /// returns its UUID. The node stays in `enroll`.
    pub fn enroll(&self, name: &str, macs: &[MacAddr], bmc: &str, inspect_interface: &str) -> String {
        let node = self.api_ok(
            "POST",
            "/v1/nodes",
            Some(&json!({"name": name, "driver": "fake-hardware", "inspect_interface": inspect_interface,
                         "driver_info": {"ipmi_address": bmc}})),
        );
        let uuid = node["uuid"].as_str().expect("node uuid").to_string();
        for (i, m) in macs.iter().enumerate() {
            self.api_ok(
                "POST",
                "/v1/ports",
                Some(&json!({"node_uuid": uuid, "address": m.to_string(), "pxe_enabled": i == 0})),
            );
        }
        uuid
    }

    /// The node (all fields).
    pub fn node(&self, ident: &str) -> Value {
        self.api_ok("GET", &format!("/v1/nodes/{ident}"), None)
    }

    pub fn provision_state(&self, ident: &str) -> String {
        self.node(ident)["provision_state"].as_str().unwrap_or_default().to_string()
    }

    pub fn power_state(&self, ident: &str) -> Option<String> {
        self.node(ident)["power_state"].as_str().map(String::from)
    }

    /// `PUT /v1/nodes/{node}/states/provision` with `target`; panics unless Ironic accepts it.
    pub fn provision(&self, ident: &str, target: &str) {
        self.api_ok("PUT", &format!("/v1/nodes/{ident}/states/provision"), Some(&json!({"target": target})));
    }

    /// Waits until the node is in `want`; panics (with its last error) on timeout.
    pub fn wait_provision_state(&self, ident: &str, want: &str, timeout: Duration) -> Value {
        let t = Instant::now();
        loop {
            let n = self.node(ident);
            if n["provision_state"] == want {
                return n;
            }
            assert!(
                t.elapsed() < timeout,
                "node {ident} never reached {want:?}: {} (last_error {})",
                n["provision_state"],
                n["last_error"]
            );
            // Each GET is Python and SQL in Ironic: four a second are enough for a state change that takes seconds.
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Drives a node to `want` from `enroll` or `manageable`: manageable, inspect wait, available or active.
    pub fn drive_to(&self, ident: &str, want: &str) {
        let t = Duration::from_secs(30);
        if want == "enroll" {
            assert_eq!(self.provision_state(ident), "enroll", "a node cannot go back to enroll");
            return;
        }
        if self.provision_state(ident) == "enroll" {
            self.provision(ident, "manage");
            self.wait_provision_state(ident, "manageable", t);
        }
        match want {
            "manageable" => {}
            "inspect wait" => {
                self.provision(ident, "inspect");
                self.wait_provision_state(ident, "inspect wait", t);
            }
            "available" => {
                self.provision(ident, "provide");
                self.wait_provision_state(ident, "available", t);
            }
            "active" => {
                self.drive_to(ident, "available");
                self.api_ok(
                    "PATCH",
                    &format!("/v1/nodes/{ident}"),
                    Some(&json!([{"op": "add", "path": "/instance_info/image_source", "value": "http://image.invalid/x.qcow2"}])),
                );
                self.provision(ident, "active");
                self.wait_provision_state(ident, "active", t);
            }
            other => panic!("drive_to: unsupported target state {other:?}"),
        }
    }

    /// `POST /v1/continue_inspection` (what the ramdisk sends at the end of Ironic's own inspection).
    pub fn continue_inspection(&self, data: &Value) -> (u16, Value) {
        self.api("POST", "/v1/continue_inspection", Some(data))
    }

    /// The node's ports: (address, pxe_enabled).
    pub fn ports(&self, ident: &str) -> Vec<(String, bool)> {
        let v = self.api_ok("GET", &format!("/v1/nodes/{ident}/ports?fields=address,pxe_enabled"), None);
        v["ports"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|p| {
                        (
                            p["address"].as_str().unwrap_or_default().to_string(),
                            p["pxe_enabled"].as_bool() == Some(true),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Raw HTTP ([`crate::http`]) to an Ironic-like API inside a namespace, as an operator's client would send it.
#[derive(Debug, Clone)]
pub struct RestClient {
    pub ns: String,
    pub url: String,
}

impl RestClient {
    /// One call with an optional `X-OpenStack-Ironic-API-Version`: (HTTP status, JSON body or Null).
    pub fn api(&self, method: &str, path: &str, body: Option<&Value>, version: Option<&str>) -> (u16, Value) {
        let (status, _, text) = self.raw(method, path, body, version);
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// One call: (status, response headers in lower case, body text). No answer (refused, timed out, not HTTP)
    /// gives status 0 and nothing else.
    pub fn raw(&self, method: &str, path: &str, body: Option<&Value>, version: Option<&str>) -> (u16, String, String) {
        let mut headers = Vec::new();
        if let Some(v) = version {
            headers.push(("X-OpenStack-Ironic-API-Version", v));
        }
        if body.is_some() {
            headers.push(("Content-Type", "application/json"));
        }
        let data = body.map(|b| b.to_string().into_bytes());
        let url = format!("{}{path}", self.url);
        match crate::http::request(&self.ns, method, &url, &headers, data.as_deref(), Duration::from_secs(30)) {
            Ok(r) => (r.status, r.headers, r.body),
            Err(_) => (0, String::new(), String::new()),
        }
    }
}

/// A minimal inventory as ironic-python-agent sends it: one interface per MAC (the first one PXE-booted), 4 CPUs,
/// 8 GiB of memory, one 20 GiB disk and a BMC address.
pub fn ipa_inventory(macs: &[MacAddr], bmc: &str) -> Value {
    let interfaces: Vec<Value> = macs
        .iter()
        .enumerate()
        .map(|(i, m)| {
            json!({"name": format!("eth{i}"), "mac_address": m.to_string(), "ipv4_address": format!("10.77.0.{}", 10 + i),
                   "ipv6_address": null, "has_carrier": true, "lldp": null, "vendor": "0x1af4", "product": "0x0001",
                   "client_id": null, "biosdevname": null, "speed_mbps": 1000, "pci_address": format!("0000:00:0{}.0", 3 + i),
                   "driver": "virtio_net"})
        })
        .collect();
    json!({
        "inventory": {
            "interfaces": interfaces,
            "cpu": {"model_name": "QEMU Virtual CPU version 2.5+", "frequency": "2400.000", "count": 4,
                    "architecture": "x86_64", "flags": ["fpu", "vme", "lm", "vmx", "sse4_2"], "socket_count": 1},
            "memory": {"total": 8_589_934_592u64, "physical_mb": 8192},
            "disks": [{"name": "/dev/vda", "model": "", "size": 21_474_836_480u64, "rotational": true,
                       "wwn": null, "serial": "disk-1", "vendor": "0x1af4", "wwn_with_extension": null,
                       "wwn_vendor_extension": null, "hctl": null, "by_path": "/dev/disk/by-path/pci-0000:00:05.0",
                       "logical_sectors": 512, "physical_sectors": 512}],
            "bmc_address": bmc, "bmc_v6address": "::/0", "bmc_mac": "52:54:00:aa:bb:cc",
            "system_vendor": {"product_name": "Standard PC (Q35 + ICH9, 2009)", "serial_number": "",
                              "manufacturer": "QEMU", "firmware": {"vendor": "SeaBIOS", "version": "1.16", "build_date": "04/01/2014"}},
            "boot": {"current_boot_mode": "bios", "pxe_interface": macs.first().map(|m| m.to_string())},
            "hostname": "localhost.localdomain"
        },
        "boot_interface": macs.first().map(|m| m.to_string()),
        "root_disk": {"name": "/dev/vda", "size": 21_474_836_480u64, "rotational": true},
        "error": null,
        "logs": ""
    })
}

/// Ironic's configuration: the API on `host:port`, `rpc_transport`, the conductor's name, the database and the
/// state directory (locks); `extra` last, so that its sections and options win.
fn config(host: &str, port: u16, rpc_transport: &str, name: &str, db_url: &str, state: &Path, extra: &str) -> String {
    format!(
        "[DEFAULT]
auth_strategy = noauth
rpc_transport = {rpc_transport}
host = {name}
use_stderr = true
debug = false
enabled_hardware_types = fake-hardware
enabled_bios_interfaces = no-bios
enabled_boot_interfaces = fake
enabled_console_interfaces = no-console
enabled_deploy_interfaces = fake
enabled_firmware_interfaces = no-firmware
enabled_inspect_interfaces = agent,no-inspect
enabled_management_interfaces = fake
enabled_network_interfaces = noop
enabled_power_interfaces = fake
enabled_raid_interfaces = no-raid
enabled_rescue_interfaces = no-rescue
enabled_storage_interfaces = noop
enabled_vendor_interfaces = no-vendor
default_inspect_interface = agent

[api]
host_ip = {host}
port = {port}

[database]
connection = {db_url}

[dhcp]
dhcp_provider = none

[conductor]
automated_clean = false

[inspector]
# Unmanaged in-band inspection: Ironic sets PXE and powers on, and relies on a PXE filter (ironguard).
require_managed_boot = false

[oslo_concurrency]
lock_path = {locks}

{extra}
",
        locks = state.join("locks").display()
    )
}
