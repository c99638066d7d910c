//! Decoders never panic: an arbitrary-bytes harness (proptest, fixed seeds)
//! over everything a member decodes from the network or its disk.
//!
//! - Peer payloads (`codec`, bincode with bounded decoding): AppendEntries
//!   and Vote requests and their answers, votes, snapshot answers, the
//!   proposals inside entries; and the snapshot manifest, the `CURRENT`
//!   engine pointer and the commit metadata of engine batches.
//! - The Raft log store's files: a real log directory (segments, vote,
//!   committed, purge state) mutated and reopened, then read in full.
//! - `DATA/IDENTITY`: mutated identity files loaded.
//!
//! Each starts from the checked-in seed corpus in `tests/corpus/` (valid
//! encodings, a real log directory, a real identity file), applies random
//! mutations (bit flips, truncation, extension, overwrite, random
//! replacement) or takes purely random bytes, and requires an `Ok` or an
//! `Err` — never a panic. `RAFTCASK_WRITE_CORPUS=1` regenerates the seeds
//! (needed only when a format changes; the canary test says so).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvnode::codec;
use kvnode::node::identity::Identity;
use kvnode::raft::types::{CommitMeta, NodeEntry, NodeInfo, NodeLogId, NodeVote, TypeConfig};
use kvnode::snapshot::{KIND_ACTIVE_PREFIX, KIND_SEALED, Manifest, ManifestFile, Pointer};
use kvnode::{LogStore, LogStoreOptions};
use kvstate::command::{Command, Condition, Op, Proposal, Request, SessionRef};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::{Entry, EntryPayload, Membership, RaftLogReader, StoredMembership, Vote};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use vfs::sim::SimFs;

/// Largest random input or extension a case makes.
const RANDOM_BYTES_MAX: usize = 4096;
/// Small log segments so the seed log has several.
const LOG_SEGMENT_BYTES: u64 = 1024;

fn corpus_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

fn write_corpus() -> bool {
    std::env::var_os("RAFTCASK_WRITE_CORPUS").is_some()
}

fn cases(factor: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
        * factor
}

fn runner(factor: u32, seed: &[u8; 32]) -> TestRunner {
    let config = Config {
        cases: cases(factor),
        failure_persistence: None,
        max_shrink_iters: 500,
        ..Config::default()
    };
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, seed))
}

fn log_id(term: u64, index: u64) -> NodeLogId {
    kvnode::raft::types::log_id(term, 1, index)
}

fn members() -> BTreeMap<u64, NodeInfo> {
    (1..=3)
        .map(|id| {
            (
                id,
                NodeInfo {
                    client_addr: format!("127.0.0.1:{}", 7000 + id),
                    peer_addr: format!("node{id}.example:7101"),
                },
            )
        })
        .collect()
}

fn membership() -> Membership<u64, NodeInfo> {
    Membership::new(vec![BTreeSet::from([1, 2, 3])], members()).expect("membership")
}

fn proposal(i: u64) -> Proposal {
    Proposal {
        time_ms: 1_700_000_000_000 + i,
        command: match i % 4 {
            0 => Command::Tick,
            1 => Command::Merge {
                inputs: vec!["seg-00000000000000000001.data".into()],
            },
            _ => Command::Requests(vec![
                Request {
                    session: Some(SessionRef {
                        client_id: 42,
                        sequence: i,
                        lowest_unacked: i.saturating_sub(2),
                        opens: i == 1,
                    }),
                    conditions: vec![Condition {
                        key: b"k".to_vec(),
                        version: i << 16,
                    }],
                    ops: vec![
                        Op::Put {
                            key: format!("key{i}").into_bytes(),
                            value: vec![b'v'; (i % 40) as usize],
                            ttl_ms: i * 1000,
                        },
                        Op::Delete {
                            key: b"gone".to_vec(),
                        },
                    ],
                },
                Request {
                    session: None,
                    conditions: vec![],
                    ops: vec![
                        Op::Expire {
                            key: b"e".to_vec(),
                            ttl_ms: 5,
                        },
                        Op::Persist { key: b"p".to_vec() },
                    ],
                },
            ]),
        },
    }
}

fn entry(term: u64, index: u64) -> NodeEntry {
    Entry {
        log_id: log_id(term, index),
        payload: match index % 5 {
            0 => EntryPayload::Blank,
            3 => EntryPayload::Membership(membership()),
            _ => EntryPayload::Normal(proposal(index)),
        },
    }
}

/// Which decoder a seed feeds.
#[derive(Clone, Copy, Debug)]
enum Decoder {
    AppendEntries,
    AppendEntriesResponse,
    Vote,
    VoteRequest,
    VoteResponse,
    Proposal,
    LogEntry,
    CommitMeta,
    Manifest,
    Pointer,
}

const DECODERS: [(Decoder, &str); 10] = [
    (Decoder::AppendEntries, "append-entries"),
    (Decoder::AppendEntriesResponse, "append-entries-response"),
    (Decoder::Vote, "vote"),
    (Decoder::VoteRequest, "vote-request"),
    (Decoder::VoteResponse, "vote-response"),
    (Decoder::Proposal, "proposal"),
    (Decoder::LogEntry, "log-entry"),
    (Decoder::CommitMeta, "commit-meta"),
    (Decoder::Manifest, "manifest"),
    (Decoder::Pointer, "pointer"),
];

/// A valid encoding for each decoder.
fn valid_encoding(decoder: Decoder) -> Vec<u8> {
    let vote = Vote::new_committed(3, 1);
    match decoder {
        Decoder::AppendEntries => codec::encode(&AppendEntriesRequest::<TypeConfig> {
            vote,
            prev_log_id: Some(log_id(3, 9)),
            entries: (10..16).map(|i| entry(3, i)).collect(),
            leader_commit: Some(log_id(3, 9)),
        }),
        Decoder::AppendEntriesResponse => codec::encode(&Ok::<
            AppendEntriesResponse<TypeConfig>,
            openraft::error::RaftError<TypeConfig>,
        >(AppendEntriesResponse::Success)),
        Decoder::Vote => codec::encode(&vote),
        Decoder::VoteRequest => {
            codec::encode(&VoteRequest::<TypeConfig>::new(vote, Some(log_id(3, 15))))
        }
        Decoder::VoteResponse => codec::encode(&Ok::<
            VoteResponse<TypeConfig>,
            openraft::error::RaftError<TypeConfig>,
        >(VoteResponse::new(
            vote,
            Some(log_id(3, 15)),
            true,
        ))),
        Decoder::Proposal => codec::encode(&proposal(2)),
        Decoder::LogEntry => codec::encode(&entry(2, 7)),
        Decoder::CommitMeta => CommitMeta {
            log_id: log_id(3, 15),
            time_ms: 1_700_000_000_123,
            membership: StoredMembership::new(Some(log_id(1, 3)), membership()),
        }
        .encode(),
        Decoder::Manifest => Manifest {
            cluster_id: 0x1234_5678_9abc_def0,
            snapshot_id: "3-15-1700000000123".into(),
            last_log_id: Some(log_id(3, 15)),
            membership: StoredMembership::new(Some(log_id(1, 3)), membership()),
            files: vec![
                ManifestFile {
                    kind: KIND_SEALED,
                    name: "seg-00000000000000000001.data".into(),
                    len: 4096,
                    crc: 0xdead_beef,
                },
                ManifestFile {
                    kind: KIND_ACTIVE_PREFIX,
                    name: "seg-00000000000000000090.data".into(),
                    len: 100,
                    crc: 7,
                },
            ],
        }
        .encode(),
        Decoder::Pointer => Pointer {
            generation: 7,
            published_prefix: Some(("seg-00000000000000000090.data".into(), 100)),
        }
        .encode(),
    }
}

/// Runs one decoder on `bytes`; `true` when it accepted them.
fn decode(decoder: Decoder, bytes: &[u8]) -> bool {
    match decoder {
        Decoder::AppendEntries => codec::decode::<AppendEntriesRequest<TypeConfig>>(bytes).is_ok(),
        Decoder::AppendEntriesResponse => codec::decode::<
            Result<AppendEntriesResponse<TypeConfig>, openraft::error::RaftError<TypeConfig>>,
        >(bytes)
        .is_ok(),
        Decoder::Vote => codec::decode::<NodeVote>(bytes).is_ok(),
        Decoder::VoteRequest => codec::decode::<VoteRequest<TypeConfig>>(bytes).is_ok(),
        Decoder::VoteResponse => codec::decode::<
            Result<VoteResponse<TypeConfig>, openraft::error::RaftError<TypeConfig>>,
        >(bytes)
        .is_ok(),
        Decoder::Proposal => codec::decode::<Proposal>(bytes).is_ok(),
        Decoder::LogEntry => codec::decode::<NodeEntry>(bytes).is_ok(),
        Decoder::CommitMeta => CommitMeta::decode(bytes).is_ok(),
        Decoder::Manifest => Manifest::decode(bytes).is_ok(),
        Decoder::Pointer => Pointer::decode(bytes).is_ok(),
    }
}

/// The checked-in encoding seeds (rewritten first when asked to).
fn encoding_seeds() -> Vec<(Decoder, Vec<u8>)> {
    let dir = corpus_root().join("codec");
    if write_corpus() {
        std::fs::create_dir_all(&dir).expect("create corpus dir");
        for (decoder, name) in DECODERS {
            std::fs::write(dir.join(format!("{name}.bin")), valid_encoding(decoder))
                .expect("write corpus file");
        }
    }
    DECODERS
        .iter()
        .map(|(decoder, name)| {
            let path = dir.join(format!("{name}.bin"));
            let bytes = std::fs::read(&path)
                .unwrap_or_else(|err| panic!("{}: {err} (checked in)", path.display()));
            (*decoder, bytes)
        })
        .collect()
}

/// One change to a byte string.
#[derive(Clone, Debug)]
enum Mutation {
    FlipByte { at: usize, bit: u8 },
    SetByte { at: usize, value: u8 },
    Truncate { at: usize },
    Extend { bytes: Vec<u8> },
    Overwrite { at: usize, bytes: Vec<u8> },
    Replace { bytes: Vec<u8> },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::FlipByte { at, bit }),
        3 => (any::<usize>(), prop_oneof![Just(0u8), Just(0xff), Just(0x80), Just(0xfb), Just(0xfc), Just(0xfd), any::<u8>()])
            .prop_map(|(at, value)| Mutation::SetByte { at, value }),
        2 => any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        1 => proptest::collection::vec(any::<u8>(), 0..64).prop_map(|bytes| Mutation::Extend { bytes }),
        2 => (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..32))
            .prop_map(|(at, bytes)| Mutation::Overwrite { at, bytes }),
        1 => proptest::collection::vec(any::<u8>(), 0..RANDOM_BYTES_MAX)
            .prop_map(|bytes| Mutation::Replace { bytes }),
    ]
}

fn apply(bytes: &mut Vec<u8>, mutation: &Mutation) {
    match mutation {
        Mutation::FlipByte { at, bit } => {
            if !bytes.is_empty() {
                let at = at % bytes.len();
                bytes[at] ^= 1 << bit;
            }
        }
        Mutation::SetByte { at, value } => {
            if !bytes.is_empty() {
                let at = at % bytes.len();
                bytes[at] = *value;
            }
        }
        Mutation::Truncate { at } => {
            let at = at % (bytes.len() + 1);
            bytes.truncate(at);
        }
        Mutation::Extend { bytes: more } => bytes.extend_from_slice(more),
        Mutation::Overwrite { at, bytes: over } => {
            if !bytes.is_empty() {
                let at = at % bytes.len();
                for (i, b) in over.iter().enumerate() {
                    if let Some(slot) = bytes.get_mut(at + i) {
                        *slot = *b;
                    }
                }
            }
        }
        Mutation::Replace { bytes: new } => *bytes = new.clone(),
    }
}

#[test]
fn the_seed_encodings_still_decode() {
    for (decoder, bytes) in encoding_seeds() {
        assert!(
            decode(decoder, &bytes),
            "the checked-in {decoder:?} seed no longer decodes; if the format changed on purpose, \
             regenerate with RAFTCASK_WRITE_CORPUS=1 cargo test -p kvnode --test node fuzz"
        );
    }
}

#[test]
fn payload_and_metadata_decoders_never_panic() {
    let seeds = encoding_seeds();
    let mut runner = runner(16, b"raftcask-kvnode-fuzz-codec-seed!");
    let accepted = std::cell::Cell::new(0u32);
    let refused = std::cell::Cell::new(0u32);
    let result = runner.run(
        &(0..seeds.len(), proptest::collection::vec(mutation(), 1..=3)),
        |(seed, mutations)| {
            let (decoder, mut bytes) = seeds[seed].clone();
            for m in &mutations {
                apply(&mut bytes, m);
            }
            // The mutated bytes go to every decoder, not just their own.
            for (other, _) in DECODERS {
                let ok = decode(other, &bytes);
                let counter = if ok { &accepted } else { &refused };
                counter.set(counter.get() + 1);
            }
            let _ = decoder;
            Ok(())
        },
    );
    if let Err(err) = result {
        panic!("a decoder panicked: {err}");
    }
    eprintln!(
        "payload decoders: {} accepted, {} refused",
        accepted.get(),
        refused.get()
    );
    assert!(
        accepted.get() > 0 && refused.get() > 0,
        "mutations should both keep and break encodings"
    );
}

/// The seed log directory: a real log store's files (several segments,
/// vote, committed index, a purge).
fn log_seed() -> Vec<(String, Vec<u8>)> {
    let dir = corpus_root().join("raft-log");
    if write_corpus() {
        let fs = SimFs::new();
        let sim_dir = PathBuf::from("/log");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let mut store =
                LogStore::<TypeConfig>::open_with(Arc::new(fs.clone()), &sim_dir, small_segments())
                    .expect("open seed log");
            store
                .save_vote(&Vote::new_committed(2, 1))
                .await
                .expect("vote");
            for batch in [1..6u64, 6..14, 14..20, 20..31] {
                store
                    .blocking_append(batch.map(|i| entry(2, i)).collect::<Vec<_>>())
                    .await
                    .expect("append");
            }
            store
                .save_committed(Some(log_id(2, 25)))
                .await
                .expect("committed");
            store.purge(log_id(2, 4)).await.expect("purge");
        });
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create corpus dir");
        use vfs::Vfs;
        for name in fs.list(&sim_dir).expect("list") {
            let bytes = fs.read_file(&sim_dir.join(&name)).expect("listed");
            std::fs::write(dir.join(name), bytes).expect("write corpus file");
        }
    }
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("{}: {err} (checked in)", dir.display()))
        .map(|e| {
            let e = e.expect("dir entry");
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).expect("read corpus file"),
            )
        })
        .collect();
    files.sort();
    files
}

fn small_segments() -> LogStoreOptions {
    LogStoreOptions {
        segment_size_bytes: LOG_SEGMENT_BYTES,
        ..LogStoreOptions::default()
    }
}

/// Opens a log directory made of `files` and reads everything it offers.
/// `Ok(entries)` when it opened.
fn exercise_log(rt: &tokio::runtime::Runtime, files: &[(String, Vec<u8>)]) -> Option<usize> {
    let fs = SimFs::new();
    let dir = PathBuf::from("/log");
    for (name, bytes) in files {
        fs.write_file(&dir.join(name), bytes);
    }
    rt.block_on(async {
        let mut store =
            LogStore::<TypeConfig>::open_with(Arc::new(fs.clone()), &dir, small_segments()).ok()?;
        let _ = store.read_vote().await;
        let _ = store.read_committed().await;
        let state = store.get_log_state().await.ok()?;
        let entries = store.try_get_log_entries(..).await.ok()?;
        let _ = state;
        Some(entries.len())
    })
}

#[test]
fn the_seed_log_opens_with_every_entry() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let files = log_seed();
    let segments = files.iter().filter(|(n, _)| n.ends_with(".seg")).count();
    assert!(
        segments >= 2,
        "the seed log should have several segments, has {segments}"
    );
    assert_eq!(
        exercise_log(&rt, &files),
        Some(26),
        "the checked-in log no longer opens with entries 5..=30; if the log format changed, \
         regenerate with RAFTCASK_WRITE_CORPUS=1 cargo test -p kvnode --test node fuzz"
    );
}

#[test]
fn mutated_raft_logs_never_panic() {
    let seed = log_seed();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let mut runner = runner(4, b"raftcask-kvnode-fuzz-raftlog-see");
    let opened = std::cell::Cell::new(0u32);
    let refused = std::cell::Cell::new(0u32);
    let result = runner.run(
        &proptest::collection::vec((any::<usize>(), mutation()), 1..=3),
        |mutations| {
            let mut files = seed.clone();
            for (file, m) in &mutations {
                let n = files.len();
                apply(&mut files[file % n].1, m);
            }
            let counter = if exercise_log(&rt, &files).is_some() {
                &opened
            } else {
                &refused
            };
            counter.set(counter.get() + 1);
            Ok(())
        },
    );
    if let Err(err) = result {
        panic!("a mutated Raft log made the log store panic: {err}");
    }
    eprintln!(
        "mutated Raft logs: {} opened, {} refused",
        opened.get(),
        refused.get()
    );
    assert!(
        opened.get() > 0 && refused.get() > 0,
        "mutations should both corrupt and spare"
    );
}

#[test]
fn mutated_identity_files_never_panic() {
    let seed_dir = tempfile::tempdir().expect("tempdir");
    let identity = Identity::load_or_create(seed_dir.path(), 2).expect("make an identity");
    identity.ensure_cluster_id().expect("cluster id");
    let seed = std::fs::read(seed_dir.path().join(kvnode::node::identity::IDENTITY_FILE))
        .expect("identity file");
    let mut runner = runner(2, b"raftcask-kvnode-fuzz-identity-s!");
    let result = runner.run(&proptest::collection::vec(mutation(), 1..=3), |mutations| {
        let mut bytes = seed.clone();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join(kvnode::node::identity::IDENTITY_FILE),
            &bytes,
        )
        .expect("write identity");
        let _ = Identity::load_or_create(dir.path(), 2);
        Ok(())
    });
    if let Err(err) = result {
        panic!("a mutated IDENTITY file made the node panic: {err}");
    }
}
