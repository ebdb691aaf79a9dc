//! The command line of `ironguardctl`: what is parsed and checked before anything runs.
//!
//! MAC arguments are parsed into [`MacAddr`] by clap, so a malformed address is a usage error (exit 2, with
//! [`MacAddr`]'s message quoting the input) before any namespace is entered or any connection is opened. Likewise
//! node names must be non-empty and inspection states one of [`INSPECTION_STATES`].

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{NonEmptyStringValueParser, PossibleValuesParser};
use clap::{Args, Parser, Subcommand};
use ironguard_dataplane::MacAddr;

use crate::inspect::wait::WaitBounds;

/// Where the control plane's gRPC API listens unless `--controlplane` or `IRONGUARD_CONTROLPLANE` says otherwise:
/// over TLS when a CA or a client certificate is configured, else in plaintext (a control plane with
/// `insecure = true` on its default loopback address).
pub const DEFAULT_CONTROLPLANE: &str = "http://127.0.0.1:9100";
pub const DEFAULT_CONTROLPLANE_TLS: &str = "https://127.0.0.1:9100";

#[derive(Debug, Parser)]
#[command(name = "ironguardctl", version, about = "ironguard operator CLI")]
pub struct Cli {
    /// gRPC address of the control plane, for `filters`, `agents`, `inspect` and `rules` (default: the config
    /// file's `controlplane`, else https://127.0.0.1:9100 when a CA or certificate is given, else
    /// http://127.0.0.1:9100).
    #[arg(long, global = true, value_name = "URL", env = "IRONGUARD_CONTROLPLANE")]
    pub controlplane: Option<String>,
    /// How errors are printed on stderr: text, or one JSON object (`{"level":"error","message":…,"causes":[…]}`)
    /// for scripts and log collectors.
    #[arg(long, global = true, value_enum, default_value = "text", env = "IRONGUARD_LOG_FORMAT")]
    pub log_format: LogFormat,
    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// TLS and credentials for the control plane. Each falls back to the environment, then to the config file.
#[derive(Debug, Clone, Default, Args)]
pub struct AuthArgs {
    /// Configuration file (TOML: controlplane, ca_file, cert_file, key_file, token_file, server_name). Default:
    /// /etc/ironguard/ctl.toml if it exists.
    #[arg(long = "config", global = true, value_name = "FILE", env = "IRONGUARD_CTL_CONFIG")]
    pub config: Option<PathBuf>,
    /// CA that signed the control plane's certificate (https:// URLs).
    #[arg(long, global = true, value_name = "FILE", env = "IRONGUARD_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// Operator certificate (its name must be in the control plane's [grpc] operator_names).
    #[arg(long, global = true, value_name = "FILE", env = "IRONGUARD_CERT_FILE")]
    pub cert_file: Option<PathBuf>,
    /// Private key of --cert-file.
    #[arg(long, global = true, value_name = "FILE", env = "IRONGUARD_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// File holding the operator token (instead of, or besides, a certificate).
    #[arg(long, global = true, value_name = "FILE", env = "IRONGUARD_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Name in the control plane's certificate, when the URL uses another host (e.g. an IP address).
    #[arg(long, global = true, value_name = "NAME", env = "IRONGUARD_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,
}

/// Where `ironguardctl` looks for its configuration when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/ironguard/ctl.toml";

/// `ironguardctl`'s configuration file.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CtlConfig {
    pub controlplane: Option<String>,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub token_file: Option<PathBuf>,
    pub server_name: Option<String>,
}

impl CtlConfig {
    /// `path`, or the default path if it exists, or nothing.
    pub fn load(path: Option<&std::path::Path>) -> anyhow::Result<Self> {
        let (path, required) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => toml::from_str(&text)
                .map_err(|e| anyhow::anyhow!("{} is not a valid ironguardctl configuration: {e}", path.display())),
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
        }
    }
}

impl Cli {
    /// The control plane to talk to and how: flags and environment first, then the configuration file.
    pub fn target(&self) -> anyhow::Result<crate::controlplane::Target> {
        let file = CtlConfig::load(self.auth.config.as_deref())?;
        let url = self.controlplane.clone().or(file.controlplane);
        let pick = |a: &Option<PathBuf>, b: Option<PathBuf>| a.clone().or(b).unwrap_or_default();
        let auth = ironguard_proto::client::ClientAuth {
            ca_file: pick(&self.auth.ca_file, file.ca_file),
            cert_file: pick(&self.auth.cert_file, file.cert_file),
            key_file: pick(&self.auth.key_file, file.key_file),
            token_file: pick(&self.auth.token_file, file.token_file),
            server_name: self.auth.tls_server_name.clone().or(file.server_name).unwrap_or_default(),
        };
        let tls = !auth.ca_file.as_os_str().is_empty() || !auth.cert_file.as_os_str().is_empty();
        let url = url.unwrap_or_else(|| if tls { DEFAULT_CONTROLPLANE_TLS } else { DEFAULT_CONTROLPLANE }.to_string());
        Ok(crate::controlplane::Target { auth, ..crate::controlplane::Target::new(url) })
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Dump the kernel chain state of this host (read over netlink; works when the agent is dead).
    Chains {
        /// Inspect this named network namespace (as listed by `ip netns`).
        #[arg(long)]
        netns: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Also list the elements of every set.
        #[arg(long)]
        elements: bool,
    },
    /// The MAC filter held by the control plane: show it, or allow, deny or remove MACs.
    Filters {
        #[command(subcommand)]
        command: FiltersCommand,
    },
    /// Does this MAC get DHCP now, on each PXE host, and why: its reasons (source, age), the revision that moved
    /// it, each agent's mode, lease and deciding rule, the leader, the unknown-MAC policy and the Ironic or
    /// inspection state behind the reasons.
    Explain {
        /// The MAC address.
        #[arg(value_name = "MAC")]
        mac: MacAddr,
        /// Also read this host's kernel (works when the agent is dead) and judge the MAC there.
        #[arg(long)]
        local: bool,
        /// With --local: read the kernel of this named network namespace.
        #[arg(long, requires = "local")]
        netns: Option<String>,
        /// Also show the boot as each host's kernel saw it (DHCP requests that reached the filter, let through,
        /// answered by the local server) and the inspection callbacks, and name where a boot stops.
        #[arg(long)]
        timeline: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// The agents reporting to the control plane: mode, applied revision, DHCP health.
    Agents {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Node inspections run by the control plane: start, follow, abort, reapply, and their data.
    Inspect {
        #[command(subcommand)]
        command: InspectCommand,
    },
    /// Introspection rules (ironic-inspector's format): import, list, show, delete.
    Rules {
        #[command(subcommand)]
        command: RulesCommand,
    },
    /// Discovery windows: while a network's window is open, machines nobody enrolled may boot there (unknown MACs
    /// get DHCP with unknown_mac_policy = "while-inspecting") and the enroll hook enrolls them. A window closes by
    /// itself.
    Discovery {
        #[command(subcommand)]
        command: DiscoveryCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum DiscoveryCommand {
    /// Open a network's window (again: its end is set anew).
    Open {
        /// The network ([agent] network of its PXE hosts' agents).
        #[arg(long)]
        network: String,
        /// How long: 90s, 30m, 2h (at most 24h).
        #[arg(long = "for", value_name = "DURATION", value_parser = parse_duration)]
        duration: std::time::Duration,
    },
    /// Close a network's window now.
    Close {
        #[arg(long)]
        network: String,
    },
    /// The windows open now.
    List {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// `90s`, `30m`, `2h`, `1d`, or a number of seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("{s:?}: a duration is a number and a unit: 90s, 30m, 2h"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        "d" => n.saturating_mul(86_400),
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (s, m, h or d)")),
    };
    if secs == 0 {
        return Err(format!("{s:?}: a window lasts at least one second"));
    }
    Ok(std::time::Duration::from_secs(secs))
}

#[derive(Debug, Subcommand)]
pub enum RulesCommand {
    /// Store the rules of a JSON file (one rule, or a list of rules), as `openstack baremetal introspection rule
    /// import` does. Stops at the first rule the control plane refuses; the rules before it stay stored.
    Import {
        /// The JSON document; `-` reads standard input.
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Every rule, in the order they apply.
    List {
        /// Print JSON (the full rules) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One rule, as indented JSON.
    Show {
        #[arg(value_name = "UUID", value_parser = NonEmptyStringValueParser::new())]
        uuid: String,
    },
    /// Delete these rules, or every rule with --all.
    Delete {
        #[arg(value_name = "UUID", value_parser = NonEmptyStringValueParser::new(), required_unless_present = "all", conflicts_with = "all")]
        uuids: Vec<String>,
        #[arg(long)]
        all: bool,
    },
}

/// The states of an inspection, as the `Inspection` service names them (`--state` of `inspect list`).
pub const INSPECTION_STATES: [&str; 8] =
    ["starting", "waiting", "processing", "finished", "error", "reapplying", "aborting", "enrolling"];

#[derive(Debug, Subcommand)]
pub enum InspectCommand {
    /// Start inspecting these nodes; a node the control plane refuses is reported and the others still start.
    Start {
        /// Ironic node UUIDs or names.
        #[arg(required = true, value_name = "NODE", value_parser = NonEmptyStringValueParser::new())]
        nodes: Vec<String>,
        /// Do not set PXE boot or power the nodes on and off: something else boots them.
        #[arg(long)]
        no_manage_boot: bool,
        /// Inspect nodes in maintenance too (refused otherwise).
        #[arg(long)]
        maintenance_ok: bool,
        /// Then wait for the started inspections to finish, as `inspect wait` does (and exit as it does).
        #[arg(long)]
        wait: bool,
        /// With --wait: give up after this many seconds (exit 2).
        #[arg(long, value_name = "SECS", default_value_t = 3600, requires = "wait")]
        timeout: u64,
        /// With --wait: ask the control plane this often, in milliseconds.
        #[arg(
            long,
            value_name = "MS",
            default_value_t = 1000,
            value_parser = clap::value_parser!(u64).range(1..),
            requires = "wait"
        )]
        interval: u64,
    },
    /// The inspection status of one node.
    Status {
        /// Ironic node UUID, as `inspect start` and `inspect list` show it (inspections are kept by UUID).
        #[arg(value_name = "NODE", value_parser = NonEmptyStringValueParser::new())]
        node: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Inspections known to the control plane, one page (or every page with --all).
    List {
        /// Only inspections in this state (repeatable).
        #[arg(long = "state", value_name = "STATE", value_parser = PossibleValuesParser::new(INSPECTION_STATES))]
        states: Vec<String>,
        /// At most this many per page (the control plane's default is 100).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
        page_size: Option<u32>,
        /// Start after this token, from a previous page's `more:` line.
        #[arg(long, value_name = "TOKEN")]
        page_token: Option<String>,
        /// Follow the pages to the last one.
        #[arg(long)]
        all: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Abort the inspection of a node.
    Abort {
        /// Ironic node UUID, as `inspect start` and `inspect list` show it (inspections are kept by UUID).
        #[arg(value_name = "NODE", value_parser = NonEmptyStringValueParser::new())]
        node: String,
    },
    /// Process a node's stored introspection data again.
    Reapply {
        /// Ironic node UUID, as `inspect start` and `inspect list` show it (inspections are kept by UUID).
        #[arg(value_name = "NODE", value_parser = NonEmptyStringValueParser::new())]
        node: String,
    },
    /// The introspection data stored for a node (after processing, without logs), as indented JSON.
    Data {
        /// Ironic node UUID, as `inspect start` and `inspect list` show it (inspections are kept by UUID).
        #[arg(value_name = "NODE", value_parser = NonEmptyStringValueParser::new())]
        node: String,
        /// The data as the ramdisk sent it (what `inspect reapply` processes again).
        #[arg(long)]
        unprocessed: bool,
        /// Write it to this file instead of standard output.
        #[arg(long, short, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Hand a ramdisk's introspection data (a JSON object) to the control plane, which finds its node.
    Continue {
        /// The JSON document; `-` reads standard input.
        #[arg(long, value_name = "FILE")]
        file: PathBuf,
        /// Look the data up against this node only.
        #[arg(long, value_name = "UUID")]
        node_uuid: Option<String>,
    },
    /// Queued requests that could not be read and were moved aside (the rest of the queue went on): id, node, key,
    /// error, when. Start the node's inspection again if it still needs one, then drop the record with --drop.
    Quarantine {
        /// Forget the quarantine record of this request id (once read).
        #[arg(long, value_name = "ID")]
        drop: Option<u64>,
        /// Print JSON instead of text, with the record's bytes as text (its first 4096 characters).
        #[arg(long, conflicts_with = "drop")]
        json: bool,
    },
    /// Wait until the inspections of these nodes are finished (exit 0), one ended in error (1), or time is up (2).
    Wait {
        /// Ironic node UUIDs (as `inspect start` and `inspect list` show them).
        #[arg(required = true, value_name = "NODE", value_parser = NonEmptyStringValueParser::new())]
        nodes: Vec<String>,
        #[command(flatten)]
        wait: WaitArgs,
    },
}

/// How long `inspect wait` waits, and how often it asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Args)]
pub struct WaitArgs {
    /// Give up after this many seconds (exit 2).
    #[arg(long, value_name = "SECS", default_value_t = 3600)]
    pub timeout: u64,
    /// Ask the control plane this often, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub interval: u64,
}

impl WaitArgs {
    pub fn bounds(&self) -> WaitBounds {
        WaitBounds { timeout: Duration::from_secs(self.timeout), interval: Duration::from_millis(self.interval) }
    }
}

#[derive(Debug, Subcommand)]
pub enum FiltersCommand {
    /// Revision, unknown-MAC policy, counts, and why each MAC is allowed or denied.
    Show {
        /// Only this MAC (repeatable); every MAC in the state if none is given.
        #[arg(long = "mac", value_name = "MAC")]
        macs: Vec<MacAddr>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Allow these MACs (reason "api"); their "api" deny reason, if any, is dropped.
    Allow(MacList),
    /// Deny these MACs (reason "api"); their "api" allow reason, if any, is dropped.
    Deny(MacList),
    /// Drop the "api" reasons of these MACs; reasons owned by inspections or Ironic stay. With --reason, drop
    /// that reason instead (an override, e.g. a stuck `inspection:<node>` allow).
    Remove {
        #[command(flatten)]
        list: MacList,
        /// The reason to drop (default "api"), e.g. `inspection:1be26c0b-03f2-4d2e-ae87-c02d7f33c123`.
        #[arg(long, value_name = "REASON")]
        reason: Option<String>,
    },
}

/// The MACs of `filters allow|deny|remove`: at least one, each a valid unicast address.
#[derive(Debug, Args)]
pub struct MacList {
    #[arg(required = true, value_name = "MAC")]
    pub macs: Vec<MacAddr>,
}

/// How `ironguardctl` prints an error: the message, then each cause, `: `-separated, leaving out a cause whose
/// text the line already ends with (hyper's connect errors wrap themselves: "tcp connect error: tcp connect error").
/// How `ironguardctl` prints its errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// The error as one JSON object: the whole message (as [`error_text`]) and each cause on its own.
pub fn error_json(error: &anyhow::Error) -> String {
    let causes: Vec<String> = error.chain().map(|c| c.to_string()).collect();
    serde_json::json!({"level": "error", "program": "ironguardctl", "message": error_text(error), "causes": causes})
        .to_string()
}

pub fn error_text(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let cause = cause.to_string();
        if text.is_empty() {
            text = cause;
        } else if !text.ends_with(&cause) {
            text = format!("{text}: {cause}");
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;
    use clap::error::ErrorKind;

    use super::*;
    use crate::filters::FilterAction;

    #[test]
    fn errors_print_as_one_json_object() {
        let e = anyhow::anyhow!("connection refused").context("calling the control plane at https://cp:9100");
        let j: serde_json::Value = serde_json::from_str(&error_json(&e)).unwrap();
        assert_eq!(j["level"], "error");
        assert_eq!(j["message"], "calling the control plane at https://cp:9100: connection refused");
        assert_eq!(j["causes"].as_array().unwrap().len(), 2);
        assert_eq!(parse(&["--log-format", "json", "agents"]).unwrap().log_format, LogFormat::Json);
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("ironguardctl").chain(args.iter().copied()))
    }

    fn mac(s: &str) -> MacAddr {
        s.parse().unwrap()
    }

    #[test]
    fn definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn allow_deny_remove_parse_their_macs() {
        for (word, action) in
            [("allow", FilterAction::Allow), ("deny", FilterAction::Deny), ("remove", FilterAction::Remove)]
        {
            let cli = parse(&["filters", word, "52:54:00:12:34:56", "52-54-00-AB-CD-EF"]).unwrap();
            let (got, list) = match cli.command {
                Command::Filters { command: FiltersCommand::Allow(list) } => (FilterAction::Allow, list),
                Command::Filters { command: FiltersCommand::Deny(list) } => (FilterAction::Deny, list),
                Command::Filters { command: FiltersCommand::Remove { list, .. } } => (FilterAction::Remove, list),
                other => panic!("not an update: {other:?}"),
            };
            assert_eq!(got, action);
            assert_eq!(list.macs, [mac("52:54:00:12:34:56"), mac("52:54:00:ab:cd:ef")]);
        }
    }

    #[test]
    fn a_malformed_mac_is_a_usage_error_quoting_the_input() {
        let err = parse(&["filters", "allow", "52:54:00:12:34:56", "52:54:00:zz:34:56"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
        assert_eq!(err.exit_code(), 2);
        let text = err.to_string();
        assert!(text.contains(r#"invalid MAC address "52:54:00:zz:34:56""#), "{text}");

        let err = parse(&["filters", "show", "--mac", "ff:ff:ff:ff:ff:ff"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
        assert!(err.to_string().contains("broadcast"), "{err}");
    }

    #[test]
    fn allow_deny_remove_need_at_least_one_mac() {
        for word in ["allow", "deny", "remove"] {
            let err = parse(&["filters", word]).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::MissingRequiredArgument, "{word}");
            assert_eq!(err.exit_code(), 2);
        }
    }

    #[test]
    fn show_takes_repeated_macs_and_json() {
        let cli =
            parse(&["filters", "show", "--mac", "52:54:00:12:34:56", "--mac", "52:54:00:ab:cd:ef", "--json"]).unwrap();
        let Command::Filters { command: FiltersCommand::Show { macs, json } } = cli.command else {
            panic!("not filters show: {cli:?}")
        };
        assert_eq!(macs, [mac("52:54:00:12:34:56"), mac("52:54:00:ab:cd:ef")]);
        assert!(json);
    }

    #[test]
    fn controlplane_defaults_and_is_accepted_after_the_subcommand() {
        // The environment may set IRONGUARD_CONTROLPLANE; only check the default when it does not.
        if std::env::var_os("IRONGUARD_CONTROLPLANE").is_none() && std::env::var_os("IRONGUARD_CTL_CONFIG").is_none() {
            let cli = parse(&["--config", "/dev/null", "agents"]).unwrap();
            if std::env::var_os("IRONGUARD_CA_FILE").is_none() && std::env::var_os("IRONGUARD_CERT_FILE").is_none() {
                assert_eq!(cli.target().unwrap().url, DEFAULT_CONTROLPLANE);
            }
            let cli = parse(&["--config", "/dev/null", "--ca-file", "/f/ca.pem", "agents"]).unwrap();
            assert_eq!(cli.target().unwrap().url, DEFAULT_CONTROLPLANE_TLS, "a CA means TLS");
        }
        let cli = parse(&["agents", "--json", "--controlplane", "http://cp.example:9100"]).unwrap();
        assert_eq!(cli.controlplane.as_deref(), Some("http://cp.example:9100"));
        let cli = parse(&["--controlplane", "http://10.0.0.1:9100", "filters", "show"]).unwrap();
        assert_eq!(cli.controlplane.as_deref(), Some("http://10.0.0.1:9100"));
    }

    #[test]
    fn credentials_come_from_flags_then_the_config_file() {
        let dir = std::env::temp_dir().join(format!("ig-ctl-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("ctl.toml");
        std::fs::write(
            &file,
            "controlplane = \"https://cp.example:9100\"\nca_file = \"/f/ca.pem\"\ncert_file = \"/f/op.pem\"\n\
             key_file = \"/f/op.key\"\ntoken_file = \"/f/token\"\nserver_name = \"cp.example\"\n",
        )
        .unwrap();
        let f = file.to_str().unwrap();
        let t = parse(&["--config", f, "agents"]).unwrap().target().unwrap();
        if std::env::var_os("IRONGUARD_CONTROLPLANE").is_none() {
            assert_eq!(t.url, "https://cp.example:9100");
        }
        if std::env::var_os("IRONGUARD_CA_FILE").is_none() {
            assert_eq!(t.auth.ca_file, PathBuf::from("/f/ca.pem"));
        }
        assert_eq!(t.auth.server_name, "cp.example");
        let t = parse(&["--config", f, "--ca-file", "/g/ca.pem", "agents"]).unwrap().target().unwrap();
        assert_eq!(t.auth.ca_file, PathBuf::from("/g/ca.pem"), "a flag wins over the file");
        std::fs::write(&file, "cert = \"x\"\n").unwrap();
        let e = parse(&["--config", f, "agents"]).unwrap().target().unwrap_err().to_string();
        assert!(e.contains("not a valid ironguardctl configuration"), "{e}");
        let e = parse(&["--config", "/nonexistent/ctl.toml", "agents"]).unwrap().target().unwrap_err().to_string();
        assert!(e.contains("cannot read /nonexistent/ctl.toml"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn error_text_lists_causes_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("{0}")]
        struct Wrapped(&'static str, #[source] std::io::Error);

        let e = anyhow::Error::new(Wrapped("tcp connect error", std::io::Error::other("tcp connect error")))
            .context("cannot reach the control plane at http://127.0.0.1:9100");
        assert_eq!(error_text(&e), "cannot reach the control plane at http://127.0.0.1:9100: tcp connect error");

        let e =
            anyhow::Error::new(std::io::Error::other("Connection refused (os error 111)")).context("transport error");
        assert_eq!(error_text(&e), "transport error: Connection refused (os error 111)");
    }

    #[test]
    fn inspect_start_takes_nodes_and_wait_bounds() {
        let cli = parse(&["inspect", "start", "n1", "n2", "--no-manage-boot", "--wait", "--timeout", "60"]).unwrap();
        let Command::Inspect { command: InspectCommand::Start { nodes, no_manage_boot, wait, timeout, interval, .. } } =
            cli.command
        else {
            panic!("not inspect start: {cli:?}")
        };
        assert_eq!(nodes, ["n1", "n2"]);
        assert!(no_manage_boot && wait);
        assert_eq!((timeout, interval), (60, 1000));

        let err = parse(&["inspect", "start", "n1", "--timeout", "60"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::MissingRequiredArgument);
        assert!(err.to_string().contains("--wait"), "{err}");

        let err = parse(&["inspect", "start"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::MissingRequiredArgument);
        let err = parse(&["inspect", "start", ""]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidValue);
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn inspect_wait_defaults_to_an_hour_polling_every_second() {
        let cli = parse(&["inspect", "wait", "n1"]).unwrap();
        let Command::Inspect { command: InspectCommand::Wait { nodes, wait } } = cli.command else {
            panic!("not inspect wait: {cli:?}")
        };
        assert_eq!(nodes, ["n1"]);
        assert_eq!(wait.bounds(), WaitBounds { timeout: Duration::from_secs(3600), interval: Duration::from_secs(1) });
        let err = parse(&["inspect", "wait", "n1", "--interval", "0"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
    }

    #[test]
    fn inspect_list_checks_states_and_page_size() {
        let cli =
            parse(&["inspect", "list", "--state", "error", "--state", "waiting", "--page-size", "5", "--all"]).unwrap();
        let Command::Inspect { command: InspectCommand::List { states, page_size, page_token, all, json } } =
            cli.command
        else {
            panic!("not inspect list: {cli:?}")
        };
        assert_eq!(states, ["error", "waiting"]);
        assert_eq!((page_size, page_token, all, json), (Some(5), None, true, false));

        let err = parse(&["inspect", "list", "--state", "done"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidValue);
        assert!(err.to_string().contains("finished"), "{err}");
        for size in ["0", "1001"] {
            let err = parse(&["inspect", "list", "--page-size", size]).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::ValueValidation, "{size}");
        }
    }

    #[test]
    fn inspect_quarantine_lists_or_drops_one_id() {
        let cli = parse(&["inspect", "quarantine", "--drop", "42"]).unwrap();
        let Command::Inspect { command: InspectCommand::Quarantine { drop, json } } = cli.command else {
            panic!("not inspect quarantine: {cli:?}")
        };
        assert_eq!((drop, json), (Some(42), false));
        let err = parse(&["inspect", "quarantine", "--drop", "x"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
        let err = parse(&["inspect", "quarantine", "--drop", "1", "--json"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    #[test]
    fn inspect_continue_needs_a_file_and_data_takes_an_output() {
        let err = parse(&["inspect", "continue"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::MissingRequiredArgument);
        let cli = parse(&["inspect", "continue", "--file", "-"]).unwrap();
        let Command::Inspect { command: InspectCommand::Continue { file, .. } } = cli.command else {
            panic!("not inspect continue: {cli:?}")
        };
        assert_eq!(file, PathBuf::from("-"));
        let cli = parse(&["inspect", "data", "n1", "-o", "/tmp/n1.json"]).unwrap();
        let Command::Inspect { command: InspectCommand::Data { node, output, .. } } = cli.command else {
            panic!("not inspect data: {cli:?}")
        };
        assert_eq!((node.as_str(), output), ("n1", Some(PathBuf::from("/tmp/n1.json"))));
    }

    #[test]
    fn chains_keeps_its_options() {
        let cli = parse(&["chains", "--netns", "ig-demo-pxe", "--json", "--elements"]).unwrap();
        let Command::Chains { netns, json, elements } = cli.command else { panic!("not chains: {cli:?}") };
        assert_eq!(netns.as_deref(), Some("ig-demo-pxe"));
        assert!(json && elements);
    }
}
