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
use clap::{Arg, ArgAction, ArgMatches, Command};
use nix::sys::signal::{SigSet, Signal};
use slotring::metrics::SlotringCollector;
use slotring::pinned::{DEFAULT_PIN_DIR, PinnedError, PinnedMaps, ThreadState};
use slotring::snapshot::{KernelSnapshot, Snapshot};
use slotring_cli::config::{ConfigError, Layers, Origin, SETTINGS, option_name, parse_duration};
use slotring_cli::http::{DEFAULT_LISTEN, MetricsServer, render_registry};
use slotring_cli::workload::{RunOptions, run};

const EXIT_ERROR: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_VERDICT_FAIL: u8 = 3;
const EXIT_NOTHING: u8 = 4;
const EXIT_INTERRUPTED: u8 = 130;

const FLAG_SETTINGS: &[(&str, &str, &str)] = &[
    ("keep", "--keep", "true"),
    ("lease_parking", "--no-lease-parking", "false"),
    ("probes", "--no-probes", "false"),
];

/// Boolean settings with both a `--<name>` and a `--no-<name>` flag.
const TOGGLE_SETTINGS: &[&str] = &["adaptive_budget"];

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

fn run_command() -> Command {
    let mut cmd = Command::new("run")
        .about("Create a data file and run scan + short queries through the throttled io_uring engine under a CPU slot budget; report achieved rates, fairness and the kernel verdict")
        .after_help(
            "Every setting can also come from the TOML file (--config, key = setting name) or the \
             environment (SLOTRING_<NAME>); precedence: command line > environment > file > default.",
        )
        .arg(
            Arg::new("config")
                .long("config")
                .value_name("FILE.toml")
                .value_parser(clap::value_parser!(PathBuf))
                .help("TOML file of settings (keys as below, snake_case)"),
        )
        .arg(
            Arg::new("json")
                .long("json")
                .action(ArgAction::SetTrue)
                .help("Print the report as JSON on stdout instead of text"),
        )
        .arg(
            Arg::new("plot")
                .long("plot")
                .value_name("FILE.svg")
                .value_parser(clap::value_parser!(PathBuf))
                .help("Draw achieved rate and slots per query over time (SVG)"),
        )
        .arg(
            Arg::new("no_progress")
                .long("no-progress")
                .action(ArgAction::SetTrue)
                .help("No progress bars"),
        )
        .arg(
            Arg::new("allow_remote")
                .long("allow-remote")
                .action(ArgAction::SetTrue)
                .help("Allow --listen on a non-loopback address"),
        );
    for (key, default, help) in SETTINGS {
        if TOGGLE_SETTINGS.contains(key) {
            // `--<name>` turns it on, `--no-<name>` off; the last one wins.
            let (on, off) = (option_name(key), format!("no-{}", option_name(key)));
            cmd = cmd
                .arg(
                    Arg::new(*key)
                        .long(on)
                        .action(ArgAction::SetTrue)
                        .overrides_with(format!("no_{key}"))
                        .help(format!("{help} [setting {key}, default {default}]")),
                )
                .arg(
                    Arg::new(format!("no_{key}"))
                        .long(off)
                        .action(ArgAction::SetTrue)
                        .overrides_with(*key)
                        .help(format!("Do not {help} [setting {key}]")),
                );
        } else if let Some((_, flag, value)) = FLAG_SETTINGS.iter().find(|f| f.0 == *key) {
            // A `--no-…` flag turns the setting off; the others turn it on.
            let verb = if *value == "false" { "Do not " } else { "" };
            cmd = cmd.arg(
                Arg::new(*key)
                    .long(flag.trim_start_matches("--"))
                    .action(ArgAction::SetTrue)
                    .help(format!("{verb}{help} [setting {key}, default {default}]")),
            );
        } else {
            cmd = cmd.arg(
                Arg::new(*key)
                    .long(option_name(key))
                    .value_name("VALUE")
                    .help(format!(
                        "{help} [default: {}]",
                        if default.is_empty() { "-" } else { default }
                    )),
            );
        }
    }
    cmd
}

fn cli() -> Command {
    Command::new("slotring")
        .version(env!("CARGO_PKG_VERSION"))
        .about("Throttled IO through io_uring, fair CPU slots, and the kernel's proof that parked threads cost nothing")
        .after_help(AFTER_HELP)
        .subcommand_required(true)
        .arg_required_else_help(true)
        .subcommand(run_command())
        .subcommand(
            Command::new("stats")
                .about("Print the pinned maps of a process using slotring (like bpftool, with units and rates)")
                .arg(pin_dir_arg())
                .arg(
                    Arg::new("watch")
                        .long("watch")
                        .action(ArgAction::SetTrue)
                        .help("Refresh every --interval until Ctrl-C"),
                )
                .arg(
                    Arg::new("interval")
                        .long("interval")
                        .default_value("1s")
                        .help("Rate interval"),
                ),
        )
        .subcommand(
            Command::new("exporter")
                .about("Serve Prometheus metrics from the pinned maps of a service that embeds slotring")
                .arg(pin_dir_arg())
                .arg(
                    Arg::new("listen")
                        .long("listen")
                        .default_value(DEFAULT_LISTEN)
                        .help("Listen address"),
                )
                .arg(
                    Arg::new("allow_remote")
                        .long("allow-remote")
                        .action(ArgAction::SetTrue)
                        .help("Allow a non-loopback --listen address"),
                ),
        )
        .subcommand(
            Command::new("verify")
                .about("Verdict on the parked threads of a running process that uses slotring with probes (reads its pinned maps over a window)")
                .arg(
                    Arg::new("pid")
                        .long("pid")
                        .required(true)
                        .value_parser(clap::value_parser!(u32))
                        .help("Process id"),
                )
                .arg(pin_dir_arg())
                .arg(
                    Arg::new("window")
                        .long("window")
                        .default_value("5s")
                        .help("Observation window"),
                )
                .arg(
                    Arg::new("threshold")
                        .long("threshold")
                        .default_value("0.001")
                        .help("Largest allowed parked on-CPU / parked time"),
                ),
        )
}

fn pin_dir_arg() -> Arg {
    Arg::new("pin_dir")
        .long("pin-dir")
        .default_value(DEFAULT_PIN_DIR)
        .value_parser(clap::value_parser!(PathBuf))
        .help("Directory of the pinned maps")
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
    let matches = match cli().try_get_matches() {
        Ok(m) => m,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EXIT_USAGE } else { 0 });
        }
    };
    let stop = install_stop();
    let result = match matches.subcommand() {
        Some(("run", m)) => cmd_run(m, stop),
        Some(("stats", m)) => cmd_stats(m, stop),
        Some(("exporter", m)) => cmd_exporter(m, stop),
        Some(("verify", m)) => cmd_verify(m),
        _ => unreachable!("subcommand_required"),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("slotring: error: {e:#}");
            let code = if e.downcast_ref::<ConfigError>().is_some() {
                EXIT_USAGE
            } else if e.downcast_ref::<PinnedError>().is_some() {
                EXIT_NOTHING
            } else {
                EXIT_ERROR
            };
            ExitCode::from(code)
        }
    }
}

fn cmd_run(m: &ArgMatches, stop: Arc<AtomicBool>) -> Result<u8> {
    let mut layers = Layers::defaults();
    if let Some(path) = m.get_one::<PathBuf>("config") {
        layers.file(path)?;
    }
    layers.env(|v| std::env::var(v).ok());
    for (key, _, _) in SETTINGS {
        if TOGGLE_SETTINGS.contains(key) {
            if m.get_flag(key) {
                layers.set(key, "true", Origin::CommandLine);
            } else if m.get_flag(&format!("no_{key}")) {
                layers.set(key, "false", Origin::CommandLine);
            }
        } else if let Some((_, _, value)) = FLAG_SETTINGS.iter().find(|f| f.0 == *key) {
            if m.get_flag(key) {
                layers.set(key, *value, Origin::CommandLine);
            }
        } else if let Some(v) = m.get_one::<String>(key) {
            layers.set(key, v.clone(), Origin::CommandLine);
        }
    }
    let cfg = layers.resolve()?;
    if let Some(path) = m.get_one::<PathBuf>("plot")
        && path.extension().is_none_or(|e| e != "svg")
    {
        return Err(ConfigError::Invalid {
            option: "plot".into(),
            value: path.display().to_string(),
            origin: Origin::CommandLine,
            expected: "a path ending in .svg (convert the SVG for other formats)",
        }
        .into());
    }
    let json = m.get_flag("json");
    let opts = RunOptions {
        progress: !m.get_flag("no_progress"),
        stop,
        allow_remote: m.get_flag("allow_remote"),
    };
    let report = match run(&cfg, &opts) {
        Ok(r) => r,
        Err(e) if opts.stop.load(Ordering::Relaxed) => {
            eprintln!("slotring: interrupted before the queries ran: {e}");
            return Ok(EXIT_INTERRUPTED);
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(path) = m.get_one::<PathBuf>("plot") {
        std::fs::write(path, slotring_cli::plot::svg(&report))
            .with_context(|| format!("writing the plot to {}", path.display()))?;
        eprintln!("slotring: plot written to {}", path.display());
    }
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        write!(out, "{report}")?;
    }
    Ok(if report.interrupted {
        EXIT_INTERRUPTED
    } else if report.kernel.verdict == "fail" {
        EXIT_VERDICT_FAIL
    } else {
        0
    })
}

fn duration_arg(m: &ArgMatches, name: &str) -> Result<Duration> {
    let v = m.get_one::<String>(name).expect("has a default");
    parse_duration(v).filter(|d| !d.is_zero()).ok_or_else(|| {
        anyhow::Error::new(ConfigError::Invalid {
            option: name.to_owned(),
            value: v.clone(),
            origin: Origin::CommandLine,
            expected: "a positive duration, e.g. 1s or 500ms",
        })
    })
}

fn mib(b: f64) -> f64 {
    b / (1 << 20) as f64
}

fn print_stats(dir: &std::path::Path, a: &Snapshot, b: &Snapshot, dt: f64) {
    let rate = |x: u64, y: u64| y.saturating_sub(x) as f64 / dt;
    println!(
        "slotring stats from {} (rates over {dt:.1} s)",
        dir.display()
    );
    println!(
        "{:<14} {:>14} {:>12} {:>12} {:>16} {:>10}",
        "throttler", "configured", "charged", "rate", "page cache/s", "waited/s"
    );
    for t in &b.throttlers {
        let prev = a
            .throttlers
            .iter()
            .find(|p| p.name == t.name)
            .map(|p| p.counters)
            .unwrap_or_default();
        let c = &t.counters;
        println!(
            "{:<14} {:>14} {:>8.1} MiB {:>6.1} MiB/s {:>10.1} MiB/s {:>9.3}s",
            t.name,
            if c.max_speed == 0 {
                "unlimited".to_owned()
            } else {
                format!("{:.1} MiB/s", mib(c.max_speed as f64))
            },
            mib(c.amount as f64),
            mib(rate(prev.amount, c.amount)),
            mib(rate(prev.page_cache_amount, c.page_cache_amount)),
            rate(prev.wait_us, c.wait_us) / 1e6
        );
    }
    let (s0, s) = (&a.slots, &b.slots);
    let max = if s.max_concurrency == u64::MAX {
        "unlimited".to_owned()
    } else {
        s.max_concurrency.to_string()
    };
    println!(
        "slots: budget {max}, in use {}, allocations {}, waiters {}, parked {}, borrowed {}",
        s.cur_concurrency, s.allocations, s.waiters, s.parked, s.borrowed
    );
    println!(
        "       acquired {:.1}/s, delayed {:.1}/s (total {}), queries delayed {}, parks {:.1}/s, borrows {}",
        rate(s0.slots_acquired, s.slots_acquired),
        rate(s0.slots_delayed, s.slots_delayed),
        s.slots_delayed,
        s.queries_delayed,
        rate(s0.parks, s.parks),
        s.unpark_borrows
    );
    let (u0, u) = (&a.uring, &b.uring);
    println!(
        "io:    {:.0} reads/s, {:.1} MiB/s read, page cache {:.1} MiB/s ({} hits total), NOWAIT misses {:.1}/s, waits {:.1}/s",
        rate(u0.reads, u.reads),
        mib(rate(u0.read_bytes, u.read_bytes)),
        mib(rate(u0.page_cache_bytes, u.page_cache_bytes)),
        u.page_cache_hits,
        rate(u0.nowait_misses, u.nowait_misses),
        rate(u0.waits_submitted, u.waits_submitted)
    );
    if let (Some(k0), Some(k)) = (&a.kernel, &b.kernel) {
        let parked = k.parked_ns.saturating_sub(k0.parked_ns);
        let oncpu = k.parked_oncpu_ns.saturating_sub(k0.parked_oncpu_ns);
        println!(
            "kernel: {} threads, {} parked now, parked {:.2} thread-s/s, on-CPU while parked {:.3} ms/s ({:.4}% of parked), run-queue while parked {:.3} ms/s, missed events {}",
            k.threads,
            k.leases_parked,
            parked as f64 / 1e9 / dt,
            oncpu as f64 / 1e6 / dt,
            if parked == 0 {
                0.0
            } else {
                oncpu as f64 / parked as f64 * 100.0
            },
            k.parked_runq_ns.saturating_sub(k0.parked_runq_ns) as f64 / 1e6 / dt,
            k.missed_events
        );
    }
}

fn cmd_stats(m: &ArgMatches, stop: Arc<AtomicBool>) -> Result<u8> {
    let dir = m.get_one::<PathBuf>("pin_dir").expect("has a default");
    let interval = duration_arg(m, "interval")?;
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
        if m.get_flag("watch") {
            print!("\x1b[2J\x1b[H");
        }
        print_stats(dir, &prev, &now, t0.elapsed().as_secs_f64());
        if !m.get_flag("watch") {
            return Ok(0);
        }
        prev = now;
    }
}

fn cmd_exporter(m: &ArgMatches, stop: Arc<AtomicBool>) -> Result<u8> {
    let dir = m.get_one::<PathBuf>("pin_dir").expect("has a default");
    let listen: SocketAddr = {
        let v = m.get_one::<String>("listen").expect("has a default");
        v.parse().map_err(|_| {
            anyhow::Error::new(ConfigError::Invalid {
                option: "listen".into(),
                value: v.clone(),
                origin: Origin::CommandLine,
                expected: "an address like 127.0.0.1:9464",
            })
        })?
    };
    let maps = PinnedMaps::new(dir.clone());
    if let Err(e) = maps.slots() {
        eprintln!("slotring exporter: {e}; serving what becomes available");
    }
    let registry = prometheus::Registry::new();
    registry.register(Box::new(SlotringCollector::pinned(maps)))?;
    let srv = MetricsServer::start(
        listen,
        m.get_flag("allow_remote"),
        render_registry(registry),
    )?;
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

fn cmd_verify(m: &ArgMatches) -> Result<u8> {
    let pid = *m.get_one::<u32>("pid").expect("required");
    let dir = m.get_one::<PathBuf>("pin_dir").expect("has a default");
    let window = duration_arg(m, "window")?;
    let threshold: f64 = {
        let v = m.get_one::<String>("threshold").expect("has a default");
        v.parse()
            .ok()
            .filter(|r| (0.0..=1.0).contains(r))
            .ok_or_else(|| {
                anyhow::Error::new(ConfigError::Invalid {
                    option: "threshold".into(),
                    value: v.clone(),
                    origin: Origin::CommandLine,
                    expected: "a ratio in [0, 1], e.g. 0.001",
                })
            })?
    };
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
    let p = slotring::throttle::LeaseState::Parked as usize;
    // The same rule as `SlotringBpf::verify`: a ratio of parked time plus a
    // fixed allowance per park for entering and leaving the wait.
    let rule = slotring::bpf::VerifyConfig {
        max_parked_cpu_ratio: threshold,
        ..slotring::bpf::VerifyConfig::default()
    };
    println!(
        "slotring verify: process {pid}, window {:.1} s, threshold: parked on-CPU <= {:.3}% of parked time + {:.0} us per park",
        (t1 - t0) as f64 / 1e9,
        threshold * 100.0,
        rule.per_park_allowance_ns as f64 / 1e3
    );
    println!(
        "{:>8} {:>6} {:>11} {:>11} {:>9} {:>11} {:>6} {:>5}",
        "tid", "parks", "parked_ms", "oncpu_ms", "oncpu%", "runq_ms", "missed", ""
    );
    let mut failing = Vec::new();
    let mut total = KernelSnapshot::default();
    for b in &before {
        let Some(a) = after.iter().find(|a| a.tid == b.tid) else {
            continue;
        };
        let parked = a.parked_ns(t1).saturating_sub(b.parked_ns(t0));
        let oncpu = a.acct.on_cpu_ns[p].saturating_sub(b.acct.on_cpu_ns[p]);
        let runq = a.acct.runq_ns[p].saturating_sub(b.acct.runq_ns[p]);
        let parks = a.lease.parks.saturating_sub(b.lease.parks);
        let missed = (a.acct.missed_switch_in + a.acct.missed_switch_out)
            .saturating_sub(b.acct.missed_switch_in + b.acct.missed_switch_out);
        let pass = rule.within(oncpu, parked, parks);
        if !pass {
            failing.push(b.tid);
        }
        total.parked_ns += parked;
        total.parked_oncpu_ns += oncpu;
        total.parked_runq_ns += runq;
        total.parks += parks;
        total.missed_events += missed;
        println!(
            "{:>8} {:>6} {:>11.3} {:>11.4} {:>8.4}% {:>11.4} {:>6} {:>5}",
            b.tid,
            parks,
            parked as f64 / 1e6,
            oncpu as f64 / 1e6,
            if parked == 0 {
                0.0
            } else {
                oncpu as f64 / parked as f64 * 100.0
            },
            runq as f64 / 1e6,
            missed,
            if pass { "ok" } else { "FAIL" }
        );
    }
    println!(
        "{:>8} {:>6} {:>11.3} {:>11.4} {:>8.4}% {:>11.4} {:>6}",
        "total",
        total.parks,
        total.parked_ns as f64 / 1e6,
        total.parked_oncpu_ns as f64 / 1e6,
        if total.parked_ns == 0 {
            0.0
        } else {
            total.parked_oncpu_ns as f64 / total.parked_ns as f64 * 100.0
        },
        total.parked_runq_ns as f64 / 1e6,
        total.missed_events
    );
    if total.parks == 0 && total.parked_ns == 0 {
        println!("verdict: UNVERIFIED (no thread parked during the window)");
        Ok(EXIT_NOTHING)
    } else if failing.is_empty() {
        // (Every thread within its allowance implies the total is too.)
        println!("verdict: PASS");
        Ok(0)
    } else {
        println!("verdict: FAIL (threads {failing:?} used CPU while parked)");
        Ok(EXIT_VERDICT_FAIL)
    }
}
