//! Leases, as etcd has them: a time to live that keys attached to it share.
//!
//! A lease is granted with a TTL and an id, renewed by keep-alives, and
//! revoked by a client or by expiry; revoking deletes every key attached to
//! it, all at one revision, so a watcher sees them go together. Everything
//! here is part of the replicated state: grants, renewals and revokes are
//! entries ([`crate::command::Command::Leases`]), and expiry is judged by
//! each entry's cluster time, like a key's TTL — never by a clock of this
//! member — so every replica revokes the same leases at the same entries.
//!
//! **Lease time.** A lease expires at `max(renewed, refreshed) + ttl`, in ms
//! of cluster time: `renewed` is the time of the entry that granted or last
//! renewed it; `refreshed` is the time of the last new leader's first entry
//! (its blank entry), which renews every lease at once (as etcd's new
//! leader does), so a leader change — during which no keep-alive can be
//! applied — never expires a lease. One number per store, not a write per
//! lease. Cluster time never advances faster than the leaders' monotonic
//! clocks (ARCHITECTURE.md, "Cluster time"), and a renewal is acknowledged
//! only once applied, at an entry stamped after its keep-alive was sent: so
//! a lease is never revoked by expiry before `ttl` (less the cluster
//! clock's 1 ms rounding) after its last acknowledged keep-alive was sent.
//!
//! **Expiry** happens before each entry's requests (after the TTL deletes):
//! every lease whose expiry is at or below the entry's time is revoked,
//! in (expiry, id) order, at most [`LEASE_EXPIRY_OPS_PER_ENTRY_MAX`]
//! records per entry (the next entries take the rest); a lease's keys and
//! its record always go in one entry.
//!
//! **Attached keys** are the keys whose [`crate::revision::KeyMeta`] names
//! the lease and whose `mod_revision` is above the lease's
//! `granted_revision`: a transaction's put attaches its key (the lease must
//! exist); any later put without the lease, or a delete, detaches it; an
//! expire, a persist or a put with `ignore_lease` keeps the lease only of a
//! key attached to it, and stores 0 otherwise. (A key may name an id that
//! is no lease: stored by a build before leases had a lifecycle, which
//! kept the id only. Those rules keep such a key detached from a lease
//! granted later under that id, on a member that kept running and on one
//! that loads its files alike.) This module keeps the set in memory,
//! updated from each entry's batch before it is written
//! ([`Leases::note_batch`]), and rebuilt at open from the key directory's
//! record metas: the same function of the files either way. A revoke
//! deletes every attached key still in the key directory, a key whose TTL
//! ran out but whose expiry delete has not come yet included, so all of
//! them go at the revoke's revision.
//!
//! ## On disk (reserved keys, under [`crate::command::RESERVED_KEY_PREFIX`])
//! - `lease/` + id (8 bytes, big-endian) → 25 bytes: a format byte
//!   [`LEASE_RECORD_FORMAT`] (1), `ttl_ms` (u64 big-endian), `renewed_ms`
//!   (u64 big-endian), `granted_revision` (u64 big-endian: the store
//!   revision when it was granted). Written by a grant and each renewal;
//!   deleted (a tombstone) by a revoke.
//! - `lease-refresh` → 9 bytes: a format byte (1) and `refreshed_ms` (u64
//!   big-endian). Written by a new leader's blank entry while any lease
//!   exists.
//!
//! These records are written after the entry's user records and before
//! its session records; they take no revision and never reach the change
//! history (reserved keys are not user keys).

use std::collections::{BTreeMap, BTreeSet};

use bitcask::{Batch, Engine, Op as EngineOp};
use serde::{Deserialize, Serialize};

use crate::command::RESERVED_KEY_PREFIX;
use crate::revision::{KeyMeta, RevisionError};

/// The shortest lease TTL (ms): a grant asking for less gets this (as etcd
/// raises a TTL below its minimum). Equal to the wire's
/// `kvproto::LEASE_TTL_MS_MIN` (kvnode checks at compile time).
pub const LEASE_TTL_MS_MIN: u64 = 2_000;
/// The longest lease TTL (ms): etcd's `MaxLeaseTTL`, 9 × 10^9 s.
pub const LEASE_TTL_MS_MAX: u64 = 9_000_000_000_000;
/// The largest lease id (an etcd lease id is a positive int64).
pub const LEASE_ID_MAX: u64 = i64::MAX as u64;
/// Leases that may exist at once: about 100 bytes of memory each, plus
/// their keys; a listing of them all (about 11 bytes each on the wire)
/// stays under the client port's 8 MiB message limit.
pub const LEASES_MAX: usize = 1 << 19;
/// Keys attached to one lease at most: its revoke deletes them all in one
/// entry, beside its own record, within [`LEASE_EXPIRY_OPS_PER_ENTRY_MAX`].
pub const LEASE_KEYS_MAX: usize = 8_191;
/// Records the expiry revokes of one entry write at most (keys and lease
/// records); a lease whose revoke does not fit goes to the next entry.
pub const LEASE_EXPIRY_OPS_PER_ENTRY_MAX: usize = LEASE_KEYS_MAX + 1;
/// Leases one renewal request names at most (one record each).
pub const LEASE_RENEW_IDS_MAX: usize = 10_000;
/// The format byte leading a lease record and the refresh record.
pub const LEASE_RECORD_FORMAT: u8 = 1;

/// A lease operation, carried by a [`crate::command::Command::Leases`] entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseOp {
    /// Grants a lease. `id` 0: the state machine picks one.
    Grant {
        /// The id asked for, or 0.
        id: u64,
        /// Time to live in ms (raised to [`LEASE_TTL_MS_MIN`]).
        ttl_ms: u64,
    },
    /// Revokes a lease and deletes its keys at one revision.
    Revoke {
        /// The lease.
        id: u64,
    },
    /// Renews leases (keep-alives, coalesced by the leader).
    Renew {
        /// The leases, each renewed at the entry's time.
        ids: Vec<u64>,
    },
}

impl LeaseOp {
    /// Records it may write at most (what the batcher counts).
    pub fn records(&self) -> usize {
        match self {
            LeaseOp::Grant { .. } => 1,
            LeaseOp::Revoke { .. } => LEASE_KEYS_MAX + 1,
            LeaseOp::Renew { ids } => ids.len(),
        }
    }
}

/// What a lease operation did, inside [`crate::command::Outcome::Lease`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseAnswer {
    /// The lease exists now.
    Granted {
        /// Its id.
        id: u64,
        /// Its TTL in ms.
        ttl_ms: u64,
    },
    /// The lease and its keys are gone.
    Revoked {
        /// Keys deleted with it.
        deleted: u64,
    },
    /// Per id of the request, in order: its TTL in ms, or 0 when there is no
    /// such lease.
    Renewed {
        /// One per id.
        ttls_ms: Vec<u64>,
    },
}

/// One lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Its time to live in ms.
    pub ttl_ms: u64,
    /// Cluster time of its grant or last renewal.
    pub renewed_ms: u64,
    /// The store revision when it was granted: keys attached to it were
    /// written above it.
    pub granted_revision: u64,
    /// Keys attached to it.
    pub keys: usize,
}

/// Why the leases could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LeaseLoadError {
    /// The engine failed.
    #[error("engine: {0}")]
    Engine(#[from] bitcask::Error),
    /// A key's revision metadata does not decode.
    #[error(transparent)]
    Revision(#[from] RevisionError),
    /// A lease record does not decode.
    #[error("lease record {key:?}: {reason}")]
    Record {
        /// The record's key.
        key: Vec<u8>,
        /// What is wrong.
        reason: String,
    },
}

/// Keys read per page while loading.
const LOAD_PAGE_KEYS: usize = 1024;

/// The leases of a store, their expiry order and their keys.
#[derive(Clone, Debug, Default)]
pub struct Leases {
    leases: BTreeMap<u64, Lease>,
    /// Cluster time of the last new leader's blank entry (renews all).
    refreshed_ms: u64,
    /// (expiry ms, id) of every lease.
    expiries: BTreeSet<(u64, u64)>,
    /// (lease, key) of every attached key.
    attached: BTreeSet<(u64, Vec<u8>)>,
    /// Leases whose record this entry rewrites (or deletes).
    dirty: BTreeSet<u64>,
    /// Whether this entry writes the refresh record.
    refresh_dirty: bool,
    /// Puts of this entry that attach keys, per lease (an upper bound of
    /// the keys they add, for [`LEASE_KEYS_MAX`]).
    attaching: BTreeMap<u64, usize>,
    /// Leases revoked by expiry, and at a request, since this was loaded
    /// (for metrics; not part of the replicated state).
    revoked: (u64, u64),
}

/// The key of a lease's record.
pub fn lease_key(id: u64) -> Vec<u8> {
    let mut key = RESERVED_KEY_PREFIX.to_vec();
    key.extend_from_slice(b"lease/");
    key.extend_from_slice(&id.to_be_bytes());
    key
}

/// The key of the refresh record.
pub fn refresh_key() -> Vec<u8> {
    [RESERVED_KEY_PREFIX, b"lease-refresh"].concat()
}

/// Bytes of a lease record's value.
const LEASE_RECORD_BYTES: usize = 25;

fn encode_lease(lease: &Lease) -> Vec<u8> {
    let mut value = Vec::with_capacity(LEASE_RECORD_BYTES);
    value.push(LEASE_RECORD_FORMAT);
    value.extend_from_slice(&lease.ttl_ms.to_be_bytes());
    value.extend_from_slice(&lease.renewed_ms.to_be_bytes());
    value.extend_from_slice(&lease.granted_revision.to_be_bytes());
    value
}

fn decode_u64(bytes: &[u8]) -> u64 {
    u64::from_be_bytes(bytes.try_into().expect("8 bytes"))
}

/// A lease id picked for a grant that names none: a mix of the entry's
/// log index and the request's position (the same on every replica; ids
/// look random, as etcd's do), moved on past ids in use.
fn pick_id(leases: &BTreeMap<u64, Lease>, index: u64, position: u64) -> u64 {
    // splitmix64's finaliser.
    let mut z = index
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(position);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let mut id = (z & LEASE_ID_MAX).max(1);
    while leases.contains_key(&id) {
        id = if id == LEASE_ID_MAX { 1 } else { id + 1 };
    }
    id
}

/// Why a lease operation was refused (nothing changed).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// No such lease (never granted, expired or revoked).
    #[error("etcdserver: requested lease not found: lease {id:016x}")]
    NotFound {
        /// The lease.
        id: u64,
    },
    /// A grant names an id in use.
    #[error("etcdserver: lease already exists: lease {id:016x}")]
    Exists {
        /// The lease.
        id: u64,
    },
    /// A grant names an id above [`LEASE_ID_MAX`].
    #[error("field `id` is {id}; the limit LEASE_ID_MAX is {LEASE_ID_MAX}")]
    IdTooLarge {
        /// The id.
        id: u64,
    },
    /// A grant asks for more than [`LEASE_TTL_MS_MAX`].
    #[error(
        "etcdserver: too large lease TTL: field `ttl_ms` is {ttl_ms}; the limit LEASE_TTL_MS_MAX is {LEASE_TTL_MS_MAX}"
    )]
    TtlTooLarge {
        /// The TTL asked for.
        ttl_ms: u64,
    },
    /// [`LEASES_MAX`] leases exist.
    #[error("{LEASES_MAX} leases exist; the limit LEASES_MAX is {LEASES_MAX}")]
    TooMany,
    /// A renewal names more than [`LEASE_RENEW_IDS_MAX`] leases.
    #[error(
        "field `ids` holds {ids} leases; the limit LEASE_RENEW_IDS_MAX is {LEASE_RENEW_IDS_MAX}"
    )]
    TooManyIds {
        /// How many.
        ids: usize,
    },
}

impl Leases {
    /// Loads the leases, the refresh time and the attached keys from
    /// `engine`: the lease records (one prefix scan), then, if any lease
    /// exists, one keys-only pass over the key directory reading metas.
    pub fn load(engine: &Engine) -> Result<Leases, LeaseLoadError> {
        let mut leases = Leases::default();
        if let Some(item) = engine.get(&refresh_key(), 0)? {
            match item.value.as_slice() {
                [LEASE_RECORD_FORMAT, rest @ ..] if rest.len() == 8 => {
                    leases.refreshed_ms = decode_u64(rest);
                }
                _ => {
                    return Err(LeaseLoadError::Record {
                        key: refresh_key(),
                        reason: format!("{} bytes, not format 1 and 8 bytes", item.value.len()),
                    });
                }
            }
        }
        let prefix = [RESERVED_KEY_PREFIX, b"lease/"].concat();
        scan_pages(
            engine,
            bitcask::Scan::prefix(prefix.clone(), LOAD_PAGE_KEYS),
            |entry| {
                let bad = |reason: &str| LeaseLoadError::Record {
                    key: entry.key.clone(),
                    reason: reason.to_string(),
                };
                let id_bytes = &entry.key[prefix.len()..];
                if id_bytes.len() != 8 {
                    return Err(bad("the id is not 8 bytes"));
                }
                let value = entry.value.as_deref().unwrap_or_default();
                let [LEASE_RECORD_FORMAT, rest @ ..] = value else {
                    return Err(bad("unknown format"));
                };
                if rest.len() != LEASE_RECORD_BYTES - 1 {
                    return Err(bad("not 25 bytes"));
                }
                let lease = Lease {
                    ttl_ms: decode_u64(&rest[..8]),
                    renewed_ms: decode_u64(&rest[8..16]),
                    granted_revision: decode_u64(&rest[16..]),
                    keys: 0,
                };
                leases.leases.insert(decode_u64(id_bytes), lease);
                Ok(())
            },
        )?;
        if !leases.leases.is_empty() {
            let scan = bitcask::Scan {
                keys_only: true,
                ..bitcask::Scan::all(LOAD_PAGE_KEYS)
            };
            let mut attached = BTreeSet::new();
            scan_pages(engine, scan, |entry| {
                if entry.key.starts_with(RESERVED_KEY_PREFIX) {
                    return Ok(());
                }
                let meta = KeyMeta::decode(&entry.meta)?;
                // A key may name an id granted as a lease after it was
                // written (see the module doc): attached to nothing.
                if meta.lease != 0
                    && leases
                        .leases
                        .get(&meta.lease)
                        .is_some_and(|lease| meta.mod_revision > lease.granted_revision)
                {
                    attached.insert((meta.lease, entry.key.clone()));
                }
                Ok(())
            })?;
            for (lease, _) in &attached {
                if let Some(found) = leases.leases.get_mut(lease) {
                    found.keys += 1;
                }
            }
            leases.attached = attached;
        }
        leases.rebuild_expiries();
        Ok(leases)
    }

    fn rebuild_expiries(&mut self) {
        self.expiries = self
            .leases
            .iter()
            .map(|(id, lease)| (self.expiry_of(lease), *id))
            .collect();
    }

    fn expiry_of(&self, lease: &Lease) -> u64 {
        lease
            .renewed_ms
            .max(self.refreshed_ms)
            .saturating_add(lease.ttl_ms)
    }

    /// Whether no lease exists and no key is attached (nothing to track).
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty() && self.attached.is_empty()
    }

    /// Leases that exist.
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    /// Keys attached to leases.
    pub fn attached_keys(&self) -> usize {
        self.attached.len()
    }

    /// The lease `id`, if it exists.
    pub fn get(&self, id: u64) -> Option<Lease> {
        self.leases.get(&id).copied()
    }

    /// When lease `id` expires (ms of cluster time), if it exists.
    pub fn expiry_ms(&self, id: u64) -> Option<u64> {
        self.leases.get(&id).map(|lease| self.expiry_of(lease))
    }

    /// Every lease id, in order.
    pub fn ids(&self) -> Vec<u64> {
        self.leases.keys().copied().collect()
    }

    /// The keys attached to lease `id`, in key order.
    pub fn keys_of(&self, id: u64) -> Vec<Vec<u8>> {
        self.attached
            .range((id, Vec::new())..)
            .take_while(|(lease, _)| *lease == id)
            .map(|(_, key)| key.clone())
            .collect()
    }

    /// [`Leases::keys_of`], if their bytes come to at most `bytes_max`;
    /// else `Err` with the bytes counted when it stopped (above the limit).
    pub fn keys_of_within(&self, id: u64, bytes_max: usize) -> Result<Vec<Vec<u8>>, usize> {
        let mut bytes = 0;
        let mut keys = Vec::new();
        for (_, key) in self
            .attached
            .range((id, Vec::new())..)
            .take_while(|(lease, _)| *lease == id)
        {
            bytes += key.len();
            if bytes > bytes_max {
                return Err(bytes);
            }
            keys.push(key.clone());
        }
        Ok(keys)
    }

    /// The earliest lease expiry (ms of cluster time).
    pub fn next_expiry_ms(&self) -> Option<u64> {
        self.expiries.first().map(|(expiry, _)| *expiry)
    }

    /// Whether `key` is attached to lease `id`.
    pub fn is_attached(&self, id: u64, key: &[u8]) -> bool {
        self.attached.contains(&(id, key.to_vec()))
    }

    /// The first lease expired at `now_ms`, if any.
    pub fn first_expired(&self, now_ms: u64) -> Option<(u64, usize)> {
        let (expiry, id) = self.expiries.first()?;
        (*expiry <= now_ms).then(|| (*id, self.leases[id].keys))
    }

    /// Grants a lease at `now_ms` and store revision `revision` (entry
    /// `index`, request `position`).
    pub fn grant(
        &mut self,
        id: u64,
        ttl_ms: u64,
        (now_ms, revision): (u64, u64),
        index: u64,
        position: u64,
    ) -> Result<(u64, u64), LeaseError> {
        if id > LEASE_ID_MAX {
            return Err(LeaseError::IdTooLarge { id });
        }
        if ttl_ms > LEASE_TTL_MS_MAX {
            return Err(LeaseError::TtlTooLarge { ttl_ms });
        }
        if self.leases.contains_key(&id) {
            return Err(LeaseError::Exists { id });
        }
        if self.leases.len() >= LEASES_MAX {
            return Err(LeaseError::TooMany);
        }
        let id = if id == 0 {
            pick_id(&self.leases, index, position)
        } else {
            id
        };
        let lease = Lease {
            ttl_ms: ttl_ms.max(LEASE_TTL_MS_MIN),
            renewed_ms: now_ms,
            granted_revision: revision,
            keys: 0,
        };
        self.expiries.insert((self.expiry_of(&lease), id));
        self.leases.insert(id, lease);
        self.dirty.insert(id);
        Ok((id, lease.ttl_ms))
    }

    /// Renews leases at `now_ms`: each one's TTL, or 0 if it does not exist
    /// or has expired (an expired lease waiting for its revoke behind a
    /// backlog is not brought back, as etcd refuses to renew one).
    pub fn renew(&mut self, ids: &[u64], now_ms: u64) -> Result<Vec<u64>, LeaseError> {
        if ids.len() > LEASE_RENEW_IDS_MAX {
            return Err(LeaseError::TooManyIds { ids: ids.len() });
        }
        let mut ttls = Vec::with_capacity(ids.len());
        for id in ids {
            let Some(lease) = self.leases.get(id).copied() else {
                ttls.push(0);
                continue;
            };
            if self.expiry_of(&lease) <= now_ms {
                ttls.push(0);
                continue;
            }
            self.expiries.remove(&(self.expiry_of(&lease), *id));
            let renewed = Lease {
                renewed_ms: lease.renewed_ms.max(now_ms),
                ..lease
            };
            self.expiries.insert((self.expiry_of(&renewed), *id));
            self.leases.insert(*id, renewed);
            self.dirty.insert(*id);
            ttls.push(lease.ttl_ms);
        }
        Ok(ttls)
    }

    /// Leases revoked (by expiry, at a request) since these were loaded.
    pub fn revoke_counts(&self) -> (u64, u64) {
        self.revoked
    }

    /// Removes lease `id` (its record is deleted with the entry), counted
    /// as expired or revoked; returns the keys attached to it, which the
    /// caller deletes.
    pub fn revoke(&mut self, id: u64, expired: bool) -> Result<Vec<Vec<u8>>, LeaseError> {
        let Some(lease) = self.leases.remove(&id) else {
            return Err(LeaseError::NotFound { id });
        };
        self.expiries.remove(&(self.expiry_of(&lease), id));
        let keys = self.keys_of(id);
        for key in &keys {
            self.attached.remove(&(id, key.clone()));
        }
        self.attaching.remove(&id);
        self.dirty.insert(id);
        if expired {
            self.revoked.0 += 1;
        } else {
            self.revoked.1 += 1;
        }
        Ok(keys)
    }

    /// A new leader's first entry, at `now_ms`: every lease counts as
    /// renewed now.
    ///
    /// NEGATIVE CONTROL (feature nc-lease-leader-memory): a new leader
    /// renews nothing (and kvnode's leader keeps renewals in memory).
    pub fn refresh(&mut self, now_ms: u64) {
        if cfg!(feature = "nc-lease-leader-memory") || self.leases.is_empty() {
            return;
        }
        self.refreshed_ms = self.refreshed_ms.max(now_ms);
        self.refresh_dirty = true;
        self.rebuild_expiries();
    }

    /// Whether lease `id` exists and can take `more` keys beyond those it
    /// has and those this entry attaches so far (counted from the puts
    /// that attach a key not attached to it before the entry: an upper
    /// bound when one entry attaches a key twice).
    pub fn attach_check(&self, id: u64, more: usize) -> Result<bool, LeaseError> {
        let Some(lease) = self.leases.get(&id) else {
            return Err(LeaseError::NotFound { id });
        };
        let attaching = self.attaching.get(&id).copied().unwrap_or(0);
        if lease.keys + attaching + more > LEASE_KEYS_MAX {
            return Ok(false);
        }
        Ok(true)
    }

    /// Counts `more` keys as attached to `id` by this entry.
    pub fn attaching(&mut self, id: u64, more: usize) {
        *self.attaching.entry(id).or_default() += more;
    }

    /// Keeps the attached keys current with the user records of `batch`,
    /// before it is written: a put's meta names its lease (or none), a
    /// delete detaches. A key's lease before the batch is the engine's.
    pub fn note_batch(&mut self, engine: &Engine, batch: &Batch) -> Result<(), RevisionError> {
        if self.is_empty() {
            return Ok(());
        }
        let mut current: BTreeMap<&[u8], u64> = BTreeMap::new();
        for op in &batch.ops {
            let (key, lease) = match op {
                EngineOp::Put { key, meta, .. } => (key, KeyMeta::decode(meta)?.lease),
                EngineOp::Delete { key, .. } => (key, 0),
            };
            if key.starts_with(RESERVED_KEY_PREFIX) {
                continue;
            }
            let before = match current.get(key.as_slice()) {
                Some(lease) => *lease,
                None => match engine.meta(key, 0) {
                    Some(item) => KeyMeta::decode(&item.meta)?.lease,
                    None => 0,
                },
            };
            current.insert(key, lease);
            // By membership, not by change: a write naming an existing
            // lease attaches its key (it is written above the grant), as
            // a load would see it.
            if before != 0
                && before != lease
                && self.attached.remove(&(before, key.clone()))
                && let Some(old) = self.leases.get_mut(&before)
            {
                old.keys -= 1;
            }
            if lease != 0
                && let Some(new) = self.leases.get_mut(&lease)
                && self.attached.insert((lease, key.clone()))
            {
                new.keys += 1;
            }
        }
        Ok(())
    }

    /// Appends this entry's lease records to `batch` (in id order, then the
    /// refresh record) and starts the next entry afresh.
    pub fn write_records(&mut self, batch: &mut Batch) {
        for id in std::mem::take(&mut self.dirty) {
            match self.leases.get(&id) {
                Some(lease) => batch.ops.push(EngineOp::Put {
                    key: lease_key(id),
                    value: encode_lease(lease),
                    expiry_ms: 0,
                    meta: bitcask::RecordMeta::EMPTY,
                }),
                None => batch.ops.push(EngineOp::Delete {
                    key: lease_key(id),
                    meta: bitcask::RecordMeta::EMPTY,
                }),
            }
        }
        if std::mem::take(&mut self.refresh_dirty) {
            let mut value = vec![LEASE_RECORD_FORMAT];
            value.extend_from_slice(&self.refreshed_ms.to_be_bytes());
            batch.ops.push(EngineOp::Put {
                key: refresh_key(),
                value,
                expiry_ms: 0,
                meta: bitcask::RecordMeta::EMPTY,
            });
        }
        self.attaching.clear();
    }

    /// Records [`Leases::write_records`] will add.
    pub fn pending_records(&self) -> usize {
        self.dirty.len() + usize::from(self.refresh_dirty)
    }
}

/// Runs `visit` on every entry `scan` finds, page by page.
fn scan_pages(
    engine: &Engine,
    scan: bitcask::Scan,
    mut visit: impl FnMut(&bitcask::Entry) -> Result<(), LeaseLoadError>,
) -> Result<(), LeaseLoadError> {
    let mut after = None;
    loop {
        let page = engine.scan(
            &bitcask::Scan {
                after: after.clone(),
                ..scan.clone()
            },
            0,
        )?;
        for entry in &page {
            visit(entry)?;
        }
        match page.last() {
            Some(last) if page.len() == LOAD_PAGE_KEYS => after = Some(last.key.clone()),
            _ => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bitcask::{Options, SyncPolicy};
    use vfs::sim::SimFs;

    use super::*;
    use crate::apply::Applier;
    use crate::command::{Command, LeaseRequest, Outcome, Proposal};
    use crate::txn::{TxnOp, TxnRequest};

    fn engine(fs: &SimFs) -> Engine {
        let options = Options {
            sync: SyncPolicy::Never,
            auto_merge: None,
            segment_size_bytes: 4096,
            vfs: Arc::new(fs.clone()),
            ..Options::default()
        };
        Engine::open("/sm", options).unwrap()
    }

    /// Applies entries one after another from log index 1.
    struct Log<'e> {
        engine: &'e Engine,
        applier: Applier,
        index: u64,
    }

    impl Log<'_> {
        fn apply(&mut self, time_ms: u64, command: Command) -> Vec<Outcome> {
            self.index += 1;
            let proposal = Proposal { time_ms, command };
            let response = self
                .applier
                .apply(self.engine, self.index, &proposal, Vec::new())
                .unwrap();
            response.answers.into_iter().map(|a| a.outcome).collect()
        }

        fn lease(&mut self, time_ms: u64, op: LeaseOp) -> Outcome {
            let request = LeaseRequest { session: None, op };
            self.apply(time_ms, Command::Leases(vec![request]))
                .remove(0)
        }

        fn grant(&mut self, time_ms: u64, id: u64, ttl_ms: u64) -> u64 {
            match self.lease(time_ms, LeaseOp::Grant { id, ttl_ms }) {
                Outcome::Lease(LeaseAnswer::Granted { id, .. }) => id,
                other => panic!("grant: {other:?}"),
            }
        }

        fn put(&mut self, time_ms: u64, key: &str, lease: u64) -> Outcome {
            let txn = TxnRequest {
                session: None,
                compares: Vec::new(),
                success: vec![TxnOp::Put {
                    key: key.as_bytes().to_vec(),
                    value: b"v".to_vec(),
                    ttl_ms: 0,
                    lease,
                    prev_kv: false,
                    ignore_value: false,
                    ignore_lease: false,
                }],
                failure: Vec::new(),
            };
            self.apply(time_ms, Command::Txns(vec![txn])).remove(0)
        }

        fn leader_start(&mut self, time_ms: u64) {
            self.index += 1;
            let seq = self.index * crate::apply::VERSIONS_PER_INDEX;
            self.applier
                .apply_leader_start(self.engine, seq, time_ms, &[])
                .unwrap();
        }

        /// Stores `key` naming `lease` straight in the engine, as a build
        /// that kept lease ids only (no lifecycle) would have applied it.
        fn store_naming(&mut self, key: &str, lease: u64) {
            let revision = self.applier.header().revision;
            let meta = crate::revision::KeyMeta::created(revision, lease).encode();
            self.index += 1;
            let seq = self.index * crate::apply::VERSIONS_PER_INDEX;
            let batch = Batch::new()
                .seq(seq)
                .put_with_meta(key.as_bytes().to_vec(), b"v".to_vec(), 0, meta)
                .meta(self.applier.commit_meta(&[]));
            self.engine.write_batch(&batch).unwrap();
        }

        /// Whether each of `keys` is present.
        fn present(&self, keys: &[&str]) -> Vec<bool> {
            keys.iter()
                .map(|key| self.engine.meta(key.as_bytes(), 0).is_some())
                .collect()
        }
    }

    /// (id, ttl, renewed, keys) of one lease.
    type Seen = (u64, u64, u64, Vec<Vec<u8>>);

    /// Every lease as [`Seen`], and the refresh time.
    fn state(leases: &Leases) -> (Vec<Seen>, u64) {
        let all = leases
            .ids()
            .into_iter()
            .map(|id| {
                let lease = leases.get(id).unwrap();
                (id, lease.ttl_ms, lease.renewed_ms, leases.keys_of(id))
            })
            .collect();
        (all, leases.refreshed_ms)
    }

    #[test]
    fn a_lease_expires_by_entry_time_deleting_its_keys_at_one_revision() {
        let fs = SimFs::new();
        let engine = engine(&fs);
        let mut log = Log {
            engine: &engine,
            applier: Applier::default(),
            index: 0,
        };
        let lease = log.grant(0, 0, 5_000);
        assert!(matches!(log.put(10, "a", lease), Outcome::Txn { .. }));
        assert!(matches!(log.put(20, "b", lease), Outcome::Txn { .. }));
        assert!(matches!(log.put(30, "free", 0), Outcome::Txn { .. }));
        assert_eq!(log.applier.leases().keys_of(lease).len(), 2);
        let revision = log.applier.header().revision;
        log.apply(4_999, Command::Advance);
        assert_eq!(log.present(&["a", "b", "free"]), [true, true, true]);
        log.apply(5_000, Command::Advance);
        assert_eq!(log.present(&["a", "b", "free"]), [false, false, true]);
        assert_eq!(log.applier.header().revision, revision + 1, "one revision");
        for key in ["a", "b"] {
            let history = log.applier.history();
            let history = history.read().unwrap();
            let versions = history.versions(key.as_bytes()).unwrap();
            let last = versions.last().unwrap();
            assert_eq!(
                (last.kind, last.revision),
                (bitcask::StoredKind::Tombstone, revision + 1),
                "{key}"
            );
        }
        assert_eq!(log.applier.leases().len(), 0);
        assert_eq!(log.applier.leases().attached_keys(), 0);
        // A put naming it now is refused, NOT_FOUND.
        assert!(matches!(
            log.put(6_000, "c", lease),
            Outcome::LeaseNotFound { .. }
        ));
        assert!(matches!(
            log.lease(6_000, LeaseOp::Revoke { id: lease }),
            Outcome::LeaseNotFound { .. }
        ));
    }

    #[test]
    fn renewals_and_a_new_leader_push_the_expiry_and_load_rebuilds_it_all() {
        let fs = SimFs::new();
        let engine = engine(&fs);
        let mut log = Log {
            engine: &engine,
            applier: Applier::default(),
            index: 0,
        };
        let short = log.grant(0, 0, 1);
        assert_eq!(
            log.applier.leases().get(short).unwrap().ttl_ms,
            LEASE_TTL_MS_MIN
        );
        let lease = log.grant(0, 42, 5_000);
        assert_eq!(lease, 42);
        assert!(matches!(
            log.lease(0, LeaseOp::Grant { id: 42, ttl_ms: 9 }),
            Outcome::LeaseExists { .. }
        ));
        log.put(0, "k", lease);
        log.put(0, "moved", lease);
        log.put(0, "moved", 0); // a put without the lease detaches
        let renewed = log.lease(
            3_000,
            LeaseOp::Renew {
                ids: vec![lease, 999],
            },
        );
        assert_eq!(
            renewed,
            Outcome::Lease(LeaseAnswer::Renewed {
                ttls_ms: vec![5_000, 0]
            })
        );
        assert_eq!(log.applier.leases().expiry_ms(lease), Some(8_000));
        // The short one expired at 2000 (the renewal entry revoked it first).
        assert_eq!(log.applier.leases().get(short), None);
        log.leader_start(7_000);
        assert_eq!(log.applier.leases().expiry_ms(lease), Some(12_000));
        // Load from the files gives exactly what applying built.
        let loaded = Applier::load(&engine).unwrap();
        assert_eq!(state(loaded.leases()), state(log.applier.leases()));
        assert_eq!(
            state(loaded.leases()).0,
            [(42, 5_000, 3_000, vec![b"k".to_vec()])]
        );
        log.apply(11_999, Command::Advance);
        assert_eq!(log.present(&["k", "moved"]), [true, true]);
        log.apply(12_000, Command::Advance);
        assert_eq!(log.present(&["k", "moved"]), [false, true]);
        let loaded = Applier::load(&engine).unwrap();
        assert_eq!(state(loaded.leases()), state(log.applier.leases()));
        assert!(loaded.leases().ids().is_empty());
    }

    #[test]
    fn a_lease_holds_at_most_lease_keys_max_keys() {
        let fs = SimFs::new();
        let engine = engine(&fs);
        let mut log = Log {
            engine: &engine,
            applier: Applier::default(),
            index: 0,
        };
        let lease = log.grant(0, 0, 60_000);
        fill(&mut log, 1, "k", lease, LEASE_KEYS_MAX);
        assert_eq!(
            log.applier.leases().get(lease).unwrap().keys,
            LEASE_KEYS_MAX
        );
        match log.put(2, "one-more", lease) {
            Outcome::Rejected { reason } => assert!(reason.contains("LEASE_KEYS_MAX"), "{reason}"),
            other => panic!("{other:?}"),
        }
        // Re-putting an attached key is fine, and the revoke deletes all.
        assert!(matches!(log.put(3, "k00000", lease), Outcome::Txn { .. }));
        let revoked = log.lease(4, LeaseOp::Revoke { id: lease });
        assert_eq!(
            revoked,
            Outcome::Lease(LeaseAnswer::Revoked {
                deleted: LEASE_KEYS_MAX as u64
            })
        );
        assert_eq!(log.present(&["k00000", "k08190"]), [false, false]);
    }

    /// Attaches `count` keys `{prefix}{i:05}` to `lease` in entries of
    /// many transactions each, at `time_ms`.
    fn fill(log: &mut Log<'_>, time_ms: u64, prefix: &str, lease: u64, count: usize) {
        let mut next = 0;
        while next < count {
            let txns: Vec<TxnRequest> = (next..(next + 1000).min(count))
                .map(|i| TxnRequest {
                    session: None,
                    compares: Vec::new(),
                    success: vec![TxnOp::Put {
                        key: format!("{prefix}{i:05}").into_bytes(),
                        value: Vec::new(),
                        ttl_ms: 0,
                        lease,
                        prev_kv: false,
                        ignore_value: false,
                        ignore_lease: false,
                    }],
                    failure: Vec::new(),
                })
                .collect();
            next += txns.len();
            let outcomes = log.apply(time_ms, Command::Txns(txns));
            assert!(outcomes.iter().all(|o| matches!(o, Outcome::Txn { .. })));
        }
    }

    #[test]
    fn a_key_naming_an_id_granted_later_stays_detached_running_or_loaded() {
        let fs = SimFs::new();
        let engine = engine(&fs);
        let mut log = Log {
            engine: &engine,
            applier: Applier::default(),
            index: 0,
        };
        log.put(0, "a", 0);
        // A key stored by a build that kept lease ids only: it names 7,
        // which is no lease.
        log.store_naming("old", 7);
        assert_eq!(log.grant(10, 7, 60_000), 7);
        log.put(20, "new", 7);
        let loaded = Applier::load(&engine).unwrap();
        assert_eq!(
            state(loaded.leases()),
            state(log.applier.leases()),
            "written below the grant: not attached on load either"
        );
        // An expire keeps no lease the key is not attached to.
        let expire = crate::command::Request {
            session: None,
            conditions: Vec::new(),
            ops: vec![crate::command::Op::Expire {
                key: b"old".to_vec(),
                ttl_ms: 600_000,
            }],
        };
        log.apply(30, Command::Writes(vec![expire]));
        let running = state(log.applier.leases());
        assert_eq!(running.0, [(7, 60_000, 10, vec![b"new".to_vec()])]);
        let loaded = Applier::load(&engine).unwrap();
        assert_eq!(state(loaded.leases()), running, "a load agrees");
        assert_eq!(
            log.lease(40, LeaseOp::Revoke { id: 7 }),
            Outcome::Lease(LeaseAnswer::Revoked { deleted: 1 })
        );
        assert_eq!(log.present(&["old", "new"]), [true, false]);
    }

    #[test]
    fn a_revoke_deletes_an_attached_key_whose_ttl_ran_out_but_waits_for_its_delete() {
        let fs = SimFs::new();
        let engine = engine(&fs);
        let mut log = Log {
            engine: &engine,
            applier: Applier::default(),
            index: 0,
        };
        let lease = log.grant(0, 0, 60_000);
        // "t" attached, with a TTL to 100; a burst of keys expiring at 50
        // ahead of it fills the next entry's expiry deletes.
        let txn = TxnRequest {
            session: None,
            compares: Vec::new(),
            success: vec![TxnOp::Put {
                key: b"t".to_vec(),
                value: b"v".to_vec(),
                ttl_ms: 100,
                lease,
                prev_kv: false,
                ignore_value: false,
                ignore_lease: false,
            }],
            failure: Vec::new(),
        };
        log.apply(0, Command::Txns(vec![txn]));
        let burst = crate::command::Request {
            session: None,
            conditions: Vec::new(),
            ops: (0..crate::apply::EXPIRY_DELETES_PER_ENTRY_MAX)
                .map(|i| crate::command::Op::Put {
                    key: format!("b{i:05}").into_bytes(),
                    value: Vec::new(),
                    ttl_ms: 50,
                })
                .collect(),
        };
        log.apply(0, Command::Writes(vec![burst]));
        let before = log.applier.header().revision;
        let revoked = log.lease(200, LeaseOp::Revoke { id: lease });
        assert_eq!(revoked, Outcome::Lease(LeaseAnswer::Revoked { deleted: 1 }));
        assert_eq!(log.present(&["t"]), [false]);
        let after = log.applier.header().revision;
        assert_eq!(
            after,
            before + crate::apply::EXPIRY_DELETES_PER_ENTRY_MAX as u64 + 1,
            "the burst's deletes, then the revoke's one revision"
        );
        let history = log.applier.history();
        let history = history.read().unwrap();
        let last = *history.versions(b"t").unwrap().last().unwrap();
        assert_eq!(last.revision, after, "t went at the revoke's revision");
    }

    #[test]
    fn an_expired_lease_waiting_for_its_revoke_is_not_renewed() {
        let fs = SimFs::new();
        let engine = engine(&fs);
        let mut log = Log {
            engine: &engine,
            applier: Applier::default(),
            index: 0,
        };
        let big = log.grant(0, 1, 2_000);
        let small = log.grant(0, 2, 2_000);
        fill(&mut log, 0, "k", big, LEASE_KEYS_MAX);
        log.put(0, "s", small);
        // Both expire at 2000; the first entry after revokes the big one
        // (its keys fill the budget), the small one waits for the next.
        let renewed = log.lease(2_500, LeaseOp::Renew { ids: vec![small] });
        assert_eq!(
            renewed,
            Outcome::Lease(LeaseAnswer::Renewed { ttls_ms: vec![0] })
        );
        assert_eq!(log.applier.leases().get(big), None);
        assert!(log.applier.leases().get(small).is_some(), "still waiting");
        log.apply(2_600, Command::Advance);
        assert_eq!(log.applier.leases().get(small), None);
        assert_eq!(log.present(&["s", "k00000"]), [false, false]);
    }

    #[test]
    fn a_key_naming_a_full_lease_from_before_its_grant_counts_when_attached() {
        let fs = SimFs::new();
        let engine = engine(&fs);
        let mut log = Log {
            engine: &engine,
            applier: Applier::default(),
            index: 0,
        };
        log.put(0, "a", 0);
        // "o" names 7 before 7 is a lease (a build that kept ids only).
        log.store_naming("o", 7);
        assert_eq!(log.grant(10, 7, 60_000), 7);
        fill(&mut log, 20, "k", 7, LEASE_KEYS_MAX);
        // A put naming 7 on "o" would attach a key: refused, the lease full.
        match log.put(30, "o", 7) {
            Outcome::Rejected { reason } => assert!(reason.contains("LEASE_KEYS_MAX"), "{reason}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(log.applier.leases().get(7).unwrap().keys, LEASE_KEYS_MAX);
        // A put on a key it holds is fine.
        assert!(matches!(log.put(40, "k00007", 7), Outcome::Txn { .. }));
        assert_eq!(log.applier.leases().get(7).unwrap().keys, LEASE_KEYS_MAX);
    }
}
