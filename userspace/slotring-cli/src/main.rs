//! `slotring`: run the throttled-IO / fair-CPU-slot workload and prove it
//! with the kernel; read, export and verify the pinned stats of any process
//! that embeds slotring.
//!
//! Exit codes (stable, for scripts):
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | success (`verify`: verdict PASS) |
//! | 1 | runtime error (message on stderr) |
//! | 2 | bad command line, setting or config file (the message names the option and the value) |
//! | 3 | the kernel verdict is FAIL: a parked thread used CPU |
//! | 4 | nothing to read or verify: no pinned maps, no permission, or no probes (`verify`: UNVERIFIED) |
//! | 130 | interrupted by Ctrl-C / SIGTERM (`run` still prints its report and cleans up) |

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use nix::sys::signal::{SigSet, Signal};
use slotring::metrics::SlotringCollector;
use slotring::pinned::{DEFAULT_PIN_DIR, PinnedError, PinnedMaps, ThreadState};
use slotring_cli::config::{self, ConfigError, ConfigFile, RunConfig};
use slotring_cli::http::{DEFAULT_LISTEN, MetricsServer, render_registry};
use slotring_cli::report::KernelVerdict;
use slotring_cli::stats::StatsView;
use slotring_cli::verify::{Outcome, Window};
use slotring_cli::workload::{RunOptions, run};

const EXIT_ERROR: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_VERDICT_FAIL: u8 = 3;
const EXIT_NOTHING: u8 = 4;
const EXIT_INTERRUPTED: u8 = 130;

const AFTER_HELP: &str = "\
Examples:
  slotring run                                   # 1 GiB file, 10 s, 64 MiB/s, 2 slots per core
  slotring run --duration 30s --max-local-read-bandwidth 100MiB --plot run.svg
  slotring run --concurrent-threads-scheduler fair_round_robin --json > report.json
  slotring stats --watch                          # pinned maps of any slotring process
  slotring exporter --listen 127.0.0.1:9464       # Prometheus metrics from the pinned maps
  slotring verify --pid 1234 --window 10s         # kernel verdict on a running process

Exit codes: 0 ok, 1 error, 2 bad option/setting, 3 verdict FAIL,
4 nothing to read (no pins/permission/probes), 130 interrupted.";

#[derive(Parser)]
#[command(
    name = "slotring",
    version,
    about = "Throttled IO through io_uring, fair CPU slots, and the kernel's proof that parked threads cost nothing",
    after_help = AFTER_HELP,
    subcommand_required = true,
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    #[command(
        about = "Create a data file and run scan + short queries through the throttled io_uring engine under a CPU slot budget; report achieved rates, fairness and the kernel verdict",
        after_help = "Every setting can also come from the TOML file (--config, key = setting name) or the \
                      environment (SLOTRING_<NAME>); precedence: command line > environment > file > default."
    )]
    Run(RunArgs),
    #[command(
        about = "Print the pinned maps of a process using slotring (like bpftool, with units and rates)"
    )]
    Stats(StatsArgs),
    #[command(
        about = "Serve Prometheus metrics from the pinned maps of a service that embeds slotring"
    )]
    Exporter(ExporterArgs),
    #[command(
        about = "Verdict on the parked threads of a running process that uses slotring with probes (reads its pinned maps over a window)"
    )]
    Verify(VerifyArgs),
}

#[derive(Args)]
struct RunArgs {
    /// TOML file of settings (keys as below, snake_case)
    #[arg(long, value_name = "FILE.toml")]
    config: Option<PathBuf>,
    /// Print the report as JSON on stdout instead of text
    #[arg(long)]
    json: bool,
    /// Draw achieved rate and slots per query over time (SVG)
    #[arg(long, value_name = "FILE.svg", value_parser = config::svg_path)]
    plot: Option<PathBuf>,
    /// No progress bars
    #[arg(long)]
    no_progress: bool,
    /// Allow --listen on a non-loopback address
    #[arg(long)]
    allow_remote: bool,
    #[command(flatten)]
    settings: RunConfig,
}

#[derive(Args)]
struct PinDir {
    /// Directory of the pinned maps
    #[arg(long, default_value = DEFAULT_PIN_DIR)]
    pin_dir: PathBuf,
}

#[derive(Args)]
struct StatsArgs {
    #[command(flatten)]
    pins: PinDir,
    /// Refresh every --interval until Ctrl-C
    #[arg(long)]
    watch: bool,
    /// Rate interval
    #[arg(long, default_value = "1s", value_parser = config::positive_duration)]
    interval: Duration,
}

#[derive(Args)]
struct ExporterArgs {
    #[command(flatten)]
    pins: PinDir,
    /// Listen address
    #[arg(long, default_value = DEFAULT_LISTEN, value_parser = config::socket_addr)]
    listen: SocketAddr,
    /// Allow a non-loopback --listen address
    #[arg(long)]
    allow_remote: bool,
}

#[derive(Args)]
struct VerifyArgs {
    /// Process id
    #[arg(long)]
    pid: u32,
    #[command(flatten)]
    pins: PinDir,
    /// Observation window
    #[arg(long, default_value = "5s", value_parser = config::positive_duration)]
    window: Duration,
    /// Largest allowed parked on-CPU / parked time
    #[arg(long, default_value = "0.001", value_parser = config::ratio)]
    threshold: f64,
}

/// Block SIGINT/SIGTERM in every thread and turn them into a stop flag; a
/// second signal exits at once.
fn install_stop() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    if set.thread_block().is_ok() {
        let s = stop.clone();
        let _ = std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                let mut first = true;
                while let Ok(sig) = set.wait() {
                    if first {
                        eprintln!("\nslotring: {sig}, stopping (again to abort)");
                        s.store(true, Ordering::Relaxed);
                        first = false;
                    } else {
                        std::process::exit(i32::from(EXIT_INTERRUPTED));
                    }
                }
            });
    }
    stop
}

fn main() -> ExitCode {
    // The settings' variables are read by `RunConfig::overlay`, below the
    // command line and above the config file.
    let cmd = config::without_env(Cli::command());
    let parsed = cmd
        .clone()
        .try_get_matches()
        .and_then(|m| Ok((Cli::from_arg_matches(&m)?, m)));
    let (cli, matches) = match parsed {
        Ok(p) => p,
        Err(e) => {
            return match config::command_line_error(e, &cmd) {
                Ok(bad) => fail(bad.into()),
                Err(e) => {
                    let _ = e.print();
                    ExitCode::from(if e.use_stderr() { EXIT_USAGE } else { 0 })
                }
            };
        }
    };
    let stop = install_stop();
    let result = match cli.command {
        Cmd::Run(args) => {
            let given = matches
                .subcommand_matches("run")
                .expect("the run subcommand");
            cmd_run(args, given, stop)
        }
        Cmd::Stats(args) => cmd_stats(&args, &stop),
        Cmd::Exporter(args) => cmd_exporter(&args, &stop),
        Cmd::Verify(args) => cmd_verify(&args),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => fail(e),
    }
}

fn fail(e: anyhow::Error) -> ExitCode {
    eprintln!("slotring: error: {e:#}");
    ExitCode::from(if e.downcast_ref::<ConfigError>().is_some() {
        EXIT_USAGE
    } else if e.downcast_ref::<PinnedError>().is_some() {
        EXIT_NOTHING
    } else {
        EXIT_ERROR
    })
}

fn cmd_run(args: RunArgs, given: &clap::ArgMatches, stop: Arc<AtomicBool>) -> Result<u8> {
    let file = args.config.as_deref().map(ConfigFile::read).transpose()?;
    let mut cfg = args.settings;
    cfg.overlay(given, &|v| std::env::var(v).ok(), file.as_ref())?;
    let opts = RunOptions {
        progress: !args.no_progress,
        stop,
        allow_remote: args.allow_remote,
    };
    let report = match run(&cfg, &opts) {
        Ok(r) => r,
        Err(e) if opts.stop.load(Ordering::Relaxed) => {
            eprintln!(
                "slotring: interrupted before the queries ran: {:#}",
                anyhow::Error::new(e)
            );
            return Ok(EXIT_INTERRUPTED);
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(path) = &args.plot {
        std::fs::write(path, slotring_cli::plot::svg(&report))
            .with_context(|| format!("writing the plot to {}", path.display()))?;
        eprintln!("slotring: plot written to {}", path.display());
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        write!(out, "{report}")?;
    }
    Ok(if report.interrupted {
        EXIT_INTERRUPTED
    } else if report.kernel.verdict == KernelVerdict::Fail {
        EXIT_VERDICT_FAIL
    } else {
        0
    })
}

fn cmd_stats(args: &StatsArgs, stop: &AtomicBool) -> Result<u8> {
    let dir = &args.pins.pin_dir;
    let interval = args.interval;
    let maps = PinnedMaps::new(dir);
    let mut prev = maps.snapshot()?;
    loop {
        let t0 = Instant::now();
        while t0.elapsed() < interval {
            if stop.load(Ordering::Relaxed) {
                return Ok(0);
            }
            std::thread::sleep(Duration::from_millis(50).min(interval));
        }
        let now = maps.snapshot()?;
        if args.watch {
            print!("\x1b[2J\x1b[H");
        }
        let view = StatsView {
            dir,
            before: &prev,
            after: &now,
            dt: t0.elapsed().as_secs_f64(),
        };
        print!("{view}");
        if !args.watch {
            return Ok(0);
        }
        prev = now;
    }
}

fn cmd_exporter(args: &ExporterArgs, stop: &AtomicBool) -> Result<u8> {
    let dir = &args.pins.pin_dir;
    let maps = PinnedMaps::new(dir.clone());
    if let Err(e) = maps.slots() {
        eprintln!("slotring exporter: {e}; serving what becomes available");
    }
    let registry = prometheus::Registry::new();
    registry.register(Box::new(SlotringCollector::pinned(maps)))?;
    let srv = MetricsServer::start(args.listen, args.allow_remote, render_registry(registry))?;
    eprintln!(
        "slotring exporter: serving {} on http://{}/metrics",
        dir.display(),
        srv.addr()
    );
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(0)
}

fn cmd_verify(args: &VerifyArgs) -> Result<u8> {
    let (pid, dir, window) = (args.pid, &args.pins.pin_dir, args.window);
    if !PathBuf::from(format!("/proc/{pid}")).exists() {
        eprintln!("slotring verify: no process {pid}");
        return Ok(EXIT_NOTHING);
    }
    let maps = PinnedMaps::new(dir);
    let belongs = |tid: u32| PathBuf::from(format!("/proc/{pid}/task/{tid}")).exists();
    let before: Vec<ThreadState> = maps
        .threads()?
        .into_iter()
        .filter(|t| belongs(t.tid))
        .collect();
    let t0 = slotring::pinned::monotonic_ns();
    if before.is_empty() {
        eprintln!(
            "slotring verify: none of the threads in {} belongs to process {pid} (is it running with probes and this pin dir?)",
            dir.display()
        );
        return Ok(EXIT_NOTHING);
    }
    eprintln!(
        "slotring verify: watching {} threads of process {pid} for {window:?}",
        before.len()
    );
    std::thread::sleep(window);
    let t1 = slotring::pinned::monotonic_ns();
    let after = maps.threads()?;
    let rule = slotring::bpf::VerifyConfig {
        max_parked_cpu_ratio: args.threshold,
        ..slotring::bpf::VerifyConfig::default()
    };
    println!(
        "slotring verify: process {pid}, window {:.1} s, threshold: parked on-CPU <= {:.3}% of parked time + {:.0} us per park",
        (t1 - t0) as f64 / 1e9,
        args.threshold * 100.0,
        rule.per_park_allowance_ns as f64 / 1e3
    );
    let measured = Window::measure(&before, t0, &after, t1, &rule);
    print!("{measured}");
    let outcome = measured.outcome();
    println!("verdict: {outcome}");
    Ok(match outcome {
        Outcome::Unverified => EXIT_NOTHING,
        Outcome::Pass => 0,
        Outcome::Fail(_) => EXIT_VERDICT_FAIL,
    })
}
