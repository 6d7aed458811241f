//! The tables that tie suites, loom models and generated files to crates.

use std::path::Path;

use anyhow::Result;

/// A benchmark suite: what `cargo xtask bench <name>` runs.
pub(crate) struct Suite {
    /// The suite's name, and the name of its `target/bench/<name>.json`.
    pub(crate) name: &'static str,
    /// `(package, bench target)`, run in this order: the first writes the
    /// JSON, the others add their keys to it (a suite whose io_uring part
    /// lives in slotring-bench, so that the library's own bench needs no
    /// crate above it).
    pub(crate) targets: &'static [(&'static str, &'static str)],
    /// `(package, binary, variable)`: a binary the benches run, built with
    /// the bench profile first, its path passed in the environment variable.
    pub(crate) bins: &'static [(&'static str, &'static str, &'static str)],
}

const fn suite(name: &'static str, targets: &'static [(&'static str, &'static str)]) -> Suite {
    Suite {
        name,
        targets,
        bins: &[],
    }
}

/// Every suite.
pub(crate) const BENCHES: &[Suite] = &[
    suite(
        "throttle",
        &[
            ("slotring-throttle", "throttle"),
            ("slotring-bench", "throttle_uring"),
        ],
    ),
    suite(
        "fair",
        &[
            ("slotring-throttle", "fair"),
            ("slotring-bench", "fair_uring"),
        ],
    ),
    suite(
        "workload",
        &[
            ("slotring-throttle", "workload"),
            ("slotring-bench", "workload_io"),
            ("slotring-slots", "workload_cpu"),
        ],
    ),
    suite("slots", &[("slotring-slots", "slots")]),
    suite("uring", &[("slotring-uring", "uring")]),
    suite("shared", &[("slotring-uring", "shared")]),
    suite("service", &[("slotring-bench", "service")]),
    suite("write", &[("slotring-bench", "write")]),
    suite("wait", &[("slotring-bench", "wait")]),
    suite("bpf", &[("slotring-bpf", "bpf")]),
    suite("verdict", &[("slotring-bpf", "verdict")]),
    suite("e2e", &[("slotring-cli", "e2e")]),
    Suite {
        name: "adaptive",
        targets: &[("slotring-bench", "adaptive")],
        // Workload (c) runs `slotring run`.
        bins: &[("slotring-cli", "slotring", "SLOTRING_BIN")],
    },
];

/// Packages whose default features are optional front ends (slotring-uring's
/// `tokio`): CI also lints and tests them with `--no-default-features`, so
/// that the crate without them keeps building and passing.
pub(crate) const NO_DEFAULT_FEATURES: &[&str] = &["slotring-uring"];

/// `(package, integration test)` pairs run with `--cfg loom`.
pub(crate) const LOOM_MODELS: &[(&str, &str)] = &[
    ("slotring-throttle", "loom"),
    ("slotring-throttle", "workload_loom"),
    ("slotring-slots", "loom"),
];

/// The suite called `name`.
pub(crate) fn bench_suite(name: &str) -> Option<&'static Suite> {
    BENCHES.iter().find(|s| s.name == name)
}

/// Checks that committed generated files are fresh (the eBPF objects, the
/// benchmark reports) and that the docs name only what exists.
pub(crate) fn ci_generated_checks(root: &Path) -> Result<()> {
    crate::ebpf::check_fresh(root)?;
    crate::bench_report::run(root, &[], false, true)?;
    crate::doc_check::run(root)
}

/// Rebuild (or, with `check`, verify) the committed eBPF objects.
pub(crate) fn build_ebpf(root: &Path, check: bool) -> Result<()> {
    crate::ebpf::build(root, check)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `package`'s manifest declares a `[[bench]]` or `[[bin]]`
    /// (`kind`) target called `name` (the manifests name every target they
    /// have; a `[[bin]]` may also be the package's `src/main.rs`).
    fn declares(package: &str, kind: &str, name: &str) -> bool {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let manifest =
            std::fs::read_to_string(root.join("userspace").join(package).join("Cargo.toml"))
                .unwrap_or_else(|e| panic!("{package}'s manifest: {e}"));
        let header = format!("[[{kind}]]");
        let wanted = format!("name = \"{name}\"");
        manifest.split(header.as_str()).skip(1).any(|target| {
            target
                .lines()
                .take_while(|l| !l.starts_with('['))
                .any(|l| l.trim() == wanted)
        })
    }

    #[test]
    fn every_suite_runs_targets_its_packages_declare() {
        for s in BENCHES {
            assert!(!s.targets.is_empty(), "suite {} runs nothing", s.name);
            for (pkg, bench) in s.targets {
                assert!(
                    declares(pkg, "bench", bench),
                    "suite {}: {pkg} has no bench {bench}",
                    s.name
                );
            }
            for (pkg, bin, _) in s.bins {
                assert!(
                    declares(pkg, "bin", bin),
                    "suite {}: {pkg} has no bin {bin}",
                    s.name
                );
            }
        }
        assert!(
            !declares("slotring-throttle", "bench", "throttle_uring"),
            "the check can fail"
        );
        assert!(bench_suite("write").is_some() && bench_suite("nope").is_none());
    }

    #[test]
    fn suite_names_are_unique() {
        for (i, s) in BENCHES.iter().enumerate() {
            assert!(
                BENCHES[i + 1..].iter().all(|o| o.name != s.name),
                "{} twice",
                s.name
            );
        }
    }
}
