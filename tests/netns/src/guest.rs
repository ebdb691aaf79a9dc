//! Tests that need another kernel than this machine's: a stock Debian 12 (6.1) or Debian 13 (6.12) kernel booted
//! with qemu (`scripts/guest-kernel.sh`). The guest mounts this machine's root read-only (with a tmpfs of its own on /tmp and
//! /run, where only the script's and the binaries' directories stay visible, so the checkout may live anywhere) and
//! runs one script from `tests/netns/scripts/` with the workspace's binaries; the script prints
//! `RESULT <check> PASS|FAIL [detail]` per check, then `DONE`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::shapes::require_tools;
use crate::{bin, require_privileges, run_ok};

/// What the guest's init prints once the kernel has started it.
const BOOTED: &str = "guest: kernel ";
/// A guest whose kernel has not started the init by then is stuck in its emulated boot: it is stopped and booted
/// once more. (Beside a CPU hog, a Debian 6.1 kernel under TCG spent 15 minutes in a soft lockup of its boot-time
/// `cryptomgr_test` thread on one vCPU, T28; a boot normally reaches the init in well under a minute.)
const BOOT_LIMIT: Duration = Duration::from_secs(420);
/// Both boots of one guest together: beside other tests and a CPU hog a guest has taken 15 minutes. This ends
/// before nextest's own limit for these tests (30 minutes), so that the test reports the guest's console itself.
const GUEST_LIMIT: Duration = Duration::from_secs(1680);

/// Which stock Debian kernel a guest boots (`scripts/guest-kernel.sh --suite`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestKernel {
    /// Debian 12's linux-image-amd64 (6.1).
    Debian12,
    /// Debian 13's linux-image-amd64 (6.12).
    Debian13,
}

impl GuestKernel {
    fn suite(self) -> &'static str {
        match self {
            Self::Debian12 => "bookworm",
            Self::Debian13 => "trixie",
        }
    }

    /// What the guest's console says of the kernel it runs ("guest: kernel 6.1.").
    pub fn console_marker(self) -> &'static str {
        match self {
            Self::Debian12 => "guest: kernel 6.1.",
            Self::Debian13 => "guest: kernel 6.12.",
        }
    }
}

/// Boots `kernel` with `script` (a file name in `tests/netns/scripts/`; its arguments: the binaries' directory, then
/// `args`, words without spaces or commas) and asserts that the guest finished, that no check failed, that every one
/// of `checks` ran, and that the guest ran that kernel. Returns the guest's console output.
pub fn run_checks_in_kernel(kernel: GuestKernel, script: &str, args: &[&str], checks: &[&str]) -> String {
    require_privileges();
    require_tools(&[("qemu-system-x86_64", "qemu-system-x86"), ("depmod", "kmod")]);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let guest_kernel = kernel;
    let out = run_ok(Command::new(root.join("scripts/guest-kernel.sh")).args(["--suite", kernel.suite()]));
    let cache = String::from_utf8_lossy(&out.stdout).trim().lines().last().unwrap_or_default().to_string();
    let kernel = std::fs::read_dir(Path::new(&cache).join("boot"))
        .expect("the guest kernel's boot directory")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-")))
        .expect("the guest kernel");
    let script = root.join("tests/netns/scripts").join(script).canonicalize().expect("the guest script");
    let script_dir = script.parent().expect("the scripts' directory");
    let bin_dir = bin("ironguard-agent").parent().expect("the binaries' directory").canonicalize().expect("bin dir");
    // The guest sees this machine's root, but with a tmpfs of its own on /tmp and /run: the checkout and the
    // binaries may live there (a clone under /tmp), so the guest is told to keep both directories visible.
    for dir in [script_dir, bin_dir.as_path()] {
        let text = dir.to_string_lossy();
        assert!(
            !text.contains([' ', ',']) && text.len() < 400,
            "{text}: the guest's kernel command line cannot carry this path (a space, a comma, or too long)"
        );
    }
    assert!(args.iter().all(|a| !a.is_empty() && !a.contains([' ', ','])), "{args:?}: not words for the command line");
    let start = Instant::now();
    // The console goes to a file as it comes, so that a guest stopped at its limit still says how far it got.
    // One file per script, arguments and kernel: two guests run at once (`.config/nextest.toml`), the same script
    // in both kernels or with other arguments among them.
    let console_file = bin_dir.join(format!(
        "guest-{}-{}{}.console",
        guest_kernel.suite(),
        script.file_name().unwrap_or_default().to_string_lossy(),
        args.iter().map(|a| format!("-{a}")).collect::<String>()
    ));
    let read_console = || String::from_utf8_lossy(&std::fs::read(&console_file).unwrap_or_default()).to_string();
    // no_timer_check: under an emulated CPU on a starved host the kernel's check that the 8254 timer reaches the
    // IO-APIC can miss its window and panic at boot ("IO-APIC + timer doesn't work!", T36); the check proves
    // nothing about the hardware qemu emulates, and virtual machines' kernels skip it for this reason.
    // norandmaps: every process maps its binary and libraries at the same addresses, so qemu reuses the code it
    // translated for one run of `ip`, `ipset`, `iptables` or `ironguardctl` in the next (with address-space
    // randomisation each start was translated afresh). Measured on 2026-12-07, two 6.1 guests side by side: the
    // ipset and observation sets boot 101.7 -> 51.8 CPU-seconds, the egress boot 81.2 -> 48.9, every check passing.
    // What the guests test (the kernel's firewall) does not depend on where a process's code lies.
    let append = format!(
        "console=ttyS0 quiet panic=-1 no_timer_check norandmaps ig.script={} ig.args={}{} ig.keep={},{}",
        script.display(),
        bin_dir.display(),
        args.iter().map(|a| format!(",{a}")).collect::<String>(),
        script_dir.display(),
        bin_dir.display()
    );
    let mut attempt = 0;
    let status = loop {
        attempt += 1;
        let sink = std::fs::File::create(&console_file).expect("the guest's console file");
        // KVM does not run guests on the CI machines; qemu emulates the CPU (TCG). One guest CPU: with two, on a
        // busy host one vCPU thread spun while the host had descheduled the other (a guest lock or IPI waiting on
        // it), and a guest took 200 % of the host's CPU doing nothing; under load, one CPU costs a sixth less CPU
        // in all for the same checks and about the same time.
        let mut qemu = Command::new("qemu-system-x86_64")
            .args(["-accel", "tcg", "-cpu", "max", "-m", "2048", "-smp", "1"])
            .args(["-nographic", "-no-reboot", "-kernel"])
            .arg(&kernel)
            .arg("-initrd")
            .arg(Path::new(&cache).join("initrd.gz"))
            .arg("-append")
            .arg(&append)
            .args(["-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"])
            .stdin(Stdio::null())
            .stdout(sink)
            .spawn()
            .expect("run qemu-system-x86_64");
        let booting = Instant::now();
        let ended = loop {
            if let Some(s) = qemu.try_wait().expect("wait for qemu") {
                break Some(s.to_string());
            }
            let limit = start.elapsed() > GUEST_LIMIT;
            let stuck = attempt == 1 && booting.elapsed() > BOOT_LIMIT && !read_console().contains(BOOTED);
            if limit || stuck {
                let _ = qemu.kill();
                let _ = qemu.wait();
                break limit.then(|| format!("stopped after {GUEST_LIMIT:?}"));
            }
            std::thread::sleep(Duration::from_secs(1));
        };
        match ended {
            Some(status) => break status,
            // The emulated kernel never reached the test's init: not a check that failed, a boot to do again.
            None => eprintln!(
                "the guest's kernel did not start its init within {BOOT_LIMIT:?} (an emulated boot stuck); booting \
                 it once more. Its console:\n{}",
                read_console()
            ),
        }
    };
    let console = read_console();
    let _ = std::fs::remove_file(&console_file);
    eprintln!("guest ran {:?} ({status}):\n{console}", start.elapsed());
    assert!(console.contains("\nDONE"), "the guest did not finish its checks ({status}); its console is above");
    let results: Vec<(&str, &str)> = console
        .lines()
        .filter_map(|l| {
            let mut f = l.trim().strip_prefix("RESULT ")?.splitn(2, ' ');
            Some((f.next()?, f.next()?))
        })
        .collect();
    let failed: Vec<String> =
        results.iter().filter(|(_, r)| !r.starts_with("PASS")).map(|(n, r)| format!("{n}: {r}")).collect();
    assert!(failed.is_empty(), "failed in the guest: {failed:#?}");
    for name in checks {
        assert!(results.iter().any(|(n, _)| n == name), "check {name} did not run in the guest");
    }
    assert!(console.contains(guest_kernel.console_marker()), "the guest runs {guest_kernel:?}'s kernel");
    console
}
