//! Statistics: keys, and live and dead bytes per data file.

use std::sync::atomic::Ordering;

use super::{Engine, lock, read};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileStats {
    /// Data file name.
    pub name: String,
    /// Whether the file is sealed (immutable).
    pub sealed: bool,
    /// Length in bytes.
    pub total_bytes: u64,
    /// Bytes of records that are the latest version of their key.
    pub live_bytes: u64,
    /// Everything else: overwritten and deleted records, tombstones, commit
    /// records, headers (and the history a retaining merge kept).
    pub dead_bytes: u64,
}

/// Engine statistics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stats {
    /// Number of keys (expired but not yet merged keys included).
    pub keys: u64,
    /// Sum of key lengths.
    pub key_bytes: u64,
    /// Live bytes over all files.
    pub live_bytes: u64,
    /// Dead bytes over all files (history a retaining merge kept included:
    /// it is not live).
    pub dead_bytes: u64,
    /// Per data file, in order.
    pub files: Vec<FileStats>,
    /// Highest sequence number stored.
    pub last_seq: u64,
    /// Merges completed since open.
    pub merges: u64,
}

/// What [`Engine::merge`] did.
impl Engine {
    /// Statistics: keys, live and dead bytes per data file.
    pub fn stats(&self) -> Stats {
        let (last_seq, active) = {
            let writer = lock(&self.shared.writer);
            (
                writer.last_seq,
                writer.active.as_ref().map(|a| (a.num, a.id, a.len)),
            )
        };
        let files = read(&self.shared.files);
        let keydir = read(&self.shared.keydir);
        let mut per_file: Vec<FileStats> = files
            .sealed
            .iter()
            .map(|meta| {
                file_stats(
                    meta.id.data_name(),
                    true,
                    meta.len,
                    keydir.live_bytes(meta.num),
                )
            })
            .collect();
        if let Some((num, id, len)) = active {
            per_file.push(file_stats(
                id.data_name(),
                false,
                len,
                keydir.live_bytes(num),
            ));
        }
        Stats {
            keys: keydir.len() as u64,
            key_bytes: keydir.key_bytes(),
            live_bytes: per_file.iter().map(|f| f.live_bytes).sum(),
            dead_bytes: per_file.iter().map(|f| f.dead_bytes).sum(),
            files: per_file,
            last_seq,
            merges: self.shared.merges.load(Ordering::SeqCst),
        }
    }
}

fn file_stats(name: String, sealed: bool, total_bytes: u64, live_bytes: u64) -> FileStats {
    FileStats {
        name,
        sealed,
        total_bytes,
        live_bytes,
        dead_bytes: total_bytes.saturating_sub(live_bytes),
    }
}
