use super::*;

/// A small workspace: one crate with a pub struct, an enum, a method, a
/// const, and a metric name in a string.
fn fixture(name: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("xtask-doc-check-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let src = root.join("userspace/slotring-demo/src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(root.join("docs")).unwrap();
    std::fs::write(
        root.join("userspace/slotring-demo/Cargo.toml"),
        "[package]\nname = \"slotring-demo\"\n\n[dependencies]\n",
    )
    .unwrap();
    std::fs::write(
        src.join("lib.rs"),
        r#"//! Demo.
pub struct Throttler;
pub enum Lifecycle {
    /// Pacing.
    Pacing,
    Held { x: u8 },
    Synced(u8),
}
enum Private {
    Hidden,
}
pub(crate) struct Policy {
    pub writeback_depth: u32,
    inner: std::num::NonZeroU32,
}
impl Throttler {
    pub fn reserve(&self) {}
}
pub(crate) const PACE_SLACK_NS: u64 = 1;
const METRIC: &str = "slotring_bytes_total";
"#,
    )
    .unwrap();
    std::fs::write(root.join("docs/guide.md"), "# g\n").unwrap();
    root
}

fn failures(root: &Path, doc: &str) -> Vec<String> {
    let ws = Workspace::scan(root).unwrap();
    check_doc(&ws, "README.md", doc)
}

#[test]
fn what_exists_is_accepted() {
    let root = fixture("ok");
    let doc = "# Demo\n\n\
        `slotring-demo` and `slotring_demo::Throttler` and `Throttler::reserve`,\n\
        `Lifecycle::Pacing`, `Lifecycle::Held`, `Lifecycle::Synced`, `PACE_SLACK_NS`,\n\
        `Private::Hidden`, `Policy::writeback_depth`, `Policy::inner`, `u64::MAX`,\n\
        `userspace/slotring-demo/src/lib.rs`, `src/lib.rs:12`, `lib.rs`, `docs/`,\n\
        `slotring_bytes_total`, [the guide](docs/guide.md#top), [site](https://x.invalid).\n\
        Skipped: `cargo xtask ci`, `--flag`, `a = b`, `/proc/self/io`, `RWF_NOWAIT`,\n\
        `write_cpu_ratio`, `Send`, `MiB/s`, `target/bench/x.json`, `tokio::fs::File`.\n\
        ```\nMissingInAFence `nope/none.rs`\n```\n";
    assert_eq!(failures(&root, doc), Vec::<String>::new());
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_missing_path_type_crate_constant_and_link_are_rejected() {
    let root = fixture("bad");
    let doc = "# Demo\n\n\
        `userspace/slotring-demo/src/gone.rs` and `gone.rs`\n\
        `Vanished` and `Throttler::vanish` and `Lifecycle::Gone`\n\
        `slotring-nope` and `slotring_nope::Throttler` and `slotring_nope`\n\
        `NOT_A_CONST` and [gone](docs/gone.md)\n";
    let got = failures(&root, doc);
    let want = [
        "README.md:3: `userspace/slotring-demo/src/gone.rs`: no such file or directory",
        "README.md:3: `gone.rs`: no file of that name in the tree",
        "README.md:4: `Vanished`: no item `Vanished` defined in the workspace",
        "README.md:4: `Throttler::vanish`: no item `vanish` defined in the workspace",
        "README.md:4: `Lifecycle::Gone`: no item `Gone` defined in the workspace",
        "README.md:5: `slotring-nope`: no workspace crate (or name in the sources) of that name",
        "README.md:5: `slotring_nope::Throttler`: no workspace crate `slotring-nope`",
        "README.md:5: `slotring_nope`: no workspace crate (or name in the sources) of that name",
        "README.md:6: `NOT_A_CONST`: not in the workspace's sources (nor an external prefix)",
        "README.md:6: `docs/gone.md`: the link's target does not exist",
    ];
    assert_eq!(got, want);
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn counts_are_rejected_wherever_they_are_written() {
    assert_eq!(
        counts("The `7` lifecycle states and 12 Tests"),
        ["7 lifecycle states", "12 tests"]
    );
    assert_eq!(counts("has 3  variants."), ["3 variants"]);
    assert!(counts("x2 states, 5 testsuites, states 3, v6 tests").is_empty());
    assert_eq!(counts("1.9–2.9 ms, 4 états, 2 tests–"), ["2 tests"]);
    let root = fixture("counts");
    assert_eq!(
        failures(&root, "a\n\nIt runs 40 tests.\n"),
        ["README.md:3: `40 tests`: a count (counts drift; name the things, not how many)"]
    );
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn spans_keep_their_lines_and_double_backticks() {
    let (spans, links) = spans_and_links("a `x`\n``y ` z`` [l](p.md)\n`split\nspan` `w`\n");
    assert_eq!(
        spans,
        [
            (1, "x".to_owned()),
            (2, "y ` z".to_owned()),
            (3, "split span".to_owned()),
            (4, "w".to_owned())
        ]
    );
    assert_eq!(links, [(2, "p.md".to_owned())]);
}

#[test]
fn classification() {
    assert_eq!(classify("cargo xtask ci"), Check::Skip);
    assert_eq!(classify("src/a.rs:10-12"), Check::Path("src/a.rs".into()));
    assert_eq!(classify("a.toml"), Check::FileName("a.toml".into()));
    assert_eq!(classify("slotring-x"), Check::Crate("slotring-x".into()));
    assert_eq!(classify("A::b"), Check::Item(vec!["A".into(), "b".into()]));
    assert_eq!(classify("MAX_BLOCK"), Check::Const("MAX_BLOCK".into()));
    assert_eq!(classify("IORING_OP_READ"), Check::Skip);
    assert_eq!(classify("snake_name"), Check::Skip);
    assert_eq!(classify("CPU"), Check::Skip);
}

#[test]
fn an_abi_struct_declared_in_its_macro_is_an_item() {
    assert_eq!(
        defined_name("    EpisodeRule = \"episode_rule\" {"),
        Some(Def::Body("EpisodeRule"))
    );
    assert_eq!(defined_name("    let x = \"episode_rule\" {"), None);
    assert_eq!(defined_name("    name = \"x\","), None);
}
