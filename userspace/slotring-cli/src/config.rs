//! `slotring run` settings: defaults < TOML file < environment < command line.
//!
//! Every setting has one name, spelled as ClickHouse spells it where
//! ClickHouse has it (`max_local_read_bandwidth`, …): `snake_case` in the
//! TOML file, `SLOTRING_` + upper case in the environment, `--kebab-case` on
//! the command line. Values are collected as strings from each layer (the
//! highest wins) and parsed once, so a bad value gets the same error from
//! any layer, naming the option, the value and where it came from.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;
use slotring::slots::Scheduler;

/// A bad setting or config file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A value that does not parse or is out of range.
    #[error("invalid value `{value}` for --{option} (from {origin}): expected {expected}")]
    Invalid {
        /// The option, kebab-case.
        option: String,
        /// The rejected value.
        value: String,
        /// Where it came from.
        origin: Origin,
        /// What would have been accepted.
        expected: &'static str,
    },
    /// A key in the TOML file that is not a setting.
    #[error("unknown setting `{key}` in {path} (known: {known})")]
    UnknownKey {
        /// The key.
        key: String,
        /// The file.
        path: PathBuf,
        /// The known keys.
        known: String,
    },
    /// The TOML file could not be read or parsed.
    #[error("config file {path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The built-in default.
    Default,
    /// The TOML config file.
    File(PathBuf),
    /// An environment variable.
    Env(String),
    /// The command line.
    CommandLine,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Default => f.write_str("the default"),
            Origin::File(p) => write!(f, "config file {}", p.display()),
            Origin::Env(v) => write!(f, "environment variable {v}"),
            Origin::CommandLine => f.write_str("the command line"),
        }
    }
}

/// Which IO engine `slotring run` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// io_uring (falls back to pread, saying why, when unavailable).
    IoUring,
    /// The `pread` engine.
    Fallback,
}

impl FromStr for EngineKind {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "io_uring" | "uring" => Ok(EngineKind::IoUring),
            "fallback" | "pread" => Ok(EngineKind::Fallback),
            _ => Err(()),
        }
    }
}

/// Every setting: `(name, default, help)`. The name is the TOML key; the
/// option is `--name-with-dashes`, the variable `SLOTRING_NAME`.
pub const SETTINGS: &[(&str, &str, &str)] = &[
    (
        "max_local_read_bandwidth",
        "64MiB",
        "bytes/s from the block device (0 = unlimited)",
    ),
    (
        "max_local_write_bandwidth",
        "64MiB",
        "bytes/s written to the block device, e.g. creating the data file; writeback is paced to it (0 = unlimited)",
    ),
    (
        "concurrent_threads_soft_limit_num",
        "0",
        "CPU slot budget (0 = no limit from this setting)",
    ),
    (
        "concurrent_threads_soft_limit_ratio_to_cores",
        "2",
        "CPU slot budget per core (0 = no limit from this setting)",
    ),
    (
        "concurrent_threads_scheduler",
        "max_min_fair",
        "round_robin | fair_round_robin | max_min_fair",
    ),
    ("duration", "10s", "how long the queries run"),
    ("file_size", "1GiB", "size of the data file"),
    (
        "dir",
        "",
        "directory for the data file (default: $TMPDIR or /var/tmp)",
    ),
    ("keep", "false", "keep the data file afterwards"),
    ("engine", "io_uring", "io_uring | fallback"),
    ("scans", "3", "concurrent scan queries"),
    ("scan_threads", "4", "threads (max slots) per scan query"),
    (
        "short_query_interval",
        "100ms",
        "a short query starts this often (0 = none)",
    ),
    ("read_size", "256KiB", "bytes per read"),
    ("cpu_work_per_read", "500us", "CPU work between reads"),
    (
        "slot_quantum",
        "50ms",
        "a scan thread gives its slot back after this much work",
    ),
    (
        "lease_parking",
        "true",
        "park the thread's CPU lease while it waits on a throttle",
    ),
    (
        "listen",
        "127.0.0.1:9464",
        "serve /metrics here (empty = off)",
    ),
    (
        "pin_dir",
        "/sys/fs/bpf/slotring",
        "where the BPF maps are pinned",
    ),
    ("probes", "true", "attach the eBPF probes when permitted"),
];

/// Raw values with their origin, before parsing.
#[derive(Debug, Clone, Default)]
pub struct Layers {
    values: BTreeMap<&'static str, (String, Origin)>,
}

fn key_of(name: &str) -> Option<&'static str> {
    SETTINGS.iter().map(|s| s.0).find(|k| *k == name)
}

/// `--max-local-read-bandwidth` for `max_local_read_bandwidth`.
pub fn option_name(key: &str) -> String {
    key.replace('_', "-")
}

/// `SLOTRING_MAX_LOCAL_READ_BANDWIDTH` for `max_local_read_bandwidth`.
pub fn env_name(key: &str) -> String {
    format!("SLOTRING_{}", key.to_uppercase())
}

impl Layers {
    /// The defaults.
    pub fn defaults() -> Self {
        let mut l = Layers::default();
        for (k, v, _) in SETTINGS {
            l.values.insert(k, ((*v).to_owned(), Origin::Default));
        }
        l
    }

    /// Set `key` (a setting name) from `origin`. Panics on an unknown key
    /// (callers pass names from [`SETTINGS`]).
    pub fn set(&mut self, key: &str, value: impl Into<String>, origin: Origin) {
        let k = key_of(key).unwrap_or_else(|| panic!("unknown setting {key}"));
        self.values.insert(k, (value.into(), origin));
    }

    /// Overlay a TOML file.
    pub fn file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        self.toml_text(&text, path)
    }

    /// Overlay TOML text (read from `path`).
    pub fn toml_text(&mut self, text: &str, path: &Path) -> Result<(), ConfigError> {
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::File {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
        for (k, v) in table {
            let Some(key) = key_of(&k) else {
                return Err(ConfigError::UnknownKey {
                    key: k,
                    path: path.to_owned(),
                    known: SETTINGS.iter().map(|s| s.0).collect::<Vec<_>>().join(", "),
                });
            };
            let value = match v {
                toml::Value::String(s) => s,
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                other => other.to_string(),
            };
            self.values
                .insert(key, (value, Origin::File(path.to_owned())));
        }
        Ok(())
    }

    /// Overlay `SLOTRING_*` environment variables found by `get`.
    pub fn env(&mut self, get: impl Fn(&str) -> Option<String>) {
        for (k, _, _) in SETTINGS {
            let var = env_name(k);
            if let Some(v) = get(&var) {
                self.values.insert(k, (v, Origin::Env(var)));
            }
        }
    }

    fn get(&self, key: &'static str) -> (&str, &Origin) {
        let (v, o) = &self.values[key];
        (v, o)
    }

    fn parse<T>(
        &self,
        key: &'static str,
        expected: &'static str,
        f: impl FnOnce(&str) -> Option<T>,
    ) -> Result<T, ConfigError> {
        let (v, origin) = self.get(key);
        f(v.trim()).ok_or_else(|| ConfigError::Invalid {
            option: option_name(key),
            value: v.to_owned(),
            origin: origin.clone(),
            expected,
        })
    }

    /// Parse every setting.
    pub fn resolve(&self) -> Result<RunConfig, ConfigError> {
        const BYTES_S: &str = "bytes per second, e.g. 64MiB or 50000000 (0 = unlimited)";
        const DUR: &str = "a duration, e.g. 10s, 500ms, 1.5s";
        let cfg = RunConfig {
            max_local_read_bandwidth: self.parse(
                "max_local_read_bandwidth",
                BYTES_S,
                parse_bytes,
            )?,
            max_local_write_bandwidth: self.parse(
                "max_local_write_bandwidth",
                BYTES_S,
                parse_bytes,
            )?,
            concurrent_threads_soft_limit_num: self.parse(
                "concurrent_threads_soft_limit_num",
                "a non-negative integer",
                |s| s.parse().ok(),
            )?,
            concurrent_threads_soft_limit_ratio_to_cores: self.parse(
                "concurrent_threads_soft_limit_ratio_to_cores",
                "a non-negative integer",
                |s| s.parse().ok(),
            )?,
            concurrent_threads_scheduler: self.parse(
                "concurrent_threads_scheduler",
                "round_robin, fair_round_robin or max_min_fair",
                |s| s.parse().ok(),
            )?,
            duration: self.parse(
                "duration",
                "a duration between 100ms and 1h, e.g. 10s",
                |s| {
                    parse_duration(s).filter(|d| {
                        *d >= Duration::from_millis(100) && *d <= Duration::from_secs(3600)
                    })
                },
            )?,
            file_size: self.parse(
                "file_size",
                "a size between 1MiB and 1TiB, e.g. 1GiB",
                |s| parse_bytes(s).filter(|b| (1 << 20..=1 << 40).contains(b)),
            )?,
            dir: self.parse("dir", "a directory", |s| {
                Some((!s.is_empty()).then(|| PathBuf::from(s)))
            })?,
            keep: self.parse("keep", "true or false", parse_bool)?,
            engine: self.parse("engine", "io_uring or fallback", |s| s.parse().ok())?,
            scans: self.parse("scans", "an integer between 1 and 64", |s| {
                s.parse().ok().filter(|n| (1..=64).contains(n))
            })?,
            scan_threads: self.parse("scan_threads", "an integer between 1 and 64", |s| {
                s.parse().ok().filter(|n| (1..=64).contains(n))
            })?,
            short_query_interval: self.parse("short_query_interval", DUR, parse_duration)?,
            read_size: self.parse("read_size", "a size between 4KiB and 16MiB", |s| {
                parse_bytes(s).filter(|b| (4096..=16 << 20).contains(b))
            })?,
            cpu_work_per_read: self.parse("cpu_work_per_read", DUR, parse_duration)?,
            slot_quantum: self.parse("slot_quantum", "a duration of at least 1ms", |s| {
                parse_duration(s).filter(|d| *d >= Duration::from_millis(1))
            })?,
            lease_parking: self.parse("lease_parking", "true or false", parse_bool)?,
            listen: self.parse("listen", "an address like 127.0.0.1:9464, or empty", |s| {
                if s.is_empty() || s == "off" {
                    Some(None)
                } else {
                    s.parse().ok().map(Some)
                }
            })?,
            pin_dir: self.parse("pin_dir", "a directory", |s| {
                (!s.is_empty()).then(|| PathBuf::from(s))
            })?,
            probes: self.parse("probes", "true or false", parse_bool)?,
        };
        Ok(cfg)
    }
}

/// The resolved settings of `slotring run`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunConfig {
    /// Block-device read rate, bytes/s (0 = unlimited).
    pub max_local_read_bandwidth: u64,
    /// Block-device write rate, bytes/s (0 = unlimited).
    pub max_local_write_bandwidth: u64,
    /// ClickHouse's `concurrent_threads_soft_limit_num`.
    pub concurrent_threads_soft_limit_num: u64,
    /// ClickHouse's `concurrent_threads_soft_limit_ratio_to_cores`.
    pub concurrent_threads_soft_limit_ratio_to_cores: u64,
    /// ClickHouse's `concurrent_threads_scheduler`.
    #[serde(serialize_with = "ser_display")]
    pub concurrent_threads_scheduler: Scheduler,
    /// How long the queries run.
    #[serde(serialize_with = "ser_secs")]
    pub duration: Duration,
    /// Data file size, bytes.
    pub file_size: u64,
    /// Directory for the data file.
    pub dir: Option<PathBuf>,
    /// Keep the data file.
    pub keep: bool,
    /// IO engine.
    pub engine: EngineKind,
    /// Concurrent scan queries.
    pub scans: u32,
    /// Threads per scan query.
    pub scan_threads: u32,
    /// Interval between short queries (zero = none).
    #[serde(serialize_with = "ser_secs")]
    pub short_query_interval: Duration,
    /// Bytes per read.
    pub read_size: u64,
    /// CPU work between reads.
    #[serde(serialize_with = "ser_secs")]
    pub cpu_work_per_read: Duration,
    /// Work done under one slot before giving it back.
    #[serde(serialize_with = "ser_secs")]
    pub slot_quantum: Duration,
    /// Park CPU leases during IO waits.
    pub lease_parking: bool,
    /// `/metrics` address.
    pub listen: Option<SocketAddr>,
    /// BPF pin directory.
    pub pin_dir: PathBuf,
    /// Try the eBPF probes.
    pub probes: bool,
}

impl Default for RunConfig {
    fn default() -> Self {
        Layers::defaults()
            .resolve()
            .expect("the built-in defaults are valid")
    }
}

fn ser_display<S: serde::Serializer, T: fmt::Display>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

fn ser_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// `64MiB`, `1G`, `4096`, `1.5GB` → bytes. Binary (`KiB`, `K`) and decimal
/// (`KB`) suffixes; case-insensitive.
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
    (v.is_finite() && v >= 0.0 && v < u64::MAX as f64).then_some(v.round() as u64)
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

fn parse_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Some(true),
        "false" | "0" | "no" | "off" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_bytes("64MiB"), Some(64 << 20));
        assert_eq!(parse_bytes("1g"), Some(1 << 30));
        assert_eq!(parse_bytes("50MB"), Some(50_000_000));
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("1.5KiB"), Some(1536));
        assert_eq!(parse_bytes("fast"), None);
        assert_eq!(parse_bytes("-1"), None);
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("soon"), None);
    }

    #[test]
    fn layers_override_in_order() {
        let mut l = Layers::defaults();
        l.toml_text(
            "max_local_read_bandwidth = \"10MiB\"\nscans = 2\nduration = \"3s\"\n",
            Path::new("x.toml"),
        )
        .unwrap();
        l.env(|v| (v == "SLOTRING_SCANS").then(|| "5".to_owned()));
        l.set("duration", "4s", Origin::CommandLine);
        let c = l.resolve().unwrap();
        assert_eq!(c.max_local_read_bandwidth, 10 << 20);
        assert_eq!(c.scans, 5);
        assert_eq!(c.duration, Duration::from_secs(4));
        assert_eq!(c.concurrent_threads_scheduler, Scheduler::MaxMinFair);
    }

    #[test]
    fn errors_name_option_value_and_origin() {
        let mut l = Layers::defaults();
        l.env(|v| (v == "SLOTRING_CONCURRENT_THREADS_SCHEDULER").then(|| "fifo".to_owned()));
        let e = l.resolve().unwrap_err().to_string();
        assert!(e.contains("--concurrent-threads-scheduler"), "{e}");
        assert!(e.contains("`fifo`"), "{e}");
        assert!(
            e.contains("environment variable SLOTRING_CONCURRENT_THREADS_SCHEDULER"),
            "{e}"
        );

        let mut l = Layers::defaults();
        l.set("max_local_read_bandwidth", "lots", Origin::CommandLine);
        let e = l.resolve().unwrap_err().to_string();
        assert!(
            e.contains("--max-local-read-bandwidth") && e.contains("`lots`"),
            "{e}"
        );

        let mut l = Layers::defaults();
        let e = l
            .toml_text("max_read = 1\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown setting `max_read` in c.toml"), "{e}");
    }

    #[test]
    fn defaults_resolve() {
        let c = RunConfig::default();
        assert_eq!(c.file_size, 1 << 30);
        assert_eq!(c.engine, EngineKind::IoUring);
        assert_eq!(c.listen, Some("127.0.0.1:9464".parse().unwrap()));
    }
}
