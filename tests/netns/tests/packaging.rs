//! Checks of the systemd packaging in `packaging/`: the unit files pass `systemd-analyze verify` with no output,
//! stay within an exposure budget of `systemd-analyze security --offline`, and say what the design needs (a
//! notify + watchdog agent with CAP_NET_ADMIN only, a guard ordered before dnsmasq, a control plane without any
//! capability, all as an unprivileged user); the sysusers.d file creates that user; the example agent
//! configuration is accepted by the agent; and the guard unit's exact command line installs the guard as an
//! unprivileged user holding only the unit's capabilities (in a private network namespace); and no packaged binary
//! carries a test hook.
//!
//! Like every test of this crate, a missing tool is a failure, never a skip: `systemd-analyze` and
//! `systemd-sysusers` come with Debian's `systemd` package.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ironguard_netns_tests::{Netns, TempDir, bin, binary_holds, run_ok};

const AGENT_UNIT: &str = "ironguard-agent.service";
const GUARD_UNIT: &str = "ironguard-guard.service";
const CONTROLPLANE_UNIT: &str = "ironguard-controlplane.service";
const UNITS: [&str; 3] = [GUARD_UNIT, AGENT_UNIT, CONTROLPLANE_UNIT];

const AGENT_EXE: &str = "/usr/bin/ironguard-agent";
const CONTROLPLANE_EXE: &str = "/usr/bin/ironguard-controlplane";
const AGENT_CONFIG: &str = "/etc/ironguard/agent.toml";

/// Lines `systemd-analyze verify` may print without failing the test: (substring, why it is harmless).
///
/// Empty on purpose. `verify` (systemd 252, Debian 12) loads each unit the way the manager would, and checks every
/// `Exec*=` path is an executable (hence the rewrite to the built binaries). It does not resolve `User=`/`Group=`,
/// so the `ironguard` user need not exist on the test host: no `--root`/`--image` is needed, and a unit with an
/// unknown key, a bad value or a missing binary prints a line here and fails the test. The units have no
/// `Documentation=man:` entries, and `--man=no` keeps `verify` from needing man pages on the test host.
const VERIFY_STDERR_ALLOWED: &[(&str, &str)] = &[];

/// Highest acceptable `systemd-analyze security --offline` exposure, on its 0–100 scale (10× the printed level).
/// At the time of writing: agent 1.5, control plane 1.1, guard 1.3 ("OK"). A change that loses a protection of
/// weight 0.5 or more (`PrivateDevices=`, a dropped `CapabilityBoundingSet=`, …) pushes a unit over.
const MAX_EXPOSURE: &str = "20";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

fn packaging(rel: &str) -> PathBuf {
    repo_root().join("packaging").join(rel)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn unit_text(name: &str) -> String {
    read(&packaging(&format!("systemd/{name}")))
}

/// A systemd tool, or a failure naming the package that provides it.
fn systemd_tool(name: &str) -> PathBuf {
    for dir in ["/usr/bin", "/bin", "/usr/sbin", "/sbin"] {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return p;
        }
    }
    let ci = std::env::var("CI").unwrap_or_default();
    panic!(
        "{name} is missing (CI={ci:?}): install Debian's `systemd` package (apt-get install --no-install-recommends \
         systemd), which provides systemd-analyze and systemd-sysusers. The packaging tests never skip."
    );
}

/// The control plane binary next to the agent's; it must be built for the units to be verified.
fn controlplane_bin() -> PathBuf {
    let p = bin("ironguard-agent").with_file_name("ironguard-controlplane");
    assert!(
        p.is_file(),
        "{} is missing: the control-plane unit runs it, and `systemd-analyze verify` checks that ExecStart= is an \
         executable. Build it first (cargo build -p ironguard-controlplane, or cargo build --workspace --bins).",
        p.display()
    );
    p
}

/// Writes the three units into `dir` with `/usr/bin/…` replaced by the built binaries.
fn install_units(dir: &Path) -> Vec<PathBuf> {
    let agent = bin("ironguard-agent");
    let controlplane = controlplane_bin();
    UNITS
        .iter()
        .map(|name| {
            let text = unit_text(name)
                .replace(AGENT_EXE, agent.to_str().unwrap())
                .replace(CONTROLPLANE_EXE, controlplane.to_str().unwrap());
            assert!(!text.contains("/usr/bin/ironguard"), "{name}: an ironguard path was not rewritten:\n{text}");
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        })
        .collect()
}

fn text_of(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn units_pass_systemd_analyze_verify() {
    let analyze = systemd_tool("systemd-analyze");
    let dir = TempDir::new("units");
    // All three units in one directory: `verify` adds the directories of the files it is given to the unit search
    // path, so the agent's Wants=/After=ironguard-guard.service resolve to the unit under test.
    for unit in install_units(dir.path()) {
        let out = Command::new(&analyze)
            .args(["verify", "--man=no", "--no-pager"])
            .arg(&unit)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", analyze.display()));
        let (stdout, stderr) = text_of(&out);
        let unexpected: Vec<&str> = stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .filter(|l| !VERIFY_STDERR_ALLOWED.iter().any(|(pat, _why)| l.contains(pat)))
            .collect();
        assert!(
            out.status.success() && unexpected.is_empty(),
            "systemd-analyze verify {} ({}):\nunexpected lines:\n{}\nstdout:\n{stdout}\nstderr:\n{stderr}",
            unit.display(),
            out.status,
            unexpected.join("\n")
        );
    }
}

#[test]
fn units_stay_within_the_exposure_budget() {
    let analyze = systemd_tool("systemd-analyze");
    let dir = TempDir::new("units");
    for unit in install_units(dir.path()) {
        // --offline: judges the unit file alone, no running service manager needed.
        let out = Command::new(&analyze)
            .args(["security", "--offline=true", "--no-pager"])
            .arg(format!("--threshold={MAX_EXPOSURE}"))
            .arg(&unit)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", analyze.display()));
        let (stdout, stderr) = text_of(&out);
        let level = stdout.lines().find(|l| l.contains("Overall exposure level")).unwrap_or("(no overall level)");
        eprintln!("{level}");
        assert!(
            out.status.success(),
            "systemd-analyze security --offline {} exceeds exposure {MAX_EXPOSURE}/100 ({}):\n{stdout}\n{stderr}",
            unit.display(),
            out.status
        );
    }
}

/// A unit file read the way systemd reads it, enough for these checks: `[Section]` headers, `Key=value` lines
/// (repeated keys keep every value in order), comments, and line continuations.
#[derive(Debug)]
struct Unit {
    name: String,
    entries: BTreeMap<(String, String), Vec<String>>,
}

impl Unit {
    fn parse(name: &str) -> Self {
        let text = unit_text(name);
        let mut entries: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        let mut section = String::new();
        let mut pending = String::new();
        for raw in text.lines() {
            let line = raw.trim();
            if pending.is_empty() && (line.is_empty() || line.starts_with('#') || line.starts_with(';')) {
                continue;
            }
            if let Some(cont) = line.strip_suffix('\\') {
                pending.push_str(cont);
                pending.push(' ');
                continue;
            }
            let line = std::mem::take(&mut pending) + line;
            if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = s.to_string();
                continue;
            }
            let (k, v) = line.split_once('=').unwrap_or_else(|| panic!("{name}: not a Key=value line: {line:?}"));
            assert!(!section.is_empty(), "{name}: {line:?} outside a section");
            entries.entry((section.clone(), k.trim().to_string())).or_default().push(v.trim().to_string());
        }
        Self { name: name.to_string(), entries }
    }

    fn all(&self, section: &str, key: &str) -> &[String] {
        self.entries.get(&(section.to_string(), key.to_string())).map(Vec::as_slice).unwrap_or(&[])
    }

    /// A single-valued setting: the last assignment wins.
    fn get(&self, section: &str, key: &str) -> Option<&str> {
        self.all(section, key).last().map(String::as_str)
    }

    fn service(&self, key: &str) -> Option<&str> {
        self.get("Service", key)
    }

    /// A list setting: assignments accumulate, an empty assignment resets the list.
    fn list(&self, section: &str, key: &str) -> Vec<String> {
        let mut out = vec![];
        for v in self.all(section, key) {
            if v.is_empty() {
                out.clear();
            }
            out.extend(v.split_whitespace().map(str::to_string));
        }
        out
    }

    fn has(&self, section: &str, key: &str) -> bool {
        !self.all(section, key).is_empty()
    }

    fn is_yes(&self, key: &str) -> bool {
        self.service(key).is_some_and(|v| matches!(v, "yes" | "true" | "on" | "1"))
    }

    fn assert_service(&self, key: &str, want: &str) {
        assert_eq!(self.service(key), Some(want), "{}: [Service] {key}=", self.name);
    }

    fn assert_yes(&self, key: &str) {
        assert!(self.is_yes(key), "{}: [Service] {key}=yes expected, got {:?}", self.name, self.service(key));
    }

    fn assert_lists(&self, section: &str, key: &str, want: &[&str]) {
        let got = self.list(section, key);
        for w in want {
            assert!(got.iter().any(|g| g == w), "{}: [{section}] {key}= lacks {w}: {got:?}", self.name);
        }
    }

    /// Every `Exec*=` command line of `key`, split into words, without systemd's `-@:+!` prefixes.
    fn commands(&self, key: &str) -> Vec<Vec<String>> {
        self.all("Service", key)
            .iter()
            .map(|l| {
                let line = l.trim_start_matches(['-', '@', ':', '+', '!']);
                assert!(
                    !line.replace("$MAINPID", "").contains(['"', '\'', '$', '%']),
                    "{}: {key}= is too clever for this test: {line}",
                    self.name
                );
                line.split_whitespace().map(str::to_string).collect()
            })
            .collect()
    }

    /// The one `Exec*=` command line of `key`.
    fn command(&self, key: &str) -> Vec<String> {
        let mut all = self.commands(key);
        assert_eq!(all.len(), 1, "{}: exactly one {key}= expected: {all:?}", self.name);
        all.remove(0)
    }

    /// The unprivileged identity every ironguard unit runs as.
    fn assert_unprivileged_user(&self) {
        let user = self.service("User").unwrap_or_else(|| panic!("{}: no User= (it would run as root)", self.name));
        assert!(!matches!(user, "root" | "0" | ""), "{}: User={user}", self.name);
        assert_eq!(user, "ironguard", "{}: User= must be the user packaging/sysusers.d creates", self.name);
        assert_eq!(self.service("Group"), Some("ironguard"), "{}: Group=", self.name);
        assert!(!self.has("Service", "DynamicUser"), "{}: DynamicUser= would replace the ironguard user", self.name);
        self.assert_yes("NoNewPrivileges");
        self.assert_service("ProtectSystem", "strict");
    }

    fn assert_only_net_admin(&self) {
        assert_eq!(
            self.list("Service", "AmbientCapabilities"),
            ["CAP_NET_ADMIN"],
            "{}: AmbientCapabilities=",
            self.name
        );
        assert_eq!(
            self.list("Service", "CapabilityBoundingSet"),
            ["CAP_NET_ADMIN"],
            "{}: CapabilityBoundingSet=",
            self.name
        );
        // The host's network namespace, with CAP_NET_ADMIN in the initial user namespace that owns it.
        assert!(!self.is_yes("PrivateNetwork"), "{}: PrivateNetwork= hides the host's firewall", self.name);
        assert!(!self.is_yes("PrivateUsers"), "{}: PrivateUsers= voids CAP_NET_ADMIN on the host", self.name);
        self.assert_lists("Service", "RestrictAddressFamilies", &["AF_NETLINK"]);
    }

    fn assert_guard_install(&self, key: &str) {
        assert_eq!(
            self.command(key),
            [AGENT_EXE, "--config", AGENT_CONFIG, "guard", "install"],
            "{}: {key}= must install the guard",
            self.name
        );
    }
}

#[test]
fn agent_unit_is_a_watched_notify_service_with_cap_net_admin_only() {
    let u = Unit::parse(AGENT_UNIT);
    u.assert_service("Type", "notify");
    u.assert_service("NotifyAccess", "main");
    let watchdog = u.service("WatchdogSec").expect("WatchdogSec= set");
    assert!(!matches!(watchdog, "" | "0" | "infinity"), "WatchdogSec={watchdog}");
    u.assert_guard_install("ExecStartPre");
    assert_eq!(u.command("ExecStart"), [AGENT_EXE, "--config", AGENT_CONFIG, "run"]);
    // After every exit, SIGKILL included: a backend nothing closes when the agent dies (dnsmasq-hostsdir) is closed.
    u.assert_guard_install("ExecStopPost");
    u.assert_service("Restart", "always");
    u.assert_service("KillSignal", "SIGTERM");
    assert!(u.has("Service", "TimeoutStopSec"), "TimeoutStopSec= set");
    u.assert_unprivileged_user();
    u.assert_only_net_admin();
    u.assert_lists("Service", "RestrictAddressFamilies", &["AF_NETLINK", "AF_UNIX", "AF_INET", "AF_INET6"]);
    u.assert_lists("Unit", "Before", &["dnsmasq.service"]);
    u.assert_lists("Unit", "Wants", &[GUARD_UNIT]);
    u.assert_lists("Unit", "After", &[GUARD_UNIT]);
    u.assert_lists("Install", "WantedBy", &["multi-user.target"]);
}

#[test]
fn guard_unit_runs_once_before_dnsmasq_and_never_removes_the_guard() {
    let u = Unit::parse(GUARD_UNIT);
    u.assert_service("Type", "oneshot");
    u.assert_yes("RemainAfterExit");
    u.assert_guard_install("ExecStart");
    u.assert_guard_install("ExecReload");
    // Stopping the unit must not open DHCP.
    assert!(
        !u.has("Service", "ExecStop") && !u.has("Service", "ExecStopPost"),
        "the guard unit must not stop anything"
    );
    u.assert_lists("Unit", "Before", &["dnsmasq.service", AGENT_UNIT, "network-pre.target"]);
    u.assert_lists("Unit", "Wants", &["network-pre.target"]);
    u.assert_lists("Install", "RequiredBy", &["dnsmasq.service"]);
    u.assert_unprivileged_user();
    u.assert_only_net_admin();
    // The agent re-installs exactly the same guard before it starts.
    assert_eq!(u.command("ExecStart"), Unit::parse(AGENT_UNIT).command("ExecStartPre"));
}

#[test]
fn controlplane_unit_has_no_capabilities() {
    let u = Unit::parse(CONTROLPLANE_UNIT);
    u.assert_service("Type", "simple");
    assert_eq!(
        u.command("ExecStart"),
        [CONTROLPLANE_EXE, "--config", "/etc/ironguard/controlplane.toml"],
        "control plane ExecStart="
    );
    u.assert_unprivileged_user();
    // Present and empty: a missing CapabilityBoundingSet= would leave the full bounding set.
    for key in ["CapabilityBoundingSet", "AmbientCapabilities"] {
        assert!(u.has("Service", key), "{key}= must be set (to nothing)");
        assert!(u.list("Service", key).is_empty(), "{key}= must be empty: {:?}", u.list("Service", key));
    }
    assert_eq!(u.service("StateDirectory"), Some("ironguard/controlplane"));
    u.assert_yes("PrivateUsers");
    assert!(!u.is_yes("PrivateNetwork"), "the control plane serves gRPC on the host's network");
    // AF_NETLINK: the neighbour table, which ties a ramdisk's callback to the node's interfaces (callback_source).
    assert_eq!(u.list("Service", "RestrictAddressFamilies"), ["AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"]);
    u.assert_service("Restart", "on-failure");
}

#[test]
fn every_unit_is_sandboxed() {
    for name in UNITS {
        let u = Unit::parse(name);
        for key in [
            "NoNewPrivileges",
            "ProtectHome",
            "PrivateDevices",
            "ProtectKernelTunables",
            "ProtectKernelModules",
            "ProtectKernelLogs",
            "ProtectControlGroups",
            "ProtectClock",
            "ProtectHostname",
            "RestrictNamespaces",
            "LockPersonality",
            "MemoryDenyWriteExecute",
            "RestrictRealtime",
            "RestrictSUIDSGID",
        ] {
            u.assert_yes(key);
        }
        u.assert_service("SystemCallArchitectures", "native");
        u.assert_lists("Service", "SystemCallFilter", &["@system-service"]);
        u.assert_service("UMask", "0077");
    }
}

/// Every command line of every unit names a subcommand and options the binary accepts (checked with `--help`,
/// which the argument parser handles before the configuration file is read).
#[test]
fn exec_lines_are_accepted_by_the_binaries() {
    let agent = bin("ironguard-agent");
    let controlplane = controlplane_bin();
    for name in UNITS {
        let u = Unit::parse(name);
        for key in ["ExecStartPre", "ExecStart", "ExecStartPost", "ExecReload", "ExecStop", "ExecStopPost"] {
            for argv in u.commands(key) {
                if key == "ExecReload" && argv[0] == "/bin/kill" {
                    // The control plane re-reads its certificates on SIGHUP (tests/netns/tests/grpc_tls.rs).
                    assert_eq!(argv, ["/bin/kill", "-HUP", "$MAINPID"], "{name}: ExecReload=");
                    assert!(Path::new("/bin/kill").exists(), "/bin/kill");
                    continue;
                }
                let exe = match argv[0].as_str() {
                    AGENT_EXE => &agent,
                    CONTROLPLANE_EXE => &controlplane,
                    other => panic!("{name}: {key}= runs {other}, not an ironguard binary"),
                };
                run_ok(Command::new(exe).args(&argv[1..]).arg("--help"));
            }
        }
    }
}

#[test]
fn sysusers_creates_the_ironguard_system_user() {
    let sysusers = systemd_tool("systemd-sysusers");
    let root = TempDir::new("sysroot");
    std::fs::create_dir_all(root.join("etc")).unwrap();
    run_ok(
        Command::new(sysusers)
            .arg(format!("--root={}", root.path().display()))
            .arg(packaging("sysusers.d/ironguard.conf")),
    );
    let passwd = read(&root.join("etc/passwd"));
    let entry =
        passwd.lines().find(|l| l.starts_with("ironguard:")).unwrap_or_else(|| panic!("no ironguard user:\n{passwd}"));
    let f: Vec<&str> = entry.split(':').collect();
    let uid: u32 = f[2].parse().unwrap();
    assert!((1..1000).contains(&uid), "a system user (uid below 1000): {entry}");
    assert!(f[6].ends_with("nologin"), "no login shell: {entry}");
    let group = read(&root.join("etc/group"));
    let gid =
        group.lines().find(|l| l.starts_with("ironguard:")).unwrap_or_else(|| panic!("no ironguard group:\n{group}"));
    assert_eq!(gid.split(':').nth(2), Some(f[3]), "the user's primary group is ironguard: {entry} / {gid}");
}

#[test]
fn example_agent_config_is_accepted_by_the_agent() {
    let out = run_ok(
        Command::new(bin("ironguard-agent")).arg("--config").arg(packaging("etc/agent.toml")).arg("print-config"),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for want in ["[dataplane]", "interfaces = [\"br-pxe\"]", "ports = [67]", "match_mode = \"both\"", "mark = 1048576"]
    {
        assert!(text.contains(want), "print-config lacks {want:?}:\n{text}");
    }
}

#[test]
fn example_controlplane_config_is_accepted_and_matches_the_state_directory() {
    let out = run_ok(
        Command::new(controlplane_bin()).arg("--config").arg(packaging("etc/controlplane.toml")).arg("--print-config"),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // The unit makes /var/lib/<StateDirectory> the only writable path: the store must live there.
    let state = Unit::parse(CONTROLPLANE_UNIT).service("StateDirectory").unwrap().to_string();
    let want = format!("data_dir = \"/var/lib/{state}\"");
    assert!(text.contains(&want), "print-config lacks {want:?}:\n{text}");
}

/// The guard unit's own command line, with the example configuration, run the way systemd would run it (a user
/// that is not root, holding exactly the unit's ambient and bounding capabilities), in a private network
/// namespace so the host's firewall is not touched.
#[test]
fn guard_unit_command_installs_the_guard_as_an_unprivileged_user() {
    let ns = Netns::new("pkg");
    let u = Unit::parse(GUARD_UNIT);
    let caps: Vec<String> = u
        .list("Service", "AmbientCapabilities")
        .iter()
        .map(|c| format!("+{}", c.to_lowercase().trim_start_matches("cap_")))
        .collect();
    let caps = format!("-all,{}", caps.join(","));
    // The unprivileged user reads the configuration from a place it can reach, as /etc/ironguard is on a host
    // (a checkout may sit under a directory only root can enter).
    let dir = TempDir::new("pkgcfg");
    let config = dir.join("agent.toml");
    std::fs::copy(packaging("etc/agent.toml"), &config).unwrap();
    std::fs::set_permissions(&config, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let argv: Vec<String> = u
        .command("ExecStart")
        .into_iter()
        .map(|w| match w.as_str() {
            AGENT_EXE => bin("ironguard-agent").display().to_string(),
            AGENT_CONFIG => config.display().to_string(),
            _ => w,
        })
        .collect();
    // The ironguard user does not exist on the test host; nobody (65534) stands in for it.
    let mut cmd = ns.cmd("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--no-new-privs"])
        .arg(format!("--inh-caps={caps}"))
        .arg(format!("--ambient-caps={caps}"))
        .arg(format!("--bounding-set={caps}"))
        .args(&argv);
    run_ok(&mut cmd);
    // `guard status`, as an operator would check it, agrees with the configuration.
    run_ok(ns.cmd(bin("ironguard-agent")).arg("--config").arg(&config).args(["guard", "status"]));
    let out = ns.nft(&["list", "table", "inet", "ironguard_guard"]);
    let ruleset = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && ruleset.contains("iifname \"br-pxe\" udp dport 67") && ruleset.contains("drop"),
        "the guard drops unmarked DHCP on br-pxe:\n{ruleset}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `scripts/package.sh`'s build command, joined across its continuation lines, as words.
fn package_build_command(script: &str) -> Vec<String> {
    let mut lines = script.lines().map(str::trim).skip_while(|l| !l.starts_with("cargo build "));
    let mut command = String::new();
    for line in lines.by_ref() {
        command.push_str(line.trim_end_matches('\\'));
        command.push(' ');
        if !line.ends_with('\\') {
            break;
        }
    }
    assert!(!command.is_empty(), "no `cargo build` line in scripts/package.sh");
    command.split_whitespace().map(str::to_string).collect()
}

/// The features `cargo tree` resolves for `packages` with these dependency kinds: the same resolution as a build of
/// them (with `dev`, as a build of their tests).
fn resolved_features(packages: &[String], dev: bool) -> String {
    let edges = if dev { "normal,build,dev,features" } else { "normal,build,features" };
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["tree", "--locked", "--offline", "--prefix", "none", "--edges", edges, "--manifest-path"])
        .arg(repo_root().join("Cargo.toml"));
    for p in packages {
        cmd.args(["-p", p]);
    }
    String::from_utf8_lossy(&run_ok(&mut cmd).stdout).into_owned()
}

/// The Debian packages carry no test hook (IRONGUARD_TEST_CRASH, the dataplane's fault injection):
/// `scripts/package.sh` builds their binaries without test targets, so the `test-hooks` feature that the end-to-end
/// tests enable through their dev-dependencies is not resolved for them, and it refuses a binary that holds a
/// hook's marker anyway. Checked: that build command, cargo's feature resolution for it, and the markers (the hooks'
/// own strings; the control plane of this test build carries its hook and marker).
#[test]
fn packaged_binaries_carry_no_test_hook() {
    let script = read(&repo_root().join("scripts/package.sh"));
    let build = package_build_command(&script);
    for word in &build {
        assert!(
            ![
                "--all-targets",
                "--tests",
                "--benches",
                "--examples",
                "--workspace",
                "--all-features",
                "--features",
                "-F"
            ]
            .contains(&word.as_str())
                && !word.contains("test-hooks"),
            "scripts/package.sh builds with {word}, which can enable the test hooks: {}",
            build.join(" ")
        );
    }
    let packages: Vec<String> = build.windows(2).filter(|w| w[0] == "-p").map(|w| w[1].clone()).collect();
    for packaged in ["ironguard-agent", "ironguard-controlplane", "ironguardctl"] {
        assert!(packages.iter().any(|p| p == packaged), "package.sh does not build {packaged}: {}", build.join(" "));
    }
    // Cargo resolves no test-hooks feature for what package.sh builds; for the end-to-end tests it does (so the
    // query would see it).
    let packaged = resolved_features(&packages, false);
    assert!(!packaged.contains("feature \"test-hooks\""), "the packaged binaries get the test hooks:\n{packaged}");
    let tests = resolved_features(&["ironguard-netns-tests".to_string()], true);
    for krate in ["ironguard-controlplane", "ironguard-dataplane"] {
        assert!(tests.contains(&format!("{krate} feature \"test-hooks\"")), "{krate}'s hooks in the tests:\n{tests}");
    }
    // package.sh's markers are the hooks' own strings, and the control plane of this test build (which the
    // end-to-end crash tests run) holds its marker.
    let listed = script
        .lines()
        .find_map(|l| l.strip_prefix("test_hook_markers=("))
        .and_then(|l| l.strip_suffix(')'))
        .unwrap_or_else(|| panic!("no test_hook_markers=(...) line in scripts/package.sh"));
    let listed: Vec<&str> = listed.split_whitespace().collect();
    let hooks =
        [ironguard_controlplane::inspection::engine::CRASH_VAR, ironguard_dataplane::ruleset::FAULT_INJECTION_CHAIN];
    assert_eq!(listed, hooks, "scripts/package.sh's test_hook_markers are not the hooks' strings");
    let controlplane = controlplane_bin();
    assert!(
        binary_holds(&controlplane, hooks[0]),
        "{} lacks {}: the test build carries the hooks (cargo build --workspace --all-targets, as scripts/test.sh \
         does; after cargo build --bins it carries none and the end-to-end crash tests fail too)",
        controlplane.display(),
        hooks[0]
    );
}
