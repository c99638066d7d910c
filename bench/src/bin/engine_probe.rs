//! `engine-probe --engine NAME --dir DIR`: opens one engine on an existing
//! data directory and prints one `PROBE ...` line (open time, heap kept by
//! the open, resident-set growth, keys). Started by `engine-compare` in a
//! fresh process per measurement; it counts heap bytes with a counting
//! global allocator around `System`.

use std::alloc::System;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use kvbench::probe::probe_open;
use kvbench::store::EngineKind;
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn net_allocated() -> i64 {
    let stats = GLOBAL.stats();
    stats.bytes_allocated as i64 - stats.bytes_deallocated as i64
}

#[derive(Debug, Parser)]
#[command(about = "Measures one engine's open on an existing data directory")]
struct Args {
    /// bitcask, redb, fjall or fjall-kvsep.
    #[arg(long)]
    engine: String,
    /// The data directory.
    #[arg(long)]
    dir: PathBuf,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let kind = EngineKind::parse(&args.engine)
        .with_context(|| format!("unknown engine {}", args.engine))?;
    let probe = probe_open(kind, &args.dir, Some(net_allocated))?;
    println!("{}", probe.to_line());
    Ok(())
}
