//! Who a member is: its member id, the incarnation of its data directory,
//! the cluster it belongs to, and the incarnations it has seen of its peers
//! (DESIGN §3 "Identity").
//!
//! - The **incarnation** is a random non-zero id made when a data directory
//!   is first used. A wiped directory gets a new one, so peers can tell a
//!   member that lost its state from the member they knew.
//! - The **cluster id** is a random non-zero id made by the bootstrapping
//!   member before it initializes the cluster. Other members start with 0
//!   ("not known yet") and adopt the id of the first AppendEntries or
//!   snapshot they accept from a leader; from then on a message carrying
//!   another cluster id is refused.
//! - **Peer incarnations** are learned on first contact (the first request a
//!   peer sends) and kept: a later request from the same member id with
//!   another incarnation is refused (a wiped member cannot rejoin under its
//!   old id; it must be removed, and its new data added under a new id).
//!
//! On disk: `DATA/IDENTITY`, a UTF-8 text file of `key=value` lines:
//!
//! ```text
//! raftcask-identity 1          format line: name and version
//! member_id=3                  decimal
//! incarnation=9f2c...          16 lowercase hex digits, never 0
//! cluster_id=51aa...           16 lowercase hex digits, 0 = not known yet
//! peer.1=07be...               one line per peer whose incarnation is known
//! ```
//!
//! It is replaced atomically (write `IDENTITY.tmp`, fsync, rename, fsync the
//! directory), so a crash leaves the old file or the new one. Changes are
//! rare: at creation, when the cluster id is made or learned, and when a
//! peer is first seen.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::snapshot::node_vfs;

/// Name of the identity file inside the data directory.
pub const IDENTITY_FILE: &str = "IDENTITY";
/// First line of the identity file (name and format version).
pub const IDENTITY_FORMAT_LINE: &str = "raftcask-identity 1";
/// Largest identity file accepted, in bytes (a line per peer is small).
pub const IDENTITY_FILE_BYTES_MAX: u64 = 64 * 1024;

/// Why an identity could not be loaded or kept.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// Reading or writing the file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a valid identity file.
    #[error("{path}: {reason}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The data directory belongs to another member.
    #[error(
        "data directory {dir} belongs to member {found}, not member {expected}: \
         start member {found} on it, or give member {expected} its own directory"
    )]
    WrongMember {
        /// The data directory.
        dir: PathBuf,
        /// The member id the directory was made for.
        found: u64,
        /// The member id this process was started as.
        expected: u64,
    },
}

/// What the identity file holds.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    member_id: u64,
    incarnation: u64,
    cluster_id: u64,
    peers: BTreeMap<u64, u64>,
}

impl Record {
    fn encode(&self) -> String {
        let mut text = format!(
            "{IDENTITY_FORMAT_LINE}\nmember_id={}\nincarnation={:016x}\ncluster_id={:016x}\n",
            self.member_id, self.incarnation, self.cluster_id
        );
        for (peer, incarnation) in &self.peers {
            text.push_str(&format!("peer.{peer}={incarnation:016x}\n"));
        }
        text
    }

    fn decode(text: &str) -> Result<Record, String> {
        let mut lines = text.lines();
        if lines.next() != Some(IDENTITY_FORMAT_LINE) {
            return Err(format!("the first line is not {IDENTITY_FORMAT_LINE:?}"));
        }
        let hex = |value: &str, what: &str| {
            u64::from_str_radix(value, 16).map_err(|err| format!("{what} {value:?}: {err}"))
        };
        let mut member_id = None;
        let mut incarnation = None;
        let mut cluster_id = None;
        let mut peers = BTreeMap::new();
        for line in lines {
            let (key, value) = line
                .split_once('=')
                .ok_or_else(|| format!("line {line:?} is not key=value"))?;
            match key {
                "member_id" => {
                    member_id = Some(
                        value
                            .parse::<u64>()
                            .map_err(|err| format!("member_id {value:?}: {err}"))?,
                    )
                }
                "incarnation" => incarnation = Some(hex(value, "incarnation")?),
                "cluster_id" => cluster_id = Some(hex(value, "cluster_id")?),
                _ => {
                    let peer = key
                        .strip_prefix("peer.")
                        .ok_or_else(|| format!("unknown key {key:?}"))?
                        .parse::<u64>()
                        .map_err(|err| format!("peer id in {key:?}: {err}"))?;
                    peers.insert(peer, hex(value, key)?);
                }
            }
        }
        let record = Record {
            member_id: member_id.ok_or("member_id is missing")?,
            incarnation: incarnation.ok_or("incarnation is missing")?,
            cluster_id: cluster_id.ok_or("cluster_id is missing")?,
            peers,
        };
        if record.incarnation == 0 {
            return Err("incarnation is 0".to_string());
        }
        Ok(record)
    }
}

/// A random non-zero id from the operating system's random source.
pub fn random_id() -> std::io::Result<u64> {
    let mut file = std::fs::File::open("/dev/urandom")?;
    loop {
        let mut bytes = [0u8; 8];
        file.read_exact(&mut bytes)?;
        let id = u64::from_le_bytes(bytes);
        if id != 0 {
            return Ok(id);
        }
    }
}

/// Why a peer's request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    /// The request is for another member id.
    #[error("member id mismatch: the request is for member {to}, this is member {me}")]
    Member {
        /// The addressed member.
        to: u64,
        /// This member.
        me: u64,
    },
    /// The request is for an earlier incarnation of this member.
    #[error(
        "incarnation mismatch: the request is for incarnation {to:016x} of member {me}, this is \
         incarnation {mine:016x} (its data directory was replaced)"
    )]
    ToIncarnation {
        /// This member.
        me: u64,
        /// The addressed incarnation.
        to: u64,
        /// This incarnation.
        mine: u64,
    },
    /// The sender is another incarnation than the one this member knows.
    #[error(
        "member {from} presented incarnation {presented:016x}, but this cluster knows it as \
         {known:016x}: a member whose data directory was wiped cannot rejoin under its old id \
         (remove it, and add the new data directory under a new id)"
    )]
    FromIncarnation {
        /// The sender.
        from: u64,
        /// What it presented.
        presented: u64,
        /// What this member recorded.
        known: u64,
    },
    /// The sender belongs to another cluster.
    #[error("cluster id mismatch: the sender is in cluster {theirs:016x}, this is {mine:016x}")]
    Cluster {
        /// The sender's cluster id.
        theirs: u64,
        /// This member's cluster id.
        mine: u64,
    },
}

/// A member's identity, shared by its network client and peer service.
#[derive(Clone, Debug)]
pub struct Identity {
    dir: PathBuf,
    record: Arc<Mutex<Record>>,
}

/// How the receiving side treats the sender's cluster id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Adopt {
    /// The request comes from a leader (AppendEntries, snapshot): a member
    /// that does not know its cluster yet adopts the sender's.
    FromLeader,
    /// Any other request: never adopt.
    Never,
}

impl Identity {
    /// Loads `DIR/IDENTITY`, or makes it (new incarnation, cluster not known
    /// yet) when the directory has none. Refuses a directory made for
    /// another member id.
    pub fn load_or_create(dir: &Path, member_id: u64) -> Result<Identity, IdentityError> {
        let vfs = node_vfs();
        vfs.create_dir_all(dir)
            .map_err(|source| IdentityError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        let path = dir.join(IDENTITY_FILE);
        let opened = if vfs.file_exists(&path) {
            vfs.open(&path)
        } else {
            Err(std::io::Error::from(std::io::ErrorKind::NotFound))
        };
        let record = match opened {
            Ok(file) => {
                let read = || -> std::io::Result<Option<String>> {
                    let len = file.len()?;
                    if len > IDENTITY_FILE_BYTES_MAX {
                        return Ok(None);
                    }
                    let mut bytes = vec![0u8; len as usize];
                    file.read_exact_at(&mut bytes, 0)?;
                    String::from_utf8(bytes)
                        .map(Some)
                        .map_err(|err| std::io::Error::new(std::io::ErrorKind::InvalidData, err))
                };
                let text = read().map_err(|source| IdentityError::Io {
                    path: path.clone(),
                    source,
                })?;
                let Some(text) = text else {
                    return Err(IdentityError::Malformed {
                        path,
                        reason: format!(
                            "larger than IDENTITY_FILE_BYTES_MAX ({IDENTITY_FILE_BYTES_MAX} bytes)"
                        ),
                    });
                };
                let record = Record::decode(&text)
                    .map_err(|reason| IdentityError::Malformed { path, reason })?;
                if record.member_id != member_id {
                    return Err(IdentityError::WrongMember {
                        dir: dir.to_path_buf(),
                        found: record.member_id,
                        expected: member_id,
                    });
                }
                record
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                let record = Record {
                    member_id,
                    incarnation: random_id().map_err(|source| IdentityError::Io {
                        path: PathBuf::from("/dev/urandom"),
                        source,
                    })?,
                    cluster_id: 0,
                    peers: BTreeMap::new(),
                };
                write_record(dir, &record)?;
                tracing::info!(
                    member = member_id,
                    incarnation = format!("{:016x}", record.incarnation),
                    "new data directory"
                );
                record
            }
            Err(source) => return Err(IdentityError::Io { path, source }),
        };
        Ok(Identity {
            dir: dir.to_path_buf(),
            record: Arc::new(Mutex::new(record)),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Record> {
        self.record.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This member's id.
    pub fn member_id(&self) -> u64 {
        self.lock().member_id
    }

    /// This data directory's incarnation.
    pub fn incarnation(&self) -> u64 {
        self.lock().incarnation
    }

    /// The cluster id, 0 while not known.
    pub fn cluster_id(&self) -> u64 {
        self.lock().cluster_id
    }

    /// The incarnation recorded for `peer`, 0 if never seen.
    pub fn peer_incarnation(&self, peer: u64) -> u64 {
        self.lock().peers.get(&peer).copied().unwrap_or(0)
    }

    /// Makes a cluster id if none is known (the bootstrapping member, before
    /// it initializes the cluster); returns the cluster id.
    pub fn ensure_cluster_id(&self) -> Result<u64, IdentityError> {
        let mut record = self.lock();
        if record.cluster_id != 0 {
            return Ok(record.cluster_id);
        }
        let mut next = record.clone();
        next.cluster_id = random_id().map_err(|source| IdentityError::Io {
            path: PathBuf::from("/dev/urandom"),
            source,
        })?;
        write_record(&self.dir, &next)?;
        *record = next;
        tracing::info!(
            cluster = format!("{:016x}", record.cluster_id),
            "made the cluster id"
        );
        Ok(record.cluster_id)
    }

    /// Writes `cluster_id` as this directory's cluster (`kvnode restore`
    /// seeding a member of a new cluster). Refuses a directory that already
    /// knows another cluster.
    pub fn adopt_cluster_id(&self, cluster_id: u64) -> Result<(), IdentityError> {
        let mut record = self.lock();
        if record.cluster_id == cluster_id {
            return Ok(());
        }
        if record.cluster_id != 0 || cluster_id == 0 {
            return Err(IdentityError::Malformed {
                path: self.dir.join(IDENTITY_FILE),
                reason: format!(
                    "cluster_id is {:016x}; refusing to replace it with {cluster_id:016x}",
                    record.cluster_id
                ),
            });
        }
        let mut next = record.clone();
        next.cluster_id = cluster_id;
        write_record(&self.dir, &next)?;
        *record = next;
        Ok(())
    }

    /// Records what a peer said of itself in answer to `Identify` (a member
    /// of this member's initial cluster): its incarnation, if none is known
    /// yet, and its cluster id, if this member does not know one yet. A
    /// changed incarnation is refused, as in [`Identity::check`].
    pub fn learn_from_peer(
        &self,
        peer: u64,
        incarnation: u64,
        cluster_id: u64,
    ) -> Result<(), CheckError> {
        let me = self.member_id();
        self.check(cluster_id, peer, incarnation, me, 0, Adopt::FromLeader)
    }

    /// Whether the cluster id and every one of `peers`' incarnations are
    /// known.
    pub fn knows_all(&self, peers: impl IntoIterator<Item = u64>) -> bool {
        let record = self.lock();
        record.cluster_id != 0
            && peers
                .into_iter()
                .all(|p| p == record.member_id || record.peers.contains_key(&p))
    }

    /// Checks a peer request's identity fields against this member, learning
    /// (and persisting) what it may: the sender's incarnation on first
    /// contact and, per `adopt`, the cluster id. An error from persisting is
    /// reported as an I/O error string.
    pub fn check(
        &self,
        cluster_id: u64,
        from_id: u64,
        from_incarnation: u64,
        to_id: u64,
        to_incarnation: u64,
        adopt: Adopt,
    ) -> Result<(), CheckError> {
        let mut record = self.lock();
        if to_id != record.member_id {
            return Err(CheckError::Mismatch(Mismatch::Member {
                to: to_id,
                me: record.member_id,
            }));
        }
        if to_incarnation != 0 && to_incarnation != record.incarnation {
            return Err(CheckError::Mismatch(Mismatch::ToIncarnation {
                me: record.member_id,
                to: to_incarnation,
                mine: record.incarnation,
            }));
        }
        if cluster_id != 0 && record.cluster_id != 0 && cluster_id != record.cluster_id {
            return Err(CheckError::Mismatch(Mismatch::Cluster {
                theirs: cluster_id,
                mine: record.cluster_id,
            }));
        }
        let known = record.peers.get(&from_id).copied();
        if let Some(known) = known
            && from_incarnation != 0
            && known != from_incarnation
        {
            return Err(CheckError::Mismatch(Mismatch::FromIncarnation {
                from: from_id,
                presented: from_incarnation,
                known,
            }));
        }
        let learn_peer = known.is_none() && from_incarnation != 0;
        let learn_cluster = record.cluster_id == 0 && cluster_id != 0 && adopt == Adopt::FromLeader;
        if learn_peer || learn_cluster {
            let mut next = record.clone();
            if learn_peer {
                next.peers.insert(from_id, from_incarnation);
            }
            if learn_cluster {
                next.cluster_id = cluster_id;
            }
            write_record(&self.dir, &next).map_err(|err| CheckError::Io(err.to_string()))?;
            if learn_cluster {
                tracing::info!(
                    cluster = format!("{cluster_id:016x}"),
                    leader = from_id,
                    "joined the cluster"
                );
            }
            *record = next;
        }
        Ok(())
    }
}

/// Why [`Identity::check`] refused a request.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CheckError {
    /// The identities do not match.
    #[error(transparent)]
    Mismatch(#[from] Mismatch),
    /// Learning something new could not be persisted.
    #[error("could not persist the identity: {0}")]
    Io(String),
}

fn write_record(dir: &Path, record: &Record) -> Result<(), IdentityError> {
    let path = dir.join(IDENTITY_FILE);
    let tmp = dir.join(format!("{IDENTITY_FILE}.tmp"));
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| IdentityError::Io { path, source }
    };
    // Through the node's vfs (the lazy disk in a lazy-disk build).
    let vfs = node_vfs();
    let file = vfs.create(&tmp).map_err(io(&tmp))?;
    file.write_all_at(record.encode().as_bytes(), 0)
        .map_err(io(&tmp))?;
    file.sync().map_err(io(&tmp))?;
    drop(file);
    vfs.rename(&tmp, &path).map_err(io(&path))?;
    vfs.sync_dir(dir).map_err(io(dir))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_and_rejects_garbage() {
        let record = Record {
            member_id: 3,
            incarnation: 0xabc,
            cluster_id: 0,
            peers: BTreeMap::from([(1, 7), (2, 0xffff_ffff_ffff_ffff)]),
        };
        assert_eq!(Record::decode(&record.encode()).unwrap(), record);
        assert!(Record::decode("raftcask-identity 2\n").is_err());
        assert!(Record::decode(&record.encode().replace("incarnation", "incarnatio")).is_err());
        assert!(
            Record::decode(
                &record
                    .encode()
                    .replace("0000000000000abc", "0000000000000000")
            )
            .is_err()
        );
    }

    #[test]
    fn learns_once_then_refuses_mismatches() {
        let dir = tempfile::tempdir().unwrap();
        let me = Identity::load_or_create(dir.path(), 2).unwrap();
        let mine = me.incarnation();
        assert_ne!(mine, 0);
        // Not the addressed member / incarnation.
        assert!(me.check(0, 1, 11, 3, 0, Adopt::Never).is_err());
        assert!(me.check(0, 1, 11, 2, mine ^ 1, Adopt::Never).is_err());
        // First contact from member 1 is learned; its cluster id is not
        // adopted from a vote, only from a leader's append.
        me.check(77, 1, 11, 2, mine, Adopt::Never).unwrap();
        assert_eq!(me.cluster_id(), 0);
        me.check(77, 1, 11, 2, mine, Adopt::FromLeader).unwrap();
        assert_eq!(me.cluster_id(), 77);
        assert_eq!(me.peer_incarnation(1), 11);
        // Member 1 wiped (new incarnation) or another cluster: refused.
        assert!(matches!(
            me.check(77, 1, 12, 2, mine, Adopt::FromLeader),
            Err(CheckError::Mismatch(Mismatch::FromIncarnation { .. }))
        ));
        assert!(matches!(
            me.check(78, 1, 11, 2, mine, Adopt::FromLeader),
            Err(CheckError::Mismatch(Mismatch::Cluster { .. }))
        ));
        // All of it survives a restart; another member id is refused.
        let again = Identity::load_or_create(dir.path(), 2).unwrap();
        assert_eq!(
            (
                again.incarnation(),
                again.cluster_id(),
                again.peer_incarnation(1)
            ),
            (mine, 77, 11)
        );
        assert!(matches!(
            Identity::load_or_create(dir.path(), 5),
            Err(IdentityError::WrongMember {
                found: 2,
                expected: 5,
                ..
            })
        ));
    }
}
