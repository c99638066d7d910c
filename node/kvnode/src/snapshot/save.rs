//! SaveSnapshot's file side (a backup to a client): open the member's
//! current snapshot — its manifest and every file it lists, held open for
//! the stream's life, so a newer snapshot pruning the directory meanwhile
//! does not matter (open descriptors keep unlinked files) — then stream the
//! files in chunks of [`SAVE_CHUNK_BYTES`], checking each file's length and
//! CRC-32 against the manifest. The gRPC service (`server::cluster`) builds
//! the first message and hands the stream to tonic.

use std::sync::Arc;
use std::time::Duration;

use kvproto::cluster::v1::{SaveSnapshotResponse, SnapshotChunk, save_snapshot_response};
use kvproto::kv::v1::Header;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use vfs::VfsFile;

use crate::snapshot::{
    MANIFEST_BYTES_MAX, Manifest, SnapshotError, convert, node_vfs, read_capped,
};
use crate::state_machine::StateMachine;

/// Bytes of file contents per SaveSnapshot chunk (well below the gRPC
/// message limit of 4 MiB).
pub const SAVE_CHUNK_BYTES: usize = 1024 * 1024;
/// SaveSnapshot messages held ahead of a slow client (with
/// [`SAVE_CHUNK_BYTES`], the stream's memory bound).
pub const SAVE_STREAM_BUFFER: usize = 4;
/// How long one SaveSnapshot message may wait for the client to take it
/// before the stream is abandoned.
pub const SAVE_SEND_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts at opening the current snapshot's files (a newer snapshot can
/// prune the directory between finding it and opening its files).
pub const SAVE_OPEN_ATTEMPTS_MAX: usize = 5;

/// A snapshot whose files are open (and so readable to the end, whatever
/// happens to its directory).
pub(crate) struct OpenedSnapshot {
    /// Its manifest.
    pub(crate) manifest: Manifest,
    /// The `MANIFEST` file's bytes.
    pub(crate) manifest_bytes: Vec<u8>,
    /// Every file of the manifest, open, in manifest order.
    files: Vec<Arc<dyn VfsFile>>,
}

/// Opens the current snapshot (see [`open_current_snapshot`]) off the
/// async threads.
pub(crate) async fn open_current(state_machine: &StateMachine) -> Result<OpenedSnapshot, Status> {
    let state_machine = state_machine.clone();
    tokio::task::spawn_blocking(move || open_current_snapshot(&state_machine))
        .await
        .map_err(|err| Status::internal(format!("open task: {err}")))?
}

/// Streams `opened`: the manifest message (answered with `header`), then
/// every file in manifest order, on a task of its own; at most
/// [`SAVE_STREAM_BUFFER`] messages are held ahead of the client.
pub(crate) fn spawn_stream(
    header: Header,
    opened: OpenedSnapshot,
) -> ReceiverStream<Result<SaveSnapshotResponse, Status>> {
    let OpenedSnapshot {
        manifest,
        manifest_bytes,
        files,
    } = opened;
    let first = SaveSnapshotResponse {
        part: Some(save_snapshot_response::Part::Manifest(
            convert::client_manifest(header, &manifest, manifest_bytes),
        )),
    };
    let (tx, rx) = mpsc::channel(SAVE_STREAM_BUFFER);
    tokio::spawn(stream_snapshot(tx, first, manifest, files));
    ReceiverStream::new(rx)
}

/// Opens the current snapshot's manifest and every file it lists (at most
/// [`SAVE_OPEN_ATTEMPTS_MAX`] tries, should it be pruned in between).
fn open_current_snapshot(state_machine: &StateMachine) -> Result<OpenedSnapshot, Status> {
    let mut last_error = String::new();
    for _ in 0..SAVE_OPEN_ATTEMPTS_MAX {
        let Some(snapshot) = state_machine.current_snapshot() else {
            return Err(Status::failed_precondition("this member has no snapshot"));
        };
        let handle = snapshot.snapshot;
        let opened = (|| -> Result<OpenedSnapshot, SnapshotError> {
            let manifest_bytes = read_capped(&handle.manifest_path(), MANIFEST_BYTES_MAX)?;
            let manifest =
                Manifest::decode(&manifest_bytes).map_err(|reason| SnapshotError::Malformed {
                    path: handle.manifest_path(),
                    reason,
                })?;
            let mut files = Vec::with_capacity(manifest.files.len());
            for file in &manifest.files {
                let path = handle.file_path(&file.name)?;
                // Through the node's vfs (the lazy disk in a lazy-disk build).
                let opened = node_vfs().open(&path).map_err(|source| SnapshotError::Io {
                    op: "open",
                    path: path.clone(),
                    source,
                })?;
                files.push(opened);
            }
            Ok(OpenedSnapshot {
                manifest,
                manifest_bytes,
                files,
            })
        })();
        match opened {
            Ok(opened) => return Ok(opened),
            // Pruned in between: take the newer one.
            Err(SnapshotError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                last_error = source.to_string();
            }
            Err(err) => return Err(Status::internal(format!("the current snapshot: {err}"))),
        }
    }
    Err(Status::unavailable(format!(
        "the current snapshot changed {SAVE_OPEN_ATTEMPTS_MAX} times while being opened: {last_error}"
    )))
}

/// Sends the manifest message, then every file's bytes, checking each
/// file's length and CRC-32 against the manifest; a mismatch ends the
/// stream with DATA_LOSS.
async fn stream_snapshot(
    tx: mpsc::Sender<Result<SaveSnapshotResponse, Status>>,
    first: SaveSnapshotResponse,
    manifest: Manifest,
    files: Vec<Arc<dyn VfsFile>>,
) {
    let send = async |message: Result<SaveSnapshotResponse, Status>| {
        matches!(
            tokio::time::timeout(SAVE_SEND_TIMEOUT, tx.send(message)).await,
            Ok(Ok(()))
        )
    };
    if !send(Ok(first)).await {
        return;
    }
    for (entry, file) in manifest.files.iter().zip(files) {
        let mut hasher = crc32fast::Hasher::new();
        let mut offset = 0u64;
        loop {
            let want = (entry.len - offset).min(SAVE_CHUNK_BYTES as u64) as usize;
            let reader = file.clone();
            let read = tokio::task::spawn_blocking(move || {
                let mut data = vec![0u8; want];
                reader.read_exact_at(&mut data, offset).map(|()| data)
            })
            .await
            .unwrap_or_else(|err| Err(std::io::Error::other(err.to_string())));
            let data = match read {
                Ok(data) => data,
                Err(err) => {
                    let _ = send(Err(Status::data_loss(format!(
                        "snapshot file {} is shorter than its {} bytes: {err}",
                        entry.name, entry.len
                    ))))
                    .await;
                    return;
                }
            };
            hasher.update(&data);
            let chunk = SaveSnapshotResponse {
                part: Some(save_snapshot_response::Part::Chunk(SnapshotChunk {
                    file_name: entry.name.clone(),
                    offset_bytes: offset,
                    data: data.into(),
                })),
            };
            offset += want as u64;
            if !send(Ok(chunk)).await {
                return;
            }
            if offset >= entry.len {
                break;
            }
        }
        let crc = hasher.finalize();
        if crc != entry.crc {
            let _ = send(Err(Status::data_loss(format!(
                "snapshot file {} has crc32 {crc:08x}, its manifest says {:08x}",
                entry.name, entry.crc
            ))))
            .await;
            return;
        }
    }
}
