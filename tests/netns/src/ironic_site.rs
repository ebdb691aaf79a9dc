//! A PXE site around a real Ironic 39: a PXE host namespace with dnsmasq, [`RealIronic`], ironguard's control plane
//! (embedded store, unknown MACs denied, the ironic-inspector API on the PXE bridge at [`INSPECTOR`]) and an agent
//! that leads, plus `n` node namespaces. The tests of `real_ironic*.rs` drive it as users would: `ironguardctl`,
//! the OpenStack client, and ironic-python-agent's own callback code from a node's namespace.

use std::process::Output;
use std::time::{Duration, Instant};

use ironguard_dataplane::MacAddr;
use serde_json::Value;

use crate::ironic::{RealIronic, venv_bin};
use crate::keystone::{RealKeystone, SERVICE_PASSWORD};
use crate::{
    ControlPlane, Netns, Proc, PxeLan, SETUP_DEADLINE, TempDir, agent_toml, ctl, dhcp, dhcp_refused,
    kernel_filter_refuses, start_agent, verdict, wait_for,
};

/// The agent's admin endpoint inside the PXE host namespace.
pub const AGENT_ADMIN: &str = "127.0.0.1:9181";
/// ironguard's ironic-inspector API, as the nodes reach it.
pub const INSPECTOR: &str = "http://10.77.0.1:5050";

#[derive(Debug)]
pub struct IronicSite {
    // Dropped in this order: the processes (printing their logs if the test failed), then the namespaces and the
    // directory holding those logs.
    pub agent: Proc,
    pub cp: ControlPlane,
    /// With [`IronicSite::with_keystone`]: the Keystone the inspector API validates tokens with.
    pub keystone: Option<RealKeystone>,
    pub ironic: RealIronic,
    pub lan: PxeLan,
    page_size: u32,
}

impl IronicSite {
    /// `n` nodes; the control plane lists Ironic `page_size` items per page.
    pub fn new(n: usize, page_size: u32) -> Self {
        Self::with_config(n, page_size, "")
    }

    /// Like [`IronicSite::new`], with more control-plane configuration (TOML) merged over the base configuration:
    /// its keys win, e.g. `[filter]\nunknown_mac_policy = "while-inspecting"\n[processing]\nadd_ports = "all"`.
    pub fn with_config(n: usize, page_size: u32, extra: &str) -> Self {
        Self::build(n, page_size, extra, false)
    }

    /// Like [`IronicSite::new`], with a real Keystone in the PXE host's namespace ([`RealKeystone`]) and the
    /// inspector API's `auth_strategy = "keystone"` validating tokens with it as user `ironguard`.
    pub fn with_keystone(n: usize, page_size: u32) -> Self {
        Self::build(n, page_size, "", true)
    }

    fn build(n: usize, page_size: u32, extra: &str, keystone: bool) -> Self {
        let lan = PxeLan::new(n);
        let ironic = RealIronic::start(&lan.pxe, &lan.dir, 6385);
        let keystone = keystone.then(|| RealKeystone::start(&lan.pxe, &lan.dir));
        let extra = match &keystone {
            Some(k) => format!(
                "[inspector_api]\ninsecure = false\nauth_strategy = \"keystone\"\nkeystone_url = \"{}\"\n\
                 keystone_username = \"ironguard\"\nkeystone_password = \"{SERVICE_PASSWORD}\"\n\
                 keystone_project_name = \"service\"\n{extra}",
                k.url
            ),
            None => extra.to_string(),
        };
        let cfg = lan.dir.join("controlplane.toml");
        std::fs::write(&cfg, config(&ironic.url, page_size, &extra)).expect("write controlplane.toml");
        let cp = ControlPlane::start(&lan.pxe, &lan.dir, 9100, 9101, &["--config", cfg.to_str().unwrap_or_default()]);
        let agent = start_agent(&lan.pxe, &lan.dir, &agent_toml("agent-r", &cp.url(), "br0", AGENT_ADMIN, 30), None);
        let leader = wait_for(SETUP_DEADLINE, || (verdict(&lan.pxe) == "LEADER").then_some(()));
        assert!(leader.is_some(), "the agent did not lead:\n{}", agent.log_text());
        Self { agent, cp, keystone, ironic, lan, page_size }
    }

    /// Stops the control plane (SIGTERM), rewrites its configuration with `extra` instead, and starts it again on
    /// the same data: what an operator does to change an option.
    pub fn reconfigure(&mut self, extra: &str) {
        self.cp.proc.signal(nix::sys::signal::Signal::SIGTERM);
        assert!(self.cp.proc.wait_exit(SETUP_DEADLINE).is_some(), "the control plane did not stop");
        let cfg = self.lan.dir.join("controlplane.toml");
        std::fs::write(&cfg, config(&self.ironic.url, self.page_size, extra)).expect("write controlplane.toml");
        self.cp.restart(&self.lan.pxe, &self.lan.dir);
    }

    pub fn ctl(&self, args: &[&str]) -> Output {
        ctl(&self.lan.pxe, args)
    }

    /// `ironguardctl ARGS`, which must succeed; its standard output.
    pub fn ctl_ok(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert!(
            out.status.success(),
            "ironguardctl {args:?} failed: {}{}\ncontrol plane log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.cp.proc.log_text()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// (allow reasons, deny reasons) of a MAC in the control plane's filter state.
    pub fn reasons(&self, m: MacAddr) -> (Vec<String>, Vec<String>) {
        let v: Value = serde_json::from_str(&self.ctl_ok(&["filters", "show", "--json", "--mac", &m.to_string()]))
            .expect("filters show --json");
        let e = v["entries"].as_array().and_then(|a| a.first()).cloned().unwrap_or(Value::Null);
        let list = |k: &str| {
            e[k].as_array().map(|a| a.iter().filter_map(|r| r.as_str().map(String::from)).collect()).unwrap_or_default()
        };
        (list("allow_reasons"), list("deny_reasons"))
    }

    /// `ironguardctl inspect status UUID --json`.
    pub fn inspection_state(&self, uuid: &str) -> Value {
        serde_json::from_str(&self.ctl_ok(&["inspect", "status", uuid, "--json"])).expect("inspect status --json")
    }

    /// Waits until the inspection of `uuid` is in `want`; panics with the control plane's log on timeout.
    pub fn wait_inspection(&self, uuid: &str, want: &str, timeout: Duration) -> Value {
        let t = Instant::now();
        loop {
            let s = self.inspection_state(uuid);
            if s["state"] == want {
                return s;
            }
            assert!(
                t.elapsed() < timeout,
                "inspection of {uuid} never reached {want}: {s}\n{}",
                self.cp.proc.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The processed data stored for `uuid` (`ironguardctl inspect data`).
    pub fn data(&self, uuid: &str) -> Value {
        serde_json::from_str(&self.ctl_ok(&["inspect", "data", uuid])).expect("inspect data")
    }

    /// `ironguardctl inspect start NODE`, then waits until the node may boot (`waiting`).
    pub fn start_inspection(&self, node: &str, uuid: &str) {
        self.ctl_ok(&["inspect", "start", node]);
        self.wait_inspection(uuid, "waiting", Duration::from_secs(20));
    }

    /// `openstack --os-auth-type none --inspector-url INSPECTOR baremetal introspection ARGS` from the PXE host:
    /// (success, standard output and error).
    pub fn openstack(&self, args: &[&str]) -> (bool, String) {
        let out = self
            .lan
            .pxe
            .cmd(venv_bin("openstack"))
            .args(["--os-auth-type", "none", "--inspector-url", INSPECTOR, "baremetal", "introspection"])
            .args(args)
            .env("PYTHONWARNINGS", "ignore")
            .output()
            .expect("run openstack");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    }
}

fn config(ironic_url: &str, page_size: u32, extra: &str) -> String {
    let mut base: toml::Table = base_config(ironic_url, page_size).parse().expect("the base configuration parses");
    let extra: toml::Table = extra.parse().expect("the extra configuration parses");
    merge(&mut base, extra);
    base.to_string()
}

/// `over`'s keys into `into`, tables merged key by key.
fn merge(into: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (into.get_mut(&k), v) {
            (Some(toml::Value::Table(a)), toml::Value::Table(b)) => merge(a, b),
            (_, v) => {
                into.insert(k, v);
            }
        }
    }
}

fn base_config(ironic_url: &str, page_size: u32) -> String {
    format!(
        "[server]\ninspector_listen = \"10.77.0.1:5050\"\n\n[inspector_api]\ninsecure = true\n\n\
         [filter]\nunknown_mac_policy = \"deny\"\n\n\
         [ironic]\nurl = \"{ironic_url}\"\nretries = 3\nretry_backoff_ms = 100\npage_size = {page_size}\n\n\
         [inspection]\nworkers = 2\ntake_timeout_ms = 200\nallow_timeout_secs = 15\n\n\
         [sync]\nironic_sync_secs = 1\nironic_inspection = true\nironic_inspection_period_ms = 300\n\
         timeout_check_secs = 5\n"
    )
}

/// A node's DHCP outcome from the PXE host `pxe`, waited for (up to `timeout`) until it is `want`: a lease,
/// retried; or none, once the kernel of `pxe` refuses `m`, shown by one DISCOVER that gets no offer.
pub fn dhcp_becomes(pxe: &Netns, node: &Netns, m: MacAddr, want: bool, timeout: Duration) -> bool {
    if want {
        return wait_for(timeout, || dhcp(node, "eth0", m)).is_some();
    }
    wait_for(timeout, || kernel_filter_refuses(pxe, m).then_some(())).is_some()
        && dhcp_refused(node, "eth0", m).is_none()
}

/// ironic-python-agent's own `call_inspector`, run in `node`'s namespace with `addr` on its interface (the address
/// its DHCP lease would give the ramdisk): (exit ok, stdout, stderr).
pub fn ipa_callback(node: &Netns, addr: &str, dir: &TempDir, data: &Value) -> (bool, String, String) {
    node.ip(&["addr", "replace", &format!("{addr}/24"), "dev", "eth0"]);
    let path = dir.join(&format!("ipa-data-{}.json", node.name()));
    std::fs::write(&path, data.to_string()).expect("write the ramdisk's data");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ironic/ipa_callback.py");
    let out = node
        .cmd(venv_bin("python"))
        .arg(script)
        .arg(&path)
        .args(["--inspection_callback_url", &format!("{INSPECTOR}/v1/continue")])
        .env("PYTHONWARNINGS", "ignore")
        .output()
        .expect("run ipa_callback.py");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
