//! `cargo xtask build-ebpf`: compile `ebpf/*.bpf.c` with clang-19.
//!
//! The compiled objects are committed (`ebpf/<name>.bpf.o`) so the Rust
//! build needs no clang; `slotring-bpf` embeds them with `include_bytes!`.
//! The build is deterministic: the source directory is mapped to `ebpf`
//! (`-ffile-prefix-map`), so the object does not depend on where the tree is
//! checked out, and `llvm-strip -g` drops the DWARF while keeping BTF.
//! `--check` (and `cargo xtask ci`) rebuilds into a temporary file and fails
//! if the committed object differs byte for byte.
//!
//! Next to each object, `<name>.bpf.o.inputs` records the compiler version
//! and a hash of every input (sources, headers, flags). The check always
//! verifies that hash, so an edited source without a rebuilt object fails
//! on any machine; the byte-for-byte comparison runs when the installed
//! clang is the one that built the committed object (another point release
//! may emit different bytes for the same inputs, which is not staleness).

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
        let manifest_path = dir.join(format!("{name}.bpf.o.inputs"));
        let manifest = Manifest::current(&dir, name)?;
        if check {
            let recorded = std::fs::read_to_string(&manifest_path)
                .with_context(|| format!("reading {}", manifest_path.display()))?;
            let recorded = Manifest::parse(&recorded)
                .with_context(|| format!("parsing {}", manifest_path.display()))?;
            if recorded.inputs != manifest.inputs {
                bail!(
                    "{} is stale: its inputs changed (hash {} recorded, {} now): run \
                     `cargo xtask build-ebpf` and commit the result",
                    committed.display(),
                    recorded.inputs,
                    manifest.inputs
                );
            }
            if recorded.compiler == manifest.compiler {
                let fresh = compile_to_temp(&dir, name)?;
                compare(&committed, &fresh)?;
                eprintln!("ebpf: {} is fresh (inputs and bytes)", committed.display());
            } else {
                eprintln!(
                    "ebpf: {} is fresh (inputs); byte comparison skipped: installed `{}` differs \
                     from `{}` that built it",
                    committed.display(),
                    manifest.compiler,
                    recorded.compiler
                );
            }
        } else {
            std::fs::write(&manifest_path, manifest.render())
                .with_context(|| format!("writing {}", manifest_path.display()))?;
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

/// What an object was built from.
struct Manifest {
    /// First line of `clang-19 --version`.
    compiler: String,
    /// FNV-1a 64 over the flags and every input file (path and contents).
    inputs: String,
}

impl Manifest {
    fn current(dir: &Path, name: &str) -> Result<Self> {
        let out = Command::new(CLANG)
            .arg("--version")
            .output()
            .with_context(|| format!("spawning {CLANG} (install clang-19 and llvm-19)"))?;
        let compiler = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .to_owned();
        let mut files = Vec::new();
        collect_inputs(dir, dir, &mut files)?;
        files.sort();
        let mut h = Fnv::default();
        h.feed(FLAGS.join(" ").as_bytes());
        h.feed(name.as_bytes());
        for rel in &files {
            h.feed(rel.as_bytes());
            h.feed(&std::fs::read(dir.join(rel)).with_context(|| format!("reading {rel}"))?);
        }
        Ok(Self {
            compiler,
            inputs: format!("{:016x}", h.0),
        })
    }

    fn render(&self) -> String {
        format!(
            "# Written by `cargo xtask build-ebpf`; checked by `cargo xtask build-ebpf --check`.\n\
             compiler: {}\ninputs: {}\n",
            self.compiler, self.inputs
        )
    }

    fn parse(text: &str) -> Result<Self> {
        let field = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.trim().to_owned())
                .with_context(|| format!("no `{key}` line"))
        };
        Ok(Self {
            compiler: field("compiler:")?,
            inputs: field("inputs:")?,
        })
    }
}

/// Every `.c` and `.h` under `dir`, as paths relative to `root`.
fn collect_inputs(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect_inputs(root, &path, out)?;
        } else if matches!(path.extension().and_then(|e| e.to_str()), Some("c" | "h")) {
            let rel = path.strip_prefix(root).context("input outside ebpf/")?;
            out.push(rel.to_str().context("non-UTF-8 input path")?.to_owned());
        }
    }
    Ok(())
}

/// FNV-1a, 64 bits: a staleness fingerprint, not a security hash.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn feed(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separate consecutive fields.
        self.0 ^= 0xff;
        self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
    }
}

/// The compiler flags (besides the source, output and prefix map).
const FLAGS: &[&str] = &[
    "-g",
    "-O2",
    "-Wall",
    "-Werror",
    "-target",
    "bpf",
    "-D__TARGET_ARCH_x86",
    "-I.",
];

fn compile_to_temp(dir: &Path, name: &str) -> Result<PathBuf> {
    let out = std::env::temp_dir().join(format!(
        "slotring-xtask-{}-{name}.bpf.o",
        std::process::id()
    ));
    let src = format!("{name}.bpf.c");
    let prefix_map = format!("-ffile-prefix-map={}=ebpf", dir.display());
    let out_s = out.to_str().context("temp path is not UTF-8")?;
    let mut args: Vec<&str> = FLAGS.to_vec();
    args.extend([prefix_map.as_str(), "-c", src.as_str(), "-o", out_s]);
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
