//! The tables that tie suites, loom models and generated files to crates.
//! Each later area adds its rows here.

use std::path::Path;

use anyhow::Result;

/// `suite -> (package, bench target)`.
pub(crate) const BENCHES: &[(&str, (&str, &str))] = &[("throttle", ("slotring-throttle", "throttle"))];

/// `(package, integration test)` pairs run with `--cfg loom`.
pub(crate) const LOOM_MODELS: &[(&str, &str)] = &[("slotring-throttle", "loom")];

/// Checks that committed generated files are fresh (none yet).
pub(crate) fn ci_generated_checks(_root: &Path) -> Result<()> {
    Ok(())
}

/// Rebuild (or, with `check`, verify) the committed eBPF objects.
pub(crate) fn build_ebpf(_root: &Path, _check: bool) -> Result<()> {
    anyhow::bail!("no eBPF programs exist yet")
}
