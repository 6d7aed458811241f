//! The three scheduling policies.

use std::fmt;
use std::str::FromStr;

use crate::SlotsError;

/// How released slots are distributed between waiting allocations.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheduler {
    /// `round_robin`: `min` slots are granted unconditionally and count
    /// against the budget (oversubscription possible); the rest round-robin.
    RoundRobin,
    /// `fair_round_robin`: `min` slots are non-competing and never count; the
    /// budget is never exceeded (except by counted lease borrows); round-robin.
    FairRoundRobin,
    /// `max_min_fair` (default): as `fair_round_robin`, but each slot goes to
    /// the waiter with the fewest allocated slots, FIFO among equals.
    #[default]
    MaxMinFair,
}

impl Scheduler {
    /// All schedulers, in index order.
    pub const ALL: [Scheduler; 3] = [
        Scheduler::RoundRobin,
        Scheduler::FairRoundRobin,
        Scheduler::MaxMinFair,
    ];

    /// The setting's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Scheduler::RoundRobin => "round_robin",
            Scheduler::FairRoundRobin => "fair_round_robin",
            Scheduler::MaxMinFair => "max_min_fair",
        }
    }

    /// Whether `min` slots are non-competing (outside the budget).
    pub fn min_is_non_competing(self) -> bool {
        !matches!(self, Scheduler::RoundRobin)
    }

    pub(crate) fn index(self) -> usize {
        match self {
            Scheduler::RoundRobin => 0,
            Scheduler::FairRoundRobin => 1,
            Scheduler::MaxMinFair => 2,
        }
    }
}

impl fmt::Display for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Scheduler {
    type Err = SlotsError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "round_robin" => Ok(Scheduler::RoundRobin),
            "fair_round_robin" => Ok(Scheduler::FairRoundRobin),
            "max_min_fair" => Ok(Scheduler::MaxMinFair),
            other => Err(SlotsError::UnknownScheduler {
                value: other.to_owned(),
            }),
        }
    }
}
