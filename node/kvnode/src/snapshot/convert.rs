//! A snapshot manifest on the wire, written once: the peer protocol's
//! `raft.v1.SnapshotManifest` (the `TransferSnapshot` offer) and the client
//! protocol's `cluster.v1.SnapshotManifest` (the first SaveSnapshot
//! message, the same fields and a header) both come from
//! [`peer_manifest`]. Either carries the node's own encoded manifest,
//! verbatim; that is what a receiver trusts ([`manifest_of_offer`]).

use kvproto::cluster::v1 as cluster;
use kvproto::kv::v1::Header;
use kvproto::raft::v1 as raft;

use crate::snapshot::Manifest;

/// The peer protocol's manifest of `manifest`, with its encoding
/// `encoded` (the `MANIFEST` file's bytes).
pub fn peer_manifest(manifest: &Manifest, encoded: Vec<u8>) -> raft::SnapshotManifest {
    raft::SnapshotManifest {
        snapshot_id: manifest.snapshot_id.clone(),
        last_log_index: manifest.last_log_id.map(|l| l.index).unwrap_or(0),
        last_log_term: manifest.last_log_id.map(|l| l.leader_id.term).unwrap_or(0),
        files: manifest
            .files
            .iter()
            .map(|f| raft::SnapshotFile {
                name: f.name.clone(),
                length_bytes: f.len,
                crc32: f.crc,
            })
            .collect(),
        encoded: encoded.into(),
    }
}

/// The client protocol's manifest of `manifest` (SaveSnapshot), answered
/// with `header`: the fields of [`peer_manifest`].
pub fn client_manifest(
    header: Header,
    manifest: &Manifest,
    encoded: Vec<u8>,
) -> cluster::SnapshotManifest {
    let peer = peer_manifest(manifest, encoded);
    cluster::SnapshotManifest {
        header: Some(header),
        snapshot_id: peer.snapshot_id,
        last_log_index: peer.last_log_index,
        last_log_term: peer.last_log_term,
        files: peer
            .files
            .into_iter()
            .map(|f| cluster::SnapshotFile {
                name: f.name,
                length_bytes: f.length_bytes,
                crc32: f.crc32,
            })
            .collect(),
        encoded: peer.encoded,
    }
}

/// The manifest a `TransferSnapshot` offer carries: its `encoded` bytes
/// (the summary fields are informational).
pub fn manifest_of_offer(offer: &raft::SnapshotManifest) -> Result<Manifest, String> {
    Manifest::decode(&offer.encoded)
}
