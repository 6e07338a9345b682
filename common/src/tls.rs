//! Mutual-TLS configuration from the PEM files that `quotient certs` writes.
//!
//! A [`TlsIdentity`] is what a process proves itself with and whom it trusts: the cluster CA,
//! its own certificate chain and private key. Loading checks that the certificate carries a
//! Quotient identity and chains to the CA, so a misconfigured process fails at start with a
//! message naming the file, instead of every peer later refusing an unexplained handshake.
//! Configs use rustls's ring provider explicitly ([`crypto_provider`]) and never the process
//! default, so nothing depends on which provider another crate happens to install, and TLS 1.3
//! only, as QUIC requires. Servers demand a client certificate signed by the CA; there is no
//! anonymous access anywhere in a cluster.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, RootCertStore};

use crate::certs::{self, IdentityError, PeerIdentity};

/// The TLS protocol versions Quotient speaks: 1.3 only (QUIC requires it).
pub static PROTOCOL_VERSIONS: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];

/// The crypto provider of every Quotient TLS config: ring, never the process default, with
/// AES-128-GCM/SHA-256 preferred to ring's first choice AES-256-GCM/SHA-384. Every packet of a
/// QUIC connection is sealed with the suite the handshake picks, and the handshake's key
/// schedule hashes with its hash: SHA-256 has instructions of its own on current x86 and ARM
/// CPUs, SHA-384 does not, and AES-128 takes fewer rounds. A leader serving thousands of
/// agents pays both on every heartbeat and on every reconnect after a failover (BENCHMARKS.md,
/// the fleet). Both suites are TLS 1.3's own; peers that prefer the other still connect.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    use rustls::crypto::ring::cipher_suite;
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites = vec![
        cipher_suite::TLS13_AES_128_GCM_SHA256,
        cipher_suite::TLS13_AES_256_GCM_SHA384,
        cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    ];
    Arc::new(provider)
}

/// The three PEM files a process needs: the cluster CA, its certificate and its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsFiles {
    /// The files `quotient certs` writes for `name` in `dir`: `ca.pem`, `NAME.pem`,
    /// `NAME-key.pem`.
    pub fn in_dir(dir: &Path, name: &str) -> Self {
        let issued = certs::issued_files(dir, name);
        TlsFiles {
            ca: certs::ca_files(dir).cert,
            cert: issued.cert,
            key: issued.key,
        }
    }

    /// The files as the binaries' flags take them: `--ca CA --cert CERT --key KEY`.
    pub fn flags(&self) -> [&std::ffi::OsStr; 6] {
        [
            "--ca".as_ref(),
            self.ca.as_os_str(),
            "--cert".as_ref(),
            self.cert.as_os_str(),
            "--key".as_ref(),
            self.key.as_os_str(),
        ]
    }
}

/// Which of the three files a [`TlsError`] is about; decides the hint on what to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFileKind {
    Ca,
    Cert,
    Key,
}

impl TlsFileKind {
    fn describe(self) -> &'static str {
        match self {
            TlsFileKind::Ca => "the cluster CA certificate",
            TlsFileKind::Cert => "the certificate",
            TlsFileKind::Key => "the private key",
        }
    }

    fn hint(self, path: &Path) -> String {
        let dir = path
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        match self {
            TlsFileKind::Ca => format!(
                "make the CA with `quotient certs init --dir {}` or point the config at the cluster's ca.pem",
                dir.display()
            ),
            TlsFileKind::Cert | TlsFileKind::Key => format!(
                "issue a certificate and key with `quotient certs issue --dir {} --role ROLE --name NAME`",
                dir.display()
            ),
        }
    }
}

/// Why TLS could not be set up. Every message names the file and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {} {}: {source}; {}", kind.describe(), path.display(), kind.hint(path))]
    Read {
        kind: TlsFileKind,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} {} holds no usable PEM block ({reason}); {}", kind.describe(), path.display(), kind.hint(path))]
    Pem {
        kind: TlsFileKind,
        path: PathBuf,
        reason: String,
    },
    #[error("the certificate {}: {source}; {}", path.display(), TlsFileKind::Cert.hint(path))]
    Identity {
        path: PathBuf,
        #[source]
        source: IdentityError,
    },
    #[error("the certificate {} is not valid under the CA {}: {reason}; issue it from that CA's directory, or use the matching ca.pem", cert.display(), ca.display())]
    NotSignedByCa {
        cert: PathBuf,
        ca: PathBuf,
        reason: String,
    },
    #[error("the certificate {} is not valid at this host's time: {reason}; if this host's clock is wrong (compare it with another host's `date -u`), set it right (NTP); if the certificate has expired, issue a new one (docs/operations.md, \"Certificate expiry\")", cert.display())]
    NotValidNow { cert: PathBuf, reason: String },
    #[error("the key {} does not fit the certificate {}: {reason}; use the NAME-key.pem issued with NAME.pem", key.display(), cert.display())]
    KeyMismatch {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
    #[error("TLS configuration failed: {0}")]
    Config(String),
}

/// How often a coordinator or agent looks again at its certificate's and its CA's expiry
/// ([`TlsIdentity::log_expiry_notices`]), in seconds: twice a day.
pub const EXPIRY_LOOK_S: u64 = 12 * 60 * 60;

/// A process's TLS material: whom it trusts (the CA) and what it presents (chain and key).
#[derive(Debug)]
pub struct TlsIdentity {
    roots: Arc<RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    identity: PeerIdentity,
    files: TlsFiles,
    /// When the first of the CA certificates trusted stops being valid (seconds since the
    /// epoch).
    ca_not_after: Option<i64>,
}

impl Clone for TlsIdentity {
    fn clone(&self) -> Self {
        TlsIdentity {
            roots: self.roots.clone(),
            chain: self.chain.clone(),
            key: self.key.clone_key(),
            identity: self.identity.clone(),
            files: self.files.clone(),
            ca_not_after: self.ca_not_after,
        }
    }
}

impl TlsIdentity {
    /// Loads and checks the three files: the certificate must name a Quotient identity and be
    /// valid under the CA now, and the key must belong to it.
    pub fn load(files: &TlsFiles) -> Result<Self, TlsError> {
        let ca_pem = read(TlsFileKind::Ca, &files.ca)?;
        let cert_pem = read(TlsFileKind::Cert, &files.cert)?;
        let key_pem = read(TlsFileKind::Key, &files.key)?;
        TlsIdentity::from_pem(files, &ca_pem, &cert_pem, &key_pem)
    }

    /// The identity of PEM held in memory (a certificate issued with
    /// [`certs::CaIssuer`]), checked as [`TlsIdentity::load`] checks files; `files` names
    /// where they would be, for messages.
    pub fn from_pem(
        files: &TlsFiles,
        ca_pem: &[u8],
        cert_pem: &[u8],
        key_pem: &[u8],
    ) -> Result<Self, TlsError> {
        let ca_certificates = parse_certificates(TlsFileKind::Ca, &files.ca, ca_pem)?;
        let ca_not_after = ca_certificates
            .iter()
            .filter_map(|der| PeerIdentity::serial_and_validity_of_certificate_der(der).ok())
            .map(|(_, (_, not_after))| not_after)
            .min();
        let mut roots = RootCertStore::empty();
        for certificate in ca_certificates {
            roots.add(certificate).map_err(|error| TlsError::Pem {
                kind: TlsFileKind::Ca,
                path: files.ca.clone(),
                reason: error.to_string(),
            })?;
        }
        let chain = parse_certificates(TlsFileKind::Cert, &files.cert, cert_pem)?;
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|error| TlsError::Pem {
            kind: TlsFileKind::Key,
            path: files.key.clone(),
            reason: error.to_string(),
        })?;
        let identity =
            PeerIdentity::from_certificate_der(&chain[0]).map_err(|source| TlsError::Identity {
                path: files.cert.clone(),
                source,
            })?;

        let tls = TlsIdentity {
            roots: Arc::new(roots),
            chain,
            key,
            identity,
            files: files.clone(),
            ca_not_after,
        };
        tls.check_chain()?;
        tls.check_key()?;
        Ok(tls)
    }

    /// What this process says of its certificate and of its CA at `now` (seconds since the
    /// epoch): each one expired, or within [`certs::SERVICE_EXPIRY_WARNING_DAYS`] of it, with
    /// whether it has expired ([`certs::expiry_notice`]).
    pub fn expiry_notices(&self, now: i64) -> Vec<(bool, String)> {
        let own = self.not_after().and_then(|not_after| {
            let what = format!("its certificate {}", self.files.cert.display());
            certs::expiry_notice(&what, not_after, now, false)
        });
        let ca = self.ca_not_after.and_then(|not_after| {
            let what = format!("the cluster CA {}", self.files.ca.display());
            certs::expiry_notice(&what, not_after, now, true)
        });
        own.into_iter().chain(ca).collect()
    }

    /// When this identity's certificate stops being valid (seconds since the epoch).
    pub fn not_after(&self) -> Option<i64> {
        PeerIdentity::serial_and_validity_of_certificate_der(&self.chain[0])
            .ok()
            .map(|(_, (_, not_after))| not_after)
    }

    /// When the first of the CA certificates it trusts stops being valid (seconds since the
    /// epoch).
    pub fn ca_not_after(&self) -> Option<i64> {
        self.ca_not_after
    }

    /// Logs [`TlsIdentity::expiry_notices`] now and every [`EXPIRY_LOOK_S`] seconds, a
    /// warning for one that expires soon and an error for one expired, for good.
    pub async fn log_expiry_notices(self) {
        loop {
            for (expired, text) in self.expiry_notices(certs::unix_now_s()) {
                if expired {
                    tracing::error!("{text}");
                } else {
                    tracing::warn!("{text}");
                }
            }
            tokio::time::sleep(std::time::Duration::from_secs(EXPIRY_LOOK_S)).await;
        }
    }

    /// A secret of 32 bytes for `purpose`, derived from this identity's private key (HKDF,
    /// SHA-256): the same identity derives the same secret after a restart, and different
    /// purposes get unrelated ones. It reveals nothing of the key.
    pub fn derived_secret(&self, purpose: &[u8]) -> [u8; 32] {
        let salt = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, b"quotient: derived secret, v1");
        let prk = salt.extract(self.key.secret_der());
        let info = [purpose];
        let okm = prk
            .expand(&info, ring::hkdf::HKDF_SHA256)
            .expect("one SHA-256 output is within HKDF's limit");
        let mut secret = [0u8; 32];
        okm.fill(&mut secret)
            .expect("the output is the length asked for");
        secret
    }

    /// Who this process is, as its certificate says.
    pub fn identity(&self) -> &PeerIdentity {
        &self.identity
    }

    /// The files this identity was loaded from.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// A server config that accepts the given ALPN protocols and requires every client to
    /// present a certificate signed by the CA.
    pub fn server_config(
        &self,
        alpn_protocols: &[&[u8]],
    ) -> Result<rustls::ServerConfig, TlsError> {
        let provider = crypto_provider();
        let verifier =
            WebPkiClientVerifier::builder_with_provider(self.roots.clone(), provider.clone())
                .build()
                .map_err(|error| TlsError::Config(error.to_string()))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(PROTOCOL_VERSIONS)
            .map_err(|error| TlsError::Config(error.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|error| self.key_mismatch(error))?;
        config.alpn_protocols = alpn_protocols.iter().map(|alpn| alpn.to_vec()).collect();
        Ok(config)
    }

    /// A server config for HTTPS (the AWS endpoint): this identity's certificate, HTTP/1.1,
    /// and no client certificate asked for, since requests prove who sent them otherwise
    /// (SigV4). TLS 1.2 as well as 1.3, as HTTP clients may offer either.
    pub fn https_server_config(&self) -> Result<rustls::ServerConfig, TlsError> {
        let mut config = rustls::ServerConfig::builder_with_provider(crypto_provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|error| TlsError::Config(error.to_string()))?
            .with_no_client_auth()
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|error| self.key_mismatch(error))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }

    /// A client config that offers `alpn`, presents this identity's certificate and trusts
    /// only servers whose certificate the CA signed.
    pub fn client_config(&self, alpn: &[u8]) -> Result<rustls::ClientConfig, TlsError> {
        let mut config = rustls::ClientConfig::builder_with_provider(crypto_provider())
            .with_protocol_versions(PROTOCOL_VERSIONS)
            .map_err(|error| TlsError::Config(error.to_string()))?
            .with_root_certificates(self.roots.clone())
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|error| self.key_mismatch(error))?;
        config.alpn_protocols = vec![alpn.to_vec()];
        Ok(config)
    }

    /// Verifies our own chain the way peers will: as a client (every role has client auth),
    /// and as a server too for roles that accept connections.
    fn check_chain(&self) -> Result<(), TlsError> {
        let not_signed = |error: rustls::Error| match error {
            // Not yet valid or expired: most often this host's clock, not the CA (found by
            // probing with a clock 2 h behind: the hint sent the operator to the CA).
            rustls::Error::InvalidCertificate(
                CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. }
                | CertificateError::Expired
                | CertificateError::ExpiredContext { .. },
            ) => TlsError::NotValidNow {
                cert: self.files.cert.clone(),
                reason: error.to_string(),
            },
            _ => TlsError::NotSignedByCa {
                cert: self.files.cert.clone(),
                ca: self.files.ca.clone(),
                reason: error.to_string(),
            },
        };
        let provider = crypto_provider();
        let now = UnixTime::now();
        let (end_entity, intermediates) = (&self.chain[0], &self.chain[1..]);
        let client_verifier =
            WebPkiClientVerifier::builder_with_provider(self.roots.clone(), provider.clone())
                .build()
                .map_err(|error| TlsError::Config(error.to_string()))?;
        client_verifier
            .verify_client_cert(end_entity, intermediates, now)
            .map_err(not_signed)?;
        if self.identity.role.is_server() {
            let server_verifier =
                WebPkiServerVerifier::builder_with_provider(self.roots.clone(), provider)
                    .build()
                    .map_err(|error| TlsError::Config(error.to_string()))?;
            // The name checked here is only a probe: which names a server must carry depends
            // on how peers address it, so a name mismatch is not an error at load time.
            let probe = ServerName::try_from("localhost")
                .map_err(|error| TlsError::Config(error.to_string()))?;
            match server_verifier.verify_server_cert(end_entity, intermediates, &probe, &[], now) {
                Ok(_)
                | Err(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                )) => {}
                Err(error) => return Err(not_signed(error)),
            }
        }
        Ok(())
    }

    /// Checks that the private key belongs to the certificate.
    fn check_key(&self) -> Result<(), TlsError> {
        let signing_key = crypto_provider()
            .key_provider
            .load_private_key(self.key.clone_key())
            .map_err(|error| self.key_mismatch(error))?;
        let certified = rustls::sign::CertifiedKey::new(self.chain.clone(), signing_key);
        certified
            .keys_match()
            .map_err(|error| self.key_mismatch(error))
    }

    fn key_mismatch(&self, error: rustls::Error) -> TlsError {
        TlsError::KeyMismatch {
            cert: self.files.cert.clone(),
            key: self.files.key.clone(),
            reason: error.to_string(),
        }
    }
}

fn read(kind: TlsFileKind, path: &Path) -> Result<Vec<u8>, TlsError> {
    crate::bounded_read::read_file_at_most(path, crate::certs::PEM_FILE_BYTES_MAX).map_err(
        |source| TlsError::Read {
            kind,
            path: path.to_path_buf(),
            source,
        },
    )
}

fn parse_certificates(
    kind: TlsFileKind,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem_error = |reason: String| TlsError::Pem {
        kind,
        path: path.to_path_buf(),
        reason,
    };
    let certificates = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| pem_error(error.to_string()))?;
    if certificates.is_empty() {
        return Err(pem_error("expected a CERTIFICATE block".to_string()));
    }
    Ok(certificates)
}
