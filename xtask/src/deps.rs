//! The Debian packages the checks need, and the set-up `cargo xtask ci` does
//! before anything else.
//!
//! [`PACKAGES`] is the one list. `cargo xtask ci` asks dpkg which of them
//! are missing; when some are, it installs them itself if it can (root and
//! `apt-get` present: one `apt-get update`, then one noninteractive
//! `apt-get install`), and otherwise stops at once with the exact
//! `sudo apt-get install ...` line to run. After an install it checks again:
//! a package apt could not provide, or a tool its package did not put on
//! `PATH`, fails the run here rather than in the middle of the tests.
//!
//! The decision is the pure [`decide`]; the machine is behind [`System`], so
//! the tests drive the whole set-up with a fake one.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// A Debian package one of the checks needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Package {
    /// The Debian package name.
    pub(crate) name: &'static str,
    /// A command the package puts on `PATH`, checked after an install
    /// (`None` for libraries).
    pub(crate) tool: Option<&'static str>,
    /// What needs it.
    pub(crate) why: &'static str,
}

const fn pkg(name: &'static str, tool: Option<&'static str>, why: &'static str) -> Package {
    Package { name, tool, why }
}

/// Every Debian package the build, the tests, the generated-file checks and
/// the benchmarks use.
pub(crate) const PACKAGES: &[Package] = &[
    pkg(
        "clang-19",
        Some("clang-19"),
        "compiles ebpf/*.bpf.c (build-ebpf --check)",
    ),
    pkg(
        "llvm-19",
        Some("llvm-strip-19"),
        "strips DWARF from the eBPF objects, keeping BTF",
    ),
    pkg(
        "libelf-dev",
        None,
        "libbpf-sys (dev-dependency of slotring-bpf, the independent map reader) links libelf",
    ),
    pkg("zlib1g-dev", None, "libbpf-sys links zlib"),
    pkg(
        "pkg-config",
        Some("pkg-config"),
        "libbpf-sys finds libelf and zlib",
    ),
    pkg(
        "bpftool",
        Some("bpftool"),
        "tests read the pinned maps with stock bpftool",
    ),
    pkg("fio", Some("fio"), "the io_uring benchmark baseline"),
    pkg(
        "e2fsprogs",
        Some("mkfs.ext4"),
        "the write tests' full loop filesystem (ENOSPC) and the write bench's device",
    ),
    pkg(
        "prometheus",
        Some("promtool"),
        "promtool checks and the scrape integration test",
    ),
    pkg(
        "systemd",
        Some("systemd-analyze"),
        "systemd-analyze verify of deploy/systemd",
    ),
    pkg(
        "util-linux",
        Some("prlimit"),
        "setpriv (the unprivileged run) and prlimit (/metrics out of file descriptors)",
    ),
    pkg(
        "wrk",
        Some("wrk"),
        "HTTP load on /metrics in the benchmarks; the object server test (fails without it under CI=true) and `bench service`",
    ),
    pkg(
        "stress-ng",
        Some("stress-ng"),
        "CPU and IO interference in the benchmarks; the CPU hog of the adaptive budget's kernel test",
    ),
];

/// What to do about the missing packages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Everything is installed.
    Nothing,
    /// Install these (root with apt-get).
    Install(Vec<&'static str>),
    /// Stop: this is the line the user must run.
    Fail {
        /// The exact install command.
        line: String,
        /// Why we cannot run it ourselves.
        reason: &'static str,
    },
}

/// The command that installs `names`, as a user would type it.
pub(crate) fn install_line(names: &[&str]) -> String {
    format!(
        "sudo apt-get install -y --no-install-recommends {}",
        names.join(" ")
    )
}

/// Decide from what is missing and what this process may do.
pub(crate) fn decide(missing: &[&'static str], root: bool, apt: bool) -> Plan {
    if missing.is_empty() {
        return Plan::Nothing;
    }
    let reason = match (root, apt) {
        (true, true) => return Plan::Install(missing.to_vec()),
        (false, _) => "not root",
        (true, false) => "apt-get is not available",
    };
    Plan::Fail {
        line: install_line(missing),
        reason,
    }
}

/// The machine, as the set-up sees it.
pub(crate) trait System {
    /// Whether dpkg lists `package` as installed.
    fn installed(&self, package: &str) -> bool;
    /// Whether `tool` is an executable on `PATH`.
    fn on_path(&self, tool: &str) -> bool;
    /// Whether this process runs as root.
    fn is_root(&self) -> bool;
    /// `apt-get update` once, then install `packages` noninteractively.
    fn apt_install(&mut self, packages: &[&str]) -> Result<()>;
    /// Stop the Prometheus that Debian's package starts on install (the
    /// tests start their own on loopback ports).
    fn stop_system_prometheus(&mut self);
}

/// Make sure every package in `packages` is installed, installing what is
/// missing when `sys` allows it; fail with the install line otherwise.
pub(crate) fn ensure(sys: &mut dyn System, packages: &[Package]) -> Result<()> {
    let missing: Vec<&'static str> = packages
        .iter()
        .filter(|p| !sys.installed(p.name))
        .map(|p| p.name)
        .collect();
    let apt = sys.on_path("apt-get");
    match decide(&missing, sys.is_root(), apt) {
        Plan::Nothing => Ok(()),
        Plan::Fail { line, reason } => {
            bail!(
                "missing Debian packages: {}\n{}\n{reason}, so run:\n  {line}",
                missing.join(" "),
                describe(packages, &missing)
            )
        }
        Plan::Install(names) => {
            eprintln!("xtask: installing {}", names.join(" "));
            sys.apt_install(&names)?;
            if names.contains(&"prometheus") {
                sys.stop_system_prometheus();
            }
            let still: Vec<&str> = names
                .iter()
                .copied()
                .filter(|n| !sys.installed(n))
                .collect();
            if !still.is_empty() {
                bail!(
                    "apt-get install did not install: {}\n{}",
                    still.join(" "),
                    describe(packages, &still)
                );
            }
            let absent: Vec<String> = packages
                .iter()
                .filter(|p| names.contains(&p.name))
                .filter_map(|p| p.tool.map(|t| (p, t)))
                .filter(|(_, t)| !sys.on_path(t))
                .map(|(p, t)| format!("`{t}` (package {})", p.name))
                .collect();
            if !absent.is_empty() {
                bail!("installed, but not on PATH: {}", absent.join(", "));
            }
            Ok(())
        }
    }
}

/// One line per package in `names`: the name and what needs it.
fn describe(packages: &[Package], names: &[&str]) -> String {
    packages
        .iter()
        .filter(|p| names.contains(&p.name))
        .map(|p| format!("  {:<12} {}", p.name, p.why))
        .collect::<Vec<_>>()
        .join("\n")
}

/// This machine: dpkg, `PATH`, the effective uid, apt-get and systemctl.
pub(crate) struct Host;

impl System for Host {
    fn installed(&self, package: &str) -> bool {
        Command::new("dpkg-query")
            .args(["-W", "-f=${Status}", package])
            .stderr(Stdio::null())
            .output()
            .is_ok_and(|o| {
                o.status.success() && String::from_utf8_lossy(&o.stdout) == "install ok installed"
            })
    }

    fn on_path(&self, tool: &str) -> bool {
        use std::os::unix::fs::PermissionsExt;
        std::env::var_os("PATH").is_some_and(|path| {
            std::env::split_paths(&path).any(|dir| {
                Path::new(&dir)
                    .join(tool)
                    .metadata()
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            })
        })
    }

    fn is_root(&self) -> bool {
        nix::unistd::geteuid().is_root()
    }

    fn apt_install(&mut self, packages: &[&str]) -> Result<()> {
        let apt = |args: &[&str]| -> Result<()> {
            eprintln!("$ apt-get {}", args.join(" "));
            let status = Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .stdin(Stdio::null())
                .status()
                .context("spawning apt-get")?;
            if !status.success() {
                bail!("`apt-get {}` failed: {status}", args.join(" "));
            }
            Ok(())
        };
        apt(&["update", "-qq"])?;
        let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
        args.extend_from_slice(packages);
        apt(&args)
    }

    fn stop_system_prometheus(&mut self) {
        if self.on_path("systemctl") {
            // Best effort, as before: without systemd there is nothing to stop.
            let _ = Command::new("systemctl")
                .args(["stop", "prometheus", "prometheus-node-exporter"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine with a fixed set of packages and tools; an install adds
    /// what its "archive" has.
    #[derive(Default)]
    struct Fake {
        installed: Vec<&'static str>,
        tools: Vec<&'static str>,
        root: bool,
        apt: bool,
        /// Packages (and the tools they bring) apt can install.
        archive: Vec<(&'static str, Option<&'static str>)>,
        installs: Vec<Vec<String>>,
        prometheus_stopped: bool,
    }

    impl System for Fake {
        fn installed(&self, package: &str) -> bool {
            self.installed.contains(&package)
        }
        fn on_path(&self, tool: &str) -> bool {
            (tool == "apt-get" && self.apt) || self.tools.contains(&tool)
        }
        fn is_root(&self) -> bool {
            self.root
        }
        fn apt_install(&mut self, packages: &[&str]) -> Result<()> {
            self.installs
                .push(packages.iter().map(|p| p.to_string()).collect());
            for (name, tool) in self.archive.clone() {
                if packages.contains(&name) {
                    self.installed.push(name);
                    self.tools.extend(tool);
                }
            }
            Ok(())
        }
        fn stop_system_prometheus(&mut self) {
            self.prometheus_stopped = true;
        }
    }

    const TABLE: &[Package] = &[
        pkg("libelf-dev", None, "libbpf-sys links libelf"),
        pkg("prometheus", Some("promtool"), "promtool"),
        pkg("wrk", Some("wrk"), "load"),
    ];

    #[test]
    fn decide_covers_every_case() {
        assert_eq!(decide(&[], false, false), Plan::Nothing);
        assert_eq!(decide(&[], true, true), Plan::Nothing);
        assert_eq!(
            decide(&["wrk", "fio"], true, true),
            Plan::Install(vec!["wrk", "fio"])
        );
        let line = "sudo apt-get install -y --no-install-recommends wrk fio".to_owned();
        assert_eq!(
            decide(&["wrk", "fio"], false, true),
            Plan::Fail {
                line: line.clone(),
                reason: "not root"
            }
        );
        assert_eq!(
            decide(&["wrk", "fio"], false, false),
            Plan::Fail {
                line: line.clone(),
                reason: "not root"
            }
        );
        assert_eq!(
            decide(&["wrk", "fio"], true, false),
            Plan::Fail {
                line,
                reason: "apt-get is not available"
            }
        );
    }

    #[test]
    fn nothing_missing_does_nothing() {
        let mut sys = Fake {
            installed: vec!["libelf-dev", "prometheus", "wrk"],
            ..Fake::default()
        };
        ensure(&mut sys, TABLE).unwrap();
        assert!(sys.installs.is_empty());
        assert!(!sys.prometheus_stopped);
    }

    #[test]
    fn not_root_fails_at_once_with_the_exact_line() {
        let mut sys = Fake {
            installed: vec!["prometheus"],
            apt: true,
            ..Fake::default()
        };
        let err = ensure(&mut sys, TABLE).unwrap_err().to_string();
        assert!(sys.installs.is_empty(), "nothing was attempted");
        assert!(
            err.lines()
                .any(|l| l.trim()
                    == "sudo apt-get install -y --no-install-recommends libelf-dev wrk"),
            "{err}"
        );
        assert!(err.contains("libbpf-sys links libelf"), "says why: {err}");
    }

    #[test]
    fn root_with_apt_installs_once_and_stops_the_system_prometheus() {
        let mut sys = Fake {
            installed: vec!["libelf-dev"],
            root: true,
            apt: true,
            archive: vec![("prometheus", Some("promtool")), ("wrk", Some("wrk"))],
            ..Fake::default()
        };
        ensure(&mut sys, TABLE).unwrap();
        assert_eq!(sys.installs, vec![vec!["prometheus", "wrk"]]);
        assert!(sys.prometheus_stopped);
        // Installed now: a second run does nothing.
        sys.prometheus_stopped = false;
        ensure(&mut sys, TABLE).unwrap();
        assert_eq!(sys.installs.len(), 1);
        assert!(!sys.prometheus_stopped);
    }

    #[test]
    fn a_package_apt_cannot_provide_fails_the_check() {
        // Root with apt, but the archive lacks wrk: neither present nor
        // installable.
        let mut sys = Fake {
            installed: vec!["libelf-dev", "prometheus"],
            root: true,
            apt: true,
            archive: vec![("prometheus", Some("promtool"))],
            ..Fake::default()
        };
        let err = ensure(&mut sys, TABLE).unwrap_err().to_string();
        assert!(err.contains("did not install: wrk"), "{err}");
        // A package that installs but does not bring its tool fails too.
        let mut sys = Fake {
            installed: vec!["libelf-dev", "prometheus"],
            root: true,
            apt: true,
            archive: vec![("wrk", None)],
            ..Fake::default()
        };
        let err = ensure(&mut sys, TABLE).unwrap_err().to_string();
        assert!(err.contains("`wrk` (package wrk)"), "{err}");
    }

    #[test]
    fn the_table_names_each_package_once_with_a_reason() {
        let mut names: Vec<_> = PACKAGES.iter().map(|p| p.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), PACKAGES.len());
        assert!(PACKAGES.iter().all(|p| !p.why.is_empty()));
        for needed in ["libelf-dev", "wrk", "stress-ng", "util-linux", "prometheus"] {
            assert!(names.contains(&needed), "{needed}");
        }
    }

    #[test]
    fn the_host_probe_reads_dpkg() {
        let host = Host;
        if !host.on_path("dpkg-query") {
            println!("skipping: not a Debian system (no dpkg-query)");
            return;
        }
        assert!(host.installed("dpkg"), "dpkg-query lists dpkg itself");
        assert!(!host.installed("slotring-no-such-package"));
        assert!(host.on_path("sh"));
        assert!(!host.on_path("slotring-no-such-tool"));
    }
}
