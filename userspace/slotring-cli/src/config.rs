//! `slotring run` settings: defaults < TOML file < environment < command line.
//!
//! [`RunConfig`] declares every setting once, as a clap argument: its name,
//! spelled as ClickHouse spells it where ClickHouse has it
//! (`max_local_read_bandwidth`, …), its `SLOTRING_` variable, its default,
//! its help and the function that parses it. The name is the TOML key and,
//! in kebab case, the option.
//!
//! clap parses the command line with the environment turned off
//! ([`without_env`]): [`RunConfig::overlay`] then fills each setting the
//! command line did not give from its variable, else from the file
//! ([`ConfigFile`]), parsing the value with the setting's own parser. So a
//! bad value gets the same error from any layer, naming the option, the
//! value and where it came from, and the file sits between the environment
//! and the defaults, where clap alone could not put it.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};
use serde::Serialize;
use slotring::slots::Scheduler;

/// A bad setting or config file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A value that does not parse or is out of range.
    #[error("invalid value `{value}` for --{option} (from {origin})")]
    Invalid {
        /// The option, kebab-case.
        option: String,
        /// The rejected value.
        value: String,
        /// Where it came from.
        origin: Origin,
        /// What would have been accepted (an [`Expected`]).
        source: Box<dyn std::error::Error + Send + Sync>,
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
    /// The TOML file could not be read.
    #[error("reading config file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The config file is not a regular file (a device, a FIFO, …).
    #[error("config file {path} is {kind}, not a regular file")]
    NotAFile {
        /// The file.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// The config file is larger than [`MAX_CONFIG_BYTES`].
    #[error(
        "config file {path} has {len} bytes, more than the {MAX_CONFIG_BYTES} a config file may have"
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size (at least, when it grew while read).
        len: u64,
    },
    /// The TOML file is not TOML.
    #[error("parsing config file {path}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The error.
        source: toml::de::Error,
    },
    /// A `SLOTRING_` environment variable that names no setting.
    #[error("unknown environment variable {name} (settings: {known})")]
    UnknownVariable {
        /// The variable (lossily decoded).
        name: String,
        /// The variables that are settings.
        known: String,
    },
    /// A setting's environment variable whose value is not UTF-8.
    #[error("environment variable {name}: the value is not UTF-8")]
    NotUtf8 {
        /// The variable.
        name: String,
    },
    /// `--listen` on an address other hosts can reach, without
    /// `--allow-remote`.
    #[error("refusing --listen {addr}: not a loopback address (pass --allow-remote to allow it)")]
    RemoteListen {
        /// The address.
        addr: SocketAddr,
    },
    /// `--plot` names a file that cannot be written.
    #[error("invalid value `{}` for --plot: cannot write there", .path.display())]
    Plot {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// `SLOTRING_` variables of this workspace that are not settings of `run`
/// and that the command therefore accepts (and ignores): where the
/// benchmarks write their JSON (set by `cargo xtask bench`, read by
/// `slotring-benchkit`), and the io_uring benchmark's debug switch.
pub const NOT_SETTINGS: &[&str] = &["SLOTRING_BENCH_DIR", "SLOTRING_URING_DEBUG"];

/// Check every `SLOTRING_`-prefixed variable of `vars` (the environment):
/// each must be a setting's variable or one of [`NOT_SETTINGS`], and a
/// setting's value must be UTF-8. The first bad one is the error.
pub fn check_environment(
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Result<(), ConfigError> {
    use std::os::unix::ffi::OsStrExt as _;
    let settings: Vec<String> = RunConfig::declared()
        .get_arguments()
        .filter_map(|a| a.get_env().map(|v| v.to_string_lossy().into_owned()))
        .collect();
    for (name, value) in vars {
        if !name.as_bytes().starts_with(b"SLOTRING_") {
            continue;
        }
        let lossy = name.to_string_lossy().into_owned();
        if NOT_SETTINGS.contains(&lossy.as_str()) {
            continue;
        }
        if !settings.contains(&lossy) {
            return Err(ConfigError::UnknownVariable {
                name: lossy,
                known: settings.join(", "),
            });
        }
        if value.to_str().is_none() {
            return Err(ConfigError::NotUtf8 { name: lossy });
        }
    }
    Ok(())
}

/// Refuse a non-loopback `--listen` unless `allow_remote` (`run` and
/// `exporter` alike, before they start).
pub fn check_listen(addr: Option<SocketAddr>, allow_remote: bool) -> Result<(), ConfigError> {
    match addr {
        Some(addr) if !allow_remote && !addr.ip().is_loopback() => {
            Err(ConfigError::RemoteListen { addr })
        }
        _ => Ok(()),
    }
}

/// Check, before the run, that the plot can be written at `path` by
/// trying: an existing file is opened for writing (not truncated, nor
/// written), and a missing one is created and removed again, so a
/// directory where no file can be made (`/proc`, a read-only mount, one
/// without permission) is refused now rather than after the run. A
/// directory or anything but a regular file is refused too.
pub fn check_plot_path(path: &Path) -> Result<(), ConfigError> {
    use std::fs::OpenOptions;
    use std::os::unix::fs::OpenOptionsExt as _;
    let fail = |source: std::io::Error| ConfigError::Plot {
        path: path.to_owned(),
        source,
    };
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(fail(std::io::ErrorKind::IsADirectory.into())),
        Ok(m) if !m.is_file() => Err(fail(std::io::ErrorKind::InvalidInput.into())),
        Ok(_) => OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map(drop)
            .map_err(fail),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(path)
                .map_err(fail)?;
            std::fs::remove_file(path).map_err(fail)
        }
        Err(e) => Err(fail(e)),
    }
}

/// Where a rejected value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
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
            Origin::File(p) => write!(f, "config file {}", p.display()),
            Origin::Env(v) => write!(f, "environment variable {v}"),
            Origin::CommandLine => f.write_str("the command line"),
        }
    }
}

/// What a value parser would have accepted: the cause of
/// [`ConfigError::Invalid`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("expected {0}")]
pub struct Expected(pub &'static str);

/// Which IO engine `slotring run` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// io_uring (falls back to pread, saying why, when unavailable).
    IoUring,
    /// The `pread` engine.
    Fallback,
}

/// The settings of `slotring run`, each declared once: option, variable,
/// default, help and parser. Serialised into the report as resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Args)]
pub struct RunConfig {
    /// bytes/s from the block device (0 = unlimited)
    #[arg(long, env = "SLOTRING_MAX_LOCAL_READ_BANDWIDTH", value_name = "BYTES", default_value = "64MiB", value_parser = bandwidth)]
    pub max_local_read_bandwidth: u64,
    /// bytes/s written to the block device, e.g. creating the data file; writeback is paced to it (0 = unlimited)
    #[arg(long, env = "SLOTRING_MAX_LOCAL_WRITE_BANDWIDTH", value_name = "BYTES", default_value = "64MiB", value_parser = bandwidth)]
    pub max_local_write_bandwidth: u64,
    /// CPU slot budget (0 = no limit from this setting)
    #[arg(long, env = "SLOTRING_CONCURRENT_THREADS_SOFT_LIMIT_NUM", value_name = "N", default_value = "0", value_parser = count)]
    pub concurrent_threads_soft_limit_num: u64,
    /// CPU slot budget per core (0 = no limit from this setting)
    #[arg(long, env = "SLOTRING_CONCURRENT_THREADS_SOFT_LIMIT_RATIO_TO_CORES", value_name = "N", default_value = "2", value_parser = count)]
    pub concurrent_threads_soft_limit_ratio_to_cores: u64,
    /// round_robin | fair_round_robin | max_min_fair
    #[arg(long, env = "SLOTRING_CONCURRENT_THREADS_SCHEDULER", value_name = "NAME", default_value = "max_min_fair", value_parser = scheduler)]
    #[serde(serialize_with = "ser_display")]
    pub concurrent_threads_scheduler: Scheduler,
    /// how long the queries run
    #[arg(long, env = "SLOTRING_DURATION", value_name = "DURATION", default_value = "10s", value_parser = run_duration)]
    #[serde(serialize_with = "ser_secs")]
    pub duration: Duration,
    /// size of the data file
    #[arg(long, env = "SLOTRING_FILE_SIZE", value_name = "BYTES", default_value = "1GiB", value_parser = file_size)]
    pub file_size: u64,
    /// directory for the data file (default: $TMPDIR or /var/tmp)
    // `std::option::Option`, spelled out, is a plain value to clap: the
    // empty default parses to `None`.
    #[arg(long, env = "SLOTRING_DIR", value_name = "DIR", default_value = "", hide_default_value = true, value_parser = dir)]
    pub dir: std::option::Option<PathBuf>,
    /// keep the data file afterwards [setting keep, default false]
    #[arg(long, env = "SLOTRING_KEEP", action = ArgAction::SetTrue, value_parser = boolean)]
    pub keep: bool,
    /// io_uring | fallback
    #[arg(long, env = "SLOTRING_ENGINE", value_name = "ENGINE", default_value = "io_uring", value_parser = engine)]
    pub engine: EngineKind,
    /// concurrent scan queries
    #[arg(long, env = "SLOTRING_SCANS", value_name = "N", default_value = "3", value_parser = per_run)]
    pub scans: u32,
    /// threads (max slots) per scan query: one value for every scan, or one per scan (8,2,1 = three scans of unequal width; sets scans)
    #[arg(long, env = "SLOTRING_SCAN_THREADS", value_name = "N[,N...]", default_value = "4", value_parser = scan_widths)]
    pub scan_threads: ScanWidths,
    /// a short query starts this often (0 = none)
    #[arg(long, env = "SLOTRING_SHORT_QUERY_INTERVAL", value_name = "DURATION", default_value = "100ms", value_parser = duration)]
    #[serde(serialize_with = "ser_secs")]
    pub short_query_interval: Duration,
    /// bytes per read
    #[arg(long, env = "SLOTRING_READ_SIZE", value_name = "BYTES", default_value = "256KiB", value_parser = read_size)]
    pub read_size: u64,
    /// CPU work between reads
    #[arg(long, env = "SLOTRING_CPU_WORK_PER_READ", value_name = "DURATION", default_value = "500us", value_parser = duration)]
    #[serde(serialize_with = "ser_secs")]
    pub cpu_work_per_read: Duration,
    /// a scan thread gives its slot back after this much work
    #[arg(long, env = "SLOTRING_SLOT_QUANTUM", value_name = "DURATION", default_value = "50ms", value_parser = slot_quantum)]
    #[serde(serialize_with = "ser_secs")]
    pub slot_quantum: Duration,
    /// Do not park the thread's CPU lease while it waits on a throttle [setting lease_parking, default true]
    #[arg(long = "no-lease-parking", env = "SLOTRING_LEASE_PARKING", action = ArgAction::SetFalse, value_parser = boolean)]
    pub lease_parking: bool,
    /// size the CPU slot budget from the run-queue delay of running leases (needs the eBPF probes; max_concurrency stays the ceiling) [setting adaptive_budget, default false]
    #[arg(long, env = "SLOTRING_ADAPTIVE_BUDGET", action = ArgAction::SetTrue, value_parser = boolean, overrides_with = "no_adaptive_budget")]
    pub adaptive_budget: bool,
    /// Do not size the CPU slot budget from run-queue delay: the static budget (overrides the environment and the file) [setting adaptive_budget]
    // The other half of the `--adaptive-budget` toggle (the last one on the
    // command line wins); applied by `overlay`, never serialised.
    #[arg(long, action = ArgAction::SetTrue, overrides_with = "adaptive_budget")]
    #[serde(skip)]
    pub no_adaptive_budget: bool,
    /// serve /metrics here (empty = off)
    // Spelled out for the same reason as `dir`: empty or `off` is `None`.
    #[arg(long, env = "SLOTRING_LISTEN", value_name = "ADDR", default_value = "127.0.0.1:9464", value_parser = listen)]
    pub listen: std::option::Option<SocketAddr>,
    /// pin root: the maps are pinned in <DIR>/<pid>/
    #[arg(long, env = "SLOTRING_PIN_DIR", value_name = "DIR", default_value = "/sys/fs/bpf/slotring", value_parser = pin_dir)]
    pub pin_dir: PathBuf,
    /// Do not attach the eBPF probes when permitted [setting probes, default true]
    #[arg(long = "no-probes", env = "SLOTRING_PROBES", action = ArgAction::SetFalse, value_parser = boolean)]
    pub probes: bool,
}

impl Default for RunConfig {
    fn default() -> Self {
        let m = without_env(Self::declared())
            .try_get_matches_from(["settings"])
            .expect("the built-in defaults are valid");
        Self::from_arg_matches(&m).expect("the built-in defaults are valid")
    }
}

impl RunConfig {
    /// The settings as clap declares them (ids are the setting names).
    fn declared() -> Command {
        Self::augment_args(Command::new("settings"))
    }

    /// The setting names (TOML keys), in declaration order.
    pub fn names() -> Vec<String> {
        Self::declared()
            .get_arguments()
            .map(|a| a.get_id().to_string())
            .collect()
    }

    /// Fill every setting that `given` (the matches `self` was made from)
    /// did not take from the command line: from its `SLOTRING_` variable
    /// (looked up with `env`) if set, else from `file` if it has the key.
    /// Each value goes through the setting's own parser; the first bad one
    /// (in declaration order) is the error.
    pub fn overlay(
        &mut self,
        given: &ArgMatches,
        env: &dyn Fn(&str) -> Option<String>,
        file: Option<&ConfigFile>,
    ) -> Result<(), ConfigError> {
        let declared = Self::declared();
        // One value at a time, as an option that takes it: no default, no
        // variable, and the `--no-…` flags take `true`/`false`.
        let parser = declared.clone().mut_args(|a| {
            a.env(None::<&'static str>)
                .default_value(None::<&'static str>)
                .action(ArgAction::Set)
        });
        for arg in declared.get_arguments() {
            let id = arg.get_id().as_str();
            if given.value_source(id) == Some(ValueSource::CommandLine) {
                continue;
            }
            let from_env = arg.get_env().and_then(|var| {
                let var = var.to_string_lossy().into_owned();
                env(&var).map(|v| (v, Origin::Env(var)))
            });
            let found = from_env.or_else(|| {
                let f = file?;
                Some((f.value(id)?, Origin::File(f.path.clone())))
            });
            if let Some((value, origin)) = found {
                let long = arg.get_long().expect("every setting is an option");
                let m = parser
                    .clone()
                    .try_get_matches_from(["settings".to_owned(), format!("--{long}={value}")])
                    .map_err(|e| invalid(arg, value.clone(), origin, e))?;
                self.update_from_arg_matches(&m)
                    .expect("a setting's parser yields its field's type");
            }
        }
        self.settle_scans();
        // `--no-adaptive-budget` on the command line beats the environment
        // and the file.
        if self.no_adaptive_budget {
            self.adaptive_budget = false;
        }
        Ok(())
    }
}

/// A TOML file of settings (keys = setting names), checked for unknown keys.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    path: PathBuf,
    table: toml::Table,
}

/// The largest config file read (a settings file is a few hundred bytes).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

impl ConfigFile {
    /// Read and check `path`: a regular file (opened without blocking, so a
    /// FIFO or a device is refused rather than waited on or read forever)
    /// of at most [`MAX_CONFIG_BYTES`], in UTF-8.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        use std::io::Read as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let failed = |source| ConfigError::Read {
            path: path.to_owned(),
            source,
        };
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(failed)?;
        let meta = f.metadata().map_err(failed)?;
        if !meta.is_file() {
            return Err(ConfigError::NotAFile {
                path: path.to_owned(),
                kind: file_kind(&meta),
            });
        }
        if meta.len() > MAX_CONFIG_BYTES {
            return Err(ConfigError::TooLarge {
                path: path.to_owned(),
                len: meta.len(),
            });
        }
        // The limit holds even for a file that grows while it is read.
        let mut bytes = Vec::new();
        f.take(MAX_CONFIG_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(failed)?;
        if bytes.len() as u64 > MAX_CONFIG_BYTES {
            return Err(ConfigError::TooLarge {
                path: path.to_owned(),
                len: bytes.len() as u64,
            });
        }
        let text = String::from_utf8(bytes).map_err(|e| {
            failed(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                e.utf8_error(),
            ))
        })?;
        Self::parse(&text, path)
    }

    /// Check `text`, read from `path`.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let table: toml::Table = text.parse().map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        })?;
        let names = RunConfig::names();
        if let Some(key) = table.keys().find(|k| !names.contains(k)) {
            return Err(ConfigError::UnknownKey {
                key: key.clone(),
                path: path.to_owned(),
                known: names.join(", "),
            });
        }
        Ok(Self {
            path: path.to_owned(),
            table,
        })
    }

    /// The value of setting `key` as text, if the file sets it.
    fn value(&self, key: &str) -> Option<String> {
        Some(match self.table.get(key)? {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => other.to_string(),
        })
    }
}

/// What kind of file `meta` describes, for an error.
fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt as _;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// `cmd` with every environment variable turned off (in its subcommands
/// too): [`RunConfig::overlay`] reads the environment, so that the file can
/// sit below it and a bad value names its variable.
pub fn without_env(cmd: Command) -> Command {
    cmd.mut_args(|a| a.env(None::<&'static str>))
        .mut_subcommands(without_env)
}

/// A command-line value that one of this module's parsers rejected, as a
/// [`ConfigError`] naming the option, the value and the command line;
/// every other clap error is handed back. `cmd` is the command that
/// produced `err`.
pub fn command_line_error(err: clap::Error, cmd: &Command) -> Result<ConfigError, clap::Error> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let context = |kind| match err.get(kind) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        _ => None,
    };
    let (Some(rendered), Some(value)) = (
        context(ContextKind::InvalidArg),
        context(ContextKind::InvalidValue),
    ) else {
        return Err(err);
    };
    let expected = std::error::Error::source(&err).and_then(|s| s.downcast_ref::<Expected>());
    let mut built = cmd.clone();
    built.build();
    match (err.kind(), expected, find_arg(&built, &rendered)) {
        (ErrorKind::ValueValidation, Some(expected), Some(arg)) => Ok(ConfigError::Invalid {
            option: option_name(arg),
            value,
            origin: Origin::CommandLine,
            source: Box::new(*expected),
        }),
        _ => Err(err),
    }
}

/// The argument of `cmd` or its subcommands that clap renders as `rendered`
/// (`--duration <DURATION>`) in its errors.
fn find_arg<'a>(cmd: &'a Command, rendered: &str) -> Option<&'a Arg> {
    cmd.get_arguments()
        .find(|a| a.to_string() == rendered)
        .or_else(|| cmd.get_subcommands().find_map(|s| find_arg(s, rendered)))
}

/// `max-local-read-bandwidth` for the setting `max_local_read_bandwidth`
/// (also for the `--no-…` flags, whose values come from the other layers).
fn option_name(arg: &Arg) -> String {
    arg.get_id().as_str().replace('_', "-")
}

fn invalid(arg: &Arg, value: String, origin: Origin, err: clap::Error) -> ConfigError {
    let source: Box<dyn std::error::Error + Send + Sync> =
        match std::error::Error::source(&err).and_then(|s| s.downcast_ref::<Expected>()) {
            Some(expected) => Box::new(*expected),
            None => Box::new(err),
        };
    ConfigError::Invalid {
        option: option_name(arg),
        value,
        origin,
        source,
    }
}

/// Serialise with `Display` (the scheduler as its setting's spelling).
pub(crate) fn ser_display<S: serde::Serializer, T: fmt::Display>(
    v: &T,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

fn ser_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

// The value parsers. Each trims its input and says what it expected.

const BYTES_S: Expected = Expected(
    "a whole number of bytes per second below 64TiB, e.g. 64MiB, 1.5KiB or 50000000 (0 = unlimited)",
);
const DUR: Expected = Expected("a duration, e.g. 10s, 500ms, 1.5s");

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

/// Scans, or threads per scan: 1 to 64.
pub fn per_run(s: &str) -> Result<u32, Expected> {
    s.trim()
        .parse()
        .ok()
        .filter(|n| (1..=64).contains(n))
        .ok_or(Expected("an integer between 1 and 64"))
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

impl RunConfig {
    /// The threads (max slots) of scan `i` (0-based).
    pub fn scan_width(&self, i: u32) -> u32 {
        match self.scan_threads.0.as_slice() {
            [one] => *one,
            many => many.get(i as usize).copied().unwrap_or(1),
        }
    }

    /// Several widths name the scans: one scan per width. Called once the
    /// layers are applied.
    pub fn settle_scans(&mut self) {
        if self.scan_threads.0.len() > 1 {
            self.scans = self.scan_threads.0.len() as u32;
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `run`'s settings parsed from `args` the way `main` parses them.
    fn given(args: &[&str]) -> Result<(RunConfig, ArgMatches), ConfigError> {
        let cmd = without_env(RunConfig::augment_args(Command::new("run")));
        let argv = std::iter::once("run").chain(args.iter().copied());
        let m = cmd
            .clone()
            .try_get_matches_from(argv)
            .map_err(|e| command_line_error(e, &cmd).expect("a value error"))?;
        Ok((RunConfig::from_arg_matches(&m).unwrap(), m))
    }

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
    fn unequal_scan_widths_name_the_scans() {
        let (mut c, m) = given(&["--scans", "5", "--scan-threads", "8, 2,1"]).unwrap();
        c.overlay(&m, &|_| None, None).unwrap();
        assert_eq!(c.scans, 3);
        assert_eq!(
            (c.scan_width(0), c.scan_width(1), c.scan_width(2)),
            (8, 2, 1)
        );
        for bad in ["0", "8,,1", "65", "a"] {
            assert!(given(&["--scan-threads", bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn layers_override_in_order() {
        let file = ConfigFile::parse(
            "max_local_read_bandwidth = \"10MiB\"\nscans = 2\nduration = \"3s\"\n",
            Path::new("x.toml"),
        )
        .unwrap();
        let env = |v: &str| (v == "SLOTRING_SCANS").then(|| "5".to_owned());
        let (mut c, m) = given(&["--duration", "4s"]).unwrap();
        c.overlay(&m, &env, Some(&file)).unwrap();
        assert_eq!(c.max_local_read_bandwidth, 10 << 20);
        assert_eq!(c.scans, 5);
        assert_eq!(c.scan_width(4), 4, "one width for every scan");
        assert_eq!(c.duration, Duration::from_secs(4));
        assert_eq!(c.concurrent_threads_scheduler, Scheduler::MaxMinFair);
    }

    #[test]
    fn flags_take_booleans_from_the_other_layers() {
        let file =
            ConfigFile::parse("keep = true\nprobes = \"off\"\n", Path::new("f.toml")).unwrap();
        let env = |v: &str| (v == "SLOTRING_LEASE_PARKING").then(|| "no".to_owned());
        let (mut c, m) = given(&[]).unwrap();
        c.overlay(&m, &env, Some(&file)).unwrap();
        assert!(c.keep && !c.lease_parking && !c.probes);
        // The command line's `--no-probes` wins over the file's `probes = true`.
        let file = ConfigFile::parse("probes = true\n", Path::new("f.toml")).unwrap();
        let (mut c, m) = given(&["--no-probes", "--listen", ""]).unwrap();
        c.overlay(&m, &|_| None, Some(&file)).unwrap();
        assert!(!c.probes);
        assert_eq!(c.listen, None);
    }

    #[test]
    fn errors_name_option_value_and_origin() {
        let env =
            |v: &str| (v == "SLOTRING_CONCURRENT_THREADS_SCHEDULER").then(|| "fifo".to_owned());
        let (mut c, m) = given(&[]).unwrap();
        let e = c.overlay(&m, &env, None).unwrap_err().to_string();
        assert!(e.contains("--concurrent-threads-scheduler"), "{e}");
        assert!(e.contains("`fifo`"), "{e}");
        assert!(
            e.contains("environment variable SLOTRING_CONCURRENT_THREADS_SCHEDULER"),
            "{e}"
        );

        let e = given(&["--max-local-read-bandwidth", "lots"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--max-local-read-bandwidth") && e.contains("`lots`"),
            "{e}"
        );

        let e = ConfigFile::parse("max_read = 1\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown setting `max_read` in c.toml"), "{e}");
    }

    #[test]
    fn adaptive_budget_toggles_and_layers() {
        let on = |v: &str| (v == "SLOTRING_ADAPTIVE_BUDGET").then(|| "true".to_owned());
        let (mut c, m) = given(&[]).unwrap();
        c.overlay(&m, &|_| None, None).unwrap();
        assert!(!c.adaptive_budget, "static by default");
        let (mut c, m) = given(&[]).unwrap();
        c.overlay(&m, &on, None).unwrap();
        assert!(c.adaptive_budget, "from the environment");
        let (mut c, m) = given(&["--no-adaptive-budget"]).unwrap();
        c.overlay(&m, &on, None).unwrap();
        assert!(!c.adaptive_budget, "the command line beats the environment");
        let (mut c, m) = given(&["--no-adaptive-budget", "--adaptive-budget"]).unwrap();
        c.overlay(&m, &|_| None, None).unwrap();
        assert!(c.adaptive_budget, "the last flag wins");
        let (mut c, m) = given(&["--adaptive-budget", "--no-adaptive-budget"]).unwrap();
        c.overlay(&m, &|_| None, None).unwrap();
        assert!(!c.adaptive_budget, "the last flag wins");
        let file = ConfigFile::parse("adaptive_budget = true\n", Path::new("f.toml")).unwrap();
        let (mut c, m) = given(&[]).unwrap();
        c.overlay(&m, &|_| None, Some(&file)).unwrap();
        assert!(c.adaptive_budget, "from the file");
    }

    #[test]
    fn an_error_prints_each_cause_once() {
        let file = ConfigFile::parse("lease_parking = \"maybe\"\n", Path::new("f.toml")).unwrap();
        let (mut c, m) = given(&[]).unwrap();
        let e = c.overlay(&m, &|_| None, Some(&file)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid value `maybe` for --lease-parking (from config file f.toml)"
        );
        let cause = std::error::Error::source(&e).unwrap().to_string();
        assert_eq!(cause, "expected true or false");
    }

    #[test]
    fn slotring_variables_are_checked() {
        use std::ffi::OsString;
        use std::os::unix::ffi::OsStringExt as _;
        let var = |n: &str, v: &[u8]| (OsString::from(n), OsString::from_vec(v.to_vec()));
        assert!(
            check_environment([
                var("SLOTRING_DURATION", b"1s"),
                var("SLOTRING_BENCH_DIR", b"\xff"),
                var("PATH", b"\xff"),
            ])
            .is_ok()
        );
        let e = check_environment([var("SLOTRING_DURATON", b"1s")]).unwrap_err();
        assert!(
            e.to_string()
                .contains("unknown environment variable SLOTRING_DURATON"),
            "{e}"
        );
        let e = check_environment([var("SLOTRING_SCANS", b"\xff")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "environment variable SLOTRING_SCANS: the value is not UTF-8"
        );
    }

    #[test]
    fn rates_the_throttler_cannot_hold_are_refused() {
        assert_eq!(bandwidth("64TiB"), Err(BYTES_S));
        assert_eq!(bandwidth("63TiB"), Ok(63 << 40));
    }

    #[test]
    fn defaults_resolve() {
        let c = RunConfig::default();
        assert_eq!(c.file_size, 1 << 30);
        assert_eq!(c.engine, EngineKind::IoUring);
        assert_eq!(c.listen, Some("127.0.0.1:9464".parse().unwrap()));
    }
}
