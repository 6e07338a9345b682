//! The cluster's certificates: making them (`quotient certs init` and `issue`) and reading
//! back who a certificate names.
//!
//! Every coordinator, agent and client authenticates with a certificate signed by one cluster
//! CA. The certificate carries a [`Role`] and a name as one SAN URI, `quotient://ROLE/NAME`
//! (the name is also the common name, for people reading it with `openssl x509`). Coordinators
//! authorise requests by that [`PeerIdentity`]; [`crate::transport`] reads it from every peer.
//! A SAN URI was chosen over a custom extension because standard tools display it and webpki
//! ignores it, so verification stays plain X.509 chain building.
//!
//! Files are written next to each other in one directory: `ca.pem` and `ca-key.pem` for the
//! CA, `NAME.pem` and `NAME-key.pem` for each issued certificate. Nothing is ever overwritten:
//! a second CA in the same directory would silently split the cluster in two, and a replaced
//! key would lock out the process still using the old one. Private keys are created with mode
//! 0600 on Unix.

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use serde::{Deserialize, Serialize};

use crate::name::validate_name;
use crate::SpecError;

/// The largest PEM file (a certificate, a key, the CA) read: a certificate is a few KiB.
pub const PEM_FILE_BYTES_MAX: u64 = 1 << 20;

/// File name of the CA certificate inside a certificate directory.
pub const CA_CERT_FILE: &str = "ca.pem";
/// File name of the CA private key inside a certificate directory.
pub const CA_KEY_FILE: &str = "ca-key.pem";
/// The name that would make an issued certificate's files collide with the CA's.
pub const RESERVED_NAME_CA: &str = "ca";
/// URI scheme of the SAN that carries role and name: `quotient://ROLE/NAME`.
pub const IDENTITY_URI_SCHEME: &str = "quotient";
/// Common name of a cluster CA, followed by a fingerprint of its key (see [`init_ca`]).
pub const CA_COMMON_NAME_PREFIX: &str = "Quotient cluster CA";
/// Bytes of the CA's public key shown (in hex) in its common name.
pub const CA_FINGERPRINT_BYTES: usize = 8;
/// How long a new CA is valid: ten years, since replacing it means re-issuing everything.
pub const CA_VALIDITY_DAYS: u64 = 3650;
/// How long an issued certificate is valid (capped at the CA's own expiry).
pub const LEAF_VALIDITY_DAYS: u64 = 1825;
/// Certificates start being valid this long before they are made, so that a peer whose
/// clock is slightly behind does not reject a fresh certificate.
pub const CLOCK_SKEW_ALLOWANCE_SECS: u64 = 3600;
/// Most `--san` entries one certificate may carry.
pub const EXTRA_SANS_MAX: usize = 64;
/// Unix permissions of a private key file.
#[cfg(unix)]
pub const KEY_FILE_MODE: u32 = 0o600;
/// Unix permissions of a certificate directory this module creates.
#[cfg(unix)]
pub const CERT_DIR_MODE: u32 = 0o700;

const SECONDS_PER_DAY: u64 = 86_400;

/// What a certificate holder is allowed to be in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Role {
    /// A coordinator: serves the API and Raft, and connects to agents.
    Coordinator,
    /// An agent on a GPU host: serves the leader's desired state.
    Agent,
    /// An operator: may change shares and the cluster.
    Admin,
    /// A user: may submit and manage jobs.
    User,
}

impl Role {
    /// Every role, in a fixed order (for help texts).
    pub const ALL: [Role; 4] = [Role::Coordinator, Role::Agent, Role::Admin, Role::User];

    /// The lowercase name used on the command line and in the SAN URI.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Coordinator => "coordinator",
            Role::Agent => "agent",
            Role::Admin => "admin",
            Role::User => "user",
        }
    }

    /// Whether holders of this role accept connections, and so need server SANs and the
    /// server-auth key usage.
    pub fn is_server(self) -> bool {
        matches!(self, Role::Coordinator | Role::Agent)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = CertError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|role| role.as_str() == s)
            .ok_or_else(|| CertError::UnknownRole(s.to_string()))
    }
}

/// Who a certificate names: its role and its name, as read from the SAN URI.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PeerIdentity {
    pub role: Role,
    pub name: String,
}

impl PeerIdentity {
    /// The SAN URI that carries this identity: `quotient://ROLE/NAME`.
    pub fn uri(&self) -> String {
        format!("{IDENTITY_URI_SCHEME}://{}/{}", self.role, self.name)
    }

    /// Parses `quotient://ROLE/NAME`; `None` when `uri` is not a Quotient identity URI at
    /// all, an error when it is one but malformed.
    pub fn from_uri(uri: &str) -> Result<Option<Self>, IdentityError> {
        let Some(rest) = uri
            .strip_prefix(IDENTITY_URI_SCHEME)
            .and_then(|rest| rest.strip_prefix("://"))
        else {
            return Ok(None);
        };
        let malformed = || IdentityError::Malformed(uri.to_string());
        let (role, name) = rest.split_once('/').ok_or_else(malformed)?;
        let role = Role::from_str(role).map_err(|_| malformed())?;
        validate_name(role.as_str(), name).map_err(|_| malformed())?;
        Ok(Some(PeerIdentity {
            role,
            name: name.to_string(),
        }))
    }

    /// The serial number of a DER certificate, as lowercase hex without leading zeros (what
    /// `quotient certs revoke --serial` takes; `openssl x509 -serial` prints it in capitals),
    /// and when it starts and stops being valid, in seconds since the Unix epoch: one parse.
    pub fn serial_and_validity_of_certificate_der(
        der: &[u8],
    ) -> Result<(String, (i64, i64)), IdentityError> {
        let (_, certificate) = x509_parser::parse_x509_certificate(der)
            .map_err(|error| IdentityError::NotX509(error.to_string()))?;
        let validity = certificate.validity();
        Ok((
            format!("{:x}", certificate.serial),
            (
                validity.not_before.timestamp(),
                validity.not_after.timestamp(),
            ),
        ))
    }

    /// Reads the identity from a DER certificate: exactly one `quotient://` SAN URI.
    pub fn from_certificate_der(der: &[u8]) -> Result<Self, IdentityError> {
        let (_, certificate) = x509_parser::parse_x509_certificate(der)
            .map_err(|error| IdentityError::NotX509(error.to_string()))?;
        let alternative_names = certificate
            .subject_alternative_name()
            .map_err(|error| IdentityError::NotX509(error.to_string()))?
            .ok_or(IdentityError::Missing)?;
        let mut found = None;
        for general_name in &alternative_names.value.general_names {
            if let x509_parser::extensions::GeneralName::URI(uri) = general_name {
                if let Some(identity) = PeerIdentity::from_uri(uri)? {
                    if found.is_some() {
                        return Err(IdentityError::Ambiguous);
                    }
                    found = Some(identity);
                }
            }
        }
        found.ok_or(IdentityError::Missing)
    }
}

impl fmt::Display for PeerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.role, self.name)
    }
}

/// Why a certificate's identity could not be read. The peer is refused in every case.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("the certificate could not be parsed: {0}")]
    NotX509(String),
    #[error("the certificate names no Quotient identity (a SAN URI quotient://ROLE/NAME): issue it with `quotient certs issue`")]
    Missing,
    #[error("the certificate names more than one Quotient identity")]
    Ambiguous,
    #[error("malformed Quotient identity {0:?}: expected quotient://ROLE/NAME with ROLE one of coordinator, agent, admin, user")]
    Malformed(String),
}

/// Why making a certificate failed. Every message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("unknown role {0:?}: use coordinator, agent, admin or user")]
    UnknownRole(String),
    #[error(transparent)]
    InvalidName(#[from] SpecError),
    #[error("the name {0:?} is reserved for the CA's own files: choose another name")]
    ReservedName(String),
    #[error("invalid --san {san:?}: {reason}")]
    InvalidSan { san: String, reason: String },
    #[error("too many --san entries ({given}): at most {max}")]
    TooManySans { given: usize, max: usize },
    #[error("a CA already exists at {}: refusing to overwrite it (a new CA would lock out every certificate it signed); use another --dir or delete the old CA deliberately", path.display())]
    CaExists { path: PathBuf },
    #[error("no CA in {}: create one first with `quotient certs init --dir {}`", dir.display(), dir.display())]
    CaMissing { dir: PathBuf },
    #[error("{} already exists: refusing to overwrite it; delete {} and its key to re-issue", path.display(), path.display())]
    AlreadyExists { path: PathBuf },
    #[error("cannot read the CA from {}: {reason}", path.display())]
    BadCa { path: PathBuf, reason: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
}

/// Where a certificate and its key were written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Paths of the CA files in `dir`.
pub fn ca_files(dir: &Path) -> CertFiles {
    CertFiles {
        cert: dir.join(CA_CERT_FILE),
        key: dir.join(CA_KEY_FILE),
    }
}

/// Paths of the certificate and key issued to `name` in `dir`.
pub fn issued_files(dir: &Path, name: &str) -> CertFiles {
    CertFiles {
        cert: dir.join(format!("{name}.pem")),
        key: dir.join(format!("{name}-key.pem")),
    }
}

/// Creates a new cluster CA in `dir` (made if missing): `ca.pem` and `ca-key.pem`.
/// Refuses when either file already exists.
pub fn init_ca(dir: &Path) -> Result<CertFiles, CertError> {
    let files = ca_files(dir);
    for path in [&files.cert, &files.key] {
        if path.exists() {
            return Err(CertError::CaExists { path: path.clone() });
        }
    }
    create_dir(dir)?;

    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    let mut distinguished_name = DistinguishedName::new();
    distinguished_name.push(DnType::CommonName, ca_common_name(&key));
    params.distinguished_name = distinguished_name;
    // Path length 0: the CA signs leaves only, never intermediates.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(&mut params, CA_VALIDITY_DAYS);

    let certificate = params.self_signed(&key)?;
    write_pair(&files, &certificate.pem(), &key.serialize_pem())?;
    Ok(files)
}

/// Issues a certificate for `role`/`name` signed by the CA in `dir`, written to
/// `NAME.pem` and `NAME-key.pem`. Coordinators and agents also get the server SANs
/// `localhost` and `127.0.0.1`, and every `extra_sans` entry (an IP SAN if it parses as an
/// address, a DNS SAN otherwise).
pub fn issue(
    dir: &Path,
    role: Role,
    name: &str,
    extra_sans: &[String],
) -> Result<CertFiles, CertError> {
    issue_for(dir, role, name, extra_sans, default_validity_days(role))
}

/// How long a certificate of `role` is valid by default: a year for people (admins and
/// users), whose certificates travel with them; [`LEAF_VALIDITY_DAYS`] for coordinators and
/// agents.
pub fn default_validity_days(role: Role) -> u64 {
    match role {
        Role::Admin | Role::User => PERSON_VALIDITY_DAYS,
        Role::Coordinator | Role::Agent => LEAF_VALIDITY_DAYS,
    }
}

/// How long a person's certificate is valid by default (days).
pub const PERSON_VALIDITY_DAYS: u64 = 365;
/// How soon before its end a certificate is said to expire soon (days).
pub const EXPIRY_WARNING_DAYS: u64 = 14;
/// How soon before its end a coordinator or agent warns of its certificate, or of its CA's
/// (days): longer than a person's, as renewing one means a restart of each process.
pub const SERVICE_EXPIRY_WARNING_DAYS: u64 = 30;

/// What a coordinator or agent says of `what` (e.g. `its certificate /etc/quotient/coord-1.pem`),
/// valid until `not_after`, at `now` (both in seconds since the epoch): nothing while more than
/// [`SERVICE_EXPIRY_WARNING_DAYS`] are left; else whether it has expired, and the text.
pub fn expiry_notice(what: &str, not_after: i64, now: i64, ca: bool) -> Option<(bool, String)> {
    let left = not_after - now;
    let when = utc_text(not_after);
    let renew = if ca {
        "every certificate it signed stops working with it: make a new CA and move the cluster to it (see \"Rotating the CA\" in the operations guide)"
    } else {
        "renew it, and restart this process with the new one (see \"Certificate expiry\" in the operations guide)"
    };
    if left <= 0 {
        Some((
            true,
            format!("{what} expired at {when}: new connections with it are refused; {renew}"),
        ))
    } else if left <= SERVICE_EXPIRY_WARNING_DAYS as i64 * SECONDS_PER_DAY as i64 {
        let days = (left + SECONDS_PER_DAY as i64 - 1) / SECONDS_PER_DAY as i64;
        Some((
            false,
            format!(
                "{what} expires at {when} (in {days} day{}): {renew}",
                if days == 1 { "" } else { "s" }
            ),
        ))
    } else {
        None
    }
}

/// What a certificate file says of itself that people need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateFacts {
    /// When it stops being valid, in seconds since the Unix epoch.
    pub expires_at: i64,
    /// Its serial number, lowercase hex (what `quotient certs revoke --serial` takes).
    pub serial: String,
}

/// Reads the certificate in the PEM file `path`.
pub fn certificate_facts(path: &Path) -> Result<CertificateFacts, String> {
    let bytes = crate::bounded_read::read_file_at_most(path, PEM_FILE_BYTES_MAX)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&bytes)
        .map_err(|e| format!("{} is not a PEM certificate: {e}", path.display()))?;
    let certificate = pem
        .parse_x509()
        .map_err(|e| format!("{} is not an X.509 certificate: {e}", path.display()))?;
    Ok(CertificateFacts {
        expires_at: certificate.validity().not_after.timestamp(),
        serial: format!("{:x}", certificate.serial),
    })
}

/// When the certificate in the PEM file `path` stops being valid, in seconds since the Unix
/// epoch.
pub fn expires_at(path: &Path) -> Result<i64, String> {
    certificate_facts(path).map(|facts| facts.expires_at)
}

/// [`issue`], valid for `validity_days` (1 to [`CA_VALIDITY_DAYS`], and never past the CA).
pub fn issue_for(
    dir: &Path,
    role: Role,
    name: &str,
    extra_sans: &[String],
    validity_days: u64,
) -> Result<CertFiles, CertError> {
    validate_name(role.as_str(), name)?;
    if name.eq_ignore_ascii_case(RESERVED_NAME_CA) {
        return Err(CertError::ReservedName(name.to_string()));
    }
    if extra_sans.len() > EXTRA_SANS_MAX {
        return Err(CertError::TooManySans {
            given: extra_sans.len(),
            max: EXTRA_SANS_MAX,
        });
    }
    let identity = PeerIdentity {
        role,
        name: name.to_string(),
    };
    let mut alternative_names = leaf_sans(&identity)?;
    for san in extra_sans {
        let san_type = parse_san(san)?;
        if !alternative_names.contains(&san_type) {
            alternative_names.push(san_type);
        }
    }

    let ca = ca_files(dir);
    if !ca.cert.exists() || !ca.key.exists() {
        return Err(CertError::CaMissing {
            dir: dir.to_path_buf(),
        });
    }
    let files = issued_files(dir, name);
    for path in [&files.cert, &files.key] {
        if path.exists() {
            return Err(CertError::AlreadyExists { path: path.clone() });
        }
    }
    let issuer = CaIssuer::load(&ca)?;
    let issued = issuer.issue_checked(
        &identity,
        alternative_names,
        validity_of_days(validity_days),
    )?;
    write_pair(&files, &issued.cert_pem, &issued.key_pem)?;
    Ok(files)
}

/// The SANs every leaf of `identity` carries: its identity URI, and for coordinators and
/// agents the server names `localhost` and `127.0.0.1`.
fn leaf_sans(identity: &PeerIdentity) -> Result<Vec<SanType>, CertError> {
    let mut alternative_names = vec![SanType::URI(ia5(&identity.uri())?)];
    if identity.role.is_server() {
        alternative_names.push(SanType::DnsName(ia5("localhost")?));
        alternative_names.push(SanType::IpAddress(IpAddr::from([127, 0, 0, 1])));
    }
    Ok(alternative_names)
}

/// A certificate and its key, in PEM, issued in memory.
#[derive(Debug, Clone)]
pub struct IssuedPem {
    pub cert_pem: String,
    pub key_pem: String,
}

/// The cluster CA, loaded once to issue many certificates in memory: what `issue` writes to
/// files, and what a load generator presents for thousands of simulated agents without
/// writing any.
pub struct CaIssuer {
    certificate: rcgen::Certificate,
    key: KeyPair,
    ca_pem: String,
}

impl std::fmt::Debug for CaIssuer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaIssuer").finish_non_exhaustive()
    }
}

impl CaIssuer {
    /// Loads the CA of `files` (its certificate and key).
    pub fn load(files: &CertFiles) -> Result<CaIssuer, CertError> {
        let (certificate, key, ca_pem) = load_ca(files)?;
        Ok(CaIssuer {
            certificate,
            key,
            ca_pem,
        })
    }

    /// The CA certificate as its file holds it (what peers trust).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A certificate for `role`/`name` with the default validity and SANs of [`issue`], in
    /// memory.
    pub fn issue(&self, role: Role, name: &str) -> Result<IssuedPem, CertError> {
        validate_name(role.as_str(), name)?;
        if name.eq_ignore_ascii_case(RESERVED_NAME_CA) {
            return Err(CertError::ReservedName(name.to_string()));
        }
        let identity = PeerIdentity {
            role,
            name: name.to_string(),
        };
        self.issue_checked(
            &identity,
            leaf_sans(&identity)?,
            validity_of_days(default_validity_days(role)),
        )
    }

    /// [`CaIssuer::issue`], valid for `validity` from now (at least a second, and never past
    /// the CA): a short-lived certificate, as tests of expiry need.
    pub fn issue_valid_for(
        &self,
        role: Role,
        name: &str,
        validity: Duration,
    ) -> Result<IssuedPem, CertError> {
        validate_name(role.as_str(), name)?;
        let identity = PeerIdentity {
            role,
            name: name.to_string(),
        };
        self.issue_checked(&identity, leaf_sans(&identity)?, validity)
    }

    /// Signs a leaf for `identity` (whose name was checked) carrying `alternative_names`.
    fn issue_checked(
        &self,
        identity: &PeerIdentity,
        alternative_names: Vec<SanType>,
        validity: Duration,
    ) -> Result<IssuedPem, CertError> {
        let mut params = CertificateParams::default();
        let mut distinguished_name = DistinguishedName::new();
        distinguished_name.push(DnType::CommonName, identity.name.as_str());
        params.distinguished_name = distinguished_name;
        params.subject_alt_names = alternative_names;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = if identity.role.is_server() {
            // Coordinators and agents both accept connections and open them to each other.
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ]
        } else {
            vec![ExtendedKeyUsagePurpose::ClientAuth]
        };
        params.use_authority_key_identifier_extension = true;
        set_validity_for(
            &mut params,
            validity.clamp(Duration::from_secs(1), validity_of_days(CA_VALIDITY_DAYS)),
        );
        // A certificate cannot usefully outlive the CA that vouches for it.
        params.not_after = params.not_after.min(self.certificate.params().not_after);

        let key = KeyPair::generate()?;
        let certificate = params.signed_by(&key, &self.certificate, &self.key)?;
        Ok(IssuedPem {
            cert_pem: certificate.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// Loads the CA as an rcgen issuer, with its PEM. rcgen 0.13 signs with a `Certificate`, so
/// the CA's parameters are read back from its PEM and re-signed in memory; only its name, key
/// identifier and key are used for signing, so the issued chain verifies against the file.
fn load_ca(files: &CertFiles) -> Result<(rcgen::Certificate, KeyPair, String), CertError> {
    let bad = |path: &Path, reason: String| CertError::BadCa {
        path: path.to_path_buf(),
        reason,
    };
    let cert_pem = read_to_string(&files.cert)?;
    let key_pem = read_to_string(&files.key)?;
    let key = KeyPair::from_pem(&key_pem).map_err(|error| bad(&files.key, error.to_string()))?;
    // The certificate of the key: the file may hold several CAs (while a cluster moves from
    // one to another, it trusts both), and a key of another CA must not sign in this one's
    // name (found by probing: certificates issued so were trusted by nothing).
    let mut found = None;
    for block in x509_parser::pem::Pem::iter_from_buffer(cert_pem.as_bytes()) {
        let block = block.map_err(|error| bad(&files.cert, error.to_string()))?;
        let certificate = block
            .parse_x509()
            .map_err(|error| bad(&files.cert, error.to_string()))?;
        if certificate.public_key().subject_public_key.data.as_ref() == key.public_key_raw() {
            let not_after = certificate.validity().not_after.timestamp();
            found = Some((block.contents.clone(), not_after));
            break;
        }
    }
    let Some((der, not_after)) = found else {
        return Err(bad(
            &files.key,
            format!(
                "this key belongs to no CA certificate in {}: the two files are of different CAs; use the ca.pem and ca-key.pem that `quotient certs init` made together",
                files.cert.display()
            ),
        ));
    };
    if not_after <= unix_now_s() {
        return Err(bad(
            &files.cert,
            format!(
                "the CA expired at {}: it can issue nothing any more; make a new CA (`quotient certs init`) and move the cluster to it (\"Rotating the CA\" in the operations guide)",
                utc_text(not_after)
            ),
        ));
    }
    let params = CertificateParams::from_ca_cert_der(&der.into())
        .map_err(|error| bad(&files.cert, error.to_string()))?;
    if params.is_ca == IsCa::NoCa || params.is_ca == IsCa::ExplicitNoCa {
        return Err(bad(&files.cert, "it is not a CA certificate".to_string()));
    }
    let certificate = params.self_signed(&key)?;
    Ok((certificate, key, cert_pem))
}

/// Each CA gets a distinct name, so that a certificate from another cluster fails
/// verification as "unknown issuer" (which says what is wrong) rather than as a bad signature
/// from a same-named CA.
fn ca_common_name(key: &KeyPair) -> String {
    // The raw P-256 public key is 0x04 followed by the point; skip the constant tag byte.
    let fingerprint: String = key
        .public_key_raw()
        .iter()
        .skip(1)
        .take(CA_FINGERPRINT_BYTES)
        .map(|byte| format!("{byte:02x}"))
        .collect();
    format!("{CA_COMMON_NAME_PREFIX} {fingerprint}")
}

/// A subject alternative name as given on a command line: an IP address, else a DNS name.
pub fn parse_san(san: &str) -> Result<SanType, CertError> {
    let invalid = |reason: &str| CertError::InvalidSan {
        san: san.to_string(),
        reason: reason.to_string(),
    };
    if let Ok(address) = san.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(address));
    }
    let valid_host = !san.is_empty()
        && san.len() <= 253
        && san.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'*')
        });
    if !valid_host {
        return Err(invalid(
            "use an IP address or a DNS host name such as coord-1.example.org",
        ));
    }
    Ok(SanType::DnsName(ia5(san)?))
}

fn ia5(text: &str) -> Result<rcgen::Ia5String, CertError> {
    rcgen::Ia5String::try_from(text).map_err(CertError::Generate)
}

/// Makes `params` valid from a little before now for `validity_days`. The date is built from
/// rcgen's own constructor so that this crate need not depend on rcgen's date library.
fn set_validity(params: &mut CertificateParams, validity_days: u64) {
    set_validity_for(params, validity_of_days(validity_days));
}

fn validity_of_days(days: u64) -> Duration {
    Duration::from_secs(days * SECONDS_PER_DAY)
}

fn set_validity_for(params: &mut CertificateParams, validity: Duration) {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    let now = rcgen::date_time_ymd(1970, 1, 1) + since_epoch;
    params.not_before = now - Duration::from_secs(CLOCK_SKEW_ALLOWANCE_SECS);
    params.not_after = now + validity;
}

/// Seconds since the Unix epoch by this host's wall clock: the time certificates are judged
/// by, as TLS judges them.
pub fn unix_now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs() as i64)
}

/// `secs` since the Unix epoch as RFC 3339 text in UTC (`2027-03-01T09:00:00Z`).
pub fn utc_text(secs: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(secs)
        .ok()
        .and_then(|at| {
            at.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("{secs} s after the Unix epoch"))
}

fn create_dir(dir: &Path) -> Result<(), CertError> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, CERT_DIR_MODE);
    builder.create(dir).map_err(|source| CertError::Io {
        path: dir.to_path_buf(),
        source,
    })
}

fn read_to_string(path: &Path) -> Result<String, CertError> {
    crate::bounded_read::read_text_file_at_most(path, PEM_FILE_BYTES_MAX).map_err(|source| {
        CertError::Io {
            path: path.to_path_buf(),
            source,
        }
    })
}

/// Writes the key, then the certificate, each only if absent; on failure removes what it
/// wrote, so a retry does not trip over half a pair.
fn write_pair(files: &CertFiles, cert_pem: &str, key_pem: &str) -> Result<(), CertError> {
    write_new(&files.key, key_pem, true)?;
    if let Err(error) = write_new(&files.cert, cert_pem, false) {
        let _ = fs::remove_file(&files.key);
        return Err(error);
    }
    Ok(())
}

fn write_new(path: &Path, contents: &str, secret: bool) -> Result<(), CertError> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    if secret {
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, KEY_FILE_MODE);
    }
    #[cfg(not(unix))]
    let _ = secret;
    let io_error = |source: io::Error| {
        if source.kind() == io::ErrorKind::AlreadyExists {
            CertError::AlreadyExists {
                path: path.to_path_buf(),
            }
        } else {
            CertError::Io {
                path: path.to_path_buf(),
                source,
            }
        }
    };
    let mut file = options.open(path).map_err(io_error)?;
    let written = file
        .write_all(contents.as_bytes())
        .and_then(|()| file.sync_all());
    if let Err(source) = written {
        drop(file);
        let _ = fs::remove_file(path);
        return Err(io_error(source));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use std::sync::Arc;

    fn read_certificate(path: &Path) -> CertificateDer<'static> {
        CertificateDer::from_pem_file(path).expect("a PEM certificate")
    }

    fn roots(dir: &Path) -> Arc<rustls::RootCertStore> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(read_certificate(&dir.join(CA_CERT_FILE)))
            .unwrap();
        Arc::new(roots)
    }

    #[test]
    fn a_service_certificate_is_warned_of_within_30_days_and_said_expired_after() {
        let day = SECONDS_PER_DAY as i64;
        let what = "its certificate coord-1.pem";
        assert_eq!(expiry_notice(what, 31 * day, 0, false), None);
        let (expired, text) = expiry_notice(what, 10 * day, 0, false).unwrap();
        assert!(!expired);
        assert!(
            text.starts_with("its certificate coord-1.pem expires at 1970-01-11T00:00:00Z (in 10 days): renew it"),
            "{text}"
        );
        let (_, one) = expiry_notice(what, day - 5, 0, false).unwrap();
        assert!(one.contains("(in 1 day)"), "{one}");
        let (expired, text) = expiry_notice(what, 10, 10, false).unwrap();
        assert!(expired);
        assert!(
            text.contains("expired at 1970-01-01T00:00:10Z: new connections with it are refused"),
            "{text}"
        );
        let (_, ca) = expiry_notice("the cluster CA ca.pem", 10 * day, 0, true).unwrap();
        assert!(
            ca.contains("every certificate it signed stops working"),
            "{ca}"
        );
    }

    #[test]
    fn a_pem_file_that_never_ends_is_refused_not_read_into_memory() {
        let said = certificate_facts(Path::new("/dev/zero")).unwrap_err();
        assert!(said.contains("not a regular file"), "{said}");
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.pem");
        std::fs::write(&big, vec![b'-'; 1_048_577]).unwrap();
        let said = certificate_facts(&big).unwrap_err();
        assert!(said.contains("more than 1048576 bytes"), "{said}");
        let error = read_to_string(&big).unwrap_err();
        assert!(
            error.to_string().contains("more than 1048576 bytes"),
            "{error}"
        );
    }

    #[test]
    fn init_and_issue_make_a_chain_that_verifies() {
        // Proves issued certificates verify under the CA as clients, and servers as servers.
        let dir = tempfile::tempdir().unwrap();
        let ca = init_ca(dir.path()).unwrap();
        assert!(ca.cert.exists() && ca.key.exists());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let now = UnixTime::now();

        let coordinator = issue(
            dir.path(),
            Role::Coordinator,
            "coord-1",
            &["10.0.0.5".to_string(), "coord-1.example.org".to_string()],
        )
        .unwrap();
        let leaf = read_certificate(&coordinator.cert);
        let server_verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            roots(dir.path()),
            provider.clone(),
        )
        .build()
        .unwrap();
        for name in ["localhost", "127.0.0.1", "10.0.0.5", "coord-1.example.org"] {
            let server_name = ServerName::try_from(name).unwrap();
            rustls::client::danger::ServerCertVerifier::verify_server_cert(
                server_verifier.as_ref(),
                &leaf,
                &[],
                &server_name,
                &[],
                now,
            )
            .unwrap_or_else(|error| panic!("{name}: {error}"));
        }
        let elsewhere = ServerName::try_from("elsewhere.example.org").unwrap();
        assert!(
            rustls::client::danger::ServerCertVerifier::verify_server_cert(
                server_verifier.as_ref(),
                &leaf,
                &[],
                &elsewhere,
                &[],
                now,
            )
            .is_err()
        );

        let user = issue(dir.path(), Role::User, "alice", &[]).unwrap();
        let client_verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots(dir.path()),
            provider,
        )
        .build()
        .unwrap();
        for files in [&coordinator, &user] {
            client_verifier
                .verify_client_cert(&read_certificate(&files.cert), &[], now)
                .unwrap();
        }
        // A user is a client only: its certificate is no good for serving.
        let localhost = ServerName::try_from("localhost").unwrap();
        assert!(
            rustls::client::danger::ServerCertVerifier::verify_server_cert(
                server_verifier.as_ref(),
                &read_certificate(&user.cert),
                &[],
                &localhost,
                &[],
                now,
            )
            .is_err()
        );
    }

    #[test]
    fn the_san_uri_round_trips_to_the_peer_identity() {
        // Proves the role and name written by `issue` are what a peer reads back.
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path()).unwrap();
        for (role, name) in [
            (Role::Coordinator, "coord-1"),
            (Role::Agent, "node-7"),
            (Role::Admin, "ops"),
            (Role::User, "alice_B-2"),
        ] {
            let files = issue(dir.path(), role, name, &[]).unwrap();
            let der = read_certificate(&files.cert);
            let identity = PeerIdentity::from_certificate_der(&der).unwrap();
            assert_eq!(
                identity,
                PeerIdentity {
                    role,
                    name: name.to_string()
                }
            );
            assert_eq!(
                PeerIdentity::from_uri(&identity.uri()).unwrap(),
                Some(identity)
            );
        }
        // The CA itself names nobody.
        let ca = read_certificate(&dir.path().join(CA_CERT_FILE));
        assert_eq!(
            PeerIdentity::from_certificate_der(&ca),
            Err(IdentityError::Missing)
        );
        assert_eq!(PeerIdentity::from_uri("https://example.org/x"), Ok(None));
        assert!(PeerIdentity::from_uri("quotient://root/alice").is_err());
        assert!(PeerIdentity::from_uri("quotient://user/al ice").is_err());
        assert!(PeerIdentity::from_uri("quotient://user").is_err());
    }

    #[test]
    fn people_get_a_year_by_default_and_any_certificate_the_days_asked_for() {
        // Proves the default validity of people's certificates and `issue_for`'s, as
        // `expires_at` reads them back.
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path()).unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let day = 86_400;
        let within = |files: &CertFiles, days: i64| {
            let expires = expires_at(&files.cert).unwrap();
            assert!(
                (expires - (now + days * day)).abs() < day,
                "expires {expires}, expected about now + {days} days"
            );
        };
        within(&issue(dir.path(), Role::User, "alice", &[]).unwrap(), 365);
        within(
            &issue(dir.path(), Role::Agent, "node-1", &[]).unwrap(),
            1825,
        );
        within(
            &issue_for(dir.path(), Role::Admin, "ops", &[], 10).unwrap(),
            10,
        );
        assert!(expires_at(&dir.path().join("missing.pem")).is_err());
    }

    #[test]
    fn init_refuses_to_overwrite_a_ca() {
        // Proves a second init leaves the first CA, and so every certificate it signed, intact.
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path()).unwrap();
        let before = fs::read(dir.path().join(CA_CERT_FILE)).unwrap();
        let error = init_ca(dir.path()).unwrap_err();
        assert!(matches!(error, CertError::CaExists { .. }), "{error:?}");
        assert!(error.to_string().contains("refusing to overwrite"));
        assert_eq!(fs::read(dir.path().join(CA_CERT_FILE)).unwrap(), before);

        // Also when only the key is left over.
        let other = tempfile::tempdir().unwrap();
        fs::write(other.path().join(CA_KEY_FILE), b"old key").unwrap();
        assert!(matches!(
            init_ca(other.path()),
            Err(CertError::CaExists { .. })
        ));
    }

    #[test]
    fn issue_refuses_bad_names_reserved_names_and_overwrites() {
        // Proves names follow the name rule and that issuing never clobbers files.
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path()).unwrap();
        for bad in ["", "has space", "../escape", "dot.ted", &"a".repeat(129)] {
            let error = issue(dir.path(), Role::User, bad, &[]).unwrap_err();
            assert!(
                matches!(error, CertError::InvalidName(_)),
                "{bad}: {error:?}"
            );
        }
        // In any case: `CA.pem` is `ca.pem` on a filesystem that ignores case.
        for reserved in [RESERVED_NAME_CA, "CA", "Ca"] {
            assert!(matches!(
                issue(dir.path(), Role::Admin, reserved, &[]),
                Err(CertError::ReservedName(_))
            ));
        }
        assert!(matches!(
            issue(
                dir.path(),
                Role::Agent,
                "node-1",
                &["bad host!".to_string()]
            ),
            Err(CertError::InvalidSan { .. })
        ));
        issue(dir.path(), Role::Agent, "node-1", &[]).unwrap();
        assert!(matches!(
            issue(dir.path(), Role::Agent, "node-1", &[]),
            Err(CertError::AlreadyExists { .. })
        ));

        let empty = tempfile::tempdir().unwrap();
        let error = issue(empty.path(), Role::User, "alice", &[]).unwrap_err();
        assert!(matches!(error, CertError::CaMissing { .. }), "{error:?}");
        assert!(error.to_string().contains("quotient certs init"));
    }

    #[cfg(unix)]
    #[test]
    fn private_keys_are_readable_by_the_owner_only() {
        // Proves key files are created 0600, not with the umask's usual 0644.
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let ca = init_ca(dir.path()).unwrap();
        let leaf = issue(dir.path(), Role::User, "alice", &[]).unwrap();
        for key in [ca.key, leaf.key] {
            let mode = fs::metadata(&key).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, KEY_FILE_MODE, "{}", key.display());
        }
    }

    #[test]
    fn roles_parse_from_their_names() {
        // Proves the command-line spelling of every role round-trips.
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>().unwrap(), role);
        }
        assert!(matches!(
            "root".parse::<Role>(),
            Err(CertError::UnknownRole(_))
        ));
    }
}
