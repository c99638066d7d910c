//! `engine-compare`: the storage benchmark. Runs the seed workload against
//! bitcask, redb and fjall in one run and prints Markdown tables (stdout,
//! and `--out`); progress goes to stderr. See `kvbench::compare`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use kvbench::compare::{Config, run};
use kvbench::probe::{Probe, probe_open};
use kvbench::run::Bounds;
use kvbench::store::EngineKind;

#[derive(Debug, Parser)]
#[command(about = "Compares bitcask with redb and fjall on the seed workload")]
struct Args {
    /// Keys of the main data set (4 KiB values).
    #[arg(long, default_value_t = 200_000)]
    keys: u64,
    /// Keys of the restart/memory data set (100 B values); 0 skips it.
    #[arg(long, default_value_t = 1_000_000)]
    big_keys: u64,
    /// Engines, comma-separated: bitcask,redb,fjall,fjall-kvsep.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "bitcask,redb,fjall,fjall-kvsep"
    )]
    engines: Vec<String>,
    /// Parent of the data directories (each is deleted after use).
    #[arg(long, default_value = "/work/bench-tmp")]
    work_dir: PathBuf,
    /// Reads per read measurement (over all threads).
    #[arg(long, default_value_t = 1_000_000)]
    read_ops: u64,
    /// Reader thread counts, comma-separated, each measured in turn.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    read_threads: Vec<usize>,
    /// Time cap of each read measurement, seconds.
    #[arg(long, default_value_t = 20)]
    read_secs: u64,
    /// Puts per synced-write measurement at most (default: min(keys, 20 000)).
    #[arg(long)]
    sync_ops: Option<u64>,
    /// Time cap of each synced-write measurement, seconds.
    #[arg(long, default_value_t = 30)]
    sync_secs: u64,
    /// Opens per cache state in the restart measurement.
    #[arg(long, default_value_t = 3)]
    probe_runs: usize,
    /// Also write the tables to this file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Internal: act as the open probe for this engine (used only when the
    /// `engine-probe` binary is missing; then no heap figure).
    #[arg(long, hide = true, requires = "probe_dir")]
    probe_engine: Option<String>,
    /// Internal: the data directory of `--probe-engine`.
    #[arg(long, hide = true)]
    probe_dir: Option<PathBuf>,
}

/// The probe program and whether it is `engine-probe` (with the counting
/// allocator) or this program in its internal probe mode (without).
fn probe_exe() -> Result<(PathBuf, bool)> {
    let exe = std::env::current_exe()?;
    let probe = exe.with_file_name("engine-probe");
    if probe.exists() {
        return Ok((probe, true));
    }
    eprintln!(
        "warning: {} not found (`cargo run --bin engine-compare` builds only this binary); \
         the key-directory heap figure will be missing. Build both with \
         `cargo build --release -p kvbench --features compare`.",
        probe.display()
    );
    Ok((exe, false))
}

fn probe_child(exe: &Path, counting: bool, kind: EngineKind, dir: &Path) -> Result<Probe> {
    let (engine_flag, dir_flag) = if counting {
        ("--engine", "--dir")
    } else {
        ("--probe-engine", "--probe-dir")
    };
    let output = Command::new(exe)
        .args([engine_flag, kind.label(), dir_flag])
        .arg(dir)
        .output()
        .with_context(|| format!("starting {}", exe.display()))?;
    if !output.status.success() {
        bail!(
            "probe of {} failed: {}",
            kind.label(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Probe::parse(&String::from_utf8_lossy(&output.stdout))
}

fn main() -> Result<()> {
    let args = Args::parse();
    if let (Some(engine), Some(dir)) = (&args.probe_engine, &args.probe_dir) {
        let kind = EngineKind::parse(engine).with_context(|| format!("unknown engine {engine}"))?;
        println!("{}", probe_open(kind, dir, None)?.to_line());
        return Ok(());
    }
    let mut cfg = Config::new(args.keys, args.work_dir.clone());
    cfg.engines = args
        .engines
        .iter()
        .map(|name| EngineKind::parse(name).with_context(|| format!("unknown engine {name}")))
        .collect::<Result<_>>()?;
    cfg.big_keys = args.big_keys;
    cfg.read_threads = args.read_threads.clone();
    cfg.reads = Bounds {
        ops: args.read_ops,
        time: Duration::from_secs(args.read_secs),
    };
    cfg.sync = Bounds {
        ops: args.sync_ops.unwrap_or(args.keys.min(20_000)),
        time: Duration::from_secs(args.sync_secs),
    };
    cfg.probe_runs = args.probe_runs;
    let (exe, counting) = probe_exe()?;
    let probe = |kind: EngineKind, dir: &Path| probe_child(&exe, counting, kind, dir);
    let tables = run(&cfg, &probe)?;
    let text: String = tables.iter().map(|t| t.to_markdown() + "\n").collect();
    print!("{text}");
    if let Some(out) = &args.out {
        std::fs::write(out, &text).with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}
