//! The tables that tie suites, loom models and generated files to crates.

use std::path::Path;

use anyhow::Result;

/// `suite -> (package, bench target)`.
pub(crate) const BENCHES: &[(&str, (&str, &str))] = &[
    ("throttle", ("slotring-throttle", "throttle")),
    ("fair", ("slotring-throttle", "fair")),
    ("slots", ("slotring-slots", "slots")),
    ("uring", ("slotring-uring", "uring")),
    ("shared", ("slotring-uring", "shared")),
    ("service", ("slotring-uring", "service")),
    ("write", ("slotring-uring", "write")),
    ("wait", ("slotring-uring", "wait")),
    ("bpf", ("slotring-bpf", "bpf")),
    ("verdict", ("slotring-bpf", "verdict")),
    ("e2e", ("slotring-cli", "e2e")),
    ("adaptive", ("slotring-cli", "adaptive")),
];

/// `(package, integration test)` pairs run with `--cfg loom`.
pub(crate) const LOOM_MODELS: &[(&str, &str)] =
    &[("slotring-throttle", "loom"), ("slotring-slots", "loom")];

/// Checks that committed generated files are fresh.
pub(crate) fn ci_generated_checks(root: &Path) -> Result<()> {
    crate::ebpf::check_fresh(root)
}

/// Rebuild (or, with `check`, verify) the committed eBPF objects.
pub(crate) fn build_ebpf(root: &Path, check: bool) -> Result<()> {
    crate::ebpf::build(root, check)
}
