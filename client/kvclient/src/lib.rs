//! # kvclient
//!
//! Async Rust client of raftcask: leader discovery and routing, bounded
//! retries with backoff and jitter, exactly-once writes through the client
//! session (DESIGN §3), and read consistency (linearizable by default, or
//! stale with a `min_index`, including read-your-writes).
//!
//! ## Modules
//!
//! - [`builder`]: [`ClientBuilder`] and the settings' defaults and limits.
//! - [`client`]: [`Client`] — get, put, delete, expire, persist, batch, scan
//!   (a paging [`ScanStream`]), cluster status, membership and snapshots.
//! - [`error`]: the one [`Error`] enum; how a gRPC status (and its
//!   `raftcask-error-bin` detail) becomes a retry, a redirect or an error.
//! - [`lease`]: leases — grant, revoke, renew once, time to live, list,
//!   and puts attached to a lease ([`Client::lease_grant`],
//!   [`Client::put_with_lease`], ...).
//! - [`keeper`]: [`LeaseKeeper`] ([`Client::keep_alive`]): a lease kept
//!   alive in the background over one stream per client until dropped,
//!   reporting its loss ([`LeaseLoss`]).
//! - [`router`]: members, the cached leader (refreshed from not-leader
//!   hints), round-robin reads over healthy members, the retry loop.
//! - the session (`kvproto::session`): the client id, write sequences and
//!   the lowest sequence not yet acknowledged.
//! - [`txn`]: etcd-style [`txn::Range`] reads, [`txn::DeleteRange`] and
//!   the [`txn::Txn`] builder (compares, then one of two branches), sent by
//!   [`Client::range`], [`Client::delete_range`] and [`Client::txn`].
//! - [`types`]: [`Consistency`], [`Entry`], [`Written`], [`PutOptions`],
//!   [`Batch`], [`Scan`] and friends.
//! - [`watch`]: [`Watch`] and the [`WatchStream`] of its changes
//!   ([`Client::watch`]), which resumes on another member by itself.
//!
//! ## Guarantees
//!
//! Every write carries the client id, its own sequence number and the lowest
//! sequence not yet acknowledged; every retry of it, to whichever member,
//! reuses that sequence, so it applies at most once. A write whose fate the
//! client cannot learn (sent, then a timeout, a lost leader, or a forgotten
//! session answer) is reported as [`Error::OutcomeUnknown`], never as failed.
//! A missing key is `Ok(None)`; a failed version condition is
//! [`Error::VersionMismatch`] with the current version.
//!
//! ## Example
//!
//! Settings are checked before anything is sent:
//!
//! ```
//! use std::time::Duration;
//! use kvclient::{Client, Error};
//!
//! let err = Client::builder(["127.0.0.1:7000"]).attempts(0).build().unwrap_err();
//! assert!(matches!(err, Error::InvalidConfig(_)));
//!
//! // Building does not connect: connections open on first use.
//! let client = Client::builder(["127.0.0.1:7000", "127.0.0.1:7001"])
//!     .request_timeout(Duration::from_secs(2))
//!     .build()
//!     .unwrap();
//! assert_ne!(client.client_id(), 0);
//! ```
//!
//! Against a running cluster:
//!
//! ```no_run
//! use kvclient::{Batch, Client, Consistency, PutOptions, Scan};
//! use tokio_stream::StreamExt;
//!
//! # async fn demo() -> kvclient::Result<()> {
//! let client = Client::connect(["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"]).await?;
//! let written = client.put("greeting", "hello").await?;
//! // Conditional update: fails with Error::VersionMismatch if someone else wrote
//! // (compares the key's mod_revision with the revision of our write).
//! client
//!     .put_with("greeting", "hi", PutOptions::default().if_mod_revision(written.revision))
//!     .await?;
//! // Read your own writes from any member, without a trip to the leader.
//! let entry = client.get_with("greeting", client.read_your_writes()).await?;
//! assert_eq!(entry.map(|e| e.value), Some("hi".into()));
//! client
//!     .batch(Batch::new().check_absent("a").put("a", "1").put("b", "2"))
//!     .await?;
//! let mut keys = client.scan(Scan::prefix("a").consistency(Consistency::Linearizable));
//! while let Some(kv) = keys.next().await {
//!     println!("{:?}", kv?.key);
//! }
//! # Ok(())
//! # }
//! ```

pub mod builder;
pub mod client;
pub mod error;
pub mod keeper;
pub mod lease;
pub mod router;
pub mod txn;
pub mod types;
pub mod watch;

pub use builder::{ClientBuilder, ClientTls};
pub use client::{Client, ScanPage, ScanStream};
pub use error::{Error, LimitExceeded, Result};
pub use keeper::{LeaseKeeper, LeaseLoss};
pub use kvproto;
pub use lease::{LeaseGrant, LeaseRenewal, LeaseRevoked, LeaseTimeToLive};
pub use types::{
    Batch, BatchApplied, Condition, Consistency, Entry, KeyValue, OpResult, PutOptions, Read,
    Removed, Revisions, Scan, Written,
};
pub use watch::{EventKind, Watch, WatchBatch, WatchEvent, WatchStream};
