//! The client's settings and their builder: endpoints, timeouts, the retry
//! budget and backoff, the default read consistency, and transport security
//! (TLS with a CA bundle and optional client certificate, a bearer token).
//! `build` checks every setting against its named limit before anything
//! touches the network.

use std::time::Duration;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::types::Consistency;

/// Default time to open a connection to one member.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(3);
/// Default time one attempt (one RPC to one member) may take. Above the
/// server's 5 s wait for a stale read's `min_index`, so that wait can finish.
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Default time a whole call, retries included, may take.
pub const OPERATION_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// Default number of attempts of one call, the first included.
pub const ATTEMPTS_DEFAULT: u32 = 60;
/// Upper bound on the attempts setting.
pub const ATTEMPTS_MAX: u32 = 10_000;
/// Default first backoff pause (doubled after each failed attempt).
pub const BACKOFF_BASE_DEFAULT: Duration = Duration::from_millis(20);
/// Default cap on one backoff pause.
pub const BACKOFF_CAP_DEFAULT: Duration = Duration::from_millis(500);
/// Upper bound on any timeout or backoff setting.
pub const DURATION_SETTING_MAX: Duration = Duration::from_secs(3600);
/// Upper bound on the operation timeout: half the cluster's session idle
/// window (`kvproto::SESSION_IDLE_MS`), so a write is never retried after
/// its session could have been evicted (a retry then could not be told
/// from a new write).
pub const OPERATION_TIMEOUT_MAX: Duration = Duration::from_millis(kvproto::SESSION_IDLE_MS / 2);
/// Upper bound on the number of endpoints given to the builder.
pub const ENDPOINTS_MAX: usize = 1024;
/// Longest bearer token accepted (it travels in every request's headers;
/// the server's own limit is the same).
pub const TOKEN_BYTES_MAX: usize = 4096;
/// Largest PEM text (CA bundle, certificate or key) accepted.
pub const PEM_BYTES_MAX: usize = 1024 * 1024;

/// TLS settings of a client: the CA bundle that verifies the members, and
/// optionally a client certificate for clusters that demand one.
#[derive(Clone)]
pub struct ClientTls {
    /// CA certificates (PEM) the members' certificates must chain to.
    pub ca_pem: Vec<u8>,
    /// Client certificate and its private key (PEM), for mutual TLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name to verify in the members' certificates instead of the
    /// endpoint's host (e.g. when members are reached through an address
    /// their certificates do not name).
    pub domain: Option<String>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("client_certificate", &self.identity.is_some())
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// TLS verifying members against the CA bundle `ca_pem`.
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> ClientTls {
        ClientTls {
            ca_pem: ca_pem.into(),
            identity: None,
            domain: None,
        }
    }

    /// Presents this client certificate (PEM) and key (PEM).
    pub fn identity(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Verifies `domain` in the members' certificates.
    pub fn domain(mut self, domain: impl Into<String>) -> Self {
        self.domain = Some(domain.into());
        self
    }

    /// tonic's channel TLS, after checking the PEM texts parse.
    pub(crate) fn channel_config(&self) -> Result<tonic::transport::ClientTlsConfig> {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certificates = |what: &str, pem: &[u8]| -> Result<()> {
            if pem.len() > PEM_BYTES_MAX {
                return Err(Error::InvalidConfig(format!(
                    "tls {what}: {} bytes, over PEM_BYTES_MAX ({PEM_BYTES_MAX})",
                    pem.len()
                )));
            }
            let certs = CertificateDer::pem_slice_iter(pem)
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|err| {
                    Error::InvalidConfig(format!("tls {what}: not PEM certificates: {err}"))
                })?;
            if certs.is_empty() {
                return Err(Error::InvalidConfig(format!(
                    "tls {what}: no CERTIFICATE block found"
                )));
            }
            Ok(())
        };
        certificates("CA bundle", &self.ca_pem)?;
        let mut config = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.ca_pem));
        if let Some((cert, key)) = &self.identity {
            certificates("client certificate", cert)?;
            if key.len() > PEM_BYTES_MAX {
                return Err(Error::InvalidConfig(format!(
                    "tls client key: {} bytes, over PEM_BYTES_MAX ({PEM_BYTES_MAX})",
                    key.len()
                )));
            }
            PrivateKeyDer::from_pem_slice(key).map_err(|err| {
                Error::InvalidConfig(format!("tls client key: no usable private key: {err}"))
            })?;
            config = config.identity(tonic::transport::Identity::from_pem(cert, key));
        }
        if let Some(domain) = &self.domain {
            config = config.domain_name(domain.clone());
        }
        Ok(config)
    }
}

/// A bearer token (never printed).
#[derive(Clone)]
pub(crate) struct Token(pub(crate) String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// Settings of a [`Client`] (built by [`ClientBuilder`]).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Member client addresses, `host:port`.
    pub endpoints: Vec<String>,
    /// Time to open a connection to one member.
    pub connect_timeout: Duration,
    /// Time one attempt may take.
    pub request_timeout: Duration,
    /// Time a whole call, retries included, may take.
    pub operation_timeout: Duration,
    /// Attempts of one call, the first included.
    pub attempts: u32,
    /// First backoff pause.
    pub backoff_base: Duration,
    /// Cap on one backoff pause.
    pub backoff_cap: Duration,
    /// Consistency of reads that do not name one.
    pub consistency: Consistency,
    /// Whether a write refused SESSION_EXPIRED before any attempt of it may
    /// have applied runs once more under a fresh client id (default on).
    pub rerun_after_expiry: bool,
    /// TLS (`None` = plain TCP).
    pub tls: Option<ClientTls>,
    /// The bearer token sent with every request.
    pub(crate) token: Option<Token>,
}

/// Builds a [`Client`]: `Client::builder(endpoints)...build()`.
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    settings: Settings,
}

impl ClientBuilder {
    /// A builder with the default settings for these member addresses
    /// (`host:port`, optionally with an `http://` prefix).
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClientBuilder {
            settings: Settings {
                endpoints: endpoints.into_iter().map(Into::into).collect(),
                connect_timeout: CONNECT_TIMEOUT_DEFAULT,
                request_timeout: REQUEST_TIMEOUT_DEFAULT,
                operation_timeout: OPERATION_TIMEOUT_DEFAULT,
                attempts: ATTEMPTS_DEFAULT,
                backoff_base: BACKOFF_BASE_DEFAULT,
                backoff_cap: BACKOFF_CAP_DEFAULT,
                consistency: Consistency::Linearizable,
                rerun_after_expiry: true,
                tls: None,
                token: None,
            },
        }
    }

    /// Time to open a connection to one member.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.settings.connect_timeout = timeout;
        self
    }

    /// Time one attempt (one RPC to one member) may take.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.settings.request_timeout = timeout;
        self
    }

    /// Time a whole call, retries included, may take. A write refused
    /// SESSION_EXPIRED before any attempt of it could have applied runs once
    /// more under a fresh client id, with a fresh allowance
    /// ([`crate::client::WRITE_ROUNDS_MAX`] runs at most); each run's
    /// retries stay within this bound, which is what the session window
    /// relies on.
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.settings.operation_timeout = timeout;
        self
    }

    /// Off: a write refused SESSION_EXPIRED is always reported
    /// [`crate::Error::OutcomeUnknown`], never run again under a fresh id
    /// (on by default). For harnesses that must see every write that opens
    /// a session: the fault suite's exactly-once workload stretches
    /// retries past the session window on purpose, where a re-run that
    /// opens a session could be applied twice.
    pub fn rerun_after_expiry(mut self, rerun: bool) -> Self {
        self.settings.rerun_after_expiry = rerun;
        self
    }

    /// Attempts of one call, the first included (the retry budget).
    pub fn attempts(mut self, attempts: u32) -> Self {
        self.settings.attempts = attempts;
        self
    }

    /// Backoff between attempts: the first pause and the cap (each pause is
    /// jittered between half and all of its nominal length).
    pub fn backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.settings.backoff_base = base;
        self.settings.backoff_cap = cap;
        self
    }

    /// Consistency of reads that do not name one (default linearizable).
    pub fn default_consistency(mut self, consistency: Consistency) -> Self {
        self.settings.consistency = consistency;
        self
    }

    /// Connects over TLS (endpoints may then be written `https://host:port`).
    pub fn tls(mut self, tls: ClientTls) -> Self {
        self.settings.tls = Some(tls);
        self
    }

    /// Sends `authorization: Bearer <token>` with every request (clusters
    /// started with `--auth-token-file`).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.settings.token = Some(Token(token.into().trim().to_string()));
        self
    }

    /// Checks the settings and makes the client. Connections open lazily on
    /// first use; see [`Client::connect`] to also find the leader at once.
    pub fn build(self) -> Result<Client> {
        let mut s = self.settings;
        if s.endpoints.is_empty() {
            return Err(Error::InvalidConfig(
                "endpoints: at least one member address is needed".into(),
            ));
        }
        if s.endpoints.len() > ENDPOINTS_MAX {
            return Err(Error::InvalidConfig(format!(
                "endpoints: {} given, ENDPOINTS_MAX is {ENDPOINTS_MAX}",
                s.endpoints.len()
            )));
        }
        for endpoint in &mut s.endpoints {
            *endpoint = normalize(endpoint)?;
        }
        if s.attempts == 0 || s.attempts > ATTEMPTS_MAX {
            return Err(Error::InvalidConfig(format!(
                "attempts: {} is outside 1..={ATTEMPTS_MAX} (ATTEMPTS_MAX)",
                s.attempts
            )));
        }
        for (name, value) in [
            ("connect_timeout", s.connect_timeout),
            ("request_timeout", s.request_timeout),
            ("operation_timeout", s.operation_timeout),
            ("backoff base", s.backoff_base),
            ("backoff cap", s.backoff_cap),
        ] {
            if value.is_zero() || value > DURATION_SETTING_MAX {
                return Err(Error::InvalidConfig(format!(
                    "{name}: {value:?} is outside (0, {DURATION_SETTING_MAX:?}] (DURATION_SETTING_MAX)"
                )));
            }
        }
        if s.operation_timeout > OPERATION_TIMEOUT_MAX {
            return Err(Error::InvalidConfig(format!(
                "operation_timeout: {:?} is above {OPERATION_TIMEOUT_MAX:?} \
                 (OPERATION_TIMEOUT_MAX, half the session idle window: a longer retry could \
                 apply a write twice)",
                s.operation_timeout
            )));
        }
        if s.backoff_base > s.backoff_cap {
            return Err(Error::InvalidConfig(format!(
                "backoff: base {:?} is above cap {:?}",
                s.backoff_base, s.backoff_cap
            )));
        }
        if let Some(Token(token)) = &s.token
            && (token.is_empty()
                || token.len() > TOKEN_BYTES_MAX
                || !token.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(Error::InvalidConfig(format!(
                "token: {} bytes; it must be 1..={TOKEN_BYTES_MAX} (TOKEN_BYTES_MAX) visible ASCII \
                 characters",
                token.len()
            )));
        }
        if let Some(tls) = &s.tls {
            let config = tls.channel_config()?;
            tonic::transport::Endpoint::from_static("https://member.invalid:1")
                .tls_config(config)
                .map_err(|err| Error::InvalidConfig(format!("tls: {err}")))?;
        }
        Ok(Client::from_settings(s))
    }
}

/// `host:port` from `host:port`, `http://host:port` or `https://host:port`
/// (the scheme used is the client's: https with TLS settings).
pub(crate) fn normalize(endpoint: &str) -> Result<String> {
    let bare = (endpoint.strip_prefix("http://"))
        .or_else(|| endpoint.strip_prefix("https://"))
        .unwrap_or(endpoint);
    let bare = bare.trim_end_matches('/');
    let Some((host, port)) = bare.rsplit_once(':') else {
        return Err(Error::InvalidConfig(format!(
            "endpoints: {endpoint:?} is not host:port"
        )));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(Error::InvalidConfig(format!(
            "endpoints: {endpoint:?} is not host:port with a port in 0..=65535"
        )));
    }
    Ok(bare.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked() {
        assert!(ClientBuilder::new(Vec::<String>::new()).build().is_err());
        assert!(ClientBuilder::new(["nohost"]).build().is_err());
        assert!(ClientBuilder::new(["h:99999"]).build().is_err());
        assert!(ClientBuilder::new(["h:1"]).attempts(0).build().is_err());
        assert!(
            ClientBuilder::new(["h:1"])
                .request_timeout(Duration::ZERO)
                .build()
                .is_err()
        );
        assert!(
            ClientBuilder::new(["h:1"])
                .backoff(Duration::from_secs(2), Duration::from_secs(1))
                .build()
                .is_err()
        );
        // An operation may not be retried for longer than half the session
        // idle window.
        assert!(
            ClientBuilder::new(["h:1"])
                .operation_timeout(OPERATION_TIMEOUT_MAX)
                .build()
                .is_ok()
        );
        let err = ClientBuilder::new(["h:1"])
            .operation_timeout(OPERATION_TIMEOUT_MAX + Duration::from_millis(1))
            .build()
            .unwrap_err();
        assert!(
            err.to_string().contains("OPERATION_TIMEOUT_MAX"),
            "names the limit: {err}"
        );
        assert_eq!(
            normalize("http://127.0.0.1:7000/").unwrap(),
            "127.0.0.1:7000"
        );
    }
}
