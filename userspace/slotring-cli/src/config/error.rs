//! [`ConfigError`]: what a bad setting, variable or config file is refused as.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::*;

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
    /// The `--workloads` file is not a valid workload tree.
    #[error("workloads file {path}")]
    Workloads {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the workload, the key and the value.
        source: WorkloadFileError,
    },
}
