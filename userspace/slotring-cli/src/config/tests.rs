//! Tests of the settings, their layers and their parsers.

use std::path::Path;

use super::*;

/// `run`'s settings parsed from `args` the way `main` parses them.
fn given(args: &[&str]) -> Result<(RunConfig, ArgMatches), ConfigError> {
    let cmd = without_env(RunConfig::augment_args(Command::new("run")));
    let argv = std::iter::once("run").chain(args.iter().copied());
    let m = cmd
        .clone()
        .try_get_matches_from(argv)
        .map_err(|e| command_line_error(e, &cmd).expect("a value error"))?;
    Ok((RunConfig::from_arg_matches(&m).unwrap(), m))
}

#[test]
fn units() {
    assert_eq!(parse_bytes("64MiB"), Some(64 << 20));
    assert_eq!(parse_bytes("1g"), Some(1 << 30));
    assert_eq!(parse_bytes("50MB"), Some(50_000_000));
    assert_eq!(parse_bytes("4096"), Some(4096));
    assert_eq!(parse_bytes("1.5KiB"), Some(1536));
    assert_eq!(parse_bytes("fast"), None);
    assert_eq!(parse_bytes("-1"), None);
    assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
    assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
    assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
    assert_eq!(parse_duration("soon"), None);
}

#[test]
fn unequal_scan_widths_name_the_scans() {
    let (mut c, m) = given(&["--scans", "5", "--scan-threads", "8, 2,1"]).unwrap();
    c.overlay(&m, &|_| None, None).unwrap();
    assert_eq!(c.scans, 3);
    assert_eq!(
        (c.scan_width(0), c.scan_width(1), c.scan_width(2)),
        (8, 2, 1)
    );
    for bad in ["0", "8,,1", "65", "a"] {
        assert!(given(&["--scan-threads", bad]).is_err(), "{bad}");
    }
}

#[test]
fn zero_scans_is_a_run_of_the_short_queries_alone_and_65_is_refused() {
    let (mut c, m) = given(&["--scans", "0"]).unwrap();
    c.overlay(&m, &|_| None, None).unwrap();
    assert_eq!(c.scans, 0);
    assert_eq!(given(&["--scans", "64"]).unwrap().0.scans, 64);
    for bad in ["65", "a", ""] {
        let e = given(&["--scans", bad]).unwrap_err().to_string();
        assert!(
            e.contains("--scans") && e.contains(&format!("`{bad}`")),
            "{bad}: {e}"
        );
    }
}

#[test]
fn layers_override_in_order() {
    let file = ConfigFile::parse(
        "max_local_read_bandwidth = \"10MiB\"\nscans = 2\nduration = \"3s\"\n",
        Path::new("x.toml"),
    )
    .unwrap();
    let env = |v: &str| (v == "SLOTRING_SCANS").then(|| "5".to_owned());
    let (mut c, m) = given(&["--duration", "4s"]).unwrap();
    c.overlay(&m, &env, Some(&file)).unwrap();
    assert_eq!(c.max_local_read_bandwidth, 10 << 20);
    assert_eq!(c.scans, 5);
    assert_eq!(c.scan_width(4), 4, "one width for every scan");
    assert_eq!(c.duration, Duration::from_secs(4));
    assert_eq!(c.concurrent_threads_scheduler, Scheduler::MaxMinFair);
}

#[test]
fn flags_take_booleans_from_the_other_layers() {
    let file = ConfigFile::parse("keep = true\nprobes = \"off\"\n", Path::new("f.toml")).unwrap();
    let env = |v: &str| (v == "SLOTRING_LEASE_PARKING").then(|| "no".to_owned());
    let (mut c, m) = given(&[]).unwrap();
    c.overlay(&m, &env, Some(&file)).unwrap();
    assert!(c.keep && !c.lease_parking && !c.probes);
    // The command line's `--no-probes` wins over the file's `probes = true`.
    let file = ConfigFile::parse("probes = true\n", Path::new("f.toml")).unwrap();
    let (mut c, m) = given(&["--no-probes", "--listen", ""]).unwrap();
    c.overlay(&m, &|_| None, Some(&file)).unwrap();
    assert!(!c.probes);
    assert_eq!(c.listen, None);
}

#[test]
fn errors_name_option_value_and_origin() {
    let env = |v: &str| (v == "SLOTRING_CONCURRENT_THREADS_SCHEDULER").then(|| "fifo".to_owned());
    let (mut c, m) = given(&[]).unwrap();
    let e = c.overlay(&m, &env, None).unwrap_err().to_string();
    assert!(e.contains("--concurrent-threads-scheduler"), "{e}");
    assert!(e.contains("`fifo`"), "{e}");
    assert!(
        e.contains("environment variable SLOTRING_CONCURRENT_THREADS_SCHEDULER"),
        "{e}"
    );

    let e = given(&["--max-local-read-bandwidth", "lots"])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--max-local-read-bandwidth") && e.contains("`lots`"),
        "{e}"
    );

    let e = ConfigFile::parse("max_read = 1\n", Path::new("c.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown setting `max_read` in c.toml"), "{e}");
}

#[test]
fn adaptive_budget_toggles_and_layers() {
    let on = |v: &str| (v == "SLOTRING_ADAPTIVE_BUDGET").then(|| "true".to_owned());
    let (mut c, m) = given(&[]).unwrap();
    c.overlay(&m, &|_| None, None).unwrap();
    assert!(!c.adaptive_budget, "static by default");
    let (mut c, m) = given(&[]).unwrap();
    c.overlay(&m, &on, None).unwrap();
    assert!(c.adaptive_budget, "from the environment");
    let (mut c, m) = given(&["--no-adaptive-budget"]).unwrap();
    c.overlay(&m, &on, None).unwrap();
    assert!(!c.adaptive_budget, "the command line beats the environment");
    let (mut c, m) = given(&["--no-adaptive-budget", "--adaptive-budget"]).unwrap();
    c.overlay(&m, &|_| None, None).unwrap();
    assert!(c.adaptive_budget, "the last flag wins");
    let (mut c, m) = given(&["--adaptive-budget", "--no-adaptive-budget"]).unwrap();
    c.overlay(&m, &|_| None, None).unwrap();
    assert!(!c.adaptive_budget, "the last flag wins");
    let file = ConfigFile::parse("adaptive_budget = true\n", Path::new("f.toml")).unwrap();
    let (mut c, m) = given(&[]).unwrap();
    c.overlay(&m, &|_| None, Some(&file)).unwrap();
    assert!(c.adaptive_budget, "from the file");
}

#[test]
fn an_error_prints_each_cause_once() {
    let file = ConfigFile::parse("lease_parking = \"maybe\"\n", Path::new("f.toml")).unwrap();
    let (mut c, m) = given(&[]).unwrap();
    let e = c.overlay(&m, &|_| None, Some(&file)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid value `maybe` for --lease-parking (from config file f.toml)"
    );
    let cause = std::error::Error::source(&e).unwrap().to_string();
    assert_eq!(cause, "expected true or false");
}

#[test]
fn slotring_variables_are_checked() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt as _;
    let var = |n: &str, v: &[u8]| (OsString::from(n), OsString::from_vec(v.to_vec()));
    assert!(
        check_environment([
            var("SLOTRING_DURATION", b"1s"),
            var("SLOTRING_BENCH_DIR", b"\xff"),
            var("PATH", b"\xff"),
        ])
        .is_ok()
    );
    let e = check_environment([var("SLOTRING_DURATON", b"1s")]).unwrap_err();
    assert!(
        e.to_string()
            .contains("unknown environment variable SLOTRING_DURATON"),
        "{e}"
    );
    let e = check_environment([var("SLOTRING_SCANS", b"\xff")]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "environment variable SLOTRING_SCANS: the value is not UTF-8"
    );
}

#[test]
fn rates_the_throttler_cannot_hold_are_refused() {
    assert_eq!(bandwidth("64TiB"), Err(BYTES_S));
    assert_eq!(bandwidth("63TiB"), Ok(63 << 40));
}

#[test]
fn defaults_resolve() {
    let c = RunConfig::default();
    assert_eq!(c.file_size, 1 << 30);
    assert_eq!(c.engine, EngineKind::IoUring);
    assert_eq!(c.listen, Some("127.0.0.1:9464".parse().unwrap()));
}
