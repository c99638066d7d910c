//! The sending side of a snapshot transfer (the leader), over the peer
//! network's `TransferSnapshot` stream: offer the manifest, answer each of
//! the follower's `need` messages with the files and file tails it lacks
//! (read from the snapshot's files, in crc32-checked chunks of at most
//! [`SNAPSHOT_CHUNK_BYTES`], at most [`SNAPSHOT_STREAM_CHUNKS_MAX`] queued),
//! then `done`, until it answers `installed`. An `impl PeerClient` block:
//! the connection, identity and deadlines are [`crate::raft::network`]'s.

// The error types are openraft's (its `RaftNetwork` trait fixes them).
#![allow(clippy::result_large_err)]

use std::time::Duration;

use kvproto::raft::v1::{
    FileRange, SnapshotChunk, SnapshotDone, SnapshotOffer, TransferSnapshotRequest,
    TransferSnapshotResponse, transfer_snapshot_request, transfer_snapshot_response,
};
use openraft::errors::{NetworkError, StreamingError};
use openraft::network::RPCTypes;
use openraft::raft::SnapshotResponse;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::codec;
#[cfg(doc)]
use crate::raft::network::PEER_MESSAGE_BYTES_MAX;
use crate::raft::network::{Msg, PeerClient, RpcErr, status_error};
use crate::raft::types::{NodeVote, TypeConfig};
use crate::snapshot::{self, ManifestFile, SnapshotHandle, convert};

/// Bytes of one snapshot chunk: well below [`PEER_MESSAGE_BYTES_MAX`].
pub const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;
/// Chunks queued in one outgoing snapshot stream at most: with
/// [`SNAPSHOT_CHUNK_BYTES`], the memory a transfer holds.
pub const SNAPSHOT_STREAM_CHUNKS_MAX: usize = 4;
/// How long the leader waits for a follower's answer (its `need` after
/// matching the offer against its files, or its `installed` / next `need`
/// after `done`: checking every staged file, fsyncs, the install).
pub const SNAPSHOT_ANSWER_TIMEOUT: Duration = Duration::from_secs(120);
/// `need` messages a leader serves in one transfer at most: the first and
/// the follower's refetch rounds (it asks for at most
/// `SNAPSHOT_REFETCH_ROUNDS_MAX` = 3).
pub const SNAPSHOT_NEED_ROUNDS_MAX: usize = 4;

fn streaming(err: RpcErr) -> StreamingError<TypeConfig> {
    StreamingError::from(err)
}

fn net_err(message: String) -> StreamingError<TypeConfig> {
    StreamingError::Network(NetworkError::new(&Msg(message)))
}

impl PeerClient {
    /// Waits for the follower's next message (a `need` or `installed`).
    async fn next_answer(
        &self,
        responses: &mut tonic::Streaming<TransferSnapshotResponse>,
    ) -> Result<transfer_snapshot_response::Step, StreamingError<TypeConfig>> {
        match tokio::time::timeout(SNAPSHOT_ANSWER_TIMEOUT, responses.message()).await {
            Err(_) => Err(streaming(
                self.timeout(RPCTypes::InstallSnapshot, SNAPSHOT_ANSWER_TIMEOUT),
            )),
            Ok(Err(status)) => Err(streaming(status_error(&status))),
            Ok(Ok(None)) => Err(net_err("snapshot stream ended early".into())),
            Ok(Ok(Some(message))) => message
                .step
                .ok_or_else(|| net_err("empty snapshot response".into())),
        }
    }

    /// Hands one message to the stream within `ttl` (the per-chunk
    /// deadline: a follower that stops reading is abandoned).
    async fn send_step(
        &self,
        tx: &mpsc::Sender<TransferSnapshotRequest>,
        step: transfer_snapshot_request::Step,
        ttl: Duration,
    ) -> Result<(), StreamingError<TypeConfig>> {
        let message = TransferSnapshotRequest { step: Some(step) };
        match tokio::time::timeout(ttl, tx.send(message)).await {
            Err(_) => Err(streaming(self.timeout(RPCTypes::InstallSnapshot, ttl))),
            Ok(Err(_)) => Err(net_err("snapshot stream closed by the follower".into())),
            Ok(Ok(())) => Ok(()),
        }
    }

    /// Streams the snapshot's files the follower lacks: offer, need,
    /// chunks, done, then either installed or (some staged files did not
    /// match) another need. Each chunk must be taken within `ttl`; each
    /// answer must come within [`SNAPSHOT_ANSWER_TIMEOUT`].
    pub(crate) async fn send_snapshot(
        &self,
        vote: NodeVote,
        handle: SnapshotHandle,
        ttl: Duration,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let mut client = self.client().map_err(streaming)?;
        let manifest_bytes = tokio::fs::read(handle.manifest_path())
            .await
            .map_err(|err| net_err(format!("read snapshot manifest: {err}")))?;
        let manifest = handle
            .read_manifest()
            .map_err(|err| net_err(format!("snapshot manifest: {err}")))?;
        // Bounded memory: at most this many chunks wait in the stream.
        let (tx, rx) = mpsc::channel::<TransferSnapshotRequest>(SNAPSHOT_STREAM_CHUNKS_MAX);
        let offer = transfer_snapshot_request::Step::Offer(SnapshotOffer {
            identity: Some(self.identity()),
            vote: codec::encode(&vote).into(),
            manifest: Some(convert::peer_manifest(&manifest, manifest_bytes)),
        });
        self.send_step(&tx, offer, ttl).await?;
        let mut responses = match tokio::time::timeout(
            ttl,
            client.transfer_snapshot(ReceiverStream::new(rx)),
        )
        .await
        {
            Err(_) => {
                return Err(streaming(self.timeout(RPCTypes::InstallSnapshot, ttl)));
            }
            Ok(Err(status)) => return Err(streaming(status_error(&status))),
            Ok(Ok(response)) => response.into_inner(),
        };
        // The first need, then one per refetch round the follower asks for.
        for _ in 0..=SNAPSHOT_NEED_ROUNDS_MAX {
            let ranges = match self.next_answer(&mut responses).await? {
                transfer_snapshot_response::Step::Installed(installed) => {
                    return decode_installed(&installed.payload);
                }
                transfer_snapshot_response::Step::Need(need) => need.ranges,
            };
            for range in ranges {
                let Some(file) = manifest.files.iter().find(|f| f.name == range.name) else {
                    return Err(net_err(format!(
                        "follower asked for unknown file {:?}",
                        range.name
                    )));
                };
                self.send_range(&tx, &handle, file, &range, ttl).await?;
            }
            let done = transfer_snapshot_request::Step::Done(SnapshotDone {});
            self.send_step(&tx, done, ttl).await?;
        }
        Err(net_err(format!(
            "the follower asked for files again more than SNAPSHOT_NEED_ROUNDS_MAX ({SNAPSHOT_NEED_ROUNDS_MAX}) times"
        )))
    }

    /// Sends one file from the follower's offset if its prefix crc32
    /// matches ours, else whole, as crc-checked chunks of at most
    /// [`SNAPSHOT_CHUNK_BYTES`] (at least one chunk, even for an empty file).
    async fn send_range(
        &self,
        tx: &mpsc::Sender<TransferSnapshotRequest>,
        handle: &SnapshotHandle,
        file: &ManifestFile,
        range: &FileRange,
        ttl: Duration,
    ) -> Result<(), StreamingError<TypeConfig>> {
        let path = handle
            .file_path(&file.name)
            .map_err(|err| net_err(err.to_string()))?;
        let mut start = 0u64;
        if range.offset_bytes > 0 && range.offset_bytes < file.len {
            let prefix_path = path.clone();
            let offset = range.offset_bytes;
            let ours =
                tokio::task::spawn_blocking(move || snapshot::crc_of_prefix(&prefix_path, offset))
                    .await
                    .map_err(|err| net_err(format!("prefix check task: {err}")))?
                    .map_err(|err| net_err(err.to_string()))?;
            if ours == Some(range.prefix_crc32) {
                start = offset;
            } else {
                tracing::warn!(file = %file.name, offset, "the follower's prefix differs from ours: sending the whole file");
            }
        }
        let mut reader = tokio::fs::File::open(&path)
            .await
            .map_err(|err| net_err(format!("open {}: {err}", path.display())))?;
        reader
            .seek(std::io::SeekFrom::Start(start))
            .await
            .map_err(|err| net_err(format!("seek {}: {err}", path.display())))?;
        let mut offset = start;
        let mut sent_any = false;
        while offset < file.len || !sent_any {
            let want = (file.len - offset).min(SNAPSHOT_CHUNK_BYTES as u64) as usize;
            let mut data = vec![0u8; want];
            reader
                .read_exact(&mut data)
                .await
                .map_err(|err| net_err(format!("read {}: {err}", path.display())))?;
            let mut crc32 = crc32fast::hash(&data);
            if !data.is_empty()
                && let Some(fix_crc) = self.faults.take_snapshot_chunk_corruption()
            {
                let middle = data.len() / 2;
                data[middle] ^= 0x01;
                if fix_crc {
                    crc32 = crc32fast::hash(&data);
                }
                tracing::warn!(file = %file.name, offset, fix_crc, "test fault: corrupted a snapshot chunk");
            }
            let chunk = transfer_snapshot_request::Step::Chunk(SnapshotChunk {
                file_name: file.name.clone(),
                offset_bytes: offset,
                data: data.into(),
                crc32,
            });
            self.send_step(tx, chunk, ttl).await?;
            offset += want as u64;
            if let Some(metrics) = &self.metrics {
                metrics.add_snapshot_bytes_sent(want as u64);
            }
            sent_any = true;
        }
        Ok(())
    }
}

fn decode_installed(
    payload: &[u8],
) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
    let result: Result<SnapshotResponse<TypeConfig>, String> =
        codec::decode(payload).map_err(|err| net_err(format!("installed payload: {err}")))?;
    result.map_err(|err| {
        net_err(format!(
            "the follower could not install the snapshot: {err}"
        ))
    })
}
