//! TLS, mutual TLS and token authentication (issue 9 items 1 and 2) on
//! in-process clusters whose certificates come from the development CA
//! (`kvcerts::DevCa`, the code behind `kvctl certs`):
//!
//! - a three-member cluster with TLS everywhere and client certificates
//!   demanded on the client port elects a leader and serves a client with
//!   a client certificate of its CA; a client without a certificate, with
//!   one from another CA, over plain TCP, or trusting another CA is
//!   refused (no certificate: UNAUTHENTICATED saying so); a client
//!   certificate (not a node certificate) of the right CA is refused on the
//!   peer port with PERMISSION_DENIED, no certificate at all by its
//!   handshake;
//! - a member whose certificate comes from another CA never joins: the two
//!   good members elect a leader and commit writes, and it never receives
//!   an entry nor becomes leader;
//! - the admin port speaks HTTPS with the node's certificate and, with
//!   `admin_client_cert_auth`, answers only clients with a certificate of
//!   its CA; plain HTTP gets no answer;
//! - with a token configured, a request without it or with a wrong one is
//!   UNAUTHENTICATED with a message saying which; the right token works;
//!   without a token configured, requests need none.

use std::time::{Duration, Instant};

use kvcerts::{DevCa, IssuedCert};
use kvnode::NodeConfig;
use kvnode::raft::watch::MetricsWatch;
use kvnode::server::security::{AuthToken, TlsMaterial};
use kvnode::testing::LocalCluster;
use kvproto::kv::v1::kv_client::KvClient;
use kvproto::kv::v1::{Consistency, put_response};
use kvproto::raft::v1::IdentifyRequest;
use kvproto::raft::v1::raft_client::RaftClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::cluster::{get, put};

/// Deadline of every wait (elections, replication).
const DEADLINE: Duration = Duration::from_secs(30);
/// How long a member with a foreign certificate is watched for entries.
const FOREIGN_WATCH: Duration = Duration::from_secs(5);
/// How often waits look.
const POLL: Duration = Duration::from_millis(50);

fn node_material(ca: &DevCa, config: &NodeConfig) -> TlsMaterial {
    let hosts = vec![
        config.client_addr.ip().to_string(),
        config.peer_addr.ip().to_string(),
    ];
    let cert = ca.node_cert(&format!("node{}", config.id), &hosts).unwrap();
    TlsMaterial::from_pem(cert.cert_pem, cert.key_pem, ca.cert_pem()).unwrap()
}

/// A TLS channel to `addr` trusting `ca`, presenting `identity` if any.
async fn tls_channel(
    addr: &str,
    ca: &DevCa,
    identity: Option<&IssuedCert>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca.cert_pem()));
    if let Some(cert) = identity {
        tls = tls.identity(Identity::from_pem(&cert.cert_pem, &cert.key_pem));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
}

/// Puts `key` through a channel; `Err` with the status or connection error.
async fn try_put(
    channel: Result<Channel, tonic::transport::Error>,
    key: &str,
) -> Result<u64, String> {
    let channel = channel.map_err(|err| format!("connect: {err:?}"))?;
    let answer = KvClient::new(channel)
        .put(put(key, "v"))
        .await
        .map_err(|status| format!("{status:?}"))?
        .into_inner();
    match answer.outcome {
        Some(put_response::Outcome::Seq(version)) => Ok(version),
        other => Err(format!("no version: {other:?}")),
    }
}

async fn leader_addr(cluster: &LocalCluster) -> String {
    let leader = cluster.wait_for_leader(DEADLINE).await.unwrap();
    cluster.addr(leader)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_cluster_serves_only_clients_with_a_certificate_of_its_ca() {
    let root = tempfile::tempdir().unwrap();
    let ca = DevCa::new("raftcask test CA").unwrap();
    let other_ca = DevCa::new("another CA").unwrap();
    let cluster = LocalCluster::start_configured(root.path(), 3, |config| {
        config.security.tls = Some(node_material(&ca, config));
        config.security.client_cert_auth = true;
    })
    .await
    .unwrap();
    let addr = leader_addr(&cluster).await;

    // The right client certificate: writes and a linearizable read work.
    let client_cert = ca.client_cert("client").unwrap();
    let version = try_put(tls_channel(&addr, &ca, Some(&client_cert)).await, "k")
        .await
        .expect("a client with a certificate of the cluster CA is served");
    assert!(version > 0);
    let channel = tls_channel(&addr, &ca, Some(&client_cert)).await.unwrap();
    let read = KvClient::new(channel)
        .get(get("k", Consistency::Linearizable, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(&read.value[..], b"v", "{read:?}");

    // No client certificate, one from another CA, plain TCP, a client that
    // trusts another CA: all refused, nothing written.
    let refused = [
        (
            "no client certificate",
            try_put(tls_channel(&addr, &ca, None).await, "no-cert").await,
        ),
        (
            "a client certificate from another CA",
            try_put(
                tls_channel(&addr, &ca, Some(&other_ca.client_cert("x").unwrap())).await,
                "other-ca",
            )
            .await,
        ),
        (
            "plain TCP",
            try_put(
                Endpoint::from_shared(format!("http://{addr}"))
                    .unwrap()
                    .timeout(Duration::from_secs(10))
                    .connect()
                    .await,
                "plain",
            )
            .await,
        ),
        (
            "a client trusting another CA",
            try_put(
                tls_channel(&addr, &other_ca, Some(&client_cert)).await,
                "wrong-trust",
            )
            .await,
        ),
    ];
    for (what, outcome) in &refused {
        assert!(outcome.is_err(), "{what}: served: {outcome:?}");
        eprintln!("{what}: refused: {outcome:?}");
    }
    // Without a certificate the answer says so (the handshake lets it in
    // so the interceptor can).
    let no_cert = &refused[0].1;
    assert!(
        no_cert
            .as_ref()
            .is_err_and(|err| err.contains("Unauthenticated")
                && err.contains("requires a client certificate")),
        "{no_cert:?}"
    );

    // The peer port: a client certificate of the right CA passes the TLS
    // handshake but is not a member's.
    let leader = cluster.wait_for_leader(DEADLINE).await.unwrap();
    let peer_addr = cluster.node(leader).unwrap().peer_addr().to_string();
    let channel = tls_channel(&peer_addr, &ca, Some(&client_cert)).await;
    let status = match channel {
        Ok(channel) => RaftClient::new(channel)
            .identify(IdentifyRequest::default())
            .await
            .expect_err("a client certificate must not reach the Raft service"),
        Err(err) => panic!("the TLS handshake itself should pass: {err:?}"),
    };
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("not a node certificate"),
        "{status:?}"
    );
    // ... and with no certificate at all the handshake fails.
    let no_cert = tls_channel(&peer_addr, &ca, None).await;
    let answer = match no_cert {
        Ok(channel) => RaftClient::new(channel)
            .identify(IdentifyRequest::default())
            .await
            .map(|_| ()),
        Err(_) => Err(tonic::Status::unavailable("handshake refused")),
    };
    assert!(
        answer.is_err(),
        "the peer port served a caller without a certificate"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_a_certificate_from_another_ca_never_joins() {
    let root = tempfile::tempdir().unwrap();
    let ca = DevCa::new("raftcask test CA").unwrap();
    let other_ca = DevCa::new("an intruder's CA").unwrap();
    let cluster = LocalCluster::start_configured(root.path(), 3, |config| {
        let issuer = if config.id == 3 { &other_ca } else { &ca };
        config.security.tls = Some(node_material(issuer, config));
    })
    .await
    .unwrap();
    // Members 1 and 2 form a quorum on their own; wait until one leads.
    let start = Instant::now();
    let leader = loop {
        let leaders: Vec<Option<u64>> = [1, 2]
            .iter()
            .map(|id| {
                cluster
                    .node(*id)
                    .unwrap()
                    .raft()
                    .metrics()
                    .borrow()
                    .current_leader
            })
            .collect();
        if let [Some(a), Some(b)] = leaders[..]
            && a == b
        {
            break a;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "no leader among 1 and 2: {leaders:?}"
        );
        tokio::time::sleep(POLL).await;
    };
    assert_ne!(leader, 3, "the member with a foreign certificate leads");
    let client_cert = ca.client_cert("client").unwrap();
    let version = try_put(
        tls_channel(&cluster.addr(leader), &ca, Some(&client_cert)).await,
        "k",
    )
    .await
    .expect("the two good members commit a write");
    let index = version >> 16;

    // The other good member applies it; member 3 never gets an entry and
    // never leads, and the leader never sees it match anything.
    let start = Instant::now();
    let follower = if leader == 1 { 2 } else { 1 };
    while cluster
        .node(follower)
        .unwrap()
        .raft()
        .metrics()
        .borrow()
        .last_applied
        .map(|l| l.index)
        < Some(index)
    {
        assert!(
            start.elapsed() < DEADLINE,
            "member {follower} never applied {index}"
        );
        tokio::time::sleep(POLL).await;
    }
    let start = Instant::now();
    while start.elapsed() < FOREIGN_WATCH {
        let intruder = cluster.node(3).unwrap().raft().metrics().borrow().clone();
        assert_eq!(
            intruder.last_log_index, None,
            "member 3 received entries: {intruder:?}"
        );
        assert_ne!(
            intruder.current_leader,
            Some(3),
            "member 3 leads: {intruder:?}"
        );
        let leader_view = cluster
            .node(leader)
            .unwrap()
            .raft()
            .metrics()
            .borrow()
            .clone();
        let matched = leader_view
            .replication
            .as_ref()
            .and_then(|r| r.get(&3).cloned())
            .flatten();
        assert_eq!(
            matched, None,
            "the leader replicated to member 3: {leader_view:?}"
        );
        assert_eq!(leader_view.current_leader, Some(leader), "leadership moved");
        tokio::time::sleep(POLL).await;
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_auth_on_and_off() {
    let token = "s3cret-token-for-tests-0123456789";
    let root = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start_configured(root.path(), 1, |config| {
        config.security.auth_token = Some(AuthToken::new(token).unwrap());
    })
    .await
    .unwrap();
    let addr = leader_addr(&cluster).await;
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let with = |value: Option<&str>| {
        let mut request = tonic::Request::new(put("k", "v"));
        if let Some(value) = value {
            request
                .metadata_mut()
                .insert("authorization", value.parse().unwrap());
        }
        request
    };
    let mut kv = KvClient::new(channel.clone());
    let missing = kv.put(with(None)).await.expect_err("no token");
    assert_eq!(missing.code(), tonic::Code::Unauthenticated, "{missing:?}");
    assert!(
        missing.message().contains("requires a bearer token"),
        "{missing:?}"
    );
    let wrong = kv
        .put(with(Some("Bearer not-the-token-0123456789")))
        .await
        .expect_err("wrong token");
    assert_eq!(wrong.code(), tonic::Code::Unauthenticated, "{wrong:?}");
    assert!(wrong.message().contains("not valid"), "{wrong:?}");
    let scheme = kv
        .put(with(Some(token)))
        .await
        .expect_err("token without the Bearer scheme");
    assert_eq!(scheme.code(), tonic::Code::Unauthenticated, "{scheme:?}");
    let right = kv.put(with(Some(&format!("Bearer {token}")))).await;
    assert!(right.is_ok(), "{right:?}");
    cluster.shutdown().await;

    // Off: no token needed (and one sent is ignored).
    let root = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(root.path(), 1).await.unwrap();
    let addr = leader_addr(&cluster).await;
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut kv = KvClient::new(channel);
    assert!(kv.put(with(None)).await.is_ok());
    assert!(
        kv.put(with(Some("Bearer anything-at-all-here")))
            .await
            .is_ok()
    );
    cluster.shutdown().await;
}

/// One HTTP/1.1 GET over `stream`; the bytes answered (empty or partial
/// when the server cut the connection).
async fn http_get<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut stream: S,
    path: &str,
) -> Vec<u8> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let request = format!("GET {path} HTTP/1.1\r\nHost: member\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return Vec::new();
    }
    let mut answer = Vec::new();
    let read = tokio::time::timeout(DEADLINE, stream.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the admin port neither answered nor closed");
    answer
}

/// An HTTPS GET to `addr` trusting `ca`, presenting `identity` if any;
/// the answer's bytes (empty when the handshake or connection failed).
async fn https_get(
    addr: std::net::SocketAddr,
    ca: &DevCa,
    identity: Option<&IssuedCert>,
    path: &str,
) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.cert_pem().as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match identity {
        Some(cert) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.cert_pem.as_bytes())
                    .map(Result::unwrap)
                    .collect(),
                PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::from(addr.ip());
    match connector.connect(name, tcp).await {
        Ok(tls) => http_get(tls, path).await,
        Err(_) => Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_port_speaks_https() {
    let root = tempfile::tempdir().unwrap();
    let ca = DevCa::new("raftcask test CA").unwrap();
    let other_ca = DevCa::new("another CA").unwrap();
    let ip = kvnode::testing::private_loopback();
    let bind = || tokio::net::TcpListener::bind((ip, 0));
    let (client, peer, admin) = (
        bind().await.unwrap(),
        bind().await.unwrap(),
        bind().await.unwrap(),
    );
    let admin_addr = admin.local_addr().unwrap();
    let info = kvnode::NodeInfo {
        client_addr: client.local_addr().unwrap().to_string(),
        peer_addr: peer.local_addr().unwrap().to_string(),
    };
    let mut config = NodeConfig::new(
        1,
        root.path().join("node1"),
        client.local_addr().unwrap(),
        peer.local_addr().unwrap(),
        [(1, info)].into(),
    );
    config.bootstrap = true;
    config.admin_addr = Some(admin_addr);
    config.security.tls = Some(node_material(&ca, &config));
    config.security.admin_client_cert_auth = true;
    let node = kvnode::Node::start_with_listeners(
        config,
        kvnode::Listeners {
            client,
            peer,
            admin: Some(admin),
        },
    )
    .await
    .unwrap();

    let client_cert = ca.client_cert("prometheus").unwrap();
    let answer = https_get(admin_addr, &ca, Some(&client_cert), "/health").await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("ok member 1"), "{text}");
    let answer = https_get(admin_addr, &ca, Some(&client_cert), "/metrics").await;
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"));

    // No certificate, a foreign one, plain HTTP: no answer.
    for (what, answer) in [
        (
            "no client certificate",
            https_get(admin_addr, &ca, None, "/health").await,
        ),
        (
            "another CA's certificate",
            https_get(
                admin_addr,
                &ca,
                Some(&other_ca.client_cert("x").unwrap()),
                "/health",
            )
            .await,
        ),
        (
            "plain HTTP",
            http_get(
                tokio::net::TcpStream::connect(admin_addr).await.unwrap(),
                "/health",
            )
            .await,
        ),
    ] {
        let text = String::from_utf8_lossy(&answer);
        assert!(!text.contains("HTTP/1.1 200"), "{what}: answered {text}");
    }
    // The refused connections gave their slots back: still served.
    let answer = https_get(admin_addr, &ca, Some(&client_cert), "/health").await;
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"));
    node.shutdown(Duration::ZERO).await;
}

#[test]
fn unusable_material_and_tokens_are_refused_with_the_field_named() {
    let ca = DevCa::new("ca").unwrap();
    let cert = ca.node_cert("n", &["127.0.0.1".to_string()]).unwrap();
    let other = ca.node_cert("m", &["127.0.0.1".to_string()]).unwrap();
    let err = TlsMaterial::from_pem("garbage", cert.key_pem.as_bytes(), ca.cert_pem())
        .unwrap_err()
        .to_string();
    assert!(err.contains("--tls-cert"), "{err}");
    let err = TlsMaterial::from_pem(cert.cert_pem.as_bytes(), "garbage", ca.cert_pem())
        .unwrap_err()
        .to_string();
    assert!(err.contains("--tls-key"), "{err}");
    let err = TlsMaterial::from_pem(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes(), "")
        .unwrap_err()
        .to_string();
    assert!(err.contains("--tls-ca"), "{err}");
    // A key that belongs to another certificate.
    assert!(
        TlsMaterial::from_pem(
            cert.cert_pem.as_bytes(),
            other.key_pem.as_bytes(),
            ca.cert_pem()
        )
        .is_err()
    );
    let err = AuthToken::new("short").unwrap_err().to_string();
    assert!(err.contains("TOKEN_BYTES_MIN"), "{err}");
    assert!(AuthToken::new("has a space in the middle of it").is_err());
}
