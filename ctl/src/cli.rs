//! The command line of `ironguardctl`: what is parsed and checked before anything runs.
//!
//! MAC arguments are parsed into [`MacAddr`] by clap, so a malformed address is a usage error (exit 2, with
//! [`MacAddr`]'s message quoting the input) before any namespace is entered or any connection is opened.

use clap::{Args, Parser, Subcommand};
use ironguard_nft::MacAddr;

/// Where the control plane's gRPC API listens unless `--controlplane` or `IRONGUARD_CONTROLPLANE` says otherwise.
pub const DEFAULT_CONTROLPLANE: &str = "http://127.0.0.1:9100";

#[derive(Debug, Parser)]
#[command(name = "ironguardctl", version, about = "ironguard operator CLI")]
pub struct Cli {
    /// gRPC address of the control plane, for `filters` and `agents`.
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "IRONGUARD_CONTROLPLANE",
        default_value = DEFAULT_CONTROLPLANE
    )]
    pub controlplane: String,
    #[command(subcommand)]
    pub command: Command,
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
    /// The agents reporting to the control plane: mode, applied revision, DHCP health.
    Agents {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
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
    /// Drop the "api" reasons of these MACs; reasons owned by inspections or Ironic stay.
    Remove(MacList),
}

/// The MACs of `filters allow|deny|remove`: at least one, each a valid unicast address.
#[derive(Debug, Args)]
pub struct MacList {
    #[arg(required = true, value_name = "MAC")]
    pub macs: Vec<MacAddr>,
}

/// How `ironguardctl` prints an error: the message, then each cause, `: `-separated, leaving out a cause whose
/// text the line already ends with (hyper's connect errors wrap themselves: "tcp connect error: tcp connect error").
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
                Command::Filters { command: FiltersCommand::Remove(list) } => (FilterAction::Remove, list),
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
        if std::env::var_os("IRONGUARD_CONTROLPLANE").is_none() {
            assert_eq!(parse(&["agents"]).unwrap().controlplane, DEFAULT_CONTROLPLANE);
        }
        let cli = parse(&["agents", "--json", "--controlplane", "http://cp.example:9100"]).unwrap();
        assert_eq!(cli.controlplane, "http://cp.example:9100");
        let cli = parse(&["--controlplane", "http://10.0.0.1:9100", "filters", "show"]).unwrap();
        assert_eq!(cli.controlplane, "http://10.0.0.1:9100");
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
    fn chains_keeps_its_options() {
        let cli = parse(&["chains", "--netns", "ig-demo-pxe", "--json", "--elements"]).unwrap();
        let Command::Chains { netns, json, elements } = cli.command else { panic!("not chains: {cli:?}") };
        assert_eq!(netns.as_deref(), Some("ig-demo-pxe"));
        assert!(json && elements);
    }
}
