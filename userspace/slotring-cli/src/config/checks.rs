//! The checks of what no value parser sees: the environment as a whole,
//! a listen address other hosts can reach, a plot file that cannot be written.

use std::net::SocketAddr;
use std::path::Path;

use super::*;

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
