//! `cargo xtask build-ebpf`: compile `ebpf/*.bpf.c` with clang-19.
//!
//! The compiled objects are committed (`ebpf/<name>.bpf.o`) so the Rust
//! build needs no clang; `slotring-bpf` embeds them with `include_bytes!`.
//! The build is deterministic: the source directory is mapped to `ebpf`
//! (`-ffile-prefix-map`), so the object does not depend on where the tree is
//! checked out, and `llvm-strip -g` drops the DWARF while keeping BTF.
//! `--check` (and `cargo xtask ci`) rebuilds into a temporary file and fails
//! if the committed object differs byte for byte.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The C programs, compiled from `ebpf/<name>.bpf.c` to `ebpf/<name>.bpf.o`.
const PROGRAMS: &[&str] = &["slotring"];
const CLANG: &str = "clang-19";
const STRIP: &str = "llvm-strip-19";

/// Compile the eBPF objects (or verify the committed ones with `check`).
pub(crate) fn build(root: &Path, check: bool) -> Result<()> {
    let dir = root.join("ebpf");
    for name in PROGRAMS {
        let committed = dir.join(format!("{name}.bpf.o"));
        if check {
            let fresh = compile_to_temp(&dir, name)?;
            compare(&committed, &fresh)?;
            eprintln!("ebpf: {} is fresh", committed.display());
        } else {
            let fresh = compile_to_temp(&dir, name)?;
            std::fs::rename(&fresh, &committed)
                .or_else(|_| std::fs::copy(&fresh, &committed).map(drop))
                .with_context(|| format!("writing {}", committed.display()))?;
            let _ = std::fs::remove_file(&fresh);
            eprintln!("ebpf: wrote {}", committed.display());
        }
    }
    Ok(())
}

/// CI: fail if a committed generated file is stale.
pub(crate) fn check_fresh(root: &Path) -> Result<()> {
    build(root, true)
}

fn compile_to_temp(dir: &Path, name: &str) -> Result<PathBuf> {
    let out = std::env::temp_dir().join(format!(
        "slotring-xtask-{}-{name}.bpf.o",
        std::process::id()
    ));
    let src = format!("{name}.bpf.c");
    let prefix_map = format!("-ffile-prefix-map={}=ebpf", dir.display());
    let out_s = out.to_str().context("temp path is not UTF-8")?;
    let args = [
        "-g",
        "-O2",
        "-Wall",
        "-Werror",
        "-target",
        "bpf",
        "-D__TARGET_ARCH_x86",
        "-I.",
        prefix_map.as_str(),
        "-c",
        src.as_str(),
        "-o",
        out_s,
    ];
    run_in(dir, CLANG, &args)?;
    run_in(dir, STRIP, &["-g", out_s])?;
    Ok(out)
}

fn run_in(dir: &Path, program: &str, args: &[&str]) -> Result<()> {
    eprintln!("$ (cd {}) {program} {}", dir.display(), args.join(" "));
    let status = Command::new(program)
        .args(args)
        .current_dir(dir)
        .status()
        .with_context(|| format!("spawning {program} (install clang-19 and llvm-19)"))?;
    if !status.success() {
        bail!("`{program} {}` failed: {status}", args.join(" "));
    }
    Ok(())
}

fn compare(committed: &Path, fresh: &Path) -> Result<()> {
    let want = std::fs::read(fresh).with_context(|| format!("reading {}", fresh.display()))?;
    let _ = std::fs::remove_file(fresh);
    let have = std::fs::read(committed)
        .with_context(|| format!("reading committed object {}", committed.display()))?;
    if have != want {
        bail!(
            "{} is stale ({} bytes committed, {} bytes fresh): run `cargo xtask build-ebpf` \
             and commit the result",
            committed.display(),
            have.len(),
            want.len()
        );
    }
    Ok(())
}
