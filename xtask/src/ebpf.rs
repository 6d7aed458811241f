//! `cargo xtask build-ebpf`: compile `ebpf/*.bpf.c` with clang-19.
//! (Owned by the eBPF work; until it lands there is nothing to build.)

use std::path::Path;

use anyhow::Result;

/// Compile the eBPF objects (or verify the committed ones with `check`).
pub(crate) fn build(_root: &Path, _check: bool) -> Result<()> {
    anyhow::bail!("no eBPF programs exist yet")
}

/// CI: fail if a committed generated file is stale.
pub(crate) fn check_fresh(_root: &Path) -> Result<()> {
    Ok(())
}
