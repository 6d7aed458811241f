//! [`WorkloadsFile`]: `slotring run --workloads FILE`, a workload tree in
//! TOML and which of its leaves the run's queries enter.
//!
//! # The format
//!
//! One `[[workload]]` table per workload, ClickHouse's
//! `CREATE WORKLOAD name IN parent SETTINGS key = value, ...` written as
//! TOML, in any order:
//!
//! ```toml
//! [[workload]]
//! name = "all"                     # no parent: the root
//! max_bytes_per_second = "64MiB"
//!
//! [[workload]]
//! name = "background"
//! parent = "all"
//! priority = 1                     # lower is served first
//! max_bytes_per_second = "32MiB"
//!
//! [run]                            # optional; these are the defaults
//! queries = "user"                 # the leaf the short queries enter
//! scans = "background"             # the leaf every scan enters
//! ```
//!
//! Keys of a workload: `name` (required), `parent` (left out for the one
//! root), `priority` (integer), `weight` (integer), and the limits
//! `max_bytes_per_second`, `max_burst_bytes`, `max_bytes_inflight` (bytes:
//! an integer, or a string with a unit such as `"32MiB"`), `max_iops`,
//! `max_io_requests`, `max_concurrent_threads` (integers). A limit left out
//! is no limit. What each means is the library's `WorkloadSpec`; the tree's
//! own validation (unique names, one root, known parents, no cycle, weight
//! and priority in range, no limit of 0) is the library's `WorkloadTree`.
//! This file adds what TOML brings: an unknown key or table, a value of the
//! wrong type, a missing name, and a `[run]` leaf that is not a leaf of the
//! tree. Every error names the workload, the key and the value.
//!
//! `max_concurrent_threads` is CPU slots (the CPU resource's in-flight
//! limit): checked here, and not used by the disk's scheduler.
//!
//! # The root's cap
//!
//! A root without `max_bytes_per_second` gets the run's
//! `max_local_read_bandwidth` (when it is not 0, unlimited): the whole
//! tree shares the disk bandwidth the run is given, as `local_read` does
//! without a tree. A root cap in the file is the file's, and the setting
//! does not apply to reads.

use std::path::{Path, PathBuf};

use serde::Serialize;
use slotring::throttle::{WorkloadError, WorkloadSpec, WorkloadTree};

use super::*;

/// The keys of a `[[workload]]` table.
pub const WORKLOAD_KEYS: &[&str] = &[
    "name",
    "parent",
    "priority",
    "weight",
    "max_bytes_per_second",
    "max_burst_bytes",
    "max_iops",
    "max_io_requests",
    "max_bytes_inflight",
    "max_concurrent_threads",
];

/// The keys of the `[run]` table.
pub const RUN_KEYS: &[&str] = &["queries", "scans"];

/// The leaf short queries enter when `[run]` does not say.
pub const DEFAULT_QUERIES: &str = "user";
/// The leaf scans enter when `[run]` does not say.
pub const DEFAULT_SCANS: &str = "background";

/// A bad workloads file (under [`ConfigError::Workloads`], which names the
/// file).
#[derive(Debug, thiserror::Error)]
pub enum WorkloadFileError {
    /// A top-level key other than `workload` and `run`.
    #[error("unknown table or key `{key}` (known: workload, run)")]
    UnknownTable {
        /// The key.
        key: String,
    },
    /// `workload` or `run` of the wrong shape.
    #[error("`{key}` must be {expected}, not `{value}`")]
    Shape {
        /// The key.
        key: &'static str,
        /// What it must be.
        expected: &'static str,
        /// What it is.
        value: String,
    },
    /// No `[[workload]]` table.
    #[error("no [[workload]] table: a tree needs at least its root")]
    Empty,
    /// A workload table without `name`.
    #[error("workload #{index} (counting from 1) has no `name`")]
    NoName {
        /// Its position in the file.
        index: usize,
    },
    /// A key that is not a setting of a workload.
    #[error("workload `{node}`: unknown key `{key}` (known: {})", WORKLOAD_KEYS.join(", "))]
    UnknownKey {
        /// The workload.
        node: String,
        /// The key.
        key: String,
    },
    /// A key of `[run]` that is not one.
    #[error("[run]: unknown key `{key}` (known: {})", RUN_KEYS.join(", "))]
    UnknownRunKey {
        /// The key.
        key: String,
    },
    /// A value of the wrong type or out of its type's range.
    #[error("workload `{node}`: {key} = {value}: expected {expected}")]
    Value {
        /// The workload (`[run]` for the run's table).
        node: String,
        /// The key.
        key: &'static str,
        /// The value, as TOML.
        value: String,
        /// What would have been accepted.
        expected: &'static str,
    },
    /// The tree's own validation refused it.
    #[error(transparent)]
    Tree(#[from] WorkloadError),
    /// A `[run]` entry that names no workload.
    #[error("[run]: {key} = \"{node}\" is not a workload of the file")]
    UnknownLeaf {
        /// `queries` or `scans`.
        key: &'static str,
        /// The name.
        node: String,
    },
    /// A `[run]` entry that names a workload with children.
    #[error("[run]: {key} = \"{node}\" has children: requests enter leaf workloads only")]
    NotALeaf {
        /// `queries` or `scans`.
        key: &'static str,
        /// The name.
        node: String,
    },
}

/// Where the root's byte cap came from (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RootCap {
    /// The file's `max_bytes_per_second` on the root.
    File,
    /// `max_local_read_bandwidth`, since the file gave the root none.
    MaxLocalReadBandwidth,
    /// Neither: the root is unlimited.
    None,
}

/// A checked workloads file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadsFile {
    /// The file.
    pub path: PathBuf,
    /// The tree, as the file gives it.
    pub tree: WorkloadTree,
    /// The leaf the short queries enter.
    pub queries: String,
    /// The leaf the scans enter.
    pub scans: String,
}

impl WorkloadsFile {
    /// Read and check `path`: a small regular file, as for `--config`.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        Self::parse(&read_small_file(path)?, path)
    }

    /// Check the workload tree `text`, read from `path`.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        Self::from_table(parse_toml(text, path)?, path).map_err(|source| ConfigError::Workloads {
            path: path.to_owned(),
            source,
        })
    }

    fn from_table(mut table: toml::Table, path: &Path) -> Result<Self, WorkloadFileError> {
        if let Some(key) = table.keys().find(|k| *k != "workload" && *k != "run") {
            return Err(WorkloadFileError::UnknownTable { key: key.clone() });
        }
        let specs = match table.remove("workload") {
            None => return Err(WorkloadFileError::Empty),
            Some(toml::Value::Array(a)) => a
                .into_iter()
                .enumerate()
                .map(|(i, v)| match v {
                    toml::Value::Table(t) => spec(t, i + 1),
                    other => Err(WorkloadFileError::Shape {
                        key: "workload",
                        expected: "an array of tables ([[workload]])",
                        value: other.to_string(),
                    }),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(other) => {
                return Err(WorkloadFileError::Shape {
                    key: "workload",
                    expected: "an array of tables ([[workload]])",
                    value: other.to_string(),
                });
            }
        };
        if specs.is_empty() {
            return Err(WorkloadFileError::Empty);
        }
        let tree = WorkloadTree::new(specs)?;
        let (mut queries, mut scans) = (DEFAULT_QUERIES.to_owned(), DEFAULT_SCANS.to_owned());
        match table.remove("run") {
            None => {}
            Some(toml::Value::Table(t)) => {
                for (key, value) in t {
                    let (key, slot) = match key.as_str() {
                        "queries" => ("queries", &mut queries),
                        "scans" => ("scans", &mut scans),
                        _ => return Err(WorkloadFileError::UnknownRunKey { key }),
                    };
                    *slot = match value {
                        toml::Value::String(s) => s,
                        other => {
                            return Err(WorkloadFileError::Value {
                                node: "[run]".into(),
                                key,
                                value: other.to_string(),
                                expected: "a workload's name (a string)",
                            });
                        }
                    };
                }
            }
            Some(other) => {
                return Err(WorkloadFileError::Shape {
                    key: "run",
                    expected: "a table ([run])",
                    value: other.to_string(),
                });
            }
        }
        for (key, leaf) in [("queries", &queries), ("scans", &scans)] {
            if tree.get(leaf).is_none() {
                return Err(WorkloadFileError::UnknownLeaf {
                    key,
                    node: leaf.clone(),
                });
            }
            if !tree.is_leaf(leaf) {
                return Err(WorkloadFileError::NotALeaf {
                    key,
                    node: leaf.clone(),
                });
            }
        }
        Ok(Self {
            path: path.to_owned(),
            tree,
            queries,
            scans,
        })
    }

    /// The tree the disk is scheduled by: the file's, with
    /// `max_local_read_bandwidth` (bytes/s, 0 = unlimited) as the root's
    /// cap when the file gives it none.
    pub fn io_tree(&self, max_local_read_bandwidth: u64) -> Result<IoWorkloads, ConfigError> {
        let root = self.tree.specs()[0].clone();
        let done = |tree, root_cap| IoWorkloads {
            file: self.clone(),
            tree,
            root_cap,
        };
        if root.max_bytes_per_second.is_some() {
            return Ok(done(self.tree.clone(), RootCap::File));
        }
        if max_local_read_bandwidth == 0 {
            return Ok(done(self.tree.clone(), RootCap::None));
        }
        let mut specs = self.tree.specs().to_vec();
        specs[0] = root.max_bytes_per_second(max_local_read_bandwidth);
        let tree = WorkloadTree::new(specs).map_err(|e| ConfigError::Workloads {
            path: self.path.clone(),
            source: e.into(),
        })?;
        Ok(done(tree, RootCap::MaxLocalReadBandwidth))
    }
}

/// The disk's tree of a run: the file, and its tree with the root's cap
/// settled ([`WorkloadsFile::io_tree`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoWorkloads {
    /// The file.
    pub file: WorkloadsFile,
    /// The tree the reads are scheduled by.
    pub tree: WorkloadTree,
    /// Where its root's byte cap came from.
    pub root_cap: RootCap,
}

/// The [`WorkloadSpec`] of the `index`th `[[workload]]` table.
fn spec(mut t: toml::Table, index: usize) -> Result<WorkloadSpec, WorkloadFileError> {
    let name = match t.remove("name") {
        None => return Err(WorkloadFileError::NoName { index }),
        Some(toml::Value::String(s)) => s,
        Some(other) => {
            return Err(WorkloadFileError::Value {
                node: format!("#{index}"),
                key: "name",
                value: other.to_string(),
                expected: "a string",
            });
        }
    };
    let mut s = WorkloadSpec::new(name.clone());
    for (key, value) in t {
        let Some(&key) = WORKLOAD_KEYS.iter().find(|k| **k == key) else {
            return Err(WorkloadFileError::UnknownKey { node: name, key });
        };
        let bad = |expected| WorkloadFileError::Value {
            node: name.clone(),
            key,
            value: value.to_string(),
            expected,
        };
        match key {
            "parent" => match &value {
                toml::Value::String(p) => s.parent = Some(p.clone()),
                _ => return Err(bad("a workload's name (a string)")),
            },
            "priority" => {
                s.priority = value.as_integer().ok_or_else(|| bad("an integer"))?;
            }
            "weight" => {
                s.weight = value
                    .as_integer()
                    .and_then(|w| u32::try_from(w).ok())
                    .ok_or_else(|| bad("a whole number (1 to 65536)"))?;
            }
            "max_bytes_per_second" | "max_burst_bytes" | "max_bytes_inflight" => {
                let v = match &value {
                    toml::Value::Integer(i) => u64::try_from(*i).ok(),
                    toml::Value::String(text) => parse_bytes(text.trim()),
                    _ => None,
                }
                .ok_or_else(|| bad("bytes: a whole number, or a string such as \"32MiB\""))?;
                *match key {
                    "max_bytes_per_second" => &mut s.max_bytes_per_second,
                    "max_burst_bytes" => &mut s.max_burst_bytes,
                    _ => &mut s.max_bytes_inflight,
                } = Some(v);
            }
            _ => {
                let v = value
                    .as_integer()
                    .and_then(|i| u64::try_from(i).ok())
                    .ok_or_else(|| bad("a whole number"))?;
                *match key {
                    "max_iops" => &mut s.max_iops,
                    "max_io_requests" => &mut s.max_io_requests,
                    _ => &mut s.max_concurrent_threads,
                } = Some(v);
            }
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TREE: &str = r#"
        [[workload]]
        name = "user"
        parent = "all"
        [[workload]]
        name = "all"
        [[workload]]
        name = "background"
        parent = "all"
        priority = 1
        weight = 3
        max_bytes_per_second = "32MiB"
        max_burst_bytes = 1048576
        max_iops = 1000
        max_io_requests = 8
        max_bytes_inflight = "2MiB"
        max_concurrent_threads = 4
    "#;

    fn parse(text: &str) -> Result<WorkloadsFile, ConfigError> {
        WorkloadsFile::parse(text, Path::new("w.toml"))
    }

    /// The message of `text`'s error, with its cause.
    fn refused(text: &str) -> String {
        let e = parse(text).expect_err("a bad workloads file");
        assert!(matches!(
            e,
            ConfigError::Workloads { .. } | ConfigError::Parse { .. }
        ));
        crate::error_chain(&e)
    }

    #[test]
    fn a_file_becomes_the_tree_with_every_key() {
        let f = parse(TREE).unwrap();
        assert_eq!(f.tree.root(), "all");
        assert_eq!(
            (f.queries.as_str(), f.scans.as_str()),
            ("user", "background")
        );
        let b = f.tree.get("background").unwrap();
        let want = WorkloadSpec::new("background")
            .parent("all")
            .priority(1)
            .weight(3)
            .max_bytes_per_second(32 << 20)
            .max_burst_bytes(1 << 20)
            .max_iops(1000)
            .max_io_requests(8)
            .max_bytes_inflight(2 << 20)
            .max_concurrent_threads(4);
        assert_eq!(b, &want);
        assert_eq!(
            f.tree.get("user").unwrap(),
            &WorkloadSpec::new("user").parent("all")
        );
    }

    #[test]
    fn run_names_the_leaves_the_queries_enter() {
        let f = parse(&format!(
            "{TREE}\n[run]\nqueries = \"background\"\nscans = \"user\"\n"
        ))
        .unwrap();
        assert_eq!(
            (f.queries.as_str(), f.scans.as_str()),
            ("background", "user")
        );
        let m = refused(&format!("{TREE}\n[run]\nscans = \"all\"\n"));
        assert!(m.contains("scans = \"all\" has children"), "{m}");
        let m = refused(&format!("{TREE}\n[run]\nqueries = \"nobody\"\n"));
        assert!(m.contains("queries = \"nobody\" is not a workload"), "{m}");
        let m = refused(&format!("{TREE}\n[run]\nqueries = 3\n"));
        assert!(m.contains("queries = 3: expected"), "{m}");
        let m = refused(&format!("{TREE}\n[run]\nreads = \"user\"\n"));
        assert!(m.contains("unknown key `reads`"), "{m}");
        // Without [run], the default leaves must exist.
        let m =
            refused("[[workload]]\nname = \"all\"\n[[workload]]\nname = \"q\"\nparent = \"all\"\n");
        assert!(m.contains("queries = \"user\" is not a workload"), "{m}");
    }

    #[test]
    fn bad_trees_name_the_node_the_key_and_the_value() {
        let with = |extra: &str| format!("{TREE}\n[[workload]]\n{extra}\n");
        let cases: &[(&str, &[&str])] = &[
            // The tree's own validation.
            (
                "name = \"x\"\nparent = \"nowhere\"",
                &["`x`", "parent `nowhere`"],
            ),
            (
                "name = \"x\"\nparent = \"all\"\nweight = 0",
                &["`x`", "weight 0"],
            ),
            (
                "name = \"x\"\nparent = \"all\"\nmax_iops = 0",
                &["`x`", "max_iops = 0"],
            ),
            (
                "name = \"user\"\nparent = \"all\"",
                &["`user` is defined twice"],
            ),
            (
                "name = \"x\"\nparent = \"all\"\npriority = 40000",
                &["`x`", "priority 40000"],
            ),
            ("name = \"x\"", &["`all`", "`x`", "both have no parent"]),
            // What the file adds.
            (
                "name = \"x\"\nparent = \"all\"\nmax_speed = 5",
                &["`x`", "unknown key `max_speed`"],
            ),
            (
                "name = \"x\"\nparent = \"all\"\nweight = \"heavy\"",
                &["`x`", "weight = \"heavy\"", "expected"],
            ),
            (
                "name = \"x\"\nparent = \"all\"\nweight = 4294967296",
                &["`x`", "weight = 4294967296"],
            ),
            (
                "name = \"x\"\nparent = \"all\"\npriority = 1.5",
                &["`x`", "priority = 1.5"],
            ),
            (
                "name = \"x\"\nparent = \"all\"\nmax_bytes_per_second = \"fast\"",
                &["`x`", "max_bytes_per_second = \"fast\""],
            ),
            (
                "name = \"x\"\nparent = \"all\"\nmax_io_requests = -1",
                &["`x`", "max_io_requests = -1"],
            ),
            ("name = \"x\"\nparent = 7", &["`x`", "parent = 7"]),
            ("parent = \"all\"", &["workload #4", "no `name`"]),
            ("name = 5", &["#4", "name = 5"]),
        ];
        for (extra, wants) in cases {
            let m = refused(&with(extra));
            for w in *wants {
                assert!(m.contains(w), "{extra:?}: {m:?} lacks {w:?}");
            }
        }
        let cycle = "[[workload]]\nname = \"r\"\n[[workload]]\nname = \"a\"\nparent = \"b\"\n[[workload]]\nname = \"b\"\nparent = \"a\"\n";
        let m = refused(cycle);
        assert!(
            m.contains("its own ancestor") && m.contains("a -> b -> a")
                || m.contains("b -> a -> b"),
            "{m}"
        );
        assert!(refused("").contains("no [[workload]] table"));
        assert!(refused("workload = 3").contains("`workload` must be an array of tables"));
        assert!(
            refused("[workload]\nname = \"all\"").contains("`workload` must be an array of tables")
        );
        assert!(refused(&format!("run = 1\n{TREE}")).contains("`run` must be a table"));
        assert!(refused(&format!("{TREE}\n[tenants]")).contains("unknown table or key `tenants`"));
        assert!(refused("[[workload]\n").contains("parsing config file w.toml"));
    }

    #[test]
    fn the_root_takes_the_read_bandwidth_unless_the_file_caps_it() {
        let f = parse(TREE).unwrap();
        let IoWorkloads {
            tree: t,
            root_cap: from,
            ..
        } = f.io_tree(64 << 20).unwrap();
        assert_eq!(from, RootCap::MaxLocalReadBandwidth);
        assert_eq!(t.get("all").unwrap().max_bytes_per_second, Some(64 << 20));
        assert_eq!(
            t.get("background"),
            f.tree.get("background"),
            "only the root changes"
        );
        let io = f.io_tree(0).unwrap();
        let (t, from) = (io.tree, io.root_cap);
        assert_eq!(
            (from, t.get("all").unwrap().max_bytes_per_second),
            (RootCap::None, None)
        );
        let capped = parse(&TREE.replacen(
            "name = \"all\"",
            "name = \"all\"\nmax_bytes_per_second = 1000",
            1,
        ))
        .unwrap();
        let io = capped.io_tree(64 << 20).unwrap();
        let (t, from) = (io.tree, io.root_cap);
        assert_eq!(
            (from, t.get("all").unwrap().max_bytes_per_second),
            (RootCap::File, Some(1000))
        );
    }
}
