//! # kvcerts
//!
//! A development certificate authority for raftcask clusters: a CA that
//! issues node certificates (server and client auth) and client
//! certificates (client auth only), as PEM text. `kvctl certs` writes them
//! to files; kvnode's TLS tests build in-process clusters with them. For
//! development only: the CA's key lives in memory and is never written.
//!
//! Node certificates carry both the server-auth and client-auth key
//! purposes (a member dials its peers with the certificate it serves);
//! client certificates carry client-auth only, so a member's peer port
//! tells a member from a client even when one CA signed both.
//!
//! ## Modules
//!
//! The crate is one module: [`DevCa`] (the CA), [`IssuedCert`] (a
//! certificate and its key), [`CertError`] (why generation failed) and the
//! validity constants [`DEV_CERT_VALIDITY_DAYS`], [`DEV_CERT_BACKDATE`].
//!
//! ## Example
//!
//! ```
//! let ca = kvcerts::DevCa::new("example CA").unwrap();
//! let node = ca.node_cert("node1", &["127.0.0.1".to_string()]).unwrap();
//! assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
//! assert!(node.key_pem.contains("PRIVATE KEY"));
//! ```

use std::time::Duration;

/// Validity of the certificates [`DevCa`] issues (development only).
pub const DEV_CERT_VALIDITY_DAYS: u64 = 365;
/// How far back a [`DevCa`] certificate's validity starts (clock skew
/// between the machine that made it and the members).
pub const DEV_CERT_BACKDATE: Duration = Duration::from_secs(3600);

/// Why a certificate could not be generated.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// rcgen refused the parameters or failed, or a request was unusable.
    #[error("certificate generation: {0}")]
    Generate(String),
}

/// A certificate and its private key, as PEM text.
#[derive(Clone)]
pub struct IssuedCert {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

impl std::fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCert").finish_non_exhaustive()
    }
}

/// A development certificate authority (ECDSA P-256, rcgen): issues node
/// certificates (server and client auth, the given host names and IP
/// addresses) and client certificates (client auth only). Held in memory
/// only; for anything but development use a real CA.
pub struct DevCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    cert_pem: String,
}

impl std::fmt::Debug for DevCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevCa").finish_non_exhaustive()
    }
}

fn generate_error(err: rcgen::Error) -> CertError {
    CertError::Generate(err.to_string())
}

fn validity(params: &mut rcgen::CertificateParams) {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    params.not_before = epoch + since_epoch.saturating_sub(DEV_CERT_BACKDATE);
    params.not_after =
        epoch + since_epoch + Duration::from_secs(DEV_CERT_VALIDITY_DAYS * 24 * 3600);
}

impl DevCa {
    /// A new CA named `common_name`.
    pub fn new(common_name: &str) -> Result<DevCa, CertError> {
        let mut params =
            rcgen::CertificateParams::new(Vec::<String>::new()).map_err(generate_error)?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params);
        let key = rcgen::KeyPair::generate().map_err(generate_error)?;
        let cert = params.self_signed(&key).map_err(generate_error)?;
        Ok(DevCa {
            issuer: rcgen::Issuer::new(params, key),
            cert_pem: cert.pem(),
        })
    }

    /// The CA certificate (the `--tls-ca` / `--cacert` bundle).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    fn issue(
        &self,
        common_name: &str,
        hosts: &[String],
        purposes: Vec<rcgen::ExtendedKeyUsagePurpose>,
    ) -> Result<IssuedCert, CertError> {
        let mut params = rcgen::CertificateParams::new(hosts.to_vec()).map_err(generate_error)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::DigitalSignature,
            rcgen::KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = purposes;
        params.use_authority_key_identifier_extension = true;
        validity(&mut params);
        let key = rcgen::KeyPair::generate().map_err(generate_error)?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(generate_error)?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A node certificate for `hosts` (DNS names and IP addresses the
    /// member is reached at), valid for server and client authentication.
    pub fn node_cert(&self, name: &str, hosts: &[String]) -> Result<IssuedCert, CertError> {
        if hosts.is_empty() {
            return Err(CertError::Generate(format!(
                "node certificate {name:?}: at least one host name or IP address is needed"
            )));
        }
        self.issue(
            name,
            hosts,
            vec![
                rcgen::ExtendedKeyUsagePurpose::ServerAuth,
                rcgen::ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )
    }

    /// A client certificate named `name`, valid for client authentication
    /// only (it cannot act as a member on the peer port).
    pub fn client_cert(&self, name: &str) -> Result<IssuedCert, CertError> {
        self.issue(name, &[], vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issues_pem_certificates_and_keys() {
        let ca = DevCa::new("test CA").unwrap();
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        let node = ca
            .node_cert("node1", &["127.0.0.1".to_string(), "localhost".to_string()])
            .unwrap();
        assert!(node.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(node.key_pem.contains("PRIVATE KEY"));
        let client = ca.client_cert("client").unwrap();
        assert_ne!(client.cert_pem, node.cert_pem);
    }

    #[test]
    fn a_node_certificate_needs_a_host() {
        let ca = DevCa::new("test CA").unwrap();
        let err = ca.node_cert("node1", &[]).unwrap_err();
        assert!(err.to_string().contains("at least one host"), "{err}");
    }
}
