//! `kvctl certs`: a development CA, node certificates and a client
//! certificate as PEM files (rcgen through `kvcerts::DevCa`), and
//! the client's TLS settings read from `--cacert`, `--cert` and `--key`.
//!
//! Files written to `--out`: `ca.pem` (the `--tls-ca` / `--cacert`
//! bundle), `NAME.pem` + `NAME-key.pem` per `--node NAME=HOSTS` (a
//! member's `--tls-cert` / `--tls-key`), and the client's pair. Keys are
//! written with mode 0600. The CA's key is not kept: to add a member later,
//! generate a new set. For development only.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use kvcerts::{DevCa, IssuedCert};
use serde_json::json;

use crate::cli::{CertsArgs, Cli};
use crate::exit::Failure;
use crate::output::{Printer, Style};

/// Most node certificates one `kvctl certs` writes.
pub const CERTS_NODES_MAX: usize = 64;
/// Most host names or addresses one node certificate names.
pub const CERT_HOSTS_MAX: usize = 32;
/// Largest PEM file kvctl reads (`--cacert`, `--cert`, `--key`).
pub const PEM_FILE_BYTES_MAX: u64 = 1024 * 1024;

/// A certificate or file name: letters, digits, `-`, `_`, `.`, not
/// starting with `.`.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn parse_node(spec: &str) -> Result<(String, Vec<String>), Failure> {
    let (name, hosts) = spec
        .split_once('=')
        .ok_or_else(|| Failure::usage(format!("--node {spec:?}: expected NAME=HOST[,HOST...]")))?;
    if !valid_name(name) {
        return Err(Failure::usage(format!(
            "--node {spec:?}: the name may hold letters, digits, '-', '_' and '.' only"
        )));
    }
    let hosts: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_string)
        .collect();
    if hosts.is_empty() || hosts.len() > CERT_HOSTS_MAX {
        return Err(Failure::usage(format!(
            "--node {spec:?}: {} hosts, expected 1..={CERT_HOSTS_MAX} (CERT_HOSTS_MAX)",
            hosts.len()
        )));
    }
    Ok((name.to_string(), hosts))
}

fn write_file(path: &Path, contents: &str, mode: u32, force: bool) -> Result<(), Failure> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).mode(mode);
    if force {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    let mut file = options.open(path).map_err(|err| {
        let hint = if err.kind() == std::io::ErrorKind::AlreadyExists {
            " (pass --force to overwrite)"
        } else {
            ""
        };
        Failure::usage(format!("cannot write {}: {err}{hint}", path.display()))
    })?;
    file.write_all(contents.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|err| Failure::usage(format!("cannot write {}: {err}", path.display())))
}

fn write_pair(
    dir: &Path,
    name: &str,
    cert: &IssuedCert,
    force: bool,
) -> Result<[String; 2], Failure> {
    let cert_path = dir.join(format!("{name}.pem"));
    let key_path = dir.join(format!("{name}-key.pem"));
    write_file(&cert_path, &cert.cert_pem, 0o644, force)?;
    write_file(&key_path, &cert.key_pem, 0o600, force)?;
    Ok([
        cert_path.display().to_string(),
        key_path.display().to_string(),
    ])
}

/// Runs `kvctl certs`.
pub fn run(printer: &Printer, args: &CertsArgs) -> Result<(), Failure> {
    if args.nodes.len() > CERTS_NODES_MAX {
        return Err(Failure::usage(format!(
            "--node given {} times, CERTS_NODES_MAX is {CERTS_NODES_MAX}",
            args.nodes.len()
        )));
    }
    if !valid_name(&args.client) {
        return Err(Failure::usage(format!(
            "--client {:?}: the name may hold letters, digits, '-', '_' and '.' only",
            args.client
        )));
    }
    let nodes = args
        .nodes
        .iter()
        .map(|spec| parse_node(spec))
        .collect::<Result<Vec<_>, _>>()?;
    let mut names: Vec<&str> = nodes.iter().map(|(name, _)| name.as_str()).collect();
    names.extend([args.client.as_str(), "ca"]);
    names.sort_unstable();
    if let Some(twice) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(Failure::usage(format!(
            "the name {:?} is used twice (node names, --client and \"ca\" must differ)",
            twice[0]
        )));
    }
    let generated = |err: kvcerts::CertError| Failure::usage(err.to_string());
    std::fs::create_dir_all(&args.out)
        .map_err(|err| Failure::usage(format!("cannot create {}: {err}", args.out.display())))?;
    let ca = DevCa::new("raftcask development CA").map_err(generated)?;
    let ca_path = args.out.join("ca.pem");
    write_file(&ca_path, ca.cert_pem(), 0o644, args.force)?;
    let mut written = vec![ca_path.display().to_string()];
    for (name, hosts) in &nodes {
        let cert = ca.node_cert(name, hosts).map_err(generated)?;
        written.extend(write_pair(&args.out, name, &cert, args.force)?);
    }
    let client = ca.client_cert(&args.client).map_err(generated)?;
    written.extend(write_pair(&args.out, &args.client, &client, args.force)?);
    if printer.json() {
        printer.print_json(&json!({ "written": written }));
    } else {
        println!("{} wrote:", printer.paint(Style::Good, "OK"));
        for path in &written {
            println!("  {path}");
        }
    }
    Ok(())
}

fn read_pem(flag: &str, path: &Path) -> Result<Vec<u8>, Failure> {
    let read_error =
        |err: std::io::Error| Failure::usage(format!("{flag} {}: {err}", path.display()));
    let size = std::fs::metadata(path).map_err(read_error)?.len();
    if size > PEM_FILE_BYTES_MAX {
        return Err(Failure::usage(format!(
            "{flag} {}: {size} bytes, over PEM_FILE_BYTES_MAX ({PEM_FILE_BYTES_MAX})",
            path.display()
        )));
    }
    std::fs::read(path).map_err(read_error)
}

/// The client's TLS settings from `--cacert`, `--cert`, `--key` (`None`
/// without `--cacert`).
pub fn client_tls(cli: &Cli) -> Result<Option<kvclient::ClientTls>, Failure> {
    let Some(cacert) = &cli.cacert else {
        if cli.cert.is_some() {
            return Err(Failure::usage("--cert needs --cacert (TLS)"));
        }
        return Ok(None);
    };
    let mut tls = kvclient::ClientTls::new(read_pem("--cacert", cacert)?);
    match (&cli.cert, &cli.client_key) {
        (Some(cert), Some(key)) => {
            tls = tls.identity(read_pem("--cert", cert)?, read_pem("--key", key)?);
        }
        (None, None) => {}
        _ => return Err(Failure::usage("--cert and --key go together")),
    }
    Ok(Some(tls))
}
