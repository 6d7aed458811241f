//! The value parsers of the settings: each trims its input and says what it
//! expected ([`Expected`]).

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use slotring::slots::Scheduler;

use super::*;

/// What a value parser would have accepted: the cause of
/// [`ConfigError::Invalid`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("expected {0}")]
pub struct Expected(pub &'static str);

// The value parsers. Each trims its input and says what it expected.

pub(super) const BYTES_S: Expected = Expected(
    "a whole number of bytes per second below 64TiB, e.g. 64MiB, 1.5KiB or 50000000 (0 = unlimited)",
);
pub(super) const DUR: Expected = Expected("a duration, e.g. 10s, 500ms, 1.5s");

/// Bytes per second (0 = unlimited).
pub fn bandwidth(s: &str) -> Result<u64, Expected> {
    parse_bytes(s.trim())
        .filter(|b| *b <= slotring::throttle::MAX_RATE)
        .ok_or(BYTES_S)
}

/// A non-negative integer.
pub fn count(s: &str) -> Result<u64, Expected> {
    s.trim()
        .parse()
        .map_err(|_| Expected("a non-negative integer"))
}

/// A scheduler name.
pub fn scheduler(s: &str) -> Result<Scheduler, Expected> {
    s.trim()
        .parse()
        .map_err(|_| Expected("round_robin, fair_round_robin or max_min_fair"))
}

/// How long the queries run: 100ms to 1h.
pub fn run_duration(s: &str) -> Result<Duration, Expected> {
    parse_duration(s.trim())
        .filter(|d| *d >= Duration::from_millis(100) && *d <= Duration::from_secs(3600))
        .ok_or(Expected("a duration between 100ms and 1h, e.g. 10s"))
}

/// The data file's size: 1MiB to 1TiB.
pub fn file_size(s: &str) -> Result<u64, Expected> {
    parse_bytes(s.trim())
        .filter(|b| (1 << 20..=1 << 40).contains(b))
        .ok_or(Expected("a size between 1MiB and 1TiB, e.g. 1GiB"))
}

/// A directory, or nothing (empty).
pub fn dir(s: &str) -> Result<Option<PathBuf>, Expected> {
    let s = s.trim();
    Ok((!s.is_empty()).then(|| PathBuf::from(s)))
}

/// `true`/`1`/`yes`/`on` or `false`/`0`/`no`/`off`.
pub fn boolean(s: &str) -> Result<bool, Expected> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(Expected("true or false")),
    }
}

/// `io_uring` (or `uring`) or `fallback` (or `pread`).
pub fn engine(s: &str) -> Result<EngineKind, Expected> {
    match s.trim() {
        "io_uring" | "uring" => Ok(EngineKind::IoUring),
        "fallback" | "pread" => Ok(EngineKind::Fallback),
        _ => Err(Expected("io_uring or fallback")),
    }
}

/// Scans: 0 to 64. Zero scans is a run of the short queries alone, the
/// floor their latency has beside no scan (the adaptive bench measures it).
pub fn per_run(s: &str) -> Result<u32, Expected> {
    s.trim()
        .parse()
        .ok()
        .filter(|n| (0..=64).contains(n))
        .ok_or(Expected("an integer between 0 and 64"))
}

/// The threads (max slots) of the scan queries: one width for every scan,
/// or one per scan. Serialised as a number when there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanWidths(pub Vec<u32>);

impl Serialize for ScanWidths {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.as_slice() {
            [one] => s.serialize_u32(*one),
            many => many.serialize(s),
        }
    }
}

impl fmt::Display for ScanWidths {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w: Vec<String> = self.0.iter().map(u32::to_string).collect();
        f.write_str(&w.join(","))
    }
}

/// `4` or `8,2,1`: 1 to 64 widths, each between 1 and 64.
pub fn scan_widths(s: &str) -> Result<ScanWidths, Expected> {
    let v: Option<Vec<u32>> = s
        .split(',')
        .map(|w| w.trim().parse().ok().filter(|n| (1..=64).contains(n)))
        .collect();
    v.filter(|v| (1..=64).contains(&v.len()))
        .map(ScanWidths)
        .ok_or(Expected(
            "integers between 1 and 64, one or one per scan (e.g. 4 or 8,2,1)",
        ))
}

/// Any duration (0 allowed).
pub fn duration(s: &str) -> Result<Duration, Expected> {
    parse_duration(s.trim()).ok_or(DUR)
}

/// Bytes per read: 4KiB to 16MiB.
pub fn read_size(s: &str) -> Result<u64, Expected> {
    parse_bytes(s.trim())
        .filter(|b| (4096..=16 << 20).contains(b))
        .ok_or(Expected("a size between 4KiB and 16MiB"))
}

/// The slot quantum: at least 1ms.
pub fn slot_quantum(s: &str) -> Result<Duration, Expected> {
    parse_duration(s.trim())
        .filter(|d| *d >= Duration::from_millis(1))
        .ok_or(Expected("a duration of at least 1ms"))
}

/// A socket address, or nothing (empty or `off`).
pub fn listen(s: &str) -> Result<Option<SocketAddr>, Expected> {
    match s.trim() {
        "" | "off" => Ok(None),
        s => s
            .parse()
            .map(Some)
            .map_err(|_| Expected("an address like 127.0.0.1:9464, or empty")),
    }
}

/// An absolute directory (a pin root is opened from `/` down, one
/// component at a time, with no symbolic link followed).
pub fn pin_dir(s: &str) -> Result<PathBuf, Expected> {
    let s = s.trim();
    Some(PathBuf::from(s))
        .filter(|p| p.is_absolute())
        .ok_or(Expected("an absolute directory, e.g. /sys/fs/bpf/slotring"))
}

/// A socket address (`slotring exporter --listen`).
pub fn socket_addr(s: &str) -> Result<SocketAddr, Expected> {
    s.parse()
        .map_err(|_| Expected("an address like 127.0.0.1:9464"))
}

/// `verify --window`: 1ms to 1h (its longest, as `run --duration`'s).
pub fn verify_window(s: &str) -> Result<Duration, Expected> {
    parse_duration(s.trim())
        .filter(|d| *d >= Duration::from_millis(1) && *d <= crate::watch::MAX_WINDOW)
        .ok_or(Expected("a duration between 1ms and 1h, e.g. 10s"))
}

/// A positive duration (`stats --interval`).
pub fn positive_duration(s: &str) -> Result<Duration, Expected> {
    parse_duration(s)
        .filter(|d| !d.is_zero())
        .ok_or(Expected("a positive duration, e.g. 1s or 500ms"))
}

/// A ratio in [0, 1] (`verify --tolerated-hot-fraction`).
pub fn ratio(s: &str) -> Result<f64, Expected> {
    s.parse()
        .ok()
        .filter(|r| (0.0..=1.0).contains(r))
        .ok_or(Expected("a ratio in [0, 1], e.g. 0.05"))
}

/// A path ending in `.svg` (`run --plot`).
pub fn svg_path(s: &str) -> Result<PathBuf, Expected> {
    let path = PathBuf::from(s);
    if path.extension().is_some_and(|e| e == "svg") {
        Ok(path)
    } else {
        Err(Expected(
            "a path ending in .svg (convert the SVG for other formats)",
        ))
    }
}

/// `64MiB`, `1G`, `4096`, `1.5GB` → bytes. Binary (`KiB`, `K`) and decimal
/// (`KB`) suffixes; case-insensitive. A fraction must come to a whole
/// number of bytes (`1.5KiB` is 1536; `1.5` and `0.3KiB` are refused, not
/// rounded).
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim().replace('_', "");
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    };
    if num.is_empty() {
        return None;
    }
    if let Ok(i) = num.parse::<u64>() {
        return i.checked_mul(mult);
    }
    let f: f64 = num.parse().ok()?;
    let v = f * mult as f64;
    (v.is_finite() && v >= 0.0 && v < u64::MAX as f64 && v.fract() == 0.0).then_some(v as u64)
}

/// `10s`, `500ms`, `1.5s`, `2m`, `100us`, `0` → a duration.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let f: f64 = num.parse().ok()?;
    let secs = match unit.trim() {
        "" | "s" => f,
        "ms" => f / 1e3,
        "us" | "µs" => f / 1e6,
        "ns" => f / 1e9,
        "m" | "min" => f * 60.0,
        "h" => f * 3600.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(secs).ok()
}
