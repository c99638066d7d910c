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

use std::io::Cursor;
use std::sync::{Arc, Mutex};

use kvnode::{LogStore, StateMachine, StateMachineOptions, TypeConfig, codec};
use openraft::storage::RaftStateMachine;
use openraft::testing::{StoreBuilder, Suite};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, Snapshot,
    SnapshotMeta, StorageError, StorageIOError, StoredMembership,
};
use vfs::RealFs;
use vfs::sim::SimFs;

use crate::common::{Store, TestConfig, sim_dir};

#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
struct SmData {
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, BasicNode>,
    applied: Vec<String>,
}

#[derive(Debug, Default)]
struct SmInner {
    data: SmData,
    current: Option<(SnapshotMeta<u64, BasicNode>, Vec<u8>)>,
    snapshots_built: u64,
}

/// Test-only in-memory state machine (see the module docs).
#[derive(Clone, Debug, Default)]
struct MemStateMachine {
    inner: Arc<Mutex<SmInner>>,
}

impl RaftSnapshotBuilder<TestConfig> for MemStateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TestConfig>, StorageError<u64>> {
        let mut inner = self.inner.lock().unwrap();
        inner.snapshots_built += 1;
        let bytes = codec::encode(&inner.data);
        let meta = SnapshotMeta {
            last_log_id: inner.data.last_applied,
            last_membership: inner.data.membership.clone(),
            snapshot_id: format!("snapshot-{}", inner.snapshots_built),
        };
        inner.current = Some((meta.clone(), bytes.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

impl RaftStateMachine<TestConfig> for MemStateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>), StorageError<u64>> {
        let inner = self.inner.lock().unwrap();
        Ok((inner.data.last_applied, inner.data.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<String>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<TestConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut inner = self.inner.lock().unwrap();
        let mut replies = Vec::new();
        for entry in entries {
            inner.data.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(text) => inner.data.applied.push(text),
                EntryPayload::Membership(membership) => {
                    inner.data.membership = StoredMembership::new(Some(entry.log_id), membership)
                }
            }
            replies.push(String::new());
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        let bytes = snapshot.into_inner();
        let data: SmData = codec::decode(&bytes)
            .map_err(|err| StorageIOError::read_snapshot(Some(meta.signature()), &err))?;
        let mut inner = self.inner.lock().unwrap();
        inner.data = data;
        inner.current = Some((meta.clone(), bytes));
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TestConfig>>, StorageError<u64>> {
        let inner = self.inner.lock().unwrap();
        Ok(inner.current.as_ref().map(|(meta, bytes)| Snapshot {
            meta: meta.clone(),
            snapshot: Box::new(Cursor::new(bytes.clone())),
        }))
    }
}

/// Builds each test's real log store and real state machine on real files
/// in a fresh temporary directory.
struct RealFiles;

impl StoreBuilder<TypeConfig, LogStore<TypeConfig>, StateMachine, tempfile::TempDir> for RealFiles {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore<TypeConfig>, StateMachine), StorageError<u64>> {
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
    async fn build(&self) -> Result<((), Store, MemStateMachine), StorageError<u64>> {
        let store = LogStore::open(Arc::new(SimFs::new()), sim_dir()).expect("open log store");
        Ok(((), store, MemStateMachine::default()))
    }
}

#[test]
fn openraft_storage_suite_on_real_files() {
    Suite::test_all(RealFiles).expect("openraft storage suite");
}

#[test]
fn openraft_storage_suite_on_simulated_disk() {
    Suite::test_all(SimulatedDisk).expect("openraft storage suite");
}
