//! Per-instance pin directories and the owner record.
//!
//! Every instance pins under its own directory `<root>/<instance>/` (root
//! default `/sys/fs/bpf/slotring`, instance default the process id). Each
//! path component is opened with `openat(…, O_NOFOLLOW | O_DIRECTORY)` from
//! `/` down, so no symbolic link is ever followed, and checked on the opened
//! descriptor (`fstat`), so what is checked is what is used:
//!
//! * the root and the instance directory must be owned by this process's
//!   effective user and not writable by group or others;
//! * the directories above them must be owned by root or this user and, if
//!   writable by others, sticky (like `/tmp` or a mode-1777 `/sys/fs/bpf`).
//!
//! A directory failing a check is refused with [`BpfError::UnsafePinDir`]
//! (path, owner, mode, reason) and neither changed nor used. Pins are made
//! through `/proc/self/fd/<dir fd>/<name>`, i.e. in the checked directory.
//!
//! The `owner` map (one [`Owner`] entry: pid and start time from
//! `/proc/<pid>/stat` field 22) is written before anything is pinned and
//! pinned first, so a reader tells a live instance from stale pins left by
//! `kill -9` ([`Liveness`]). A load removes the instance directories under
//! the root whose owner is provably dead (pid gone, or pid reused with
//! another start time); dropping an instance removes its pins, its
//! directory, the root when it is empty, and the ancestors it created.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use aya::maps::{Array, Map, MapData};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{FchmodatFlags, Mode, fchmod, fchmodat, fstat, fstatat, mkdirat};
use nix::unistd::{Gid, UnlinkatFlags, fchown, fchownat, geteuid, unlinkat};

use crate::BpfError;
use crate::abi::{AbiStruct, Owner};

/// Name of the pinned owner map inside an instance directory.
pub const OWNER_MAP: &str = "owner";

/// Longest accepted instance name.
pub const MAX_INSTANCE_NAME: usize = 64;

/// Whether the process that pinned an instance is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// The owner runs: same pid, same start time.
    Live,
    /// No process has the owner's pid: the pins are stale.
    Gone,
    /// The pid now belongs to a process with another start time: stale.
    PidReused,
    /// No owner record to judge by (still being pinned, or pins without a
    /// record); never treated as stale.
    Unknown,
}

impl Liveness {
    /// Provably dead (only these pins are ever removed by another process).
    pub fn is_stale(self) -> bool {
        matches!(self, Self::Gone | Self::PidReused)
    }
}

impl std::fmt::Display for Liveness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Live => "live",
            Self::Gone => "stale (owner process gone)",
            Self::PidReused => "stale (owner pid reused by another process)",
            Self::Unknown => "unknown (no owner record)",
        })
    }
}

/// Field 22 (`starttime`, clock ticks after boot) of a `/proc/<pid>/stat`
/// text. The command name (field 2) may hold spaces and parentheses, so the
/// fields are counted after the last `)`.
fn parse_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // Field 3 (state) is the first after the `)`: field 22 is the 20th.
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// The start time of process `pid` (field 22 of `/proc/<pid>/stat`), or
/// `None` when no such process exists.
pub fn process_start_time(pid: u32) -> io::Result<Option<u64>> {
    let path = format!("/proc/{pid}/stat");
    match std::fs::read_to_string(&path) {
        Ok(text) => parse_start_time(&text).map(Some).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, format!("no field 22 in {path}"))
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

impl Owner {
    /// This process.
    pub fn current() -> io::Result<Self> {
        let pid = std::process::id();
        let start_time = process_start_time(pid)?
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "/proc/self/stat"))?;
        Ok(Self {
            pid: u64::from(pid),
            start_time,
        })
    }

    /// Whether the owner still runs, judged by `/proc/<pid>/stat`.
    pub fn liveness(&self) -> Liveness {
        let Ok(pid) = u32::try_from(self.pid) else {
            return Liveness::Unknown;
        };
        if pid == 0 {
            return Liveness::Unknown;
        }
        match process_start_time(pid) {
            Ok(Some(t)) if t == self.start_time => Liveness::Live,
            Ok(Some(_)) => Liveness::PidReused,
            Ok(None) => Liveness::Gone,
            Err(_) => Liveness::Unknown,
        }
    }
}

/// Read the owner record pinned at `path`; `None` when nothing is pinned
/// there.
pub fn read_owner(path: &Path) -> Result<Option<Owner>, BpfError> {
    if std::fs::symlink_metadata(path).is_err_and(|e| e.kind() == io::ErrorKind::NotFound) {
        return Ok(None);
    }
    let err = |source| BpfError::Map {
        what: format!("reading the owner record {}", path.display()),
        source: Box::new(source),
    };
    let data = MapData::from_pin(path).map_err(err)?;
    let map = Map::from_map_data(data).map_err(err)?;
    let array: Array<MapData, [u64; Owner::WORDS]> = Array::try_from(map).map_err(err)?;
    let words = array.get(&0, 0).map_err(err)?;
    Ok(Some(Owner::from_words(&words)))
}

/// One instance directory under a pin root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceDir {
    /// Directory name (the instance name, by default the owner's pid).
    pub name: String,
    /// Its path.
    pub path: PathBuf,
    /// The owner record, when one is pinned and readable.
    pub owner: Option<Owner>,
    /// Whether the owner runs.
    pub liveness: Liveness,
}

/// The instance directories under `root`, sorted by name (symbolic links
/// and plain files are skipped). A missing root is an empty list.
pub fn instances(root: &Path) -> Result<Vec<InstanceDir>, BpfError> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(BpfError::PinAccess {
                what: "listing",
                path: root.to_owned(),
                source,
            });
        }
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = entry.path();
        let owner = read_owner(&path.join(OWNER_MAP))?;
        out.push(InstanceDir {
            name: entry.file_name().to_string_lossy().into_owned(),
            liveness: owner.map_or(Liveness::Unknown, |o| o.liveness()),
            owner,
            path,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Check an instance name: 1 to 64 of `[A-Za-z0-9._-]`, not `.` or `..`.
pub fn check_instance_name(name: &str) -> Result<(), BpfError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_INSTANCE_NAME
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(BpfError::BadInstanceName {
            name: name.to_owned(),
        })
    }
}

/// A directory opened with `O_NOFOLLOW`.
#[derive(Debug)]
struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

impl Dir {
    /// `/proc/self/fd/<fd>/<name>`: `name` inside this very directory.
    fn fd_path(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}/{name}", self.fd.as_raw_fd()))
    }

    /// Names of the entries (through the descriptor, not the path).
    fn entries(&self) -> io::Result<Vec<OsString>> {
        std::fs::read_dir(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))?
            .map(|e| e.map(|e| e.file_name()))
            .collect()
    }
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// What must hold for a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// Owned by this user, not writable by group or others.
    Own,
    /// An ancestor: owned by root or this user; writable by others only if
    /// sticky.
    Ancestor,
}

fn refuse(path: &Path, owner: u32, mode: u32, reason: &'static str) -> BpfError {
    BpfError::UnsafePinDir {
        path: path.to_owned(),
        owner,
        mode: mode & 0o7777,
        reason,
    }
}

fn check(fd: &OwnedFd, path: &Path, rule: Rule) -> Result<(), BpfError> {
    let st = fstat(fd.as_fd()).map_err(|e| BpfError::PinAccess {
        what: "checking",
        path: path.to_owned(),
        source: e.into(),
    })?;
    let (uid, mode, me) = (st.st_uid, st.st_mode, geteuid().as_raw());
    match rule {
        Rule::Own if uid != me => Err(refuse(path, uid, mode, "owned by another user")),
        Rule::Own if mode & 0o022 != 0 => {
            Err(refuse(path, uid, mode, "writable by group or others"))
        }
        Rule::Ancestor if uid != me && uid != 0 => {
            Err(refuse(path, uid, mode, "an ancestor owned by another user"))
        }
        Rule::Ancestor if mode & 0o022 != 0 && mode & 0o1000 == 0 => Err(refuse(
            path,
            uid,
            mode,
            "an ancestor writable by group or others without the sticky bit",
        )),
        _ => Ok(()),
    }
}

/// Open `name` in `parent` without following a symlink, creating it (mode
/// `mode`, exactly) when missing. Returns the directory and whether this
/// call created it.
fn open_or_create(
    parent: &Dir,
    name: &OsStr,
    mode: u32,
    rule: Rule,
) -> Result<(Dir, bool), BpfError> {
    let path = parent.path.join(name);
    let created = match mkdirat(parent.fd.as_fd(), name, Mode::from_bits_truncate(mode)) {
        Ok(()) => true,
        Err(Errno::EEXIST) => false,
        Err(e) => {
            return Err(BpfError::PinAccess {
                what: "creating",
                path,
                source: e.into(),
            });
        }
    };
    let fd = match openat(parent.fd.as_fd(), name, dir_flags(), Mode::empty()) {
        Ok(fd) => fd,
        Err(e @ (Errno::ELOOP | Errno::ENOTDIR)) => {
            // Describe what is there without following it.
            return Err(
                match fstatat(parent.fd.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                    Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => {
                        refuse(&path, st.st_uid, st.st_mode, "a symbolic link")
                    }
                    Ok(st) => refuse(&path, st.st_uid, st.st_mode, "not a directory"),
                    Err(_) => BpfError::PinAccess {
                        what: "opening",
                        path,
                        source: e.into(),
                    },
                },
            );
        }
        Err(e) => {
            return Err(BpfError::PinAccess {
                what: "opening",
                path,
                source: e.into(),
            });
        }
    };
    if created {
        // mkdir applied the umask; set the exact mode on what was opened.
        fchmod(fd.as_fd(), Mode::from_bits_truncate(mode)).map_err(|e| BpfError::PinAccess {
            what: "chmod of",
            path: path.clone(),
            source: e.into(),
        })?;
    }
    check(&fd, &path, rule)?;
    Ok((Dir { fd, path }, created))
}

/// Remove every entry of `dir` (pins only: a subdirectory fails).
fn clear(dir: &Dir) -> Result<(), BpfError> {
    let access = |what, source| BpfError::PinAccess {
        what,
        path: dir.path.clone(),
        source,
    };
    for name in dir.entries().map_err(|e| access("listing", e))? {
        match unlinkat(dir.fd.as_fd(), name.as_os_str(), UnlinkatFlags::NoRemoveDir) {
            // Another load removing the same stale pins got there first.
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => {
                return Err(BpfError::PinAccess {
                    what: "removing",
                    path: dir.path.join(&name),
                    source: e.into(),
                });
            }
        }
    }
    Ok(())
}

/// The liveness of the instance in `dir` (by its pinned owner record).
fn liveness_of(dir: &Dir) -> Result<Liveness, BpfError> {
    let owner = read_owner(&dir.fd_path(OWNER_MAP)).map_err(|e| match e {
        BpfError::Map { source, .. } => BpfError::Map {
            what: format!(
                "reading the owner record {}",
                dir.path.join(OWNER_MAP).display()
            ),
            source,
        },
        e => e,
    })?;
    Ok(owner.map_or(Liveness::Unknown, |o| o.liveness()))
}

/// The opened directories of one instance, and the pins made in it.
#[derive(Debug)]
pub(crate) struct PinDirs {
    /// Opened directories from `/` to the root (the instance's parent).
    chain: Vec<Dir>,
    /// Index in `chain` of the first directory this load created (removed
    /// when empty on drop, with everything below it).
    first_created: usize,
    /// The instance directory.
    inst: Dir,
    /// Pinned entries, in creation order (names in `inst`, full paths).
    pub(crate) pins: Vec<PathBuf>,
    /// Stale instance directories removed by this load.
    pub(crate) removed_stale: Vec<PathBuf>,
    /// Keep everything on drop.
    pub(crate) keep: bool,
}

impl PinDirs {
    /// Open (creating what is missing) `root/instance` with the checks of
    /// this module, remove provably stale instances under `root`, and take
    /// over `root/instance` itself only if it is stale or empty. `group`
    /// makes the instance directory 0750 with that group (else 0700).
    pub(crate) fn open(root: &Path, instance: &str, group: Option<u32>) -> Result<Self, BpfError> {
        check_instance_name(instance)?;
        // Another instance may remove an empty root between our open and
        // our mkdir in it (ENOENT): start again.
        let mut tries = 0;
        loop {
            match Self::open_once(root, instance, group) {
                Err(BpfError::PinAccess { source, .. })
                    if source.kind() == io::ErrorKind::NotFound && tries < 5 =>
                {
                    tries += 1;
                }
                r => return r,
            }
        }
    }

    fn open_once(root: &Path, instance: &str, group: Option<u32>) -> Result<Self, BpfError> {
        let bad = |reason| BpfError::BadPinDir {
            path: root.to_owned(),
            reason,
        };
        if !root.is_absolute() {
            return Err(bad("not an absolute path"));
        }
        let names: Vec<&OsStr> = root
            .components()
            .skip(1)
            .map(|c| match c {
                Component::Normal(n) => Ok(n),
                _ => Err(bad("has `.` or `..` components")),
            })
            .collect::<Result<_, _>>()?;
        if names.is_empty() {
            return Err(bad("is `/`"));
        }
        let slash = std::fs::File::open("/").map_err(|source| BpfError::PinAccess {
            what: "opening",
            path: PathBuf::from("/"),
            source,
        })?;
        let mut chain = vec![Dir {
            fd: OwnedFd::from(slash),
            path: PathBuf::from("/"),
        }];
        let mut first_created = usize::MAX;
        for (i, name) in names.iter().enumerate() {
            let is_root = i + 1 == names.len();
            let rule = if is_root { Rule::Own } else { Rule::Ancestor };
            let parent = chain.last().expect("starts with /");
            let (dir, created) = open_or_create(parent, name, 0o755, rule)?;
            if created && first_created == usize::MAX {
                first_created = chain.len();
            }
            chain.push(dir);
        }
        let root_dir = chain.last().expect("the root");
        let mut removed_stale = Vec::new();
        for name in root_dir.entries().map_err(|source| BpfError::PinAccess {
            what: "listing",
            path: root_dir.path.clone(),
            source,
        })? {
            if name.as_bytes() == instance.as_bytes() {
                continue;
            }
            // Only directories that pass our checks and are provably dead.
            let Ok(fd) = openat(
                root_dir.fd.as_fd(),
                name.as_os_str(),
                dir_flags(),
                Mode::empty(),
            ) else {
                continue;
            };
            let dir = Dir {
                fd,
                path: root_dir.path.join(&name),
            };
            if check(&dir.fd, &dir.path, Rule::Own).is_err()
                || !liveness_of(&dir).is_ok_and(Liveness::is_stale)
            {
                continue;
            }
            // Best effort: another instance's leftovers never fail this load.
            if clear(&dir).is_ok()
                && unlinkat(
                    root_dir.fd.as_fd(),
                    name.as_os_str(),
                    UnlinkatFlags::RemoveDir,
                )
                .is_ok()
            {
                removed_stale.push(dir.path);
            }
        }
        let mode = if group.is_some() { 0o750 } else { 0o700 };
        let (inst, created) = open_or_create(root_dir, OsStr::new(instance), mode, Rule::Own)?;
        let mut dirs = Self {
            chain,
            first_created,
            inst,
            pins: Vec::new(),
            removed_stale,
            keep: true, // nothing of ours to remove until the checks pass
        };
        if !created {
            let empty = dirs
                .inst
                .entries()
                .map_err(|source| BpfError::PinAccess {
                    what: "listing",
                    path: dirs.inst.path.clone(),
                    source,
                })?
                .is_empty();
            let liveness = liveness_of(&dirs.inst)?;
            if liveness.is_stale() {
                clear(&dirs.inst)?;
                dirs.removed_stale.push(dirs.inst.path.clone());
            } else if !empty {
                return Err(BpfError::InstanceInUse {
                    path: dirs.inst.path.clone(),
                    liveness,
                });
            }
        }
        if let Some(g) = group {
            fchown(dirs.inst.fd.as_fd(), None, Some(Gid::from_raw(g))).map_err(|e| {
                BpfError::PinAccess {
                    what: "chown of",
                    path: dirs.inst.path.clone(),
                    source: e.into(),
                }
            })?;
        }
        dirs.keep = false;
        Ok(dirs)
    }

    /// The instance directory.
    pub(crate) fn path(&self) -> &Path {
        &self.inst.path
    }

    /// Whether the directory is on bpffs (checked on the descriptor).
    pub(crate) fn is_bpffs(&self) -> bool {
        nix::sys::statfs::fstatfs(self.inst.fd.as_fd())
            .is_ok_and(|s| s.filesystem_type().0 == crate::loader::BPF_FS_MAGIC)
    }

    /// Pin with `pin` (given a path that resolves inside the instance
    /// directory) as `name`, then set its mode (and group).
    pub(crate) fn pin<E>(
        &mut self,
        name: &str,
        group: Option<u32>,
        pin: impl FnOnce(&Path) -> Result<(), E>,
        on_err: impl FnOnce(PathBuf, E) -> BpfError,
    ) -> Result<(), BpfError> {
        let path = self.inst.path.join(name);
        pin(&self.inst.fd_path(name)).map_err(|e| on_err(path.clone(), e))?;
        self.pins.push(path.clone());
        let fd = self.inst.fd.as_fd();
        if let Some(g) = group {
            fchownat(
                fd,
                name,
                None,
                Some(Gid::from_raw(g)),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(|e| BpfError::PinAccess {
                what: "chown of",
                path: path.clone(),
                source: e.into(),
            })?;
        }
        let mode = if group.is_some() { 0o640 } else { 0o600 };
        fchmodat(
            fd,
            name,
            Mode::from_bits_truncate(mode),
            FchmodatFlags::FollowSymlink,
        )
        .map_err(|e| BpfError::PinAccess {
            what: "chmod of",
            path,
            source: e.into(),
        })
    }
}

impl Drop for PinDirs {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        for p in self.pins.iter().rev() {
            if let Some(name) = p.file_name() {
                let _ = unlinkat(self.inst.fd.as_fd(), name, UnlinkatFlags::NoRemoveDir);
            }
        }
        // The instance directory, then the root when empty (other
        // instances keep it), then the ancestors this load created.
        let last = self.chain.len() - 1;
        let Some(name) = self.inst.path.file_name() else {
            return;
        };
        if unlinkat(self.chain[last].fd.as_fd(), name, UnlinkatFlags::RemoveDir).is_err() {
            return;
        }
        for j in (1..=last).rev() {
            if j != last && j < self.first_created {
                break;
            }
            let Some(name) = self.chain[j].path.file_name() else {
                break;
            };
            if unlinkat(self.chain[j - 1].fd.as_fd(), name, UnlinkatFlags::RemoveDir).is_err() {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_field_22_after_the_last_parenthesis() {
        let stat = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(stat), Some(987_654));
        assert_eq!(parse_start_time("42 (x) S 1"), None);
        let me = Owner::current().unwrap();
        assert_eq!(me.liveness(), Liveness::Live);
        let reused = Owner {
            start_time: me.start_time + 1,
            ..me
        };
        assert_eq!(reused.liveness(), Liveness::PidReused);
        // pid_max is at most 2^22: this pid cannot exist.
        let gone = Owner {
            pid: 1 << 23,
            start_time: 1,
        };
        assert_eq!(gone.liveness(), Liveness::Gone);
        assert!(Liveness::Gone.is_stale() && !Liveness::Unknown.is_stale());
    }

    #[test]
    fn instance_names_are_single_plain_components() {
        for ok in ["1234", "click-house_1.a"] {
            check_instance_name(ok).unwrap();
        }
        for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(65)] {
            assert!(
                matches!(
                    check_instance_name(bad),
                    Err(BpfError::BadInstanceName { .. })
                ),
                "{bad:?}"
            );
        }
    }
}
