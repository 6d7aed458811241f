//! `cargo xtask`: one small binary for the project's chores (matklad's xtask).
//!
//! * `ci` — everything CI runs: first the Debian packages the checks need
//!   (installed as root, else the install line; see `deps.rs`), then fmt
//!   check, clippy with `-D warnings`, the test suite, the crates that have
//!   optional front ends once more without them (`suites::NO_DEFAULT_FEATURES`:
//!   clippy and tests), the loom models, and staleness checks of committed
//!   generated files.
//! * `deps` — only that first step of `ci`.
//! * `bench <suite>` — run one benchmark suite (ours and baselines side by
//!   side; its bench targets in the order `suites.rs` lists them, after
//!   building the binaries they run); it prints a table and writes
//!   `target/bench/<suite>.json` (and `<suite>.meta.json`, the run's
//!   machine, commit and load).
//! * `bench-report [SUITE ...] [--take] [--check]` — render
//!   `docs/bench/<suite>.md` and its index from `docs/bench/data/`
//!   (`--take`: copy the suites' data from `target/bench/` first;
//!   `--check`: fail if a checked-in report differs from its data); see
//!   `bench_report.rs`.
//! * `doc-check` — the project's Markdown names only paths, crates and
//!   items that exist, and no counts; see `doc_check.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

mod bench_goal;
mod bench_goals;
mod bench_report;
mod deps;
mod doc_check;
mod ebpf;
mod suites;

#[derive(Parser)]
#[command(about = "slotring project automation")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run every check CI runs (the README's test command).
    Ci {
        /// Skip the loom models (they are slow).
        #[arg(long)]
        no_loom: bool,
    },
    /// Check the Debian packages the checks need; as root, install the
    /// missing ones (the first step of `ci`).
    Deps,
    /// Run a benchmark suite (the table in `suites.rs`; an unknown name lists them).
    Bench {
        /// The suite name.
        suite: String,
    },
    /// Render the benchmark reports in docs/bench/ from docs/bench/data/.
    BenchReport {
        /// The suites to render (default: every suite with data); with
        /// `--take`, the suites to take.
        suites: Vec<String>,
        /// First copy the suites' `target/bench/<suite>{,.meta}.json` into
        /// docs/bench/data/ (no suites named: every suite target/bench/ holds).
        #[arg(long)]
        take: bool,
        /// Do not write; fail if a checked-in report differs from its data.
        #[arg(long, conflicts_with = "take")]
        check: bool,
    },
    /// Check that README.md, ARCHITECTURE.md, CONTRIBUTING.md and
    /// docs/bench/README.md name only paths, crates and items that exist.
    DocCheck,
    /// Recompile the eBPF objects with clang-19 (`--check`: fail if stale).
    BuildEbpf {
        /// Do not write; fail if the committed objects differ from a fresh build.
        #[arg(long)]
        check: bool,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = workspace_root();
    match cli.cmd {
        Cmd::Ci { no_loom } => ci(&root, no_loom),
        Cmd::Deps => deps::ensure(&mut deps::Host, deps::PACKAGES),
        Cmd::Bench { suite } => bench(&root, &suite),
        Cmd::BenchReport {
            suites,
            take,
            check,
        } => bench_report::run(&root, &suites, take, check),
        Cmd::DocCheck => doc_check::run(&root),
        Cmd::BuildEbpf { check } => suites::build_ebpf(&root, check),
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_owned()
}

/// Run a command in the workspace root, echoing it; fail on a non-zero exit.
pub(crate) fn run(root: &Path, program: &str, args: &[&str], envs: &[(&str, &str)]) -> Result<()> {
    eprintln!("$ {program} {}", args.join(" "));
    let mut cmd = Command::new(program);
    cmd.args(args).current_dir(root);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let status = cmd
        .status()
        .with_context(|| format!("spawning {program}"))?;
    if !status.success() {
        bail!("`{program} {}` failed: {status}", args.join(" "));
    }
    Ok(())
}

fn ci(root: &Path, no_loom: bool) -> Result<()> {
    deps::ensure(&mut deps::Host, deps::PACKAGES)?;
    run(root, "cargo", &["fmt", "--all", "--", "--check"], &[])?;
    suites::ci_generated_checks(root)?;
    run(
        root,
        "cargo",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        &[],
    )?;
    run(
        root,
        "cargo",
        &["test", "--workspace", "--no-fail-fast"],
        &[],
    )?;
    for pkg in suites::NO_DEFAULT_FEATURES {
        let pkg_args = ["-p", pkg, "--no-default-features"];
        let clippy = [
            &["clippy"][..],
            &pkg_args,
            &["--all-targets", "--", "-D", "warnings"],
        ]
        .concat();
        run(root, "cargo", &clippy, &[])?;
        let test = [&["test"][..], &pkg_args, &["--no-fail-fast"]].concat();
        run(root, "cargo", &test, &[])?;
    }
    if !no_loom {
        for (pkg, test) in suites::LOOM_MODELS {
            let target = root.join("target/loom");
            run(
                root,
                "cargo",
                &["test", "--release", "-p", pkg, "--test", test],
                &[
                    ("RUSTFLAGS", "--cfg loom"),
                    ("LOOM_MAX_PREEMPTIONS", "3"),
                    ("CARGO_TARGET_DIR", target.to_str().context("utf-8 path")?),
                ],
            )?;
        }
    }
    eprintln!("xtask ci: all checks passed");
    Ok(())
}

fn bench(root: &Path, suite: &str) -> Result<()> {
    let Some(s) = suites::bench_suite(suite) else {
        let names: Vec<_> = suites::BENCHES.iter().map(|s| s.name).collect();
        bail!("unknown bench suite `{suite}`; known: {}", names.join(", "));
    };
    // The baselines (fio, wrk, stress-ng) are the same packages CI needs.
    deps::ensure(&mut deps::Host, deps::PACKAGES)?;
    let dir = root.join("target/bench");
    let mut envs = vec![(
        "SLOTRING_BENCH_DIR".to_owned(),
        dir.to_str().context("utf-8 path")?.to_owned(),
    )];
    // The bench profile's binaries go where its benches are built.
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    for (pkg, bin, var) in s.bins {
        run(
            root,
            "cargo",
            &["build", "--profile", "bench", "-p", pkg, "--bin", bin],
            &[],
        )?;
        let path = target.join("release").join(bin);
        envs.push((
            (*var).to_owned(),
            path.to_str().context("utf-8 path")?.to_owned(),
        ));
    }
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    for (pkg, bench) in s.targets {
        run(
            root,
            "cargo",
            &["bench", "-p", pkg, "--bench", bench],
            &envs,
        )?;
    }
    Ok(())
}
