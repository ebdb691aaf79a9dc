//! The callback benchmark: ramdisk callbacks (`POST /v1/continue`, ironic-inspector's API) against the real
//! Ironic 39 (single process, sqlite, `fake-hardware`), the real control plane (embedded store) and a real agent
//! (leader; no dnsmasq, so its DHCP health check is off), all in one network namespace.
//!
//! 1. N nodes are enrolled in Ironic over its REST API (one port each, distinct MACs, a BMC address each); they
//!    stay in `enroll`, which ironguard inspects. The enrollment is timed as context.
//! 2. N inspections are started through gRPC with `manage_boot = false` (nothing to power on: the "ramdisks" are
//!    this benchmark) and all must reach `waiting` (the node's allow applied by the agent).
//! 3. The measurement: N callbacks with IPA-shaped data (`ipa_inventory`), at most `--concurrency` in flight (that
//!    many ramdisks posting at the same moment; each callback comes from its own source address, 127.1.x.y, on
//!    its own connection, as separate machines do).
//!    Per callback: the send time, the reply latency (until the whole body is read) and the reply, which must be
//!    200 with the node's UUID. Then every inspection must reach `finished` (an `error` fails the run); callback →
//!    finished is the inspection's `finished_at_ms` minus the callback's send time (same host clock).
//! 4. Ironic requests per inspection in the callback phase, counted two independent ways: Ironic's own access log
//!    (the lines written after the first callback, grouped by method, path shape and status), and ironguard's count
//!    (the `processed reads=.. writes=..` event of each processing, from the control plane's JSON log). The goal:
//!    no more than ironic-inspector needs — one node PATCH plus one request per new port (none here: the port
//!    exists).
//!
//! 5. Context: the control plane's RSS (when all wait, when all callbacks are answered, at the end) and store size,
//!    the CPU time the control plane and Ironic (its whole process tree) used in the callback phase, and the host's
//!    load average (the machine is shared: other work on it skews every figure).
//!
//! The control plane's Ironic sync and its poll of Ironic's own inspections are off, so that every Ironic request
//! of the callback phase belongs to the processing. Its log is JSON (`[log] format = "json"`) so that the
//! `processed` events parse reliably. `--keep-logs DIR` keeps both logs; `--cp-env KEY=VALUE` sets the control
//! plane's environment (e.g. `MALLOC_ARENA_MAX=2`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{Read as _, Seek as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use futures::StreamExt as _;
use ironguard_dataplane::MacAddr;
use ironguard_netns_tests::{
    ControlPlane, Netns, RealIronic, TempDir, in_netns, ipa_inventory, start_agent, verdict, wait_for,
};
use ironguard_proto::v1::inspection_client::InspectionClient;
use ironguard_proto::v1::{InspectionStatus, ListRequest, StartRequest};
use serde_json::{Value, json};
use tonic::transport::Channel;

use crate::stats::{Samples, human, ms, vm_kib};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Nodes enrolled in Ironic (one port each), each inspected once.
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Callbacks in flight at once (ramdisks posting at the same moment).
    #[arg(long, default_value_t = 50)]
    concurrency: usize,
    /// Inspection workers (0: the number of CPUs, the default of the control plane).
    #[arg(long, default_value_t = 0)]
    workers: usize,
    #[arg(long, default_value = "bench-results/callbacks.json")]
    json: PathBuf,
    /// Environment for the control plane, KEY=VALUE (repeatable; e.g. `MALLOC_ARENA_MAX=2` to tell allocator
    /// fragmentation from growth).
    #[arg(long = "cp-env", value_parser = parse_env)]
    cp_env: Vec<(String, String)>,
    /// Copy Ironic's and the control plane's logs into this directory at the end (also when the run fails).
    #[arg(long)]
    keep_logs: Option<PathBuf>,
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

/// Copies the logs it was given to a directory when dropped (declared after the `TempDir` holding them, so it
/// runs first).
#[derive(Debug, Default)]
struct KeepLogs {
    dest: Option<PathBuf>,
    files: Vec<PathBuf>,
}

impl Drop for KeepLogs {
    fn drop(&mut self) {
        let Some(dest) = &self.dest else { return };
        if let Err(e) = std::fs::create_dir_all(dest) {
            eprintln!("cannot create {}: {e}", dest.display());
            return;
        }
        for f in &self.files {
            let to = dest.join(f.file_name().unwrap_or_default());
            match std::fs::copy(f, &to) {
                Ok(_) => eprintln!("kept {}", to.display()),
                Err(e) => eprintln!("cannot copy {} to {}: {e}", f.display(), to.display()),
            }
        }
    }
}

/// Concurrent requests while enrolling (sqlite Ironic serialises its writes anyway).
const ENROLL_CONCURRENCY: usize = 8;
/// gRPC `Start` calls in flight.
const START_CONCURRENCY: usize = 32;
const IRONIC_PORT: u16 = 6385;
const INSPECTOR: &str = "http://127.0.0.1:5050";
const GRPC: &str = "http://127.0.0.1:9100";
/// The MAC tag of this benchmark (`02:cb:..`).
const MAC_TAG: u8 = 0xcb;

#[derive(Debug, Clone)]
struct Node {
    name: String,
    uuid: String,
    mac: MacAddr,
    bmc: String,
}

/// One callback as the ramdisk saw it.
#[derive(Debug, Clone)]
struct Callback {
    node: usize,
    /// Milliseconds since the Unix epoch, just before sending.
    sent_ms: f64,
    reply: Duration,
    status: u16,
    body: String,
}

fn now_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64() * 1e3).unwrap_or(0.0)
}

/// (parent pid, CPU seconds: user + system, all threads) of a process. `/proc` counts in USER_HZ ticks, which
/// are 1/100 s on Linux whatever the kernel's tick.
fn proc_stat(pid: u32) -> Option<(u32, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After "pid (comm) ": state is field 3, ppid field 4, utime field 14 and stime field 15.
    let (_, rest) = stat.rsplit_once(") ")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Some((num(1) as u32, (num(11) + num(12)) as f64 / 100.0))
}

/// CPU seconds of a process and all its live descendants (Ironic runs its API and conductor as children of a
/// launcher process); 0 if it is gone.
fn tree_cpu_secs(root: u32) -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc") else { return 0.0 };
    let all: Vec<(u32, u32, f64)> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| proc_stat(pid).map(|(ppid, cpu)| (pid, ppid, cpu)))
        .collect();
    let mut tree = BTreeSet::from([root]);
    loop {
        let before = tree.len();
        for (pid, ppid, _) in &all {
            if tree.contains(ppid) {
                tree.insert(*pid);
            }
        }
        if tree.len() == before {
            break;
        }
    }
    all.iter().filter(|(pid, _, _)| tree.contains(pid)).map(|(_, _, cpu)| cpu).sum()
}

/// The control plane's and Ironic's CPU time and the control plane's RSS at one instant.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    cp_cpu_s: f64,
    ironic_cpu_s: f64,
    cp_rss_kib: u64,
}

#[derive(Debug, Clone, Copy)]
struct Pids {
    cp: u32,
    ironic: u32,
}

impl Pids {
    fn usage(&self) -> Usage {
        Usage {
            cp_cpu_s: tree_cpu_secs(self.cp),
            ironic_cpu_s: tree_cpu_secs(self.ironic),
            cp_rss_kib: vm_kib(self.cp, "VmRSS:"),
        }
    }
}

/// Bytes of the files under `dir` (the control plane's store).
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else { return 0 };
    rd.filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            _ => e.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .sum()
}

/// The source address of callback `i`: 127.1.0.1, 127.1.0.2, … (distinct for 16 million callbacks).
fn source_address(i: usize) -> std::net::IpAddr {
    let j = i as u32 + 1;
    std::net::IpAddr::from([127, 1 + (j >> 16) as u8, (j >> 8) as u8, j as u8])
}

/// The host's 1-minute load average (other work on the host skews every figure here).
fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg").ok().and_then(|s| s.split_whitespace().next()?.parse().ok()).unwrap_or(0.0)
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// A log file from byte `offset` on.
fn log_since(path: &Path, offset: u64) -> anyhow::Result<String> {
    let mut f = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    f.seek(std::io::SeekFrom::Start(offset))?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The last `n` lines of a log file, for error messages.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `POST` to Ironic with the newest microversion; retried (with back-off) on connection errors and 5xx (sqlite
/// may answer "database is locked" under concurrent writes).
async fn ironic_post(client: &reqwest::Client, url: &str, body: &Value) -> anyhow::Result<Value> {
    let mut delay = Duration::from_millis(100);
    let attempts = 6;
    for attempt in 1..=attempts {
        let last = attempt == attempts;
        match client.post(url).header("X-OpenStack-Ironic-API-Version", "latest").json(body).send().await {
            Ok(resp) if resp.status().is_success() => {
                return resp.json().await.with_context(|| format!("Ironic's answer to POST {url} {body}"));
            }
            Ok(resp) if resp.status().is_server_error() && !last => {}
            Ok(resp) => {
                let status = resp.status();
                let text = resp.text().await.unwrap_or_default();
                anyhow::bail!("Ironic answered {status} to POST {url} {body}: {text}");
            }
            Err(e) if !last => eprintln!("POST {url}: {e}; retrying"),
            Err(e) => return Err(e).with_context(|| format!("POST {url} {body}")),
        }
        tokio::time::sleep(delay).await;
        delay *= 2;
    }
    anyhow::bail!("POST {url}: no answer after {attempts} attempts")
}

/// Enrolls node `i` (a `fake-hardware` node with its BMC address, then its PXE port); returns its UUID.
async fn enroll_one(client: &reqwest::Client, ironic: &str, node: &Node) -> anyhow::Result<String> {
    let v = ironic_post(
        client,
        &format!("{ironic}/v1/nodes"),
        &json!({"name": node.name, "driver": "fake-hardware", "driver_info": {"ipmi_address": node.bmc}}),
    )
    .await?;
    let uuid = v["uuid"].as_str().with_context(|| format!("no uuid in Ironic's node {v}"))?.to_string();
    ironic_post(
        client,
        &format!("{ironic}/v1/ports"),
        &json!({"node_uuid": uuid, "address": node.mac.to_string(), "pxe_enabled": true}),
    )
    .await?;
    Ok(uuid)
}

/// The agent's configuration: leader without dnsmasq (its DHCP health check off), plaintext gRPC to the control
/// plane — with `insecure = true` when this agent refuses a plaintext endpoint without it (an older one knows no
/// such key), found by asking the agent itself (`print-config`).
fn agent_config(dir: &TempDir) -> anyhow::Result<String> {
    let config = |insecure: &str| {
        format!(
            "[agent]\nid = \"bench\"\nnetwork = \"bench\"\n[controlplane]\nendpoints = [\"http://127.0.0.1:9100\"]\n{insecure}\
             [dhcp_health]\nudp_port = 0\n[admin]\nlisten = \"127.0.0.1:9181\"\n"
        )
    };
    let probe = dir.join("agent-probe.toml");
    std::fs::write(&probe, config(""))?;
    let agent = ironguard_netns_tests::bin("ironguard-agent");
    let out = std::process::Command::new(&agent)
        .arg("--config")
        .arg(&probe)
        .arg("print-config")
        .output()
        .with_context(|| format!("running {} print-config", agent.display()))?;
    if out.status.success() {
        return Ok(config(""));
    }
    let err = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(err.contains("insecure = true"), "the agent refuses its configuration: {err}");
    Ok(config("insecure = true\n"))
}

/// Every inspection in `states` (all if empty), page by page.
async fn list_all(ch: &Channel, states: &[&str]) -> anyhow::Result<Vec<InspectionStatus>> {
    let mut c = InspectionClient::new(ch.clone());
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let r = c
            .list(ListRequest {
                page_size: 1000,
                page_token: token,
                states: states.iter().map(|s| s.to_string()).collect(),
            })
            .await
            .context("gRPC Inspection.List")?
            .into_inner();
        out.extend(r.inspections);
        if r.next_page_token.is_empty() {
            return Ok(out);
        }
        token = r.next_page_token;
    }
}

/// Polls until every node in `uuids` is in `want`; fails at once on an `error` inspection, and on timeout.
async fn wait_all(
    ch: &Channel,
    uuids: &BTreeSet<String>,
    want: &str,
    timeout: Duration,
    every: Duration,
    cp_log: &Path,
) -> anyhow::Result<Vec<InspectionStatus>> {
    let t = Instant::now();
    loop {
        let all = list_all(ch, &[]).await?;
        let ours: Vec<InspectionStatus> = all.into_iter().filter(|s| uuids.contains(&s.node)).collect();
        if let Some(e) = ours.iter().find(|s| s.state == "error") {
            let errors = ours.iter().filter(|s| s.state == "error").count();
            anyhow::bail!(
                "the inspection of {} failed ({errors} in error in all): {}\ncontrol plane log (tail):\n{}",
                e.node,
                e.error,
                tail(cp_log, 30)
            );
        }
        let done = ours.iter().filter(|s| s.state == want).count();
        if done == uuids.len() {
            return Ok(ours);
        }
        if t.elapsed() > timeout {
            let mut by_state: BTreeMap<&str, usize> = BTreeMap::new();
            for s in &ours {
                *by_state.entry(s.state.as_str()).or_default() += 1;
            }
            anyhow::bail!(
                "after {}: {done} of {} inspections are `{want}` (states: {by_state:?}, {} unknown)\n\
                 control plane log (tail):\n{}",
                human(t.elapsed()),
                uuids.len(),
                uuids.len() - ours.len(),
                tail(cp_log, 30)
            );
        }
        tokio::time::sleep(every).await;
    }
}

/// A request path with UUIDs as `{uuid}` and MACs as `{mac}`, so requests group by shape.
fn path_shape(path: &str) -> String {
    let is_hex = |s: &str| s.chars().all(|c| c.is_ascii_hexdigit());
    let is_uuid = |s: &str| {
        let p: Vec<&str> = s.split('-').collect();
        p.len() == 5 && p.iter().map(|x| x.len()).eq([8, 4, 4, 4, 12]) && p.iter().all(|x| is_hex(x))
    };
    let is_mac = |s: &str| {
        let s = s.replace("%3A", ":").replace("%3a", ":");
        let p: Vec<&str> = s.split(':').collect();
        p.len() == 6 && p.iter().all(|x| x.len() == 2 && is_hex(x))
    };
    let (p, q) = path.split_once('?').unwrap_or((path, ""));
    let p: Vec<String> =
        p.split('/').map(|s| if is_uuid(s) { "{uuid}".into() } else { s.to_string() }).collect::<Vec<_>>();
    let mut out = p.join("/");
    if !q.is_empty() {
        let q: Vec<String> = q
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) if is_uuid(v) => format!("{k}={{uuid}}"),
                Some((k, v)) if is_mac(v) => format!("{k}={{mac}}"),
                _ => kv.to_string(),
            })
            .collect();
        out = format!("{out}?{}", q.join("&"));
    }
    out
}

/// The API requests in Ironic's log text: "METHOD shape STATUS" → count. An access line names the method and the
/// path (`PATCH /v1/nodes/<uuid> ... 200`); the status is the first 3-digit token after the path.
fn ironic_requests(log: &str) -> BTreeMap<String, usize> {
    const METHODS: [&str; 6] = ["GET", "POST", "PATCH", "PUT", "DELETE", "HEAD"];
    let mut out = BTreeMap::new();
    for line in log.lines() {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        let Some(i) = tokens.iter().position(|t| {
            let t = t.trim_start_matches('"');
            METHODS.contains(&t)
        }) else {
            continue;
        };
        let Some(path) = tokens.get(i + 1).filter(|p| p.starts_with('/')) else { continue };
        let status = tokens[i + 2..]
            .iter()
            .map(|t| t.trim_matches(|c: char| !c.is_ascii_digit()))
            .find(|t| t.len() == 3 && t.parse::<u16>().is_ok_and(|s| (100..600).contains(&s)))
            .unwrap_or("?");
        let method = tokens[i].trim_start_matches('"');
        *out.entry(format!("{method} {} {status}", path_shape(path.trim_end_matches('"')))).or_insert(0) += 1;
    }
    out
}

/// ironguard's own count of its Ironic requests: the `processed` events of its JSON log.
#[derive(Debug, Default)]
struct IronguardCount {
    events: usize,
    /// Distinct nodes named by those events' spans.
    nodes: usize,
    reads: usize,
    writes: usize,
    /// (reads, writes) of one event → how many events.
    hist: BTreeMap<(u64, u64), usize>,
}

fn ironguard_counts(log: &str) -> IronguardCount {
    let mut c = IronguardCount::default();
    let mut nodes = BTreeSet::new();
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else { continue };
        let msg = v["message"].as_str().or_else(|| v["fields"]["message"].as_str());
        if msg != Some("processed") {
            continue;
        }
        let field = |k: &str| v[k].as_u64().or_else(|| v["fields"][k].as_u64()).unwrap_or(0);
        let (r, w) = (field("reads"), field("writes"));
        c.events += 1;
        c.reads += r as usize;
        c.writes += w as usize;
        *c.hist.entry((r, w)).or_insert(0) += 1;
        if let Some(n) = v["span"]["node"].as_str() {
            nodes.insert(n.to_string());
        }
    }
    c.nodes = nodes.len();
    c
}

/// What the logs and /proc say after the run.
struct Counts {
    /// Ironic's log: requests while the inspections started, and in the callback phase.
    ironic_start: BTreeMap<String, usize>,
    ironic_cb: BTreeMap<String, usize>,
    ironguard: IronguardCount,
    rss_kib: u64,
    peak_kib: u64,
    /// The control plane's data directory (embedded store) at the end.
    store_bytes: u64,
    /// The host's load average before the run and at its end.
    load: (f64, f64),
}

struct Measured {
    callbacks: Vec<Callback>,
    finished: Vec<InspectionStatus>,
    starts_accepted: Duration,
    all_waiting: Duration,
    /// Byte offsets of the Ironic and control-plane logs when the starts and when the callbacks began.
    ironic_start_offset: u64,
    ironic_callback_offset: u64,
    cp_callback_offset: u64,
    /// Wall time from the first callback sent until the poll saw all finished.
    polled_all_finished: Duration,
    callbacks_answered: Duration,
    /// Usage when all were waiting (just before the callbacks), when all callbacks were answered, when all were
    /// finished.
    at_waiting: Usage,
    at_answered: Usage,
    at_finished: Usage,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.nodes > 0, "--nodes must be at least 1");
    anyhow::ensure!(args.concurrency > 0, "--concurrency must be at least 1");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let n = args.nodes;
    let macs = crate::stats::macs(n, MAC_TAG);
    anyhow::ensure!(macs.len() == n, "cannot make {n} MACs");
    let load_before = loadavg();
    let dir = TempDir::new("bench-callbacks");
    let mut keep = KeepLogs { dest: args.keep_logs.clone(), files: Vec::new() };
    let ns = Netns::new("bench-cb");
    eprintln!("starting Ironic {} …", ironguard_netns_tests::ironic::IRONIC_VERSION);
    let ironic = RealIronic::start(&ns, &dir, IRONIC_PORT);
    let ironic_log = ironic.proc.log.clone();
    keep.files.push(ironic_log.clone());

    // 1. Enrollment.
    let mut nodes: Vec<Node> = (0..n)
        .map(|i| Node {
            name: format!("bench-{i}"),
            uuid: String::new(),
            mac: macs[i],
            bmc: format!("10.2.{}.{}", i / 250, i % 250 + 1),
        })
        .collect();
    eprintln!("enrolling {n} nodes ({ENROLL_CONCURRENCY} requests at once) …");
    let (uuids, enroll) = {
        let url = ironic.url.clone();
        let todo = nodes.clone();
        in_netns(&ns, move || -> anyhow::Result<(Vec<String>, Duration)> {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
            rt.block_on(async move {
                let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?;
                let t = Instant::now();
                let mut done: Vec<(usize, anyhow::Result<String>)> = futures::stream::iter(todo.iter().enumerate())
                    .map(|(i, node)| {
                        let (client, url) = (client.clone(), url.clone());
                        async move { (i, enroll_one(&client, &url, node).await) }
                    })
                    .buffer_unordered(ENROLL_CONCURRENCY)
                    .collect()
                    .await;
                let took = t.elapsed();
                done.sort_by_key(|(i, _)| *i);
                let uuids = done
                    .into_iter()
                    .map(|(i, r)| r.with_context(|| format!("enrolling node bench-{i}")))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                Ok((uuids, took))
            })
        })?
    };
    for (node, uuid) in nodes.iter_mut().zip(uuids) {
        node.uuid = uuid;
    }
    eprintln!("enrolled {n} nodes and {n} ports in {}", human(enroll));

    // 2. Control plane and agent. The callbacks come from loopback addresses, not from machines that booted
    // through the filter: no evidence is asked of them (`callback_evidence = "none"`), so this measures the
    // processing path alone (the evidence check reads the agents' reports, in memory).
    let cfg = dir.join("cp.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\ninspector_listen = \"127.0.0.1:5050\"\n[log]\nformat = \"json\"\n\
             [filter]\nunknown_mac_policy = \"deny\"\n[ironic]\nurl = \"{}\"\n[inspection]\nworkers = {}\ncallback_evidence = \"none\"\n\
             [sync]\nironic_sync_secs = 0\nironic_inspection = false\n",
            ironic.url, args.workers
        ),
    )?;
    // Plaintext gRPC where the control plane wants TLS by default (an older one ignores the variable).
    let mut env: Vec<(&str, &str)> = vec![("IRONGUARD_CP_GRPC_INSECURE", "true")];
    env.extend(args.cp_env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let cp = ControlPlane::start_env(&ns, &dir, 9100, 9101, &["--config", cfg.to_str().context("path")?], &env);
    let cp_pid = cp.proc.pid() as u32;
    let pids = Pids { cp: cp_pid, ironic: ironic.proc.pid() as u32 };
    let cp_log = cp.proc.log.clone();
    keep.files.push(cp_log.clone());
    let _agent = start_agent(&ns, &dir, &agent_config(&dir)?, None);
    wait_for(Duration::from_secs(20), || (verdict(&ns) == "LEADER").then_some(())).context("agent never led")?;
    anyhow::ensure!(
        ironguard_netns_tests::wait_tcp_listen(&ns, 5050, Duration::from_secs(10)),
        "the control plane's inspector API does not listen on {INSPECTOR}:\n{}",
        tail(&cp_log, 30)
    );

    // 3. Starts, then 4. the callbacks.
    let concurrency = args.concurrency;
    let measured = {
        let nodes = nodes.clone();
        let (ironic_log, cp_log) = (ironic_log.clone(), cp_log.clone());
        in_netns(&ns, move || -> anyhow::Result<Measured> {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
            rt.block_on(measure(nodes, concurrency, pids, ironic_log, cp_log))
        })?
    };

    // Let both processes flush their last lines, then read what they logged.
    std::thread::sleep(Duration::from_millis(500));
    let ironic_cb = ironic_requests(&log_since(&ironic_log, measured.ironic_callback_offset)?);
    let ironic_start = {
        let text = log_since(&ironic_log, measured.ironic_start_offset)?;
        let upto = (measured.ironic_callback_offset - measured.ironic_start_offset) as usize;
        ironic_requests(text.get(..upto.min(text.len())).unwrap_or(&text))
    };
    let counts = Counts {
        ironic_start,
        ironic_cb,
        ironguard: ironguard_counts(&log_since(&cp_log, measured.cp_callback_offset)?),
        rss_kib: vm_kib(cp_pid, "VmRSS:"),
        peak_kib: vm_kib(cp_pid, "VmHWM:"),
        store_bytes: dir_bytes(&cp.data_dir),
        load: (load_before, loadavg()),
    };
    report(&args, &nodes, &measured, enroll, &counts)?;
    drop(cp);
    drop(ironic);
    Ok(())
}

async fn measure(
    nodes: Vec<Node>,
    concurrency: usize,
    pids: Pids,
    ironic_log: PathBuf,
    cp_log: PathBuf,
) -> anyhow::Result<Measured> {
    let n = nodes.len();
    let uuids: BTreeSet<String> = nodes.iter().map(|x| x.uuid.clone()).collect();
    let ch = tonic::transport::Endpoint::from_static(GRPC)
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(60))
        .connect()
        .await
        .context("connecting to the control plane's gRPC")?;

    // Starts (manage_boot = false), START_CONCURRENCY in flight.
    eprintln!("starting {n} inspections …");
    let ironic_start_offset = file_len(&ironic_log);
    let t0 = Instant::now();
    let started: Vec<anyhow::Result<()>> = futures::stream::iter(nodes.iter())
        .map(|node| {
            let mut c = InspectionClient::new(ch.clone());
            let uuid = node.uuid.clone();
            async move {
                c.start(StartRequest { node: uuid.clone(), manage_boot: false, ..Default::default() })
                    .await
                    .with_context(|| format!("gRPC Inspection.Start {uuid}"))
                    .map(|_| ())
            }
        })
        .buffer_unordered(START_CONCURRENCY)
        .collect()
        .await;
    started.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    let starts_accepted = t0.elapsed();
    let waiting_timeout = Duration::from_secs(60) + Duration::from_millis(100) * n as u32;
    wait_all(&ch, &uuids, "waiting", waiting_timeout, Duration::from_millis(100), &cp_log)
        .await
        .context("waiting for every inspection to be `waiting`")?;
    let all_waiting = t0.elapsed();
    eprintln!(
        "{n} inspections waiting after {} (Start calls accepted in {})",
        human(all_waiting),
        human(starts_accepted)
    );

    // The ramdisks' data, serialised before anything is timed.
    let bodies: Vec<Vec<u8>> =
        nodes.iter().map(|x| serde_json::to_vec(&ipa_inventory(&[x.mac], &x.bmc))).collect::<Result<_, _>>()?;
    // Every callback from its own machine: its own source address (all of 127/8 is local) and connection, as
    // separate ramdisks have (and as a per-source limit of the inspector API sees them). Plain HTTP: the TLS
    // configuration only spares each client loading the system's roots.
    let tls =
        rustls::ClientConfig::builder().with_root_certificates(rustls::RootCertStore::empty()).with_no_client_auth();
    let clients: Vec<reqwest::Client> = (0..n)
        .map(|i| {
            reqwest::Client::builder()
                .use_preconfigured_tls(tls.clone())
                .local_address(Some(source_address(i)))
                .pool_max_idle_per_host(0)
                .timeout(Duration::from_secs(30))
                .build()
                .context("HTTP client")
        })
        .collect::<anyhow::Result<_>>()?;
    let url = format!("{INSPECTOR}/v1/continue");
    eprintln!("{n} callbacks, {concurrency} at once …");
    let at_waiting = pids.usage();
    let ironic_callback_offset = file_len(&ironic_log);
    let cp_callback_offset = file_len(&cp_log);
    let t1 = Instant::now();
    let results: Vec<anyhow::Result<Callback>> = futures::stream::iter(bodies.into_iter().zip(clients).enumerate())
        .map(|(i, (body, client))| {
            let url = url.clone();
            async move {
                let sent_ms = now_ms();
                let t = Instant::now();
                let resp = client
                    .post(&url)
                    .header("Content-Type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .with_context(|| format!("callback {i}: POST {url} from {}", source_address(i)))?;
                let status = resp.status().as_u16();
                let body = resp.text().await.with_context(|| format!("callback {i}: reading the reply"))?;
                let reply = t.elapsed();
                Ok(Callback { node: i, sent_ms, reply, status, body })
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let callbacks_answered = t1.elapsed();
    let at_answered = pids.usage();
    let mut callbacks = Vec::with_capacity(n);
    let mut bad = Vec::new();
    for r in results {
        let c = r?;
        let uuid = serde_json::from_str::<Value>(&c.body).ok().and_then(|v| v["uuid"].as_str().map(String::from));
        if c.status != 200 || uuid.as_deref() != Some(nodes[c.node].uuid.as_str()) {
            bad.push(format!("{} ({}): {} {}", nodes[c.node].name, nodes[c.node].uuid, c.status, c.body));
        }
        callbacks.push(c);
    }
    callbacks.sort_by_key(|c| c.node);
    if !bad.is_empty() {
        anyhow::bail!(
            "{} of {n} callbacks were not answered 200 with the node's UUID; first ones:\n{}\ncontrol plane log (tail):\n{}",
            bad.len(),
            bad.iter().take(5).cloned().collect::<Vec<_>>().join("\n"),
            tail(&cp_log, 30)
        );
    }
    eprintln!("{n} callbacks answered in {}; waiting for `finished` …", human(callbacks_answered));
    let finished_timeout = Duration::from_secs(60) + Duration::from_millis(200) * n as u32;
    let finished = wait_all(&ch, &uuids, "finished", finished_timeout, Duration::from_millis(200), &cp_log)
        .await
        .context("waiting for every inspection to be `finished`")?;
    let polled_all_finished = t1.elapsed();
    let at_finished = pids.usage();
    Ok(Measured {
        callbacks,
        finished,
        starts_accepted,
        all_waiting,
        ironic_start_offset,
        ironic_callback_offset,
        cp_callback_offset,
        polled_all_finished,
        callbacks_answered,
        at_waiting,
        at_answered,
        at_finished,
    })
}

fn report(args: &Args, nodes: &[Node], m: &Measured, enroll: Duration, counts: &Counts) -> anyhow::Result<()> {
    let (ironic_start, ironic_cb) = (&counts.ironic_start, &counts.ironic_cb);
    let IronguardCount { events, nodes: event_nodes, reads: ig_reads, writes: ig_writes, hist: ref ig_hist } =
        counts.ironguard;
    let (rss, hwm) = (counts.rss_kib, counts.peak_kib);
    let n = nodes.len();
    let nf = n as f64;
    let finished_at: HashMap<&str, u64> = m.finished.iter().map(|s| (s.node.as_str(), s.finished_at_ms)).collect();
    let mut per_node = Vec::with_capacity(n);
    let mut to_finished = Vec::with_capacity(n);
    for c in &m.callbacks {
        let node = &nodes[c.node];
        let fin = *finished_at.get(node.uuid.as_str()).with_context(|| format!("{} is not finished", node.uuid))?;
        anyhow::ensure!(fin > 0, "{} is finished without finished_at_ms", node.uuid);
        let d = fin as f64 - c.sent_ms;
        to_finished.push(Duration::from_secs_f64(d.max(0.0) / 1e3));
        per_node.push(callback_json(node, c, fin));
    }
    let replies = Samples::new(m.callbacks.iter().map(|c| c.reply).collect());
    let to_finished = Samples::new(to_finished);
    let first_sent = m.callbacks.iter().map(|c| c.sent_ms).fold(f64::INFINITY, f64::min);
    let last_finished = m.finished.iter().map(|s| s.finished_at_ms).max().unwrap_or(0) as f64;
    let wall = Duration::from_secs_f64(((last_finished - first_sent) / 1e3).max(0.0));
    let per_second = nf / wall.as_secs_f64().max(1e-9);

    let is_read = |k: &str| k.starts_with("GET ") || k.starts_with("HEAD ");
    let cb_total: usize = ironic_cb.values().sum();
    let cb_reads: usize = ironic_cb.iter().filter(|(k, _)| is_read(k)).map(|(_, v)| v).sum();
    let cb_writes = cb_total - cb_reads;
    let workers = if args.workers == 0 {
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2)
    } else {
        args.workers
    };

    println!(
        "ironguard callback benchmark — real Ironic {} (sqlite, fake-hardware) with {n} enrolled nodes (1 port each, enrolled in {}), \
         real control plane (embedded store, {workers} workers) and agent, one namespace; {n} callbacks to `/v1/continue`, {} at once, \
         each from its own address and connection; host load average {:.1} before, {:.1} after",
        ironguard_netns_tests::ironic::IRONIC_VERSION,
        human(enroll),
        args.concurrency,
        counts.load.0,
        counts.load.1
    );
    println!();
    println!("| measurement | result | goal |");
    println!("|---|---:|---|");
    println!(
        "| {n} inspections started (`manage_boot = false`) → all `waiting` | {} (Start calls accepted in {}) | context |",
        human(m.all_waiting),
        human(m.starts_accepted)
    );
    println!(
        "| `/v1/continue` reply p50 / p99 / max | {} / {} / {} | p99 < 50 ms |",
        human(replies.median()),
        human(replies.percentile(99.0)),
        human(replies.percentile(100.0))
    );
    println!(
        "| callback → `finished` p50 / p99 / max | {} / {} / {} | — |",
        human(to_finished.median()),
        human(to_finished.percentile(99.0)),
        human(to_finished.percentile(100.0))
    );
    println!(
        "| first callback → all {n} `finished` (wall) | {} ({per_second:.0} inspections per second) | throughput |",
        human(wall)
    );
    let kinds: Vec<String> =
        ironic_cb.iter().map(|(k, v)| format!("`{}` {}", short(k), fmt_per(*v as f64 / nf))).collect();
    println!(
        "| Ironic requests per inspection, Ironic's log | {} ({} reads + {} writes): {} | writes ≤ 1 PATCH + 1 per new port (here 0 new) |",
        fmt_per(cb_total as f64 / nf),
        fmt_per(cb_reads as f64 / nf),
        fmt_per(cb_writes as f64 / nf),
        if kinds.is_empty() { "none".to_string() } else { kinds.join(", ") }
    );
    let hist: Vec<String> = ig_hist.iter().map(|((r, w), c)| format!("{c}× reads={r} writes={w}")).collect();
    println!(
        "| Ironic requests per inspection, ironguard's count (`processed` events: {events} for {event_nodes} nodes) | {} reads + {} writes ({}) | writes ≤ 1 |",
        fmt_per(ig_reads as f64 / nf),
        fmt_per(ig_writes as f64 / nf),
        hist.join(", ")
    );
    println!(
        "| control-plane RSS: all `waiting` → callbacks answered → all `finished` | {:.1} → {:.1} → {:.1} MiB (peak {:.1} MiB; store on disk {:.1} MiB) | < 60 MB |",
        m.at_waiting.cp_rss_kib as f64 / 1024.0,
        m.at_answered.cp_rss_kib as f64 / 1024.0,
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
        counts.store_bytes as f64 / (1024.0 * 1024.0)
    );
    let (a, b, c) = (m.at_waiting, m.at_answered, m.at_finished);
    println!(
        "| CPU used from the first callback to all `finished`: control plane / Ironic (callbacks answered in {}) | {:.1} s / {:.1} s (while answering: {:.1} s / {:.1} s) | context ({} CPUs) |",
        human(m.callbacks_answered),
        c.cp_cpu_s - a.cp_cpu_s,
        c.ironic_cpu_s - a.ironic_cpu_s,
        b.cp_cpu_s - a.cp_cpu_s,
        b.ironic_cpu_s - a.ironic_cpu_s,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );
    println!();
    println!(
        "(poll saw all finished {} after the first callback; Ironic requests while starting, per inspection: {})",
        human(m.polled_all_finished),
        ironic_start
            .iter()
            .map(|(k, v)| format!("`{}` {}", short(k), fmt_per(*v as f64 / nf)))
            .collect::<Vec<_>>()
            .join(", ")
    );

    let to_map =
        |m: &BTreeMap<String, usize>| m.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>();
    let out = json!({
        "ironic_version": ironguard_netns_tests::ironic::IRONIC_VERSION,
        "nodes": n,
        "concurrency": args.concurrency,
        "workers": workers,
        "enroll_ms": ms(enroll),
        "starts_accepted_ms": ms(m.starts_accepted),
        "all_waiting_ms": ms(m.all_waiting),
        "reply_ms": latency_json(&replies),
        "callback_to_finished_ms": latency_json(&to_finished),
        "all_finished_wall_ms": ms(wall),
        "polled_all_finished_ms": ms(m.polled_all_finished),
        "inspections_per_second": per_second,
        "ironic_requests_callback_phase": {
            "from_ironic_log": to_map(ironic_cb),
            "total": cb_total, "reads": cb_reads, "writes": cb_writes,
            "per_inspection": {"total": cb_total as f64 / nf, "reads": cb_reads as f64 / nf, "writes": cb_writes as f64 / nf},
            "from_ironguard_log": {
                "processed_events": events, "nodes": event_nodes, "reads": ig_reads, "writes": ig_writes,
                "per_inspection": {"reads": ig_reads as f64 / nf, "writes": ig_writes as f64 / nf},
                "histogram": ig_hist.iter().map(|((r, w), c)| json!({"reads": r, "writes": w, "count": c})).collect::<Vec<_>>(),
            },
            "ironic_inspector_writes": 1,
        },
        "ironic_requests_start_phase": to_map(ironic_start),
        "controlplane_rss_kib": rss,
        "controlplane_peak_kib": hwm,
        "controlplane_store_bytes": counts.store_bytes,
        "host_loadavg_1m": {"before": counts.load.0, "after": counts.load.1},
        "controlplane_env": args.cp_env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "callbacks_answered_ms": ms(m.callbacks_answered),
        "usage": {
            "all_waiting": usage_json(a),
            "callbacks_answered": usage_json(b),
            "all_finished": usage_json(c),
        },
        "callbacks": per_node,
    });
    crate::write_json(&args.json, &out)?;
    crate::write_chart(&args.json, crate::plot::Kind::Callbacks, &out);
    anyhow::ensure!(
        events == n,
        "the control plane logged {events} `processed` events for {n} callbacks (see its log)"
    );
    Ok(())
}

/// One entry of `callbacks` (the chart reads `reply_ms` and `callback_to_finished_ms`).
fn callback_json(node: &Node, c: &Callback, finished_at_ms: u64) -> Value {
    json!({
        "name": node.name, "uuid": node.uuid, "mac": node.mac.to_string(), "bmc": node.bmc,
        "sent_ms": c.sent_ms, "reply_ms": ms(c.reply), "status": c.status,
        "finished_at_ms": finished_at_ms, "callback_to_finished_ms": finished_at_ms as f64 - c.sent_ms,
    })
}

/// `reply_ms` / `callback_to_finished_ms`: p50, p99 and max (the chart marks them on its curves).
fn latency_json(s: &Samples) -> Value {
    json!({"p50": ms(s.median()), "p99": ms(s.percentile(99.0)), "max": ms(s.percentile(100.0))})
}

/// The parts of the JSON that the chart reads, built as `report` builds them: one callback per (reply latency,
/// callback → finished) pair, whole milliseconds for the latter (Ironic's `finished_at` is in ms).
#[cfg(test)]
pub(crate) fn sample_json(samples: &[(Duration, u64)]) -> Value {
    let sent = 1_750_000_000_000.0;
    let mut per_node = Vec::new();
    for (i, &(reply, to_finished_ms)) in samples.iter().enumerate() {
        let mac = crate::stats::macs(samples.len(), MAC_TAG)[i];
        let node = Node { name: format!("bench-{i}"), uuid: format!("uuid-{i}"), mac, bmc: format!("10.0.0.{i}") };
        let c = Callback { node: i, sent_ms: sent, reply, status: 200, body: String::new() };
        per_node.push(callback_json(&node, &c, sent as u64 + to_finished_ms));
    }
    let replies = Samples::new(samples.iter().map(|s| s.0).collect());
    let to_finished = Samples::new(samples.iter().map(|s| Duration::from_millis(s.1)).collect());
    json!({
        "ironic_version": "39.0.0", "nodes": samples.len(), "concurrency": 50, "workers": 2,
        "reply_ms": latency_json(&replies),
        "callback_to_finished_ms": latency_json(&to_finished),
        "callbacks": per_node,
    })
}

fn usage_json(u: Usage) -> Value {
    json!({"controlplane_cpu_s": u.cp_cpu_s, "ironic_cpu_s": u.ironic_cpu_s, "controlplane_rss_kib": u.cp_rss_kib})
}

/// A request shape for the table: a `fields=` list shortened to `fields=…` (the JSON keeps it whole).
fn short(shape: &str) -> String {
    let Some((head, rest)) = shape.split_once("fields=") else { return shape.to_string() };
    let tail = rest.find(['&', ' ']).map(|i| &rest[i..]).unwrap_or("");
    format!("{head}fields=…{tail}")
}

/// A per-inspection count: integral values without decimals.
fn fmt_per(x: f64) -> String {
    if (x - x.round()).abs() < 1e-9 { format!("{x:.0}") } else { format!("{x:.2}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_group_requests() {
        assert_eq!(
            path_shape("/v1/nodes/6f1c3a52-0d7e-4a43-9b0a-2f3e6c1d9a01/ports?detail=True&limit=1000"),
            "/v1/nodes/{uuid}/ports?detail=True&limit=1000"
        );
        assert_eq!(
            short("GET /v1/ports?fields=uuid%2Caddress&node_uuid={uuid} 200"),
            "GET /v1/ports?fields=…&node_uuid={uuid} 200"
        );
        assert_eq!(short("GET /v1/nodes/{uuid}?fields=uuid,name 200"), "GET /v1/nodes/{uuid}?fields=… 200");
        assert_eq!(path_shape("/v1/ports?address=02%3Acb%3A00%3A00%3A01%3A01"), "/v1/ports?address={mac}");
        let log = "2025 INFO ironic.api [-] 127.0.0.1 \"PATCH /v1/nodes/6f1c3a52-0d7e-4a43-9b0a-2f3e6c1d9a01 HTTP/1.1\" status: 200 len: 9\n\
                   x \"GET /v1/nodes/6f1c3a52-0d7e-4a43-9b0a-2f3e6c1d9a02 - 200\nnoise line\n";
        let r = ironic_requests(log);
        assert_eq!(r.get("PATCH /v1/nodes/{uuid} 200"), Some(&1));
        assert_eq!(r.get("GET /v1/nodes/{uuid} 200"), Some(&1));
        assert_eq!(r.len(), 2);
    }
}
