//! `kvctl snapshot trigger` (a member builds a snapshot now) and `kvctl
//! snapshot save FILE`: the `SaveSnapshot` stream written into a backup
//! archive (`kvarchive`'s format, the one `kvnode restore` reads) through
//! `FILE.partial`, fsynced, verified, renamed.

use std::path::Path;

use kvarchive::{ArchiveFile, ArchiveWriter, verify_archive};
use kvclient::kvproto::cluster::v1 as cpb;
use serde_json::json;
use tokio_stream::StreamExt as _;

use super::Context;
use crate::cli::SnapshotCommand;
use crate::exit::{Exit, Failure};
use crate::output::Style;

/// `kvctl snapshot trigger | save`.
pub async fn run(context: &Context, command: SnapshotCommand) -> Result<(), Failure> {
    let client = context.client()?;
    let printer = &context.printer;
    match command {
        SnapshotCommand::Trigger { purge_log } => {
            let built = client
                .trigger_snapshot(purge_log)
                .await
                .map_err(|err| context.fail(err))?;
            let member = built.header.as_ref().map_or(0, |h| h.member_id);
            if printer.json() {
                printer.print_json(&json!({
                    "member": member,
                    "snapshot_id": built.snapshot_id,
                    "last_log_index": built.last_log_index,
                    "last_log_term": built.last_log_term,
                    "purged_log": purge_log,
                }));
            } else {
                println!(
                    "{} member {member} built snapshot {} (last log index {}, term {})",
                    printer.paint(Style::Good, "OK"),
                    built.snapshot_id,
                    built.last_log_index,
                    built.last_log_term
                );
            }
            Ok(())
        }
        SnapshotCommand::Save { file, latest } => {
            let stream = client
                .save_snapshot(!latest)
                .await
                .map_err(|err| context.fail(err))?;
            let header =
                save_stream(stream, &file)
                    .await
                    .map_err(|failure| match failure.exit {
                        Exit::Usage => failure,
                        _ => Failure::new(
                            failure.exit,
                            format!("{failure} (tried {})", context.endpoints.join(", ")),
                        ),
                    })?;
            if printer.json() {
                printer.print_json(&json!({
                    "file": file.display().to_string(),
                    "snapshot_id": header.snapshot_id,
                    "last_log_index": header.last_log_index,
                    "last_log_term": header.last_log_term,
                    "files": header.files,
                    "data_bytes": header.data_bytes,
                }));
            } else {
                println!(
                    "{} saved snapshot {} (last log index {}, term {}): {} files, {} bytes, to {}",
                    printer.paint(Style::Good, "OK"),
                    header.snapshot_id,
                    header.last_log_index,
                    header.last_log_term,
                    header.files,
                    header.data_bytes,
                    file.display()
                );
            }
            Ok(())
        }
    }
}

/// Removes a partial archive unless disarmed.
struct PartialFile<'a> {
    path: &'a Path,
    armed: bool,
}

impl Drop for PartialFile<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = std::fs::remove_file(self.path);
        }
    }
}

/// What `snapshot save` wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    /// The snapshot's id.
    pub snapshot_id: String,
    /// Last log index the snapshot covers.
    pub last_log_index: u64,
    /// Its term.
    pub last_log_term: u64,
    /// Files in the archive.
    pub files: usize,
    /// Bytes of file contents in the archive.
    pub data_bytes: u64,
}

/// The files a `SnapshotManifest` lists, as the archive's headers repeat
/// them (the member fills the list from the manifest it sends verbatim).
fn archive_files(manifest: &cpb::SnapshotManifest) -> Vec<ArchiveFile> {
    manifest
        .files
        .iter()
        .map(|f| ArchiveFile {
            name: f.name.clone(),
            len: f.length_bytes,
            crc: f.crc32,
        })
        .collect()
}

/// Writes a SaveSnapshot stream into the archive `file` (through
/// `FILE.partial`, verified, then renamed), with a progress bar on a
/// terminal.
pub async fn save_stream(
    mut stream: impl tokio_stream::Stream<Item = kvclient::Result<cpb::SaveSnapshotResponse>> + Unpin,
    file: &Path,
) -> Result<Saved, Failure> {
    use cpb::save_snapshot_response::Part;
    let local = |what: &str, err: &dyn std::fmt::Display| {
        Failure::usage(format!("{what} {}: {err}", file.display()))
    };
    let remote = |err: kvclient::Error| Failure::from_client(err, &[]);
    let manifest = match stream.next().await {
        Some(Ok(cpb::SaveSnapshotResponse {
            part: Some(Part::Manifest(manifest)),
        })) => manifest,
        Some(Ok(other)) => {
            return Err(Failure::new(
                Exit::Unavailable,
                format!("the snapshot stream did not start with its manifest: {other:?}"),
            ));
        }
        Some(Err(err)) => return Err(remote(err)),
        None => {
            return Err(Failure::new(
                Exit::Unavailable,
                "the snapshot stream ended before its manifest",
            ));
        }
    };
    let partial_path = {
        let mut name = file.as_os_str().to_owned();
        name.push(".partial");
        std::path::PathBuf::from(name)
    };
    let out = std::fs::File::create(&partial_path).map_err(|err| local("cannot create", &err))?;
    let mut guard = PartialFile {
        path: &partial_path,
        armed: true,
    };
    // The archive holds the manifest's bytes as they came, once their
    // envelope checks out; the writer checks every chunk against the file
    // list the member sent with them.
    let invalid = |reason: &dyn std::fmt::Display| {
        Failure::new(
            Exit::Unavailable,
            format!("the snapshot stream's manifest is not valid: {reason}"),
        )
    };
    // The envelope (magic, version, length, CRC-32) is checked here; the
    // body's fields are the node's to decode (`kvnode restore` does).
    kvarchive::manifest_body(&manifest.encoded, kvarchive::MANIFEST_BYTES_MAX)
        .map_err(|reason| invalid(&reason))?;
    let files = archive_files(&manifest);
    let mut writer = ArchiveWriter::new(
        std::io::BufWriter::new(out),
        &manifest.encoded,
        files.clone(),
    )
    .map_err(|err| invalid(&err))?;
    let saved = Saved {
        snapshot_id: manifest.snapshot_id.clone(),
        last_log_index: manifest.last_log_index,
        last_log_term: manifest.last_log_term,
        files: writer.files().len(),
        data_bytes: writer.file_bytes_total(),
    };
    let bar = super::bench::progress_bar(saved.data_bytes, true);
    bar.set_message(format!("snapshot {}", saved.snapshot_id));
    while let Some(item) = stream.next().await {
        match item.map_err(remote)?.part {
            Some(Part::Chunk(chunk)) => {
                writer
                    .write_chunk(&chunk.file_name, chunk.offset_bytes, &chunk.data)
                    .map_err(|err| {
                        Failure::new(
                            Exit::Unavailable,
                            format!("the snapshot stream is inconsistent: {err}"),
                        )
                    })?;
                bar.inc(chunk.data.len() as u64);
            }
            Some(Part::Manifest(_)) => {
                return Err(Failure::new(
                    Exit::Unavailable,
                    "the snapshot stream sent a second manifest",
                ));
            }
            None => {
                return Err(Failure::new(
                    Exit::Unavailable,
                    "the snapshot stream sent an empty message",
                ));
            }
        }
    }
    let out = writer.finish().map_err(|err| {
        Failure::new(
            Exit::Unavailable,
            format!("the snapshot stream ended early: {err}"),
        )
    })?;
    bar.finish_and_clear();
    let out = out
        .into_inner()
        .map_err(|err| local("cannot write", &err.into_error()))?;
    out.sync_all().map_err(|err| local("cannot sync", &err))?;
    drop(out);
    // Read it back: the file on disk must be a valid archive.
    verify_archive(&partial_path, &mut |encoded| {
        kvarchive::manifest_body(encoded, kvarchive::MANIFEST_BYTES_MAX)
            .map_err(|reason| format!("manifest: {reason}"))?;
        Ok(files.clone())
    })
    .map_err(|err| local("verification failed for", &err))?;
    std::fs::rename(&partial_path, file).map_err(|err| local("cannot rename to", &err))?;
    guard.armed = false;
    Ok(saved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpb::save_snapshot_response::Part;
    use prost::bytes::Bytes;

    fn manifest(files: &[(&str, &[u8])]) -> cpb::SaveSnapshotResponse {
        use kvnode::snapshot::{KIND_SEALED, Manifest, ManifestFile};
        let real = Manifest {
            snapshot_id: "2-9-x".into(),
            cluster_id: 7,
            last_log_id: None,
            membership: Default::default(),
            files: files
                .iter()
                .map(|(name, bytes)| ManifestFile {
                    kind: KIND_SEALED,
                    name: name.to_string(),
                    len: bytes.len() as u64,
                    crc: crc32fast::hash(bytes),
                })
                .collect(),
        };
        cpb::SaveSnapshotResponse {
            part: Some(Part::Manifest(cpb::SnapshotManifest {
                header: None,
                snapshot_id: "2-9-x".into(),
                last_log_index: 9,
                last_log_term: 2,
                files: files
                    .iter()
                    .map(|(name, bytes)| cpb::SnapshotFile {
                        name: name.to_string(),
                        length_bytes: bytes.len() as u64,
                        crc32: crc32fast::hash(bytes),
                    })
                    .collect(),
                encoded: Bytes::from(real.encode()),
            })),
        }
    }

    fn chunk(name: &str, offset: u64, data: &'static [u8]) -> cpb::SaveSnapshotResponse {
        cpb::SaveSnapshotResponse {
            part: Some(Part::Chunk(cpb::SnapshotChunk {
                file_name: name.into(),
                offset_bytes: offset,
                data: Bytes::from_static(data),
            })),
        }
    }

    #[tokio::test]
    async fn a_stream_becomes_a_verified_archive() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snap.rcs");
        let items = vec![
            Ok(manifest(&[("a.data", b"hello world"), ("b.hint", b"")])),
            Ok(chunk("a.data", 0, b"hello ")),
            Ok(chunk("a.data", 6, b"world")),
        ];
        let saved = save_stream(tokio_stream::iter(items), &path).await.unwrap();
        assert_eq!((saved.files, saved.data_bytes), (2, 11));
        let read = kvnode::snapshot::backup::verify_archive(&path).unwrap();
        assert_eq!(read.manifest.files.len(), 2);
        assert_eq!(read.file_bytes, 11);
        assert!(!dir.path().join("snap.rcs.partial").exists());
    }

    #[tokio::test]
    async fn a_short_stream_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snap.rcs");
        let items = vec![
            Ok(manifest(&[("a.data", b"hello world")])),
            Ok(chunk("a.data", 0, b"hello ")),
        ];
        let failure = save_stream(tokio_stream::iter(items), &path)
            .await
            .unwrap_err();
        assert_eq!(failure.exit, Exit::Unavailable);
        assert!(failure.message.contains("ended"), "{failure}");
        assert!(!path.exists());
        assert!(!dir.path().join("snap.rcs.partial").exists());
    }

    #[tokio::test]
    async fn a_corrupt_manifest_is_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snap.rcs");
        let mut first = manifest(&[("a.data", b"hello world")]);
        if let Some(Part::Manifest(m)) = &mut first.part {
            let mut bytes = m.encoded.to_vec();
            bytes[20] ^= 0x40;
            m.encoded = Bytes::from(bytes);
        }
        let items = vec![Ok(first), Ok(chunk("a.data", 0, b"hello world"))];
        let failure = save_stream(tokio_stream::iter(items), &path)
            .await
            .unwrap_err();
        assert_eq!(failure.exit, Exit::Unavailable);
        assert!(failure.message.contains("crc32 mismatch"), "{failure}");
        assert!(!path.exists());
        assert!(!dir.path().join("snap.rcs.partial").exists());
    }
}
