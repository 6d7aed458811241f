//! Cross-crate integration tests live in `tests/tests/`.
//!
//! This library also compiles and runs every Rust example in the top-level
//! `README.md` as a doctest, so the README cannot drift from the code.

#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
