//! What a run drives and how: the [`System`], the operation mix, where
//! reads go, one run's settings and the bound of each, checked before
//! anything is sent.

use std::time::Duration;

use kvproto::kv::v1::Consistency;

pub use kvproto::{KEY_SIZE_BYTES_MAX, VALUE_SIZE_BYTES_MAX};

/// The system a run drives. Everything but the two RPCs (put, get) is the
/// same code for each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum System {
    /// A raftcask cluster (kvproto's gRPC API).
    #[default]
    Raftcask,
    /// An etcd v3 cluster (`etcd-client` on the same tonic channels).
    /// Stale reads are etcd's serializable reads; a put acknowledges no
    /// Raft entry, so `ops/entry` stays empty.
    #[cfg(feature = "etcd")]
    Etcd,
}

impl System {
    /// Its lower-case name (table columns, plot legends).
    pub fn name(self) -> &'static str {
        match self {
            System::Raftcask => "raftcask",
            #[cfg(feature = "etcd")]
            System::Etcd => "etcd",
        }
    }
}

/// Most concurrent clients (tasks) in one run.
pub const CLIENTS_MAX: usize = 4096;
/// Most gRPC connections per endpoint (clients share them round-robin).
pub const CONNECTIONS_MAX: usize = 256;
/// Most operations in one run.
pub const OPS_MAX: u64 = 100_000_000;
/// Longest run.
pub const DURATION_MAX: Duration = Duration::from_secs(3600);

/// What each operation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Every operation a put.
    Put,
    /// Every operation a get.
    Get,
    /// Gets with this probability in percent (0..=100), puts otherwise.
    Mixed {
        /// Percent of operations that are gets.
        read_percent: u8,
    },
}

/// Where reads go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadTarget {
    /// Client `i` reads from endpoint `i mod n`.
    Spread,
    /// Every read goes to the (discovered) leader.
    Leader,
}

/// One run's settings. [`LoadConfig::validate`] checks every bound.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// Client addresses of members (`host:port`, or an `http://` URL).
    pub endpoints: Vec<String>,
    /// Concurrent clients (one task each, one operation in flight each).
    pub clients: usize,
    /// gRPC connections per endpoint.
    pub connections: usize,
    /// Stop after this many operations (over all clients)...
    pub ops: u64,
    /// ...or after this long, whichever comes first.
    pub duration: Duration,
    /// Key length; keys are zero-padded decimal ids.
    pub key_size_bytes: usize,
    /// Value length (incompressible bytes).
    pub value_size_bytes: usize,
    /// Keys are drawn uniformly from `0..key_space`.
    pub key_space: u64,
    /// The operation mix.
    pub op: OpKind,
    /// Read consistency.
    pub consistency: Consistency,
    /// Where reads go.
    pub read_target: ReadTarget,
    /// Seed of the key choice and the values.
    pub seed: u64,
}

impl Default for LoadConfig {
    fn default() -> LoadConfig {
        LoadConfig {
            endpoints: vec![
                "127.0.0.1:7001".into(),
                "127.0.0.1:7002".into(),
                "127.0.0.1:7003".into(),
            ],
            clients: 1,
            connections: 1,
            ops: 10_000,
            duration: Duration::from_secs(20),
            key_size_bytes: 16,
            value_size_bytes: 100,
            key_space: 100_000,
            op: OpKind::Put,
            consistency: Consistency::Linearizable,
            read_target: ReadTarget::Spread,
            seed: 1,
        }
    }
}

/// A setting out of bounds, naming the setting and the bound.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{field} = {value}: {rule}")]
pub struct ConfigError {
    /// The setting.
    pub field: &'static str,
    /// Its value.
    pub value: String,
    /// What it must be.
    pub rule: String,
}

fn check(
    field: &'static str,
    value: impl ToString,
    ok: bool,
    rule: String,
) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError {
            field,
            value: value.to_string(),
            rule,
        })
    }
}

impl LoadConfig {
    /// Checks every setting against its bound.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check(
            "endpoints",
            self.endpoints.join(","),
            !self.endpoints.is_empty(),
            "at least one endpoint".into(),
        )?;
        check(
            "clients",
            self.clients,
            (1..=CLIENTS_MAX).contains(&self.clients),
            format!("1..={CLIENTS_MAX} (CLIENTS_MAX)"),
        )?;
        check(
            "connections",
            self.connections,
            (1..=CONNECTIONS_MAX).contains(&self.connections),
            format!("1..={CONNECTIONS_MAX} (CONNECTIONS_MAX)"),
        )?;
        check(
            "ops",
            self.ops,
            (1..=OPS_MAX).contains(&self.ops),
            format!("1..={OPS_MAX} (OPS_MAX)"),
        )?;
        check(
            "duration",
            format!("{:?}", self.duration),
            !self.duration.is_zero() && self.duration <= DURATION_MAX,
            format!("above zero and at most {DURATION_MAX:?} (DURATION_MAX)"),
        )?;
        check(
            "key_space",
            self.key_space,
            self.key_space >= 1,
            "at least 1".into(),
        )?;
        let digits = (self.key_space - 1).max(1).ilog10() as usize + 1;
        check(
            "key_size_bytes",
            self.key_size_bytes,
            (digits..=KEY_SIZE_BYTES_MAX).contains(&self.key_size_bytes),
            format!(
                "{digits}..={KEY_SIZE_BYTES_MAX} (the key space's digits up to KEY_SIZE_BYTES_MAX)"
            ),
        )?;
        check(
            "value_size_bytes",
            self.value_size_bytes,
            self.value_size_bytes <= VALUE_SIZE_BYTES_MAX,
            format!("at most {VALUE_SIZE_BYTES_MAX} (VALUE_SIZE_BYTES_MAX)"),
        )?;
        if let OpKind::Mixed { read_percent } = self.op {
            check(
                "read_percent",
                read_percent,
                read_percent <= 100,
                "0..=100".into(),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_name_the_setting() {
        assert_eq!(LoadConfig::default().validate(), Ok(()));
        let err = LoadConfig {
            clients: 0,
            ..LoadConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(err.field, "clients");
        assert!(err.to_string().contains("CLIENTS_MAX"), "{err}");
        let err = LoadConfig {
            key_size_bytes: 3,
            key_space: 100_000,
            ..LoadConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(err.field, "key_size_bytes");
        let err = LoadConfig {
            duration: Duration::ZERO,
            ..LoadConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(err.field, "duration");
    }
}
