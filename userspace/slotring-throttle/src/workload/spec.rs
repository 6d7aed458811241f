//! The tree as data: one [`WorkloadSpec`] per workload, in ClickHouse's
//! names (`CREATE WORKLOAD name IN parent SETTINGS ...`), validated into a
//! [`WorkloadTree`]. Plain fields of plain types, so that a loader (TOML in
//! the command) can derive its deserialiser without this crate knowing it.

use std::collections::HashMap;

use super::{MAX_DEPTH, MAX_WEIGHT, PRIORITIES, WorkloadError};
use crate::MAX_RATE;

/// One workload: ClickHouse's `CREATE WORKLOAD` with its settings. A
/// setting left out (`None`) is no limit; a limit of 0 is an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadSpec {
    /// The name requests use to enter it (leaves) and children use as
    /// their `parent`.
    pub name: String,
    /// The parent's name; `None` for the root.
    pub parent: Option<String>,
    /// Strict order between siblings: the lower value is served first
    /// (default 0; within [`PRIORITIES`]).
    pub priority: i64,
    /// Max-min fair share among siblings of one priority (default 1;
    /// `1..=`[`MAX_WEIGHT`]).
    pub weight: u32,
    /// A cap on the bytes this workload's subtree moves per second.
    pub max_bytes_per_second: Option<u64>,
    /// The cap's bucket size, bytes (default: one second of the rate).
    pub max_burst_bytes: Option<u64>,
    /// A cap on the requests per second (its burst: one second of it).
    pub max_iops: Option<u64>,
    /// Requests submitted and not yet complete, at most.
    pub max_io_requests: Option<u64>,
    /// Bytes submitted and not yet complete, at most.
    pub max_bytes_inflight: Option<u64>,
    /// CPU slots held at once, at most (the CPU resource's in-flight limit).
    pub max_concurrent_threads: Option<u64>,
}

impl WorkloadSpec {
    /// A workload of weight 1 at priority 0 with no limits, under `parent`
    /// (set with [`WorkloadSpec::parent`]) or the root.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            parent: None,
            priority: 0,
            weight: 1,
            max_bytes_per_second: None,
            max_burst_bytes: None,
            max_iops: None,
            max_io_requests: None,
            max_bytes_inflight: None,
            max_concurrent_threads: None,
        }
    }

    /// `IN parent`.
    pub fn parent(mut self, parent: impl Into<String>) -> Self {
        self.parent = Some(parent.into());
        self
    }

    /// `priority`.
    pub fn priority(mut self, priority: i64) -> Self {
        self.priority = priority;
        self
    }

    /// `weight`.
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// `max_bytes_per_second`.
    pub fn max_bytes_per_second(mut self, v: u64) -> Self {
        self.max_bytes_per_second = Some(v);
        self
    }

    /// `max_burst_bytes`.
    pub fn max_burst_bytes(mut self, v: u64) -> Self {
        self.max_burst_bytes = Some(v);
        self
    }

    /// `max_iops`.
    pub fn max_iops(mut self, v: u64) -> Self {
        self.max_iops = Some(v);
        self
    }

    /// `max_io_requests`.
    pub fn max_io_requests(mut self, v: u64) -> Self {
        self.max_io_requests = Some(v);
        self
    }

    /// `max_bytes_inflight`.
    pub fn max_bytes_inflight(mut self, v: u64) -> Self {
        self.max_bytes_inflight = Some(v);
        self
    }

    /// `max_concurrent_threads`.
    pub fn max_concurrent_threads(mut self, v: u64) -> Self {
        self.max_concurrent_threads = Some(v);
        self
    }

    fn check(&self) -> Result<(), WorkloadError> {
        let node = || self.name.clone();
        if self.name.is_empty() {
            return Err(WorkloadError::EmptyName);
        }
        if self.weight == 0 || self.weight > MAX_WEIGHT {
            return Err(WorkloadError::Weight {
                node: node(),
                weight: self.weight,
                max: MAX_WEIGHT,
            });
        }
        if !PRIORITIES.contains(&self.priority) {
            return Err(WorkloadError::Priority {
                node: node(),
                priority: self.priority,
                min: *PRIORITIES.start(),
                max: *PRIORITIES.end(),
            });
        }
        let settings = [
            ("max_bytes_per_second", self.max_bytes_per_second, MAX_RATE),
            ("max_burst_bytes", self.max_burst_bytes, u64::MAX),
            ("max_iops", self.max_iops, MAX_RATE),
            ("max_io_requests", self.max_io_requests, u64::MAX),
            ("max_bytes_inflight", self.max_bytes_inflight, u64::MAX),
            (
                "max_concurrent_threads",
                self.max_concurrent_threads,
                u64::MAX,
            ),
        ];
        for (setting, value, max) in settings {
            match value {
                Some(0) => {
                    return Err(WorkloadError::ZeroCap {
                        node: node(),
                        setting,
                    });
                }
                Some(value) if value > max => {
                    return Err(WorkloadError::CapTooLarge {
                        node: node(),
                        setting,
                        value,
                        max,
                    });
                }
                _ => {}
            }
        }
        if let (Some(burst), None) = (self.max_burst_bytes, self.max_bytes_per_second) {
            return Err(WorkloadError::BurstWithoutRate {
                node: node(),
                burst,
            });
        }
        Ok(())
    }
}

/// A validated tree: unique names, one root, every parent known, no cycle,
/// every setting in range. Build one with [`WorkloadTree::new`]; a
/// scheduler is built from it, and a live change takes another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadTree {
    /// Parents before children (the root first), otherwise in the order given.
    specs: Vec<WorkloadSpec>,
    /// Name → index in `specs`.
    index: HashMap<String, usize>,
    /// Per spec: whether no workload names it as parent.
    leaf: Vec<bool>,
}

impl WorkloadTree {
    /// Validate `specs` (in any order) into a tree.
    pub fn new(specs: Vec<WorkloadSpec>) -> Result<Self, WorkloadError> {
        let mut index = HashMap::with_capacity(specs.len());
        for (i, s) in specs.iter().enumerate() {
            s.check()?;
            if index.insert(s.name.as_str(), i).is_some() {
                return Err(WorkloadError::Duplicate {
                    node: s.name.clone(),
                });
            }
        }
        let mut root = None;
        for s in &specs {
            match &s.parent {
                None => match root {
                    None => root = Some(s.name.as_str()),
                    Some(first) => {
                        return Err(WorkloadError::MultipleRoots {
                            first: first.to_owned(),
                            second: s.name.clone(),
                        });
                    }
                },
                Some(p) if !index.contains_key(p.as_str()) => {
                    return Err(WorkloadError::UnknownParent {
                        node: s.name.clone(),
                        parent: p.clone(),
                    });
                }
                Some(_) => {}
            }
        }
        // Every chain of parents ends at the root within `len` steps, or
        // it loops: with one root and every parent known, a node that
        // does not reach the root lies on (or under) a cycle.
        let mut depth = vec![0usize; specs.len()];
        for (i, s) in specs.iter().enumerate() {
            let mut chain = vec![i];
            let mut at = s;
            while let Some(p) = &at.parent {
                let pi = index[p.as_str()];
                if let Some(pos) = chain.iter().position(|&c| c == pi) {
                    let mut cycle: Vec<String> = chain[pos..]
                        .iter()
                        .map(|&c| specs[c].name.clone())
                        .collect();
                    cycle.push(specs[pi].name.clone());
                    return Err(WorkloadError::Cycle {
                        node: specs[pi].name.clone(),
                        cycle,
                    });
                }
                chain.push(pi);
                at = &specs[pi];
            }
            depth[i] = chain.len();
            if chain.len() > MAX_DEPTH {
                return Err(WorkloadError::TooDeep {
                    node: s.name.clone(),
                    depth: chain.len(),
                    max: MAX_DEPTH,
                });
            }
        }
        if root.is_none() {
            return Err(WorkloadError::NoRoot);
        }
        // Parents first: a stable sort by depth.
        let mut order: Vec<usize> = (0..specs.len()).collect();
        order.sort_by_key(|&i| depth[i]);
        let mut slots: Vec<Option<WorkloadSpec>> = specs.into_iter().map(Some).collect();
        let specs: Vec<WorkloadSpec> = order
            .into_iter()
            .map(|i| slots[i].take().expect("each index once"))
            .collect();
        let index: HashMap<String, usize> = specs
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.clone(), i))
            .collect();
        let mut leaf = vec![true; specs.len()];
        for s in &specs {
            if let Some(p) = &s.parent {
                leaf[index[p.as_str()]] = false;
            }
        }
        Ok(Self { specs, index, leaf })
    }

    /// The workloads, parents before children (the root first).
    pub fn specs(&self) -> &[WorkloadSpec] {
        &self.specs
    }

    /// The workload named `name`.
    pub fn get(&self, name: &str) -> Option<&WorkloadSpec> {
        self.index.get(name).map(|&i| &self.specs[i])
    }

    /// The root's name.
    pub fn root(&self) -> &str {
        &self.specs[0].name
    }

    /// Whether `name` is a leaf (no workload names it as parent).
    pub fn is_leaf(&self, name: &str) -> bool {
        self.index.get(name).is_some_and(|&i| self.leaf[i])
    }
}
