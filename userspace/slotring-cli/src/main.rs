//! `slotring`: run the throttled-IO / fair-CPU-slot workload and prove it
//! with the kernel; read, export and verify the pinned stats of any process
//! that embeds slotring.
//!
//! Exit codes (stable, for scripts):
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | success (`verify`: verdict PASS) |
//! | 1 | runtime error, message on stderr (`run`: also a plot that cannot be written or data file reads that failed or came back short, after the report) |
//! | 2 | bad command line, setting, `SLOTRING_` variable or config file, a bad `--workloads` file, a non-loopback `--listen` without `--allow-remote`, an unwritable `--plot` (the message names the option or variable and the value; nothing ran); several live instances under the pin root and no `--instance` |
//! | 3 | the kernel verdict is FAIL: a parked thread used CPU |
//! | 4 | nothing to read or verify: no pinned maps, stale pins of a process that is gone, no permission, or no probes (`verify`: UNVERIFIED) |
//! | 130 | interrupted by Ctrl-C / SIGTERM (`run` still prints its report and cleans up; a second one exits at once, still removing the data file and the pins) |

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
use slotring::pinned::{self, DEFAULT_PIN_DIR, Liveness, PinnedError, PinnedMaps};
use slotring_cli::config::{self, ConfigError, ConfigFile, RunConfig, WorkloadsFile};
use slotring_cli::http::{DEFAULT_LISTEN, MetricsServer, render_registry};
use slotring_cli::report::KernelVerdict;
use slotring_cli::stats::StatsView;
use slotring_cli::verify::{Outcome, Reading, Window};
use slotring_cli::watch;
use slotring_cli::workload::{RunError, RunOptions, run};

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
4 nothing to read (no pins, stale pins, no permission, no probes), 130 interrupted.";

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
    Run(Box<RunArgs>),
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
    /// Schedule the reads by this workload tree (TOML: [[workload]] tables with ClickHouse's
    /// settings; [run] queries/scans name the leaves the short queries and the scans enter,
    /// default user/background; a root without max_bytes_per_second gets
    /// --max-local-read-bandwidth)
    #[arg(long, value_name = "FILE.toml")]
    workloads: Option<PathBuf>,
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
    /// Pin root (absolute): each process pins its maps in <DIR>/<pid or instance name>/
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PIN_DIR, value_parser = config::pin_dir)]
    pin_dir: PathBuf,
    /// Instance (directory under --pin-dir) [default: the only live one; verify: the one of --pid]
    #[arg(long, value_name = "NAME")]
    instance: Option<String>,
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
    /// Observation window, at most 1h (ends early on Ctrl-C, with the verdict so far, or when the process exits)
    #[arg(long, default_value = "5s", value_parser = config::verify_window)]
    window: Duration,
    /// Hot parked episodes a thread may have in the window
    #[arg(long, value_name = "N", default_value_t = slotring::bpf::TOLERATED_HOT_EPISODES)]
    tolerated_hot_episodes: u64,
    /// Plus this fraction of its episodes (a ratio in [0, 1])
    #[arg(long, value_name = "RATIO", default_value_t = slotring::bpf::TOLERATED_HOT_FRACTION, value_parser = config::ratio)]
    tolerated_hot_fraction: f64,
    /// On-CPU time above the bounds a thread may spend, as a fraction of its parked time (in [0, 1])
    #[arg(long, value_name = "RATIO", default_value_t = slotring::bpf::TOLERATED_EXCESS_FRACTION, value_parser = config::ratio)]
    tolerated_excess_fraction: f64,
}

/// Block SIGINT/SIGTERM in every thread and turn them into a stop flag; a
/// second signal exits at once, after the registered cleanups (the data
/// file and the pins: [`slotring_cli::abort`]).
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
                        let done = slotring_cli::abort::run_all();
                        eprintln!("{}", slotring_cli::abort::message(sig, &done));
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
    // Every `SLOTRING_` name is checked, whatever the command.
    if let Err(e) = config::check_environment(std::env::vars_os()) {
        return fail(e.into());
    }
    let stop = install_stop();
    let result = match cli.command {
        Cmd::Run(args) => {
            let given = matches
                .subcommand_matches("run")
                .expect("the run subcommand");
            cmd_run(*args, given, stop)
        }
        Cmd::Stats(args) => cmd_stats(&args, &stop),
        Cmd::Exporter(args) => cmd_exporter(&args, &stop),
        Cmd::Verify(args) => cmd_verify(&args, &stop),
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
    } else if let Some(RunError::Throttler { .. } | RunError::Workloads { .. }) =
        e.downcast_ref::<RunError>()
    {
        // A setting the throttler or the workload tree refuses is a bad
        // setting.
        EXIT_USAGE
    } else if let Some(p) = e.downcast_ref::<PinnedError>() {
        if matches!(p, PinnedError::Ambiguous { .. }) {
            EXIT_USAGE
        } else {
            EXIT_NOTHING
        }
    } else {
        EXIT_ERROR
    })
}

fn cmd_run(args: RunArgs, given: &clap::ArgMatches, stop: Arc<AtomicBool>) -> Result<u8> {
    let file = args.config.as_deref().map(ConfigFile::read).transpose()?;
    let mut cfg = args.settings;
    cfg.overlay(given, &|v| std::env::var(v).ok(), file.as_ref())?;
    // Refused now rather than after the run.
    config::check_listen(cfg.listen, args.allow_remote)?;
    if let Some(path) = &args.plot {
        config::check_plot_path(path)?;
    }
    let workloads = match &args.workloads {
        Some(path) => Some(WorkloadsFile::read(path)?.io_tree(cfg.max_local_read_bandwidth)?),
        None => None,
    };
    let opts = RunOptions {
        progress: !args.no_progress,
        stop,
        allow_remote: args.allow_remote,
        workloads,
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
    // The report first: nothing after the run can lose it.
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        write!(out, "{report}")?;
    }
    out.flush()?;
    drop(out);
    if let Some(path) = &args.plot {
        std::fs::write(path, slotring_cli::plot::svg(&report)).with_context(|| {
            format!(
                "writing the plot to {} (the report is above)",
                path.display()
            )
        })?;
        eprintln!("slotring: plot written to {}", path.display());
    }
    if report.io.reads_failed() {
        let end = match report.data_file.size_at_end_bytes {
            Some(n) if n < report.data_file.size_bytes => {
                format!(", truncated to {n} bytes during the run")
            }
            None => ", removed or replaced during the run".to_owned(),
            Some(_) => String::new(),
        };
        anyhow::bail!(
            "data file {}: {} read errors, {} short reads{end}: the report above did not read what it measured",
            report.data_file.path,
            report.io.read_errors,
            report.io.short_reads
        );
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
    let inst = pinned::select(&args.pins.pin_dir, args.pins.instance.as_deref())?;
    let (maps, dir) = (&inst.maps, inst.maps.dir());
    let interval = args.interval;
    let mut prev = maps.snapshot()?;
    loop {
        let t0 = Instant::now();
        while t0.elapsed() < interval {
            if stop.load(Ordering::Relaxed) {
                return Ok(EXIT_INTERRUPTED);
            }
            std::thread::sleep(Duration::from_millis(50).min(interval));
        }
        let now = maps.snapshot()?;
        // Frozen counters of a process that died meanwhile are not rates.
        maps.check_live()?;
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
    config::check_listen(Some(args.listen), args.allow_remote)?;
    let root = &args.pins.pin_dir;
    let (collector, dir) = match &args.pins.instance {
        // One instance, unlabelled.
        Some(name) => {
            let maps = PinnedMaps::new(root.join(name));
            if let Err(e) = maps.slots() {
                eprintln!(
                    "slotring exporter: {}; serving what becomes available",
                    slotring_cli::error_chain(&e)
                );
            }
            let dir = maps.dir().to_owned();
            (SlotringCollector::pinned(maps), dir)
        }
        // Every instance under the root, labelled slotring_instance.
        None => {
            match pinned::instances(root) {
                Ok(all) if all.is_empty() => eprintln!(
                    "slotring exporter: no instance under {} yet; serving what becomes available",
                    root.display()
                ),
                Ok(all) => {
                    for i in all {
                        eprintln!("slotring exporter: instance {} is {}", i.name, i.liveness);
                    }
                }
                Err(e) => eprintln!(
                    "slotring exporter: {:#}; serving what becomes available",
                    anyhow::Error::new(e)
                ),
            }
            (SlotringCollector::pinned_instances(root), root.clone())
        }
    };
    let registry = prometheus::Registry::new();
    registry.register(Box::new(collector))?;
    let srv = MetricsServer::start(args.listen, args.allow_remote, render_registry(registry))?;
    eprintln!(
        "slotring exporter: serving {} on http://{}/metrics",
        dir.display(),
        srv.addr()
    );
    // It serves until a signal: that is its only way to end.
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(EXIT_INTERRUPTED)
}

fn cmd_verify(args: &VerifyArgs, stop: &AtomicBool) -> Result<u8> {
    let (pid, dir, window) = (args.pid, &args.pins.pin_dir, args.window);
    let no_process = || {
        eprintln!("slotring verify: no process {pid}");
        Ok(EXIT_NOTHING)
    };
    // The target, by pid and start time: a pid reused meanwhile is not it.
    let Some(start_time) = slotring::bpf::pins::process_start_time(pid).ok().flatten() else {
        // Pins the process left (stale) are reported as such.
        return match owned_by(dir, pid) {
            Some(inst) => {
                inst.check_live()?;
                no_process()
            }
            None => no_process(),
        };
    };
    let target = slotring::bpf::Owner {
        pid: u64::from(pid),
        start_time,
    };
    // The instance asked for, or the one process `pid` pinned.
    let inst = match &args.pins.instance {
        Some(name) => pinned::select(dir, Some(name))?,
        None => match owned_by(dir, pid) {
            Some(inst) => inst,
            None => {
                pinned::instances(dir)?;
                return Err(PinnedError::NoInstance {
                    root: dir.clone(),
                    name: Some(pid.to_string()),
                }
                .into());
            }
        },
    };
    inst.check_live()?;
    let (maps, dir) = (&inst.maps, inst.maps.dir());
    let belongs = |tid: u32| PathBuf::from(format!("/proc/{pid}/task/{tid}")).exists();
    let mut before = Reading::of(maps)?;
    before.threads.retain(|t| belongs(t.tid));
    if before.threads.is_empty() {
        eprintln!(
            "slotring verify: none of the threads in {} belongs to process {pid} (is it running with probes and this pin dir?)",
            dir.display()
        );
        return Ok(EXIT_NOTHING);
    }
    let rule = maps.episode_rule()?;
    let cfg = slotring::bpf::VerifyConfig {
        tolerated_hot_episodes: args.tolerated_hot_episodes,
        tolerated_hot_fraction: args.tolerated_hot_fraction,
        tolerated_excess_fraction: args.tolerated_excess_fraction,
        ..slotring::bpf::VerifyConfig::default()
    };
    eprintln!(
        "slotring verify: watching {} threads of process {pid} for {window:?}",
        before.threads.len()
    );
    // The target by pid and start time, and the owner of the pins (re-read:
    // an instance of another process may be asked for by name).
    let alive = || target.liveness() == Liveness::Live && maps.check_live().is_ok();
    let ended = watch::watch(window, &|| stop.load(Ordering::Relaxed), &alive);
    if let watch::Ended::TargetGone(after) = ended {
        eprintln!(
            "slotring verify: process {pid} exited {:.1} s into the window: nothing to verify",
            after.as_secs_f64()
        );
        return Ok(EXIT_NOTHING);
    }
    // The probes may go away during the window (the process dropped them,
    // or exited): then nothing is verified.
    let outcome = match Reading::of(maps) {
        Ok(after) => {
            println!(
                "slotring verify: process {pid}, window {:.1} s",
                after.at_ns.saturating_sub(before.at_ns) as f64 / 1e9
            );
            let measured = Window::measure(&before, &after, &rule, &cfg);
            print!("{measured}");
            measured.outcome()
        }
        Err(e) => Outcome::Unverified(format!(
            "the probes went away during the window: {}",
            slotring_cli::error_chain(&e)
        )),
    };
    println!("verdict: {outcome}");
    if let watch::Ended::Stopped(after) = ended {
        eprintln!(
            "slotring verify: interrupted {:.1} s into the {window:?} window: the verdict covers that time",
            after.as_secs_f64()
        );
        return Ok(EXIT_INTERRUPTED);
    }
    Ok(match outcome {
        Outcome::Unverified(_) => EXIT_NOTHING,
        Outcome::Pass => 0,
        Outcome::Fail(_) => EXIT_VERDICT_FAIL,
    })
}

/// The instance under `root` whose owner record names `pid`, live or stale.
fn owned_by(root: &std::path::Path, pid: u32) -> Option<pinned::Instance> {
    pinned::instances(root)
        .ok()?
        .into_iter()
        .find(|i| i.owner.is_some_and(|o| o.pid == u64::from(pid)))
}
