//! [`ConfigFile`]: the TOML layer, a small regular file of settings.

use std::path::{Path, PathBuf};

use super::*;

/// A TOML file of settings (keys = setting names), checked for unknown keys.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    pub(super) path: PathBuf,
    table: toml::Table,
}

/// The largest config file read (a settings file is a few hundred bytes).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

impl ConfigFile {
    /// Read and check `path`: a regular file (opened without blocking, so a
    /// FIFO or a device is refused rather than waited on or read forever)
    /// of at most [`MAX_CONFIG_BYTES`], in UTF-8.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        Self::parse(&read_small_file(path)?, path)
    }

    /// Check `text`, read from `path`.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let table = parse_toml(text, path)?;
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
    pub(super) fn value(&self, key: &str) -> Option<String> {
        Some(match self.table.get(key)? {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => other.to_string(),
        })
    }
}

/// `text`, read from `path`, as a TOML table.
pub(crate) fn parse_toml(text: &str, path: &Path) -> Result<toml::Table, ConfigError> {
    text.parse().map_err(|source| ConfigError::Parse {
        path: path.to_owned(),
        source,
    })
}

/// Read `path` for a config layer: a regular file (opened without
/// blocking, so a FIFO or a device is refused rather than waited on or
/// read forever) of at most [`MAX_CONFIG_BYTES`], in UTF-8.
pub(crate) fn read_small_file(path: &Path) -> Result<String, ConfigError> {
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
    Ok(text)
}

/// What kind of file `meta` describes, for an error.
pub(super) fn file_kind(meta: &std::fs::Metadata) -> &'static str {
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
