//! The openraft type configuration of the node and the metadata every
//! applied entry leaves in the engine.
//!
//! openraft reaches two crates only — kvnode and raftlog; kvstate, bitcask,
//! vfs, kvcodec and every client crate never see it (`.ci/boundaries`).
//! Inside kvnode the type config and node type are defined here; the
//! state machine and snapshot folder implement openraft's storage traits,
//! and the services in `server/` and the tasks in `node/` hold the
//! `openraft::Raft` handle and read its metrics.

use std::fmt;

use openraft::alias::{
    EntryOf, LeaderIdOf, LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf, VoteOf,
};
use openraft::vote::RaftLeaderId;
use serde::{Deserialize, Serialize};

use crate::codec::{self, CodecError};
use crate::snapshot::SnapshotHandle;
use crate::state_machine::StateMachine;
use kvstate::command::{EntryResponse, Proposal};

/// A cluster member as openraft stores it in the membership: where clients
/// reach it and where peers reach it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Address of the client gRPC port (`host:port`).
    pub client_addr: String,
    /// Address of the peer (Raft) gRPC port (`host:port`).
    pub peer_addr: String,
}

/// Longest member address accepted (`host:port`), in bytes: far above any
/// real host name (DNS names are at most 253 bytes) and far below what the
/// snapshot manifest can encode.
pub const NODE_ADDR_BYTES_MAX: usize = 512;

impl NodeInfo {
    /// Checks both addresses against [`NODE_ADDR_BYTES_MAX`] and for a
    /// `host:port` shape; the error names the field and the limit.
    pub fn validate(&self, id: u64) -> Result<(), String> {
        for (field, addr) in [
            ("client_addr", &self.client_addr),
            ("peer_addr", &self.peer_addr),
        ] {
            if addr.len() > NODE_ADDR_BYTES_MAX {
                return Err(format!(
                    "member {id}: {field} is {} bytes, above NODE_ADDR_BYTES_MAX ({NODE_ADDR_BYTES_MAX})",
                    addr.len()
                ));
            }
            let port = addr
                .rsplit_once(':')
                .map(|(host, port)| (host, port.parse::<u16>()));
            if !matches!(port, Some((host, Ok(_))) if !host.is_empty()) {
                return Err(format!("member {id}: {field} {addr:?} is not host:port"));
            }
        }
        Ok(())
    }
}

impl fmt::Display for NodeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "client {} peer {}", self.client_addr, self.peer_addr)
    }
}

openraft::declare_raft_types!(
    /// The node's openraft type configuration.
    pub TypeConfig:
        D = Proposal,
        R = EntryResponse,
        NodeId = u64,
        Node = NodeInfo,
);

/// The node's Raft handle: openraft over this node's state machine.
pub type NodeRaft = openraft::Raft<TypeConfig, StateMachine>;
/// A log id: the leader (term, member) that proposed the entry, and its index.
pub type NodeLogId = LogIdOf<TypeConfig>;
/// A leader id: (term, member), openraft's "advanced" mode, where several
/// members may be candidates in one term (the same shape as 0.9's).
pub type NodeLeaderId = LeaderIdOf<TypeConfig>;
/// A vote: a leader id and whether a quorum granted it.
pub type NodeVote = VoteOf<TypeConfig>;
/// A log entry.
pub type NodeEntry = EntryOf<TypeConfig>;
/// A stored membership of this node's type config.
pub type NodeMembership = StoredMembershipOf<TypeConfig>;
/// A snapshot: openraft's meta over this node's snapshot handle.
pub type NodeSnapshot = SnapshotOf<TypeConfig, SnapshotHandle>;
/// A snapshot's meta as openraft sees it (last log id, membership, id).
pub type NodeSnapshotMeta = SnapshotMetaOf<TypeConfig>;
/// Raft metrics of this node's type config.
pub type NodeMetrics = openraft::RaftMetrics<TypeConfig>;

/// The log id of the entry at `index` proposed by `member` in `term`.
pub fn log_id(term: u64, member: u64, index: u64) -> NodeLogId {
    NodeLogId::new(NodeLeaderId::new(term, member), index)
}

/// What the commit record of every engine batch the state machine writes
/// carries: the entry's log id, the cluster time after applying it, and the
/// membership in force after it. Restart recovers `last_applied`, the
/// membership and the cluster clock from the engine's last batch alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitMeta {
    /// The applied entry's log id.
    pub log_id: NodeLogId,
    /// Cluster time in ms after the entry (its own time for a proposal, the
    /// previous entry's for blank and membership entries).
    pub time_ms: u64,
    /// The last membership applied at or before this entry.
    pub membership: NodeMembership,
}

impl CommitMeta {
    /// Encodes with the crate's codec.
    pub fn encode(&self) -> Vec<u8> {
        codec::encode(self)
    }

    /// Decodes bytes written by [`CommitMeta::encode`].
    pub fn decode(bytes: &[u8]) -> Result<CommitMeta, CodecError> {
        codec::decode(bytes)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use openraft::{Membership, StoredMembership};

    use super::*;

    #[test]
    fn commit_meta_round_trips() {
        let nodes = BTreeMap::from([(
            1u64,
            NodeInfo {
                client_addr: "127.0.0.1:7001".into(),
                peer_addr: "127.0.0.1:7101".into(),
            },
        )]);
        let log_id = log_id(3, 1, 42);
        let meta = CommitMeta {
            log_id,
            time_ms: 1234,
            membership: StoredMembership::new(
                Some(log_id),
                Membership::new(vec![BTreeSet::from([1])], nodes).unwrap(),
            ),
        };
        assert_eq!(CommitMeta::decode(&meta.encode()).unwrap(), meta);
        assert!(CommitMeta::decode(&meta.encode()[1..]).is_err());
    }
}

#[cfg(test)]
mod node_info_tests {
    use super::*;

    #[test]
    fn addresses_are_checked_with_the_limit_named() {
        let ok = NodeInfo {
            client_addr: "127.0.0.1:7001".into(),
            peer_addr: "kv-1.example:7101".into(),
        };
        ok.validate(1).unwrap();
        let long = NodeInfo {
            peer_addr: format!("{}:1", "h".repeat(NODE_ADDR_BYTES_MAX)),
            ..ok.clone()
        };
        let err = long.validate(2).unwrap_err();
        assert!(
            err.contains("peer_addr") && err.contains("NODE_ADDR_BYTES_MAX"),
            "{err}"
        );
        for bad in ["127.0.0.1", ":7001", "host:port", "host:70000"] {
            let info = NodeInfo {
                client_addr: bad.into(),
                ..ok.clone()
            };
            assert!(info.validate(3).is_err(), "{bad}");
        }
    }
}
