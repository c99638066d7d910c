//! Transport security of one member (issue 9): the TLS material a member
//! serves and dials with (PEM certificate, key and CA bundle), the TLS
//! settings of its three ports (client and admin: server certificate,
//! client certificates optional per port; peer: always mutual TLS with the
//! cluster CA, and the caller's certificate must be a node certificate),
//! and the client port's bearer-token check. The development CA that `kvctl
//! certs` and the TLS tests use is the `kvcerts` crate.
//!
//! Node certificates carry both the server-auth and client-auth key
//! purposes (a member dials its peers with the certificate it serves);
//! client certificates carry client-auth only, so the peer port tells a
//! member from a client even when one CA signed both.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, TrustAnchor, UnixTime};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};
use tonic::{Request, Status};

/// Largest PEM file (certificate, key or CA bundle) a member reads.
pub const PEM_FILE_BYTES_MAX: u64 = 1024 * 1024;
/// Shortest bearer token accepted (a short token is guessable).
pub const TOKEN_BYTES_MIN: usize = 16;
/// Longest bearer token accepted (it travels in every request's headers).
pub const TOKEN_BYTES_MAX: usize = 4096;
/// How long a TLS handshake on any port may take before the connection is
/// dropped (a client that opens a connection and says nothing holds no
/// slot for longer).
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The metadata key carrying the bearer token.
pub const AUTHORIZATION_KEY: &str = "authorization";

/// Why TLS material or a token could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    /// A file could not be read.
    #[error("{what} {path}: {source}")]
    Read {
        /// Which flag's file (e.g. `--tls-cert`).
        what: &'static str,
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A file is over [`PEM_FILE_BYTES_MAX`].
    #[error("{what} {path}: {size} bytes, over PEM_FILE_BYTES_MAX ({PEM_FILE_BYTES_MAX})")]
    TooLarge {
        /// Which flag's file.
        what: &'static str,
        /// The path.
        path: String,
        /// Its size.
        size: u64,
    },
    /// The PEM text holds no usable item of the kind expected.
    #[error("{what}: {problem}")]
    Pem {
        /// Which flag's file.
        what: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// The token is unusable.
    #[error("auth token: {0}")]
    Token(String),
    /// rustls refused the material.
    #[error("tls: {0}")]
    Tls(String),
}

/// A member's certificate, private key and CA bundle, as PEM text checked
/// to parse. The CA bundle is the cluster CA: it verifies peers (both
/// ways) and, where a port asks for them, client certificates.
#[derive(Clone)]
pub struct TlsMaterial {
    cert_pem: Arc<[u8]>,
    key_pem: Arc<[u8]>,
    ca_pem: Arc<[u8]>,
    /// The CA bundle's certificates, parsed.
    ca: Arc<Vec<CertificateDer<'static>>>,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("ca_certificates", &self.ca.len())
            .finish_non_exhaustive()
    }
}

fn read_pem(what: &'static str, path: &Path) -> Result<Vec<u8>, SecurityError> {
    let shown = path.display().to_string();
    let read_error = |source| SecurityError::Read {
        what,
        path: shown.clone(),
        source,
    };
    let size = std::fs::metadata(path).map_err(read_error)?.len();
    if size > PEM_FILE_BYTES_MAX {
        return Err(SecurityError::TooLarge {
            what,
            path: shown,
            size,
        });
    }
    std::fs::read(path).map_err(read_error)
}

fn certificates(
    what: &'static str,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, SecurityError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| SecurityError::Pem {
            what,
            problem: format!("not PEM certificates: {err}"),
        })?;
    if certs.is_empty() {
        return Err(SecurityError::Pem {
            what,
            problem: "no CERTIFICATE block found".to_string(),
        });
    }
    Ok(certs)
}

fn private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, SecurityError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|err| SecurityError::Pem {
        what: "--tls-key",
        problem: format!("no usable private key (PKCS#8, PKCS#1 or SEC1 PEM): {err}"),
    })
}

impl TlsMaterial {
    /// Material from PEM text; each part must parse.
    pub fn from_pem(
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
        ca_pem: impl Into<Vec<u8>>,
    ) -> Result<TlsMaterial, SecurityError> {
        let (cert_pem, key_pem, ca_pem) = (cert_pem.into(), key_pem.into(), ca_pem.into());
        certificates("--tls-cert", &cert_pem)?;
        private_key(&key_pem)?;
        let ca = certificates("--tls-ca", &ca_pem)?;
        let material = TlsMaterial {
            cert_pem: cert_pem.into(),
            key_pem: key_pem.into(),
            ca_pem: ca_pem.into(),
            ca: Arc::new(ca),
        };
        // Catch a key that does not match the certificate, or a CA bundle
        // rustls cannot use, at start rather than at the first handshake.
        material.rustls_server_config(true)?;
        grpc_server(Some(&material), ClientCerts::Required)?;
        Ok(material)
    }

    /// Material from the files of `--tls-cert`, `--tls-key`, `--tls-ca`.
    pub fn load(cert: &Path, key: &Path, ca: &Path) -> Result<TlsMaterial, SecurityError> {
        TlsMaterial::from_pem(
            read_pem("--tls-cert", cert)?,
            read_pem("--tls-key", key)?,
            read_pem("--tls-ca", ca)?,
        )
    }

    fn identity(&self) -> Identity {
        Identity::from_pem(&*self.cert_pem, &*self.key_pem)
    }

    /// tonic's server TLS for a gRPC port. `ClientCerts::Required`: the
    /// handshake demands a certificate signed by the CA bundle (the peer
    /// port). `Verified`: a presented certificate must be signed by the CA
    /// bundle, but one may be missing, so the port's interceptor can answer
    /// UNAUTHENTICATED with a clear message instead of a cut connection
    /// (the client port with `--client-cert-auth`). `Ignored`: none asked.
    pub fn server_tls(&self, client_certs: ClientCerts) -> ServerTlsConfig {
        let config = ServerTlsConfig::new()
            .identity(self.identity())
            .timeout(TLS_HANDSHAKE_TIMEOUT);
        match client_certs {
            ClientCerts::Ignored => config,
            ClientCerts::Verified => config
                .client_ca_root(Certificate::from_pem(&*self.ca_pem))
                .client_auth_optional(true),
            ClientCerts::Required => config.client_ca_root(Certificate::from_pem(&*self.ca_pem)),
        }
    }

    /// tonic's channel TLS for dialing a peer: the CA bundle verifies the
    /// peer, this member's certificate identifies it.
    pub fn peer_channel_tls(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&*self.ca_pem))
            .identity(self.identity())
            .timeout(TLS_HANDSHAKE_TIMEOUT)
    }

    /// A rustls server configuration (the admin port's acceptor), with the
    /// `ring` provider; `require_client_cert` as in [`Self::server_tls`].
    pub fn rustls_server_config(
        &self,
        require_client_cert: bool,
    ) -> Result<Arc<rustls::ServerConfig>, SecurityError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|err| SecurityError::Tls(err.to_string()))?;
        let builder = if require_client_cert {
            let mut roots = rustls::RootCertStore::empty();
            for cert in self.ca.iter() {
                roots.add(cert.clone()).map_err(|err| SecurityError::Pem {
                    what: "--tls-ca",
                    problem: format!("not a usable CA certificate: {err}"),
                })?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(|err| SecurityError::Tls(format!("client verifier: {err}")))?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder
            .with_single_cert(
                certificates("--tls-cert", &self.cert_pem)?,
                private_key(&self.key_pem)?,
            )
            .map_err(|err| SecurityError::Tls(format!("--tls-cert / --tls-key: {err}")))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// The peer port's check that a caller is a member (see [`PeerCheck`]).
    pub fn peer_check(&self) -> Result<PeerCheck, SecurityError> {
        let anchors = self
            .ca
            .iter()
            .map(|cert| {
                webpki::anchor_from_trusted_cert(cert)
                    .map(|anchor| anchor.to_owned())
                    .map_err(|err| SecurityError::Pem {
                        what: "--tls-ca",
                        problem: format!("not a usable CA certificate: {err}"),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PeerCheck {
            anchors: Some(Arc::new(anchors)),
        })
    }
}

/// What a gRPC port does with client certificates (see
/// [`TlsMaterial::server_tls`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientCerts {
    /// None asked for.
    Ignored,
    /// Verified when presented; a missing one is the interceptor's call.
    Verified,
    /// Demanded by the handshake.
    Required,
}

/// A member's security settings (all off by default: plain TCP, no token).
#[derive(Clone, Debug, Default)]
pub struct Security {
    /// TLS on every port (`--tls-cert`, `--tls-key`, `--tls-ca`); `None` =
    /// plain TCP everywhere. With TLS the peer port always demands a node
    /// certificate from the cluster CA.
    pub tls: Option<TlsMaterial>,
    /// The client port demands a client certificate from the CA
    /// (`--client-cert-auth`).
    pub client_cert_auth: bool,
    /// The admin port demands a client certificate from the CA
    /// (`--admin-client-cert-auth`).
    pub admin_client_cert_auth: bool,
    /// Every client-port request must carry `authorization: Bearer
    /// <token>` (`--auth-token-file`).
    pub auth_token: Option<AuthToken>,
}

impl Security {
    /// Checks that the settings fit together.
    pub fn validate(&self) -> Result<(), SecurityError> {
        if self.tls.is_none() && (self.client_cert_auth || self.admin_client_cert_auth) {
            return Err(SecurityError::Tls(
                "--client-cert-auth / --admin-client-cert-auth need TLS (--tls-cert, --tls-key, \
                 --tls-ca)"
                    .to_string(),
            ));
        }
        Ok(())
    }

    /// The client port's request check.
    pub fn client_check(&self) -> ClientCheck {
        ClientCheck {
            token: self.auth_token.clone(),
            require_cert: self.tls.is_some() && self.client_cert_auth,
        }
    }

    /// What the client port does with client certificates.
    pub fn client_certs(&self) -> ClientCerts {
        if self.client_cert_auth {
            ClientCerts::Verified
        } else {
            ClientCerts::Ignored
        }
    }

    /// The peer port's request check (passes everything without TLS).
    pub fn peer_check(&self) -> Result<PeerCheck, SecurityError> {
        match &self.tls {
            Some(tls) => tls.peer_check(),
            None => Ok(PeerCheck { anchors: None }),
        }
    }
}

/// A gRPC server builder: TLS from `tls` with `client_certs`, or plain
/// TCP when `tls` is `None`.
pub fn grpc_server(
    tls: Option<&TlsMaterial>,
    client_certs: ClientCerts,
) -> Result<tonic::transport::Server, SecurityError> {
    let server = tonic::transport::Server::builder();
    match tls {
        Some(tls) => server
            .tls_config(tls.server_tls(client_certs))
            .map_err(|err| SecurityError::Tls(format!("server TLS: {err}"))),
        None => Ok(server),
    }
}

/// A bearer token (never printed).
#[derive(Clone)]
pub struct AuthToken(Arc<str>);

impl std::fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthToken(..)")
    }
}

impl AuthToken {
    /// A token: surrounding whitespace trimmed, then
    /// [`TOKEN_BYTES_MIN`]..=[`TOKEN_BYTES_MAX`] visible ASCII characters.
    pub fn new(token: &str) -> Result<AuthToken, SecurityError> {
        let token = token.trim();
        if token.len() < TOKEN_BYTES_MIN || token.len() > TOKEN_BYTES_MAX {
            return Err(SecurityError::Token(format!(
                "{} bytes, outside TOKEN_BYTES_MIN..=TOKEN_BYTES_MAX ({TOKEN_BYTES_MIN}..={TOKEN_BYTES_MAX})",
                token.len()
            )));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(SecurityError::Token(
                "only visible ASCII characters (no spaces or control characters) are allowed"
                    .to_string(),
            ));
        }
        Ok(AuthToken(token.into()))
    }

    /// The token from a file (`--auth-token-file`).
    pub fn load(path: &Path) -> Result<AuthToken, SecurityError> {
        let bytes = read_pem("--auth-token-file", path)?;
        let text = String::from_utf8(bytes)
            .map_err(|_| SecurityError::Token(format!("{}: not UTF-8", path.display())))?;
        AuthToken::new(&text)
    }

    /// The token's text (to send it).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this token, in time independent of where
    /// they differ.
    pub(crate) fn matches(&self, presented: &[u8]) -> bool {
        let mine = self.0.as_bytes();
        let mut diff = u8::from(mine.len() != presented.len());
        for (i, b) in mine.iter().enumerate() {
            diff |= b ^ presented.get(i).copied().unwrap_or(0);
        }
        diff == 0
    }
}

/// The client port's interceptor: with `--client-cert-auth`, the caller
/// must have presented a certificate (the handshake already verified it
/// against the CA); with a token configured, every request must carry
/// `authorization: Bearer <token>`. Otherwise UNAUTHENTICATED with a
/// message saying what was missing or wrong.
#[derive(Clone, Debug)]
pub struct ClientCheck {
    token: Option<AuthToken>,
    require_cert: bool,
}

impl tonic::service::Interceptor for ClientCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        if self.require_cert && request.peer_certs().is_none_or(|certs| certs.is_empty()) {
            return Err(Status::unauthenticated(
                "this cluster requires a client certificate signed by its CA (kvctl --cert and \
                 --key, kvclient ClientTls::identity)",
            ));
        }
        let Some(token) = &self.token else {
            return Ok(request);
        };
        let Some(value) = request.metadata().get(AUTHORIZATION_KEY) else {
            return Err(Status::unauthenticated(
                "this cluster requires a bearer token: no `authorization` metadata was sent \
                 (kvctl --token / RAFTCASK_TOKEN, kvclient ClientBuilder::token)",
            ));
        };
        let presented = value.as_bytes();
        let Some(presented) = presented.strip_prefix(b"Bearer ") else {
            return Err(Status::unauthenticated(
                "the `authorization` metadata is not `Bearer <token>`",
            ));
        };
        if token.matches(presented) {
            Ok(request)
        } else {
            Err(Status::unauthenticated(
                "the bearer token is not valid for this cluster",
            ))
        }
    }
}

/// The peer port's interceptor: with TLS on, the caller's certificate
/// (already verified against the cluster CA for client use by the TLS
/// handshake) must also be valid for server authentication, i.e. a node
/// certificate, not a client's; otherwise PERMISSION_DENIED.
#[derive(Clone, Debug)]
pub struct PeerCheck {
    anchors: Option<Arc<Vec<TrustAnchor<'static>>>>,
}

impl tonic::service::Interceptor for PeerCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(anchors) = &self.anchors else {
            return Ok(request);
        };
        let certs = request.peer_certs().ok_or_else(|| {
            Status::permission_denied("peer port: a member's certificate is required")
        })?;
        let Some((leaf, intermediates)) = certs.split_first() else {
            return Err(Status::permission_denied(
                "peer port: a member's certificate is required",
            ));
        };
        let leaf = webpki::EndEntityCert::try_from(leaf).map_err(|err| {
            Status::permission_denied(format!("peer port: unreadable certificate: {err}"))
        })?;
        let algorithms = rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .all;
        leaf.verify_for_usage(
            algorithms,
            anchors,
            intermediates,
            UnixTime::now(),
            webpki::KeyUsage::server_auth(),
            None,
            None,
        )
        .map_err(|err| {
            Status::permission_denied(format!(
                "peer port: the caller's certificate is not a node certificate of this cluster \
                 (it must be valid for server authentication too): {err}"
            ))
        })?;
        Ok(request)
    }
}
