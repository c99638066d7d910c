//! Proves the log store and the state machine pass openraft's own storage
//! conformance suite (`openraft::testing::Suite`): log state, reads, vote,
//! committed, truncate, purge, apply, snapshot build / install / current
//! snapshot, and the initial-state reconstruction openraft does at startup.
//!
//! On real files the suite runs the node's real pair: `LogStore<TypeConfig>`
//! and `StateMachine` (the bitcask engine under Raft, snapshots of its
//! files). The state machine needs real files (snapshots hard-link them), so
//! the run on the simulated disk pairs the log store with a minimal
//! in-memory state machine that exists only for this test.

use std::io;
use std::io::Cursor;
use std::sync::{Arc, Mutex};

use kvnode::raft::types::NodeLogId;
use kvnode::{LogStore, StateMachine, StateMachineOptions, TypeConfig, codec};
use openraft::StorageError;
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::{
    EntryPayload, OptionalSend, RaftSnapshotBuilder, Snapshot, SnapshotMeta, StoredMembership,
};
use tokio_stream::{Stream, StreamExt};
use vfs::RealFs;
use vfs::sim::SimFs;

use crate::common::{Store, TestConfig, sim_dir};

type TestMembership = openraft::alias::StoredMembershipOf<TestConfig>;
type TestSnapshotMeta = openraft::alias::SnapshotMetaOf<TestConfig>;
type TestSnapshot = openraft::alias::SnapshotOf<TestConfig, Cursor<Vec<u8>>>;

#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
struct SmData {
    last_applied: Option<NodeLogId>,
    membership: TestMembership,
    applied: Vec<String>,
}

#[derive(Debug, Default)]
struct SmInner {
    data: SmData,
    current: Option<(TestSnapshotMeta, Vec<u8>)>,
}

/// Test-only in-memory state machine (see the module docs).
#[derive(Clone, Debug, Default)]
struct MemStateMachine {
    inner: Arc<Mutex<SmInner>>,
}

impl RaftSnapshotBuilder<TestConfig> for MemStateMachine {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn build_snapshot(&mut self) -> Result<TestSnapshot, io::Error> {
        let mut inner = self.inner.lock().unwrap();
        let bytes = codec::encode(&inner.data);
        let meta = SnapshotMeta {
            last_log_id: inner.data.last_applied,
            last_membership: inner.data.membership.clone(),
        };
        inner.current = Some((meta.clone(), bytes.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Cursor::new(bytes),
        })
    }
}

impl RaftStateMachine<TestConfig> for MemStateMachine {
    type SnapshotData = Cursor<Vec<u8>>;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<NodeLogId>, TestMembership), io::Error> {
        let inner = self.inner.lock().unwrap();
        Ok((inner.data.last_applied, inner.data.membership.clone()))
    }

    async fn apply<S>(&mut self, mut entries: S) -> Result<(), io::Error>
    where
        S: Stream<Item = Result<EntryResponder<TestConfig>, io::Error>> + Unpin + OptionalSend,
    {
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            {
                let mut inner = self.inner.lock().unwrap();
                inner.data.last_applied = Some(entry.log_id);
                match entry.payload {
                    EntryPayload::Blank => {}
                    EntryPayload::Normal(text) => inner.data.applied.push(text),
                    EntryPayload::Membership(membership) => {
                        inner.data.membership =
                            StoredMembership::new(Some(entry.log_id), membership)
                    }
                }
            }
            if let Some(responder) = responder {
                responder.send(String::new());
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &TestSnapshotMeta,
        snapshot: Cursor<Vec<u8>>,
    ) -> Result<(), io::Error> {
        let bytes = snapshot.into_inner();
        let data: SmData =
            codec::decode(&bytes).map_err(|err| io::Error::new(io::ErrorKind::InvalidData, err))?;
        let mut inner = self.inner.lock().unwrap();
        inner.data = data;
        inner.current = Some((meta.clone(), bytes));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<TestSnapshot>, io::Error> {
        let inner = self.inner.lock().unwrap();
        Ok(inner.current.as_ref().map(|(meta, bytes)| Snapshot {
            meta: meta.clone(),
            snapshot: Cursor::new(bytes.clone()),
        }))
    }
}

/// Builds each test's real log store and real state machine on real files
/// in a fresh temporary directory.
struct RealFiles;

impl StoreBuilder<TypeConfig, LogStore<TypeConfig>, StateMachine, tempfile::TempDir> for RealFiles {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore<TypeConfig>, StateMachine), StorageError<TypeConfig>>
    {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store =
            LogStore::open(Arc::new(RealFs), dir.path().join("raft-log")).expect("open log store");
        let sm = StateMachine::open(dir.path().join("state"), StateMachineOptions::default())
            .expect("open state machine");
        Ok((dir, store, sm))
    }
}

/// Builds each test's store on a fresh simulated disk.
struct SimulatedDisk;

impl StoreBuilder<TestConfig, Store, MemStateMachine> for SimulatedDisk {
    async fn build(&self) -> Result<((), Store, MemStateMachine), StorageError<TestConfig>> {
        let store = LogStore::open(Arc::new(SimFs::new()), sim_dir()).expect("open log store");
        Ok(((), store, MemStateMachine::default()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_on_real_files() {
    Suite::test_all(RealFiles)
        .await
        .expect("openraft storage suite");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_on_simulated_disk() {
    Suite::test_all(SimulatedDisk)
        .await
        .expect("openraft storage suite");
}
