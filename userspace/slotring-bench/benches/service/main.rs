//! `cargo xtask bench service`: slotring-uring's object server example
//! (`slotring-uring/examples/object_server.rs`) in its three variants — `slotring`
//! (`SharedEngine`, one disk throttler, page-cache hits free), `tokio-fs`
//! (unthrottled) and `tokio-fs-governor` (a `governor` limiter per read) —
//! driven by `wrk` (a Debian package; `latency.lua` beside this file picks
//! random 64 KiB ranges and prints latency percentiles), on a hot set
//! (in the page cache) and a cold set (evicted before each run, limited to
//! 64 MiB/s), at 1, 64 and 1,024 connections. Each run starts a fresh server
//! process (this binary re-executed), sampled from `/proc` for threads, RSS,
//! CPU and the bytes it read from the disk. Writes `target/bench/service.json`
//! with the keys; the full table is printed. Nothing asserts a time.

#[allow(
    dead_code,
    reason = "the bench uses the example's main and Config, not all of it"
)]
#[path = "../../../slotring-uring/examples/object_server.rs"]
mod object_server;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use slotring_benchkit::{Report, disk_dir, median};

const SERVER_ENV: &str = "SLOTRING_BENCH_OBJECT_SERVER";
const SIZE: u64 = 1 << 20;
const CHUNK: u64 = 64 << 10;
const HOT_OBJECTS: u64 = 64;
/// 4 GiB: an 8 s run at 64 MiB/s reads 12 % of it, so the set stays cold
/// and the disk rate is a steady state. A smaller set (1 GiB, half of it
/// read in by the end of a run) has a page-cache share, and with it
/// refunds, that grow through the run, and the disk trails the limit at
/// 1,024 connections.
const COLD_OBJECTS: u64 = 4096;
const RATE: u64 = 64 << 20;
const HOT_SECS: u64 = 5;
/// Rounds of the hot, 64-connection runs (the keys take their median).
const HOT_ROUNDS: usize = 3;
const COLD_SECS: u64 = 8;
/// The sustained disk rate is measured after this much of a run (the
/// throttlers' one-second burst and the start-up are left out).
const SETTLE: Duration = Duration::from_secs(2);
const CONNS: [u32; 3] = [1, 64, 1024];
const VARIANTS: [(&str, &str); 3] = [
    ("slotring", "slotring"),
    ("tokiofs", "tokio-fs"),
    ("governor", "tokio-fs-governor"),
];

fn make_set(dir: &Path, objects: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let mut block = vec![0u8; SIZE as usize];
    for n in 0..objects {
        for (i, b) in block.iter_mut().enumerate() {
            *b = ((i as u64 * 7 + n * 31 + i as u64 / 4096) % 251) as u8;
        }
        let mut f = std::fs::File::create(dir.join(n.to_string())).unwrap();
        f.write_all(&block).unwrap();
        f.sync_all().unwrap();
    }
}

fn for_each_object(dir: &Path, objects: u64, mut f: impl FnMut(&std::fs::File)) {
    for n in 0..objects {
        f(&std::fs::File::open(dir.join(n.to_string())).unwrap());
    }
}

fn evict(dir: &Path, objects: u64) {
    for_each_object(dir, objects, |f| {
        let _ =
            nix::fcntl::posix_fadvise(f, 0, 0, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED);
    });
}

fn warm(dir: &Path, objects: u64) {
    let mut buf = vec![0u8; SIZE as usize];
    for_each_object(dir, objects, |f| {
        let _ = f.read_at(&mut buf, 0);
    });
}

/// One `/proc/<pid>` sample of the server.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    at: Duration,
    threads: u64,
    rss_kb: u64,
    cpu_s: f64,
    read_bytes: u64,
}

fn sample(pid: u32, t0: Instant) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name: state is 3rd, utime 14th, stime 15th.
    let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?;
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    let read_bytes = io
        .lines()
        .find_map(|l| l.strip_prefix("read_bytes: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    Some(Sample {
        at: t0.elapsed(),
        threads: field("Threads:"),
        rss_kb: field("VmRSS:"),
        cpu_s: ticks as f64 / 100.0,
        read_bytes,
    })
}

/// What one run measured.
#[derive(Debug, Default, Clone)]
struct Run {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
    served: u64,
    disk_charged: u64,
    /// Charged as misses, found cached after the wait and given back.
    refunded: u64,
    cq_overflows: u64,
    cpu_s: f64,
    peak_threads: u64,
    peak_rss_mb: f64,
    /// Bytes/s read from the disk by the server from [`SETTLE`] to the end
    /// of wrk's duration.
    disk_rate: f64,
}

struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(dir: &Path, variant: &str, rate: u64) -> Server {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env(SERVER_ENV, "1")
        .args(["--dir", dir.to_str().unwrap(), "--variant", variant])
        .args(["--rate", &rate.to_string(), "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("server said {line:?}"))
        .parse()
        .unwrap();
    Server { child, addr }
}

fn stats(addr: SocketAddr) -> HashMap<String, u64> {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let body = resp.split_once("\r\n\r\n").map_or("", |x| x.1);
    body.lines()
        .filter_map(|l| l.split_once('='))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

fn run(dir: &Path, objects: u64, variant: &str, rate: u64, conns: u32, secs: u64) -> Run {
    let server = start_server(dir, variant, rate);
    let pid = server.child.id();
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut out = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if let Some(s) = sample(pid, t0) {
                    out.push(s);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            out.extend(sample(pid, t0));
            out
        })
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/service/latency.lua");
    let out = Command::new("wrk")
        // wrk wants at least one connection per thread.
        .arg(format!("-t{}", conns.min(2)))
        .args([
            &format!("-c{conns}"),
            &format!("-d{secs}s"),
            "--timeout",
            "30s",
        ])
        .arg("-s")
        .arg(&script)
        .arg(format!("http://{}", server.addr))
        .env("OBJECTS", objects.to_string())
        .env("SIZE", SIZE.to_string())
        .env("CHUNK", CHUNK.to_string())
        .output()
        .expect("run wrk (apt-get install wrk)");
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.join().unwrap();
    let st = stats(server.addr);
    drop(server);
    let text = String::from_utf8_lossy(&out.stdout);
    let r: HashMap<String, f64> = text
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("no RESULT from wrk:\n{text}"))
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
        .collect();
    let first = samples.first().copied().unwrap_or_default();
    let last = samples.last().copied().unwrap_or_default();
    let settled = samples
        .iter()
        .find(|s| s.at >= SETTLE)
        .copied()
        .unwrap_or(first);
    // The rate window ends with the load: the last sample within wrk's
    // duration (after it, wrk closes its connections and prints, and the
    // idle tail, longer at 1,024 connections, would read as a rate error).
    let loaded = samples
        .iter()
        .rev()
        .find(|s| s.at <= Duration::from_secs(secs))
        .copied()
        .unwrap_or(last);
    let window = (loaded.at.saturating_sub(settled.at))
        .as_secs_f64()
        .max(1e-3);
    Run {
        rps: r["requests"] / r["duration_s"],
        p50_ms: r["p50_ms"],
        p99_ms: r["p99_ms"],
        errors: (r["non2xx"] + r["connect"] + r["read"] + r["write"] + r["timeout"]) as u64,
        served: st.get("bytes_served").copied().unwrap_or(0),
        disk_charged: st.get("disk_charged").copied().unwrap_or(0),
        refunded: st.get("page_cache_refund_bytes").copied().unwrap_or(0),
        cq_overflows: st.get("cq_overflows").copied().unwrap_or(0),
        cpu_s: last.cpu_s - first.cpu_s,
        peak_threads: samples.iter().map(|s| s.threads).max().unwrap_or(0),
        peak_rss_mb: samples.iter().map(|s| s.rss_kb).max().unwrap_or(0) as f64 / 1024.0,
        disk_rate: loaded.read_bytes.saturating_sub(settled.read_bytes) as f64 / window,
    }
}

struct RemoveOnDrop(PathBuf);
impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn server_main() {
    if let Err(e) = object_server::main() {
        eprintln!("object_server: {e}");
        std::process::exit(1);
    }
}

/// Every run of the suite: `(set, variant key, connections)` → its run;
/// the hot 64-connection runs of every round per variant; the half-warm
/// cold set's runs.
struct Runs {
    runs: HashMap<(String, &'static str, u32), Run>,
    hot64: HashMap<&'static str, Vec<Run>>,
    partial: HashMap<&'static str, Run>,
}

/// Every variant at every connection count, on the hot set (warmed) and
/// the cold one (evicted) before each run.
fn every_run(hot: &Path, cold: &Path) -> HashMap<(String, &'static str, u32), Run> {
    let mut runs = HashMap::new();
    for (set, dir, objects, secs) in [
        ("hot", hot, HOT_OBJECTS, HOT_SECS),
        ("cold", cold, COLD_OBJECTS, COLD_SECS),
    ] {
        for conns in CONNS {
            for (key, variant) in VARIANTS {
                if set == "hot" {
                    warm(dir, objects);
                } else {
                    evict(dir, objects);
                }
                let r = run(dir, objects, variant, RATE, conns, secs);
                eprintln!("{set:>4} {variant:<18} c{conns:<5} {r:?}");
                runs.insert((set.to_string(), key, conns), r);
            }
        }
    }
    runs
}

/// Run the suite on the data sets `hot` and `cold`.
fn measure(hot: &Path, cold: &Path) -> Runs {
    let runs = every_run(hot, cold);
    // The headline comparison (hot, 64 connections) again, in interleaved
    // rounds: the machine is shared, and a neighbour's burst must not decide
    // it. The keys take the median over all rounds.
    let mut hot64: HashMap<&str, Vec<Run>> = HashMap::new();
    for (key, _) in VARIANTS {
        hot64.insert(key, vec![runs[&("hot".to_string(), key, 64)].clone()]);
    }
    for _ in 0..HOT_ROUNDS - 1 {
        for (key, variant) in VARIANTS {
            warm(hot, HOT_OBJECTS);
            let r = run(hot, HOT_OBJECTS, variant, RATE, 64, HOT_SECS);
            eprintln!(" hot {variant:<18} c64 (round) {r:?}");
            hot64.get_mut(key).expect("every variant").push(r);
        }
    }
    // A warm-but-partial set: half of the cold set in the page cache.
    let mut partial = HashMap::new();
    for (key, variant) in [VARIANTS[0], VARIANTS[2]] {
        evict(cold, COLD_OBJECTS);
        warm(cold, COLD_OBJECTS / 2);
        let r = run(cold, COLD_OBJECTS, variant, RATE, 64, COLD_SECS);
        eprintln!("partial {variant:<18} c64 {r:?}");
        partial.insert(key, r);
    }
    Runs {
        runs,
        hot64,
        partial,
    }
}

/// Every run side by side, then the half-warm runs and the load averages.
fn print_table(m: &Runs, load: &str, load_after: &str) {
    let (runs, partial) = (&m.runs, &m.partial);
    println!(
        "\nservice: every run side by side (rate limit {} MiB/s for slotring and governor)",
        RATE >> 20
    );
    println!(
        "{:<5} {:<9} {:>5} {:>10} {:>9} {:>9} {:>7} {:>8} {:>8} {:>9} {:>9} {:>8} {:>7} {:>10}",
        "set",
        "variant",
        "conns",
        "req/s",
        "p50 ms",
        "p99 ms",
        "errors",
        "threads",
        "RSS MB",
        "CPU s/GB",
        "disk MiB/s",
        "err %",
        "CQ ovf",
        "refund MiB"
    );
    let mut keys: Vec<_> = runs.keys().cloned().collect();
    keys.sort_by_key(|(s, v, c)| (s.clone(), *c, *v));
    for k in &keys {
        let r = &runs[k];
        let gb = r.served as f64 / 1e9;
        let err = (r.disk_rate - RATE as f64).abs() / RATE as f64 * 100.0;
        println!(
            "{:<5} {:<9} {:>5} {:>10.0} {:>9.2} {:>9.2} {:>7} {:>8} {:>8.1} {:>9.2} {:>9.1} {:>8.1} {:>7} {:>10.1}",
            k.0,
            k.1,
            k.2,
            r.rps,
            r.p50_ms,
            r.p99_ms,
            r.errors,
            r.peak_threads,
            r.peak_rss_mb,
            if gb > 0.0 { r.cpu_s / gb } else { 0.0 },
            r.disk_rate / (1 << 20) as f64,
            err,
            r.cq_overflows,
            r.refunded as f64 / (1 << 20) as f64
        );
    }
    for (k, r) in partial {
        let free =
            100.0 * (r.served.saturating_sub(r.disk_charged)) as f64 / r.served.max(1) as f64;
        println!(
            "partial {k:<9} req/s {:.0}  served {:.1} MiB  charged to the disk {:.1} MiB  not charged {free:.1} %  disk {:.1} MiB/s",
            r.rps,
            r.served as f64 / (1 << 20) as f64,
            r.disk_charged as f64 / (1 << 20) as f64,
            r.disk_rate / (1 << 20) as f64
        );
    }
    println!("load average before: {}after: {}", load, load_after);
}

/// The hot 64-connection keys (median of the rounds; governor's rounds
/// are printed only).
fn hot_keys(report: &mut Report, m: &Runs) {
    for (key, _) in VARIANTS {
        let rs = &m.hot64[key];
        let mut rps: Vec<f64> = rs.iter().map(|r| r.rps).collect();
        let mut p99: Vec<f64> = rs.iter().map(|r| r.p99_ms).collect();
        let (rps, p99) = (median(&mut rps), median(&mut p99));
        println!(
            "hot c64 {key:<9} rounds req/s {:?}  median {rps:.0}; p99 ms {:?}  median {p99:.2}",
            rs.iter().map(|r| r.rps.round()).collect::<Vec<_>>(),
            rs.iter().map(|r| r.p99_ms).collect::<Vec<_>>()
        );
        if key == "governor" {
            continue;
        }
        report.put(
            &format!("svc_hot_rps_{key}_c64"),
            rps,
            "hot set, 64 connections, requests/s (wrk), median of rounds",
        );
        report.put(
            &format!("svc_hot_p99_ms_{key}_c64"),
            p99,
            "hot set, 64 connections, p99 ms (wrk), median of rounds",
        );
    }
}

/// The cold set's, the servers' costs and the half-warm set's keys.
fn other_keys(report: &mut Report, m: &Runs) {
    let runs = &m.runs;
    let g = |s: &str, v: &'static str, c: u32| runs[&(s.to_string(), v, c)].clone();
    for v in ["slotring", "governor"] {
        // The sustained disk rate of the cold runs at 64 and 1,024
        // connections (at 1 the load cannot fill the limit).
        let errs: Vec<f64> = [64, 1024]
            .iter()
            .map(|&c| (g("cold", v, c).disk_rate - RATE as f64).abs() / RATE as f64 * 100.0)
            .collect();
        report.put(
            &format!("svc_cold_rate_error_pct_{v}"),
            errs.iter().sum::<f64>() / errs.len() as f64,
            "cold set, |disk read rate − 64 MiB/s| / 64 MiB/s, %, mean of c64 and c1024",
        );
        report.put(
            &format!("svc_cold_p99_ms_{v}_c1024"),
            g("cold", v, 1024).p99_ms,
            "cold set, 1,024 connections, p99 ms",
        );
    }
    for v in ["slotring", "tokiofs", "governor"] {
        report.put(
            &format!("svc_threads_{v}_c1024"),
            g("cold", v, 1024).peak_threads as f64,
            "peak OS threads of the server, cold, 1,024 connections",
        );
    }
    for v in ["slotring", "tokiofs", "governor"] {
        let (cpu, bytes) = runs
            .iter()
            .filter(|(k, _)| k.1 == v)
            .fold((0.0, 0u64), |(c, b), (_, r)| (c + r.cpu_s, b + r.served));
        report.put(
            &format!("svc_cpu_s_per_gb_{v}"),
            cpu / (bytes as f64 / 1e9),
            "server CPU s per GB served, all its runs",
        );
    }
    for v in ["slotring", "governor"] {
        report.put(
            &format!("svc_rss_mb_{v}_c1024"),
            g("cold", v, 1024).peak_rss_mb,
            "peak RSS MB, cold, 1,024 connections",
        );
    }
    let p = &m.partial["slotring"];
    report.put(
        "svc_pagecache_bytes_free_pct_slotring",
        100.0 * p.served.saturating_sub(p.disk_charged) as f64 / p.served.max(1) as f64,
        "half the cold set warm: share of served bytes not charged to the disk, %",
    );
}

fn main() {
    if std::env::var_os(SERVER_ENV).is_some() {
        return server_main();
    }
    // 1,024 connections on each side of loopback.
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .expect("RLIMIT_NOFILE");
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard)
        .expect("raise RLIMIT_NOFILE");
    assert!(
        Command::new("wrk").arg("--version").output().is_ok(),
        "wrk is missing: apt-get install -y wrk"
    );
    let root = disk_dir().join(format!("slotring-service-bench-{}", std::process::id()));
    let _cleanup = RemoveOnDrop(root.clone());
    let (hot, cold) = (root.join("hot"), root.join("cold"));
    eprintln!("creating the data sets under {} ...", root.display());
    make_set(&hot, HOT_OBJECTS);
    make_set(&cold, COLD_OBJECTS);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!("load average before: {load}");
    let m = measure(&hot, &cold);
    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    print_table(&m, &load, &load_after);
    let mut report = Report::new("service");
    hot_keys(&mut report, &m);
    other_keys(&mut report, &m);
    report.finish().expect("write the report");
}
