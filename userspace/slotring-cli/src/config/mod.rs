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

mod checks;
mod clap_layer;
mod error;
mod file;
#[cfg(test)]
mod tests;
mod values;
mod workloads;

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Args, Command, FromArgMatches};
use serde::Serialize;
use slotring::slots::Scheduler;

pub use checks::*;
pub use clap_layer::*;
pub use error::*;
pub use file::*;
pub use values::*;
pub use workloads::*;

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
    /// concurrent scan queries (0 = the short queries alone)
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
