//! A benchmark key's goal: the expression `bench_goals.rs` writes, parsed
//! and judged against a suite's values.
//!
//! Forms: `<= N`, `>= N`, `N +- M` (within M of N), `<= F x KEY` and
//! `>= F x KEY` (against F times another key of the same suite), `<= KEY + N`
//! and `>= KEY + N` (against another key plus N, for goals on a share in
//! percentage points above a floor). A key may carry several goals: each
//! is one row of `bench_goals.rs`.

use std::collections::BTreeMap;
use std::fmt;

use anyhow::{Result, bail};

/// A suite's values: a key whose JSON value is `null` (not measured, or
/// not a finite number) is `None`.
pub(crate) type Values = BTreeMap<String, Option<f64>>;

/// A parsed goal.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Goal {
    /// The value is at most this.
    AtMost(f64),
    /// The value is at least this.
    AtLeast(f64),
    /// The value is within `tolerance` of `target`.
    Within {
        /// The target.
        target: f64,
        /// How far from it the value may be.
        tolerance: f64,
    },
    /// The value is at most `factor` times the other key's.
    AtMostTimes(f64, String),
    /// The value is at least `factor` times the other key's.
    AtLeastTimes(f64, String),
    /// The value is at most the other key's plus `margin`.
    AtMostPlus(String, f64),
    /// The value is at least the other key's plus `margin`.
    AtLeastPlus(String, f64),
}

/// What a goal makes of a value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    /// Met.
    Met,
    /// Missed.
    Missed,
    /// Cannot be judged: the value, or the key it is compared with, is
    /// missing or null (the reason says which).
    NotJudged(String),
}

impl Verdict {
    /// The table's mark: ✓, ✗ or —.
    pub(crate) fn mark(&self) -> &'static str {
        match self {
            Self::Met => "✓",
            Self::Missed => "✗",
            Self::NotJudged(_) => "—",
        }
    }
}

fn number(s: &str, expr: &str) -> Result<f64> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => bail!("goal `{expr}`: `{}` is not a number", s.trim()),
    }
}

fn is_key(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

impl Goal {
    /// Parse one of the forms in the module's docs.
    pub(crate) fn parse(expr: &str) -> Result<Self> {
        let e = expr.trim();
        if let Some((target, tol)) = e.split_once("+-") {
            let tolerance = number(tol, expr)?;
            if tolerance < 0.0 {
                bail!("goal `{expr}`: a negative tolerance");
            }
            return Ok(Self::Within {
                target: number(target, expr)?,
                tolerance,
            });
        }
        let (at_most, rest) = if let Some(r) = e.strip_prefix("<=") {
            (true, r)
        } else if let Some(r) = e.strip_prefix(">=") {
            (false, r)
        } else {
            bail!(
                "goal `{expr}`: not `<= N`, `>= N`, `N +- M`, `<= F x KEY`, `>= F x KEY`, `<= KEY + N` or `>= KEY + N`"
            );
        };
        if let Some((key, margin)) = rest.split_once(" + ") {
            let key = key.trim();
            if !is_key(key) {
                bail!("goal `{expr}`: `{key}` is not a bench key");
            }
            let margin = number(margin, expr)?;
            return Ok(match at_most {
                true => Self::AtMostPlus(key.to_owned(), margin),
                false => Self::AtLeastPlus(key.to_owned(), margin),
            });
        }
        match rest.split_once(" x ") {
            Some((f, key)) => {
                let key = key.trim();
                if !is_key(key) {
                    bail!("goal `{expr}`: `{key}` is not a bench key");
                }
                let f = number(f, expr)?;
                Ok(match at_most {
                    true => Self::AtMostTimes(f, key.to_owned()),
                    false => Self::AtLeastTimes(f, key.to_owned()),
                })
            }
            None => {
                let n = number(rest, expr)?;
                Ok(if at_most {
                    Self::AtMost(n)
                } else {
                    Self::AtLeast(n)
                })
            }
        }
    }

    /// The other key it is judged against, if any.
    pub(crate) fn other_key(&self) -> Option<&str> {
        match self {
            Self::AtMostTimes(_, k)
            | Self::AtLeastTimes(_, k)
            | Self::AtMostPlus(k, _)
            | Self::AtLeastPlus(k, _) => Some(k),
            _ => None,
        }
    }

    /// Judge `key`'s value in `values`.
    pub(crate) fn judge(&self, key: &str, values: &Values) -> Verdict {
        let get = |k: &str| match values.get(k) {
            Some(Some(v)) => Ok(*v),
            Some(None) => Err(Verdict::NotJudged(format!("`{k}` is null"))),
            None => Err(Verdict::NotJudged(format!("no `{k}`"))),
        };
        let v = match get(key) {
            Ok(v) => v,
            Err(n) => return n,
        };
        let bound = |f: f64, other: &str| get(other).map(|o| f * o);
        let met = match self {
            Self::AtMost(n) => v <= *n,
            Self::AtLeast(n) => v >= *n,
            Self::Within { target, tolerance } => (v - target).abs() <= *tolerance,
            Self::AtMostTimes(f, other) => match bound(*f, other) {
                Ok(b) => v <= b,
                Err(n) => return n,
            },
            Self::AtLeastTimes(f, other) => match bound(*f, other) {
                Ok(b) => v >= b,
                Err(n) => return n,
            },
            Self::AtMostPlus(other, m) => match get(other) {
                Ok(o) => v <= o + m,
                Err(n) => return n,
            },
            Self::AtLeastPlus(other, m) => match get(other) {
                Ok(o) => v >= o + m,
                Err(n) => return n,
            },
        };
        if met { Verdict::Met } else { Verdict::Missed }
    }
}

impl fmt::Display for Goal {
    /// The form it was parsed from (its numbers as written), with ≤/≥/±
    /// and `×`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AtMost(v) => write!(f, "≤ {v}"),
            Self::AtLeast(v) => write!(f, "≥ {v}"),
            Self::Within { target, tolerance } => write!(f, "{target} ± {tolerance}"),
            Self::AtMostTimes(x, k) => write!(f, "≤ {x} × `{k}`"),
            Self::AtLeastTimes(x, k) => write!(f, "≥ {x} × `{k}`"),
            Self::AtMostPlus(k, m) => write!(f, "≤ `{k}` + {m}"),
            Self::AtLeastPlus(k, m) => write!(f, "≥ `{k}` + {m}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(kv: &[(&str, Option<f64>)]) -> Values {
        kv.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    fn judge(expr: &str, kv: &[(&str, Option<f64>)]) -> Verdict {
        Goal::parse(expr).unwrap().judge("k", &values(kv))
    }

    #[test]
    fn every_form_parses() {
        assert_eq!(Goal::parse("<= 1.5").unwrap(), Goal::AtMost(1.5));
        assert_eq!(Goal::parse(">=0.99").unwrap(), Goal::AtLeast(0.99));
        assert_eq!(
            Goal::parse("75 +- 2").unwrap(),
            Goal::Within {
                target: 75.0,
                tolerance: 2.0
            }
        );
        assert_eq!(
            Goal::parse("<= 1.5 x wl_charge_ns_flat").unwrap(),
            Goal::AtMostTimes(1.5, "wl_charge_ns_flat".into())
        );
        assert_eq!(
            Goal::parse(">= 1 x verdict_partial_threads").unwrap(),
            Goal::AtLeastTimes(1.0, "verdict_partial_threads".into())
        );
        assert_eq!(
            Goal::parse("<= floor_runq_share_pct_hog + 10").unwrap(),
            Goal::AtMostPlus("floor_runq_share_pct_hog".into(), 10.0)
        );
        assert_eq!(
            Goal::parse(">= k2 + 0.5").unwrap(),
            Goal::AtLeastPlus("k2".into(), 0.5)
        );
        assert_eq!(
            Goal::parse("<= floor_x + 10").unwrap().to_string(),
            "≤ `floor_x` + 10"
        );
    }

    #[test]
    fn a_malformed_goal_is_rejected_with_its_text() {
        for bad in [
            "< 1",
            "== 0",
            "<= x",
            "<= 1 x",
            "<= 1 x Not_A_Key",
            "<= Not_A_Key + 10",
            "<= k + ten",
            "<= k + nan",
            "<= + 10",
            "1 +- -2",
            "<= nan",
            "",
        ] {
            let e = Goal::parse(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("`{bad}`")), "{bad}: {e}");
        }
    }

    #[test]
    fn each_form_meets_and_misses() {
        use Verdict::{Met, Missed};
        assert_eq!(judge("<= 1.5", &[("k", Some(1.5))]), Met);
        assert_eq!(judge("<= 1.5", &[("k", Some(1.51))]), Missed);
        assert_eq!(judge(">= 0.99", &[("k", Some(0.99))]), Met);
        assert_eq!(judge(">= 0.99", &[("k", Some(0.98))]), Missed);
        assert_eq!(judge("75 +- 2", &[("k", Some(73.0))]), Met);
        assert_eq!(judge("75 +- 2", &[("k", Some(77.5))]), Missed);
        assert_eq!(judge("75 +- 2", &[("k", Some(72.9))]), Missed);
        let ratio = |k, o| [("k", Some(k)), ("o", Some(o))];
        assert_eq!(judge("<= 1.5 x o", &ratio(15.0, 10.0)), Met);
        assert_eq!(judge("<= 1.5 x o", &ratio(15.1, 10.0)), Missed);
        assert_eq!(judge(">= 1 x o", &ratio(4.0, 4.0)), Met);
        assert_eq!(judge(">= 1 x o", &ratio(3.0, 4.0)), Missed);
        assert_eq!(judge("<= o + 10", &ratio(30.0, 20.0)), Met);
        assert_eq!(judge("<= o + 10", &ratio(30.1, 20.0)), Missed);
        assert_eq!(judge(">= o + 0.5", &ratio(4.5, 4.0)), Met);
        assert_eq!(judge(">= o + 0.5", &ratio(4.4, 4.0)), Missed);
    }

    #[test]
    fn a_missing_or_null_value_is_not_judged() {
        let not = |v: Verdict| matches!(v, Verdict::NotJudged(_));
        assert!(not(judge("<= 1", &[])));
        assert!(not(judge("<= 1", &[("k", None)])));
        assert!(not(judge("<= 1 x o", &[("k", Some(1.0))])));
        assert!(not(judge(">= 1 x o", &[("k", Some(1.0)), ("o", None)])));
        assert!(not(judge("<= o + 10", &[("k", Some(1.0))])));
        assert!(not(judge(">= o + 1", &[("k", Some(1.0)), ("o", None)])));
        assert_eq!(
            judge("<= 1 x o", &[("k", Some(1.0))]),
            Verdict::NotJudged("no `o`".into())
        );
    }
}
