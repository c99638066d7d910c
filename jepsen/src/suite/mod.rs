//! `jepsen suite` and `jepsen controls`: fixed lists of `jepsen run`
//! scenarios, each run as a child process of this executable (its own
//! namespace, its own output directory `OUT/<scenario>/`), with a table and
//! the last line `N passed, N failed`.
//!
//! - `jepsen suite [--short]`: partition, kill, pause, clock (TTL
//!   workload), `ttl-leader-change` (TTL workload under
//!   restart-after-idle, leader kills, a leader partition, membership) and
//!   `exactly-once` (lost replies, leader kills, a short session idle
//!   window), `watch` (watchers on every member under partitions and
//!   kills), `lease` (leases kept alive and let go under leader
//!   partitions and kills), `redis-register` (the register workload
//!   through the members' Redis ports under leader partitions and kills)
//!   and `etcd-register` (the same through the members' etcd v3 ports)
//!   against the real kvnode, and power loss against a
//!   `lazy-disk` build. A scenario passes when its run passes.
//! - `jepsen controls [--only NAME]`: each negative control is a kvnode
//!   built with one `nc-*` feature that breaks it on purpose, run in the
//!   scenario that catches it. A control passes only when the **checker**
//!   rejects the run (an anomaly, a lost acknowledged write, or a
//!   durability anomaly: [`crate::durability`]); a run that fails for
//!   another reason (too few ops, a harness error) is not a catch. Exit 0 only if every control was caught. `--baseline` runs the
//!   same scenarios against builds without the `nc-*` feature, which must
//!   pass.
//!
//! A scenario that sets a test-only kvnode setting (`KVNODE_TEST_*`, or
//! `--session-idle-ms`) runs a build with kvnode's `testing` feature added
//! (`exactly-once` runs the `testing` variant): product builds do not have
//! the test hooks at all.
//!
//! Variant builds put their binaries in their own target directory,
//! `target/jepsen-builds` (`cargo build -p kvnode --features F --target-dir
//! target/jepsen-builds --config build.build-dir=<the workspace's target>`),
//! and the binary is copied to `target/jepsen-builds/kvnode-<variant>`, so
//! the real `target/debug/kvnode` is never replaced. Their intermediate
//! files go to the workspace's own build directory (`CARGO_TARGET_DIR` or
//! `target`), where the workspace's builds left every dependency with the
//! same features (the `workspace-hack` crate makes `-p kvnode` resolve them
//! as `--workspace` does): a variant recompiles only the workspace crates.
//! They build without the variables `cargo test` sets about the package
//! under test, which some build scripts track, and with the caller's
//! `CARGO_INCREMENTAL` (a different setting would count as a changed
//! profile and rebuild the shared crates back and forth). `JEPSEN_CARGO`
//! (split on spaces, default `cargo`) is the cargo command, e.g. `flock
//! LOCK cargo` on a shared machine.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

mod scenarios;
pub use scenarios::{
    Build, DROP_REPLY_ENV, DROP_REPLY_PERCENT, ETCD_REGISTER_CONCURRENCY, ETCD_REGISTER_NEMESIS,
    ETCD_REGISTER_SHORT_SECONDS, EXACTLY_ONCE_SESSION_IDLE_MS, LEASE_FAULT_HOLD, LEASE_NEMESIS,
    LEASE_TTL_MAX, LEASE_TTL_MIN, REDIS_REGISTER_CONCURRENCY, REDIS_REGISTER_NEMESIS,
    SNAPSHOT_EVERY_ENTRIES_CONTROL, SNAPSHOT_EVERY_ENTRIES_ENV, SNAPSHOT_LOG_KEEP_ENV,
    STALE_BUILD_ENV, Scenario, TTL_LEADER_CHANGE_IDLE, TTL_LEADER_CHANGE_TTL_MAX,
    TTL_LEADER_CHANGE_TTL_MIN, WATCH_NEMESIS, control_scenarios, suite_scenarios,
};

/// Extra time a scenario's run may take beyond its `--time` (start-up,
/// heal, final read, checker) before it is killed and counted failed.
pub const SCENARIO_SLACK: Duration = Duration::from_secs(240);
/// Poll interval while waiting for a scenario's run.
const WAIT_POLL: Duration = Duration::from_millis(500);
/// Target directory of the variant builds, relative to the workspace.
pub const BUILDS_DIR: &str = "target/jepsen-builds";
/// The environment variable that names the cargo command.
pub const CARGO_ENV: &str = "JEPSEN_CARGO";

/// Flags of `jepsen suite`.
#[derive(Debug, Clone, clap::Args)]
pub struct SuiteArgs {
    /// The short suite (30–40 s per scenario, for CI); otherwise 5 minutes
    /// per scenario.
    #[arg(long)]
    pub short: bool,
    /// Output directory: one sub-directory per scenario.
    #[arg(long)]
    pub out: PathBuf,
    /// Run only the scenario of this name.
    #[arg(long)]
    pub only: Option<String>,
    #[command(flatten)]
    pub common: BuildArgs,
}

/// Flags of `jepsen controls`.
#[derive(Debug, Clone, clap::Args)]
pub struct ControlsArgs {
    /// Output directory: one sub-directory per control.
    #[arg(long)]
    pub out: PathBuf,
    /// Run only the control of this name (e.g. nc-local-reads).
    #[arg(long)]
    pub only: Option<String>,
    /// Run the controls' scenarios against builds without the `nc-*`
    /// features instead: each must pass.
    #[arg(long)]
    pub baseline: bool,
    #[command(flatten)]
    pub common: BuildArgs,
}

/// Where builds come from.
#[derive(Debug, Clone, clap::Args)]
pub struct BuildArgs {
    /// The workspace to build kvnode variants in (default: the one this
    /// jepsen was built from).
    #[arg(long)]
    pub workspace: Option<PathBuf>,
    /// The real kvnode (default: `kvnode` next to this executable).
    #[arg(long, env = "KVNODE_BIN")]
    pub kvnode_bin: Option<PathBuf>,
    /// Seed of every scenario (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Use the variant binaries already in target/jepsen-builds (from an
    /// earlier suite or controls run) instead of building them.
    #[arg(long)]
    pub no_build: bool,
}

/// One scenario's result.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The scenario's name.
    pub name: String,
    /// The build it ran.
    pub build: String,
    /// Whether the run's checker rejected the history.
    pub checker_rejected: bool,
    /// The run's exit code (`None`: killed or did not start).
    pub exit: Option<i32>,
    /// Whether it passed (as a scenario or as a control).
    pub passed: bool,
    /// Anomalies by kind and lost writes, or why it did not pass.
    pub note: String,
    /// Seconds it took.
    pub seconds: f64,
}

/// `jepsen suite`: exit 0 when every scenario passed.
pub fn suite(args: SuiteArgs) -> anyhow::Result<ExitCode> {
    let scenarios = filter(suite_scenarios(args.short), args.only.as_deref())?;
    run_all(&scenarios, &args.out, &args.common)
}

/// `jepsen controls`: exit 0 when every control was caught (or, with
/// `--baseline`, every baseline passed).
pub fn controls(args: ControlsArgs) -> anyhow::Result<ExitCode> {
    let scenarios = filter(control_scenarios(args.baseline), args.only.as_deref())?;
    run_all(&scenarios, &args.out, &args.common)
}

fn filter(scenarios: Vec<Scenario>, only: Option<&str>) -> anyhow::Result<Vec<Scenario>> {
    let Some(only) = only else {
        return Ok(scenarios);
    };
    let names: Vec<_> = scenarios.iter().map(|s| s.name).collect();
    let kept: Vec<_> = scenarios.into_iter().filter(|s| s.name == only).collect();
    if kept.is_empty() {
        bail!(
            "--only {only:?}: no such scenario; known: {}",
            names.join(", ")
        );
    }
    Ok(kept)
}

fn run_all(scenarios: &[Scenario], out: &Path, common: &BuildArgs) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let workspace = match &common.workspace {
        Some(dir) => dir.clone(),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .context("the jepsen crate has no parent directory")?
            .to_path_buf(),
    };
    let real = match &common.kvnode_bin {
        Some(path) => path.clone(),
        None => crate::run::default_kvnode_bin()?,
    };
    let seed = common.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    // Build every variant first (one cargo at a time), then run.
    let mut binaries = Vec::new();
    for scenario in scenarios {
        let bin = match scenario.build {
            Build::Real => real.clone(),
            Build::Features(features) if common.no_build => {
                let copy = variant_path(&workspace, features);
                let got = crate::nemesis::power::build_features(&copy)?;
                if got.iter().map(String::as_str).ne(features.iter().copied()) {
                    bail!(
                        "--no-build: {} reports features [{}], wanted [{}]",
                        copy.display(),
                        got.join(","),
                        features.join(",")
                    );
                }
                copy
            }
            Build::Features(features) => build_variant(&workspace, features)?,
        };
        binaries.push(bin);
    }
    let mut outcomes = Vec::new();
    for (scenario, bin) in scenarios.iter().zip(&binaries) {
        eprintln!(
            "== {} ({} s, nemesis {}, kvnode {})",
            scenario.name,
            scenario.seconds,
            scenario.nemesis,
            scenario.build.label()
        );
        let outcome = run_scenario(scenario, bin, &out.join(scenario.name), seed)?;
        eprintln!(
            "== {}: {} ({})",
            outcome.name,
            if outcome.passed { "PASS" } else { "FAIL" },
            outcome.note
        );
        if !outcome.passed {
            // CI keeps only this process's output: show why.
            print_log_tail(&out.join(format!("{}.log", scenario.name)));
        }
        outcomes.push(outcome);
    }
    let table = table(&outcomes);
    std::fs::write(out.join("suite.txt"), &table).context("writing suite.txt")?;
    print!("{table}");
    Ok(if outcomes.iter().all(|o| o.passed) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Lines of a failed scenario's log printed to stderr.
pub const FAILED_LOG_TAIL_LINES: usize = 60;

/// Prints the last [`FAILED_LOG_TAIL_LINES`] lines of `log` (the run's
/// summary, with its shortfalls and the checker's verdict) to stderr.
fn print_log_tail(log: &Path) {
    match std::fs::read_to_string(log) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(FAILED_LOG_TAIL_LINES);
            eprintln!("-- last {} lines of {}:", lines.len() - from, log.display());
            for line in &lines[from..] {
                eprintln!("   {line}");
            }
            eprintln!("-- end of {}", log.display());
        }
        Err(err) => eprintln!("-- cannot read {}: {err}", log.display()),
    }
}

/// Builds kvnode with `features` into [`BUILDS_DIR`] and copies it to
/// `kvnode-<features joined by +>`; returns the copy.
pub fn build_variant(workspace: &Path, features: &[&str]) -> anyhow::Result<PathBuf> {
    let target = workspace.join(BUILDS_DIR);
    let cargo = std::env::var(CARGO_ENV).unwrap_or_else(|_| "cargo".to_string());
    let mut words = cargo.split_whitespace();
    let program = words.next().context("JEPSEN_CARGO is empty")?;
    let feature_list = features.join(",");
    eprintln!(
        "== building kvnode --features {feature_list} into {}",
        target.display()
    );
    let mut command = Command::new(program);
    // Under `cargo test` (the controls test) this process carries the test
    // package's CARGO_MANIFEST_DIR, CARGO_PKG_*, ...: build scripts that
    // read one (ring reads CARGO_MANIFEST_DIR) would count as changed and
    // rebuild half the dependencies that `.ci/run`'s product build left in
    // the same target directory.
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(is_test_run_cargo_var) {
            command.env_remove(&name);
        }
    }
    command.args(words).args([
        "build",
        "-p",
        "kvnode",
        "--features",
        &feature_list,
        "--target-dir",
    ]);
    command.arg(&target);
    // A build directory the caller named (CARGO_BUILD_BUILD_DIR) stays
    // theirs; otherwise the workspace's own target directory.
    if std::env::var_os("CARGO_BUILD_BUILD_DIR").is_none() {
        let build_dir = std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| workspace.join("target"), |dir| workspace.join(dir));
        command.arg("--config").arg(format!(
            "build.build-dir={}",
            toml_string(&build_dir.to_string_lossy())
        ));
    }
    let status = command
        .current_dir(workspace)
        .status()
        .with_context(|| format!("running {cargo} build"))?;
    if !status.success() {
        bail!("building kvnode --features {feature_list} failed: {status}");
    }
    let built = target.join("debug").join("kvnode");
    let copy = variant_path(workspace, features);
    std::fs::copy(&built, &copy)
        .with_context(|| format!("copying {} to {}", built.display(), copy.display()))?;
    let got = crate::nemesis::power::build_features(&copy)?;
    if got.iter().map(String::as_str).ne(features.iter().copied()) {
        bail!(
            "{} reports features [{}], wanted [{feature_list}]",
            copy.display(),
            got.join(",")
        );
    }
    Ok(copy)
}

/// `text` as a TOML basic string (for a `--config KEY=VALUE` argument).
fn toml_string(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(quoted, "\\u{:04X}", u32::from(c));
            }
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

/// Whether `name` is one of the variables cargo sets for a test process it
/// runs (about the package under test), not one a user sets to steer cargo.
fn is_test_run_cargo_var(name: &str) -> bool {
    const SET_FOR_A_TEST: &[&str] = &[
        "CARGO_MANIFEST_DIR",
        "CARGO_MANIFEST_PATH",
        "CARGO_CRATE_NAME",
        "CARGO_BIN_NAME",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
    ];
    SET_FOR_A_TEST.contains(&name)
        || name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_BIN_EXE_")
}

/// Where the copy of the build with `features` lives.
pub fn variant_path(workspace: &Path, features: &[&str]) -> PathBuf {
    workspace
        .join(BUILDS_DIR)
        .join(format!("kvnode-{}", features.join("+")))
}

/// Runs one scenario as `jepsen run` in a child process.
pub fn run_scenario(
    scenario: &Scenario,
    kvnode_bin: &Path,
    out: &Path,
    seed: u64,
) -> anyhow::Result<Outcome> {
    if out.exists() {
        bail!("{} exists: give the suite a new --out", out.display());
    }
    let exe = std::env::current_exe().context("finding this executable")?;
    let parent = out.parent().unwrap_or(Path::new("."));
    let log_path = parent.join(format!("{}.log", scenario.name));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let started = Instant::now();
    let mut command = Command::new(exe);
    command
        .arg("run")
        .args(["--workload", scenario.workload])
        .args(["--nemesis", scenario.nemesis])
        .args(["--time", &format!("{}s", scenario.seconds)])
        .args(["--seed", &seed.to_string()])
        .arg("--out")
        .arg(out)
        .arg("--kvnode-bin")
        .arg(kvnode_bin)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    command.args(&scenario.args);
    for (name, value) in &scenario.env {
        command.env(name, value);
    }
    let mut child = command.spawn().context("starting jepsen run")?;
    let limit = Duration::from_secs(scenario.seconds) + SCENARIO_SLACK;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(WAIT_POLL);
    };
    let exit = status.and_then(|s| s.code());
    let verdict = read_verdict(out);
    // `not-linearizable` (register, set), `not-valid (ttl)`, `not-valid`
    // (exactly-once, watch): the checker found an anomaly or a lost write.
    let checker_rejected = verdict
        .as_ref()
        .is_some_and(|v| v.verdict.starts_with("not-"));
    let passed = if scenario.expect_caught {
        checker_rejected
    } else {
        exit == Some(0)
    };
    let mut note = match &verdict {
        Some(v) => v.describe(),
        None => "no checker.json".to_string(),
    };
    if !passed {
        let why = match exit {
            None => format!("killed after {} s", limit.as_secs()),
            Some(0) if scenario.expect_caught => "NOT CAUGHT: the run passed".to_string(),
            Some(code) => format!("exit {code}; see {}", log_path.display()),
        };
        note = format!("{note}; {why}");
    }
    Ok(Outcome {
        name: scenario.name.to_string(),
        build: scenario.build.label(),
        checker_rejected,
        exit,
        passed,
        note,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The parts of `checker.json` the table shows.
#[derive(Debug)]
struct Verdict {
    verdict: String,
    anomalies: Vec<(String, usize)>,
    lost_writes: usize,
}

impl Verdict {
    fn describe(&self) -> String {
        let mut out = self.verdict.clone();
        for (kind, count) in &self.anomalies {
            let _ = write!(out, ", {count} {kind}");
        }
        if self.lost_writes > 0 {
            let _ = write!(out, ", {} lost writes", self.lost_writes);
        }
        out
    }
}

fn read_verdict(out: &Path) -> Option<Verdict> {
    let text = std::fs::read_to_string(out.join("checker.json")).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    // The register and set checkers write `verdict`; the TTL checker
    // writes `valid` (its anomalies are listed the same way).
    let verdict = match json.get("verdict").and_then(|v| v.as_str()) {
        Some(verdict) => verdict.to_string(),
        None if json.get("valid")?.as_bool()? => "valid (ttl)".to_string(),
        None => "not-valid (ttl)".to_string(),
    };
    let mut anomalies: Vec<(String, usize)> = Vec::new();
    // The TTL and exactly-once checkers list at most 50 anomalies but
    // count every one by kind.
    if let Some(kinds) = json.get("anomalies_by_kind").and_then(|k| k.as_object()) {
        // (The watch checker lists every kind, zeros included.)
        for (kind, count) in kinds {
            let count = count.as_u64().unwrap_or(0) as usize;
            if count > 0 {
                anomalies.push((kind.clone(), count));
            }
        }
    }
    if json.get("anomalies_by_kind").is_none() {
        for anomaly in json
            .get(crate::durability::JSON_FIELD)
            .and_then(|r| r.as_array())
            .into_iter()
            .flatten()
        {
            let kind = anomaly
                .get("kind")
                .and_then(|k| k.as_str())
                .unwrap_or("durability");
            match anomalies.iter_mut().find(|(k, _)| k == kind) {
                Some((_, count)) => *count += 1,
                None => anomalies.push((kind.to_string(), 1)),
            }
        }
    }
    for anomaly in json
        .get("anomalies")
        .and_then(|a| a.as_array())
        .into_iter()
        .flatten()
        .filter(|_| json.get("anomalies_by_kind").is_none())
    {
        let kind = anomaly
            .get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or("anomaly")
            .to_string();
        match anomalies.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, count)) => *count += 1,
            None => anomalies.push((kind, 1)),
        }
    }
    // The revision checks count every kind, zeros included.
    for (kind, count) in json
        .get("revisions")
        .and_then(|r| r.get("anomalies_by_kind"))
        .and_then(|k| k.as_object())
        .into_iter()
        .flatten()
    {
        let count = count.as_u64().unwrap_or(0) as usize;
        if count > 0 {
            anomalies.push((kind.clone(), count));
        }
    }
    let lost_writes = json
        .get("lost_writes")
        .and_then(|l| l.get("lost"))
        .and_then(|l| l.as_array())
        .map_or(0, Vec::len);
    Some(Verdict {
        verdict,
        anomalies,
        lost_writes,
    })
}

/// The results table; the last line is `N passed, N failed`.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<22} {:<28} {:>6} {:>8}  {:<6} note",
        "scenario", "kvnode", "exit", "seconds", "result"
    );
    for o in outcomes {
        let _ = writeln!(
            out,
            "{:<22} {:<28} {:>6} {:>8.1}  {:<6} {}",
            o.name,
            o.build,
            o.exit.map_or("-".to_string(), |c| c.to_string()),
            o.seconds,
            if o.passed { "PASS" } else { "FAIL" },
            o.note
        );
    }
    let passed = outcomes.iter().filter(|o| o.passed).count();
    let _ = writeln!(out, "{passed} passed, {} failed", outcomes.len() - passed);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variant_builds_drop_the_test_package_variables_and_keep_the_users() {
        for dropped in [
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_BIN_EXE_kvnode",
            "CARGO_TARGET_TMPDIR",
        ] {
            assert!(is_test_run_cargo_var(dropped), "{dropped}");
        }
        for kept in [
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_JOBS",
            "CARGO_INCREMENTAL",
            "CARGO_NET_OFFLINE",
            "PATH",
        ] {
            assert!(!is_test_run_cargo_var(kept), "{kept}");
        }
    }

    #[test]
    fn a_build_directory_is_quoted_for_cargo_config() {
        assert_eq!(toml_string("/work/main/target"), r#""/work/main/target""#);
        assert_eq!(toml_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(toml_string("a\nb"), r#""a\u000Ab""#);
    }

    #[test]
    fn the_table_counts_every_anomaly_by_kind() {
        let dir = std::env::temp_dir().join(format!("jepsen-verdict-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("checker.json"),
            r#"{"valid": false, "anomalies_by_kind": {"early-expiry": 57},
                "anomalies": [{"kind": "early-expiry"}]}"#,
        )
        .unwrap();
        let verdict = read_verdict(&dir).unwrap();
        assert_eq!(verdict.describe(), "not-valid (ttl), 57 early-expiry");
        std::fs::write(
            dir.join("checker.json"),
            r#"{"verdict": "not-linearizable", "anomalies": [{"kind": "stale-read"}],
                "revisions": {"anomalies_by_kind": {"revision-order": 2, "duplicate-revision": 0}}}"#,
        )
        .unwrap();
        let verdict = read_verdict(&dir).unwrap();
        assert_eq!(
            verdict.describe(),
            "not-linearizable, 1 stale-read, 2 revision-order"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
