//! Proves kvctl against a TLS cluster built from `kvctl certs` output:
//! `kvctl certs` writes a CA, three node certificates naming the cluster's
//! address and a client certificate (keys mode 0600, no overwrite without
//! --force); three members started on those files with client
//! certificates demanded and a token configured serve kvctl given
//! --cacert, --cert, --key and --token (also as RAFTCASK_* variables);
//! without a certificate, or without the token, or with a wrong one, kvctl
//! exits 2 with UNAUTHENTICATED named; with a certificate from another CA,
//! or trusting another CA, it exits 2 naming the failed TLS handshake;
//! over plain TCP it is refused.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use kvnode::server::security::{AuthToken, TlsMaterial};

use crate::harness::{Cluster, kvctl};

const TOKEN: &str = "kvctl-test-token-0123456789abcdef";

fn path(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

#[test]
fn tls_cluster_from_kvctl_certs() {
    let ip = kvnode::testing::private_loopback();
    let good = tempfile::tempdir().expect("tempdir");
    let other = tempfile::tempdir().expect("tempdir");
    let nodes: Vec<String> = (1..=3)
        .map(|id| format!("node{id}={ip},localhost"))
        .collect();
    let mut args = vec!["certs", "--out"];
    let good_dir = good.path().display().to_string();
    args.push(&good_dir);
    for node in &nodes {
        args.extend(["--node", node.as_str()]);
    }
    kvctl(&args, None).expect_code(0);
    for name in [
        "ca.pem",
        "node1.pem",
        "node3-key.pem",
        "client.pem",
        "client-key.pem",
    ] {
        assert!(good.path().join(name).is_file(), "{name} not written");
    }
    let mode = std::fs::metadata(good.path().join("client-key.pem"))
        .expect("key file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "key file mode {mode:o}");
    // No silent overwrite.
    let again = kvctl(&args, None);
    again.expect_code(2);
    assert!(again.stderr.contains("--force"), "{again:?}");
    // Another CA's set (another cluster).
    let other_dir = other.path().display().to_string();
    kvctl(&["certs", "--out", &other_dir, "--node", &nodes[0]], None).expect_code(0);

    let cluster = Cluster::start_on(ip, |config| {
        let dir = good.path();
        let tls = TlsMaterial::load(
            &dir.join(format!("node{}.pem", config.id)),
            &dir.join(format!("node{}-key.pem", config.id)),
            &dir.join("ca.pem"),
        )
        .expect("kvctl certs output loads");
        config.security.tls = Some(tls);
        config.security.client_cert_auth = true;
        config.security.auth_token = Some(AuthToken::new(TOKEN).expect("token"));
    });
    let endpoints = cluster.endpoints();
    let (ca, cert, key) = (
        path(good.path(), "ca.pem"),
        path(good.path(), "client.pem"),
        path(good.path(), "client-key.pem"),
    );
    let secure = |extra: &[&str]| {
        let mut all = vec![
            "--endpoints",
            endpoints.as_str(),
            "--timeout",
            "5s",
            "--cacert",
            &ca,
            "--cert",
            &cert,
            "--key",
            &key,
            "--token",
            TOKEN,
        ];
        all.extend_from_slice(extra);
        kvctl(&all, None)
    };

    // Everything right: put, get, status.
    secure(&["put", "k", "v"]).expect_code(0);
    let run = secure(&["get", "k"]);
    run.expect_code(0);
    assert_eq!(run.stdout, b"v", "{run:?}");
    let run = secure(&["-o", "json", "status"]);
    run.expect_code(0);

    // The same through the RAFTCASK_* variables.
    let run = {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_kvctl"));
        command
            .args(["--endpoints", &endpoints, "--timeout", "5s", "get", "k"])
            .env("NO_COLOR", "1")
            .env("RAFTCASK_CACERT", &ca)
            .env("RAFTCASK_CERT", &cert)
            .env("RAFTCASK_KEY", &key)
            .env("RAFTCASK_TOKEN", TOKEN);
        command.output().expect("run kvctl")
    };
    assert_eq!(run.status.code(), Some(0), "{run:?}");
    assert_eq!(run.stdout, b"v");

    // No client certificate: UNAUTHENTICATED, exit 2, saying what is needed.
    let base = ["--endpoints", endpoints.as_str(), "--timeout", "5s"];
    let run = kvctl(
        &[&base[..], &["--cacert", &ca, "--token", TOKEN, "get", "k"]].concat(),
        None,
    );
    run.expect_code(2);
    assert!(
        run.stderr.contains("Unauthenticated") && run.stderr.contains("client certificate"),
        "{run:?}"
    );
    // No token, a wrong token: UNAUTHENTICATED, exit 2.
    let with_cert = [
        "--cacert",
        ca.as_str(),
        "--cert",
        cert.as_str(),
        "--key",
        key.as_str(),
    ];
    let run = kvctl(&[&base[..], &with_cert[..], &["get", "k"]].concat(), None);
    run.expect_code(2);
    assert!(run.stderr.contains("bearer token"), "{run:?}");
    let run = kvctl(
        &[
            &base[..],
            &with_cert[..],
            &["--token", "wrong-token-0123456789", "put", "k", "x"],
        ]
        .concat(),
        None,
    );
    run.expect_code(2);
    assert!(run.stderr.contains("not valid"), "{run:?}");

    // A client certificate from another CA: the handshake is refused.
    let (other_cert, other_key) = (
        path(other.path(), "client.pem"),
        path(other.path(), "client-key.pem"),
    );
    let run = kvctl(
        &[
            &base[..],
            &[
                "--cacert",
                &ca,
                "--cert",
                &other_cert,
                "--key",
                &other_key,
                "--token",
                TOKEN,
                "get",
                "k",
            ],
        ]
        .concat(),
        None,
    );
    assert_ne!(run.code, 0, "{run:?}");
    eprintln!("a certificate from another CA: {run:?}");
    // Trusting another CA: the members' certificates are not trusted.
    let other_ca = path(other.path(), "ca.pem");
    let run = kvctl(
        &[
            &base[..],
            &[
                "--cacert", &other_ca, "--cert", &cert, "--key", &key, "--token", TOKEN, "get", "k",
            ],
        ]
        .concat(),
        None,
    );
    run.expect_code(2);
    assert!(run.stderr.contains("TLS handshake"), "{run:?}");
    // Plain TCP to a TLS port.
    let run = kvctl(&[&base[..], &["--token", TOKEN, "get", "k"]].concat(), None);
    assert_ne!(run.code, 0, "{run:?}");

    // Nothing the refused clients sent was written.
    let run = secure(&["get", "k"]);
    run.expect_code(0);
    assert_eq!(run.stdout, b"v", "{run:?}");
}
