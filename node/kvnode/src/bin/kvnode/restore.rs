//! `kvnode restore`: seeds the data directory of one member of a new
//! cluster from a backup archive (`kvctl snapshot save FILE`). Run it once
//! per new member, with the same archive, `--initial-cluster` and
//! `--cluster-token` on each; then start every member with `kvnode run` on
//! its directory and the same `--initial-cluster` (no `--bootstrap` needed:
//! the restored members already form a cluster). The work is
//! [`kvnode::snapshot::backup::restore`].

use std::path::PathBuf;

use anyhow::{Context, bail};
use kvnode::StateMachineOptions;
use kvnode::snapshot::backup::{RestoreOptions, restore};

/// Flags of `kvnode restore`.
#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// The backup archive.
    #[arg(long)]
    from: PathBuf,
    /// The new member's data directory (must not exist, or be empty).
    #[arg(long)]
    data_dir: PathBuf,
    /// The new member's id (from 1).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    id: u64,
    /// The new cluster's members, all voters, as for `kvnode run`:
    /// `1=<client>/<peer>,2=...`.
    #[arg(long, alias = "initial-members")]
    initial_cluster: String,
    /// Mixed into the new cluster id: the same on every member; a different
    /// token makes a different cluster from the same backup.
    #[arg(long, default_value = "")]
    cluster_token: String,
}

/// Runs the restore and prints what it made.
pub async fn run(args: RestoreArgs) -> anyhow::Result<()> {
    let initial_cluster = crate::parse_cluster(&args.initial_cluster)?;
    if !initial_cluster.contains_key(&args.id) {
        bail!("--initial-cluster does not list member {}", args.id);
    }
    let restored = restore(RestoreOptions {
        archive: args.from.clone(),
        data_dir: args.data_dir.clone(),
        member_id: args.id,
        initial_cluster,
        cluster_token: args.cluster_token,
        state_machine: StateMachineOptions::default(),
    })
    .await
    .with_context(|| {
        format!(
            "restoring {} from {}",
            args.data_dir.display(),
            args.from.display()
        )
    })?;
    println!(
        "restored member {} into {}: cluster {:016x} (from cluster {:016x}), backup at log index {} \
         (term {}), {} files, {} bytes; start it with `kvnode run --id {} --data-dir {} ...`",
        args.id,
        args.data_dir.display(),
        restored.cluster_id,
        restored.source_cluster_id,
        restored.snapshot_last_log_id.index,
        restored.snapshot_last_log_id.leader_id.term,
        restored.files,
        restored.file_bytes,
        args.id,
        args.data_dir.display(),
    );
    Ok(())
}
