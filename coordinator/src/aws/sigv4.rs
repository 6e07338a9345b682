//! SigV4: who sent a request. The signature is recomputed with AWS's own signer (`aws-sigv4`)
//! over the headers the client says it signed, with the secret of its access key, and compared
//! with the one it sent; the scope (date, region, service) and the clock skew are checked
//! first. Nothing else in the request is trusted before this passes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use axum::http::{HeaderMap, Method, Uri};
use quotient_common::certs::{PeerIdentity, Role};
use quotient_core::aws::AccessKey;

use super::AwsError;

/// The service name a signature must be scoped to.
pub const SERVICE: &str = "batch";
/// How far a request's time may be from this coordinator's clock, either way: AWS's own
/// 15 minutes.
pub const SKEW_MAX: Duration = Duration::from_secs(15 * 60);
/// The error code of a request signed with a key this coordinator does not know.
pub const UNKNOWN_KEY: &str = "UnrecognizedClientException";
/// The longest `Authorization` header read.
const AUTHORIZATION_BYTES_MAX: usize = 4_096;

fn signature_error(message: impl Into<String>) -> AwsError {
    AwsError {
        status: 403,
        code: "InvalidSignatureException",
        message: message.into(),
    }
}

fn incomplete(message: impl Into<String>) -> AwsError {
    AwsError {
        status: 400,
        code: "IncompleteSignatureException",
        message: message.into(),
    }
}

/// The parts of an `Authorization: AWS4-HMAC-SHA256 ...` header.
#[derive(Debug, PartialEq, Eq)]
struct Authorization<'a> {
    key_id: &'a str,
    date: &'a str,
    region: &'a str,
    service: &'a str,
    signed_headers: Vec<&'a str>,
    signature: &'a str,
}

fn parse_authorization(header: &str) -> Result<Authorization<'_>, AwsError> {
    let Some(rest) = header.strip_prefix("AWS4-HMAC-SHA256 ") else {
        return Err(incomplete(
            "the Authorization header must be a SigV4 one (AWS4-HMAC-SHA256); sign requests \
             with an access key from `quotient access-key create`",
        ));
    };
    let (mut credential, mut signed, mut signature) = (None, None, None);
    for part in rest.split(',') {
        let part = part.trim();
        if let Some(value) = part.strip_prefix("Credential=") {
            credential = Some(value);
        } else if let Some(value) = part.strip_prefix("SignedHeaders=") {
            signed = Some(value);
        } else if let Some(value) = part.strip_prefix("Signature=") {
            signature = Some(value);
        }
    }
    let (Some(credential), Some(signed), Some(signature)) = (credential, signed, signature) else {
        return Err(incomplete(
            "the Authorization header needs Credential, SignedHeaders and Signature",
        ));
    };
    let scope: Vec<&str> = credential.split('/').collect();
    let [key_id, date, region, service, "aws4_request"] = scope[..] else {
        return Err(incomplete(format!(
            "the credential {credential:?} must read KEY/YYYYMMDD/REGION/SERVICE/aws4_request"
        )));
    };
    Ok(Authorization {
        key_id,
        date,
        region,
        service,
        signed_headers: signed.split(';').collect(),
        signature,
    })
}

/// `20261205T090000Z` as a time.
pub fn parse_amz_date(text: &str) -> Option<SystemTime> {
    let bytes = text.as_bytes();
    if bytes.len() != 16 || bytes[8] != b'T' || bytes[15] != b'Z' {
        return None;
    }
    let digits = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())
            .flatten()
    };
    let (year, month, day) = (digits(0..4)?, digits(4..6)?, digits(6..8)?);
    let (hour, minute, second) = (digits(9..11)?, digits(11..13)?, digits(13..15)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let seconds = quotient_common::duration::days_from_civil(year, month, day) * 86_400
        + hour * 3_600
        + minute * 60
        + second;
    u64::try_from(seconds)
        .ok()
        .map(|seconds| UNIX_EPOCH + Duration::from_secs(seconds))
}

/// The caller of a request, or why it is refused. `keys` finds an access key by id.
pub fn verify(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
    region: &str,
    now: SystemTime,
    keys: impl Fn(&str) -> Option<AccessKey>,
) -> Result<PeerIdentity, AwsError> {
    let Some(header) = headers.get("authorization") else {
        return Err(AwsError {
            status: 403,
            code: "MissingAuthenticationTokenException",
            message: "the request is not signed: sign it with SigV4 and an access key from \
                      `quotient access-key create`"
                .into(),
        });
    };
    if header.len() > AUTHORIZATION_BYTES_MAX {
        return Err(incomplete("the Authorization header is too long"));
    }
    let header = header
        .to_str()
        .map_err(|_| incomplete("the Authorization header is not text"))?;
    let auth = parse_authorization(header)?;
    let amz_date = headers
        .get("x-amz-date")
        .and_then(|value| value.to_str().ok())
        .ok_or_else(|| incomplete("the request has no X-Amz-Date header"))?;
    let signed_at = parse_amz_date(amz_date)
        .ok_or_else(|| incomplete(format!("X-Amz-Date {amz_date:?} is not YYYYMMDDTHHMMSSZ")))?;
    let skew = now
        .duration_since(signed_at)
        .or_else(|_| signed_at.duration_since(now))
        .unwrap_or_default();
    if skew > SKEW_MAX {
        return Err(signature_error(format!(
            "Signature expired: the request was signed at {amz_date}, more than 15 minutes from \
             this coordinator's clock; check the client's clock"
        )));
    }
    if !amz_date.starts_with(auth.date) {
        return Err(signature_error(format!(
            "the credential's date {} is not the day of X-Amz-Date {amz_date}",
            auth.date
        )));
    }
    if auth.region != region {
        return Err(signature_error(format!(
            "Credential should be scoped to a valid region, not '{}': this endpoint's region is \
             '{region}' (set AWS_DEFAULT_REGION or region_name)",
            auth.region
        )));
    }
    if auth.service != SERVICE {
        return Err(signature_error(format!(
            "Credential should be scoped to correct service: '{SERVICE}', not '{}'",
            auth.service
        )));
    }
    let Some(key) = keys(auth.key_id) else {
        return Err(AwsError {
            status: 403,
            code: UNKNOWN_KEY,
            message: format!(
                "The security token included in the request is invalid: no access key {} \
                 (ask an admin for one: quotient access-key create)",
                auth.key_id
            ),
        });
    };
    if !auth.signed_headers.contains(&"host") {
        return Err(signature_error("the signature must cover the host header"));
    }
    let mut signed_headers = Vec::with_capacity(auth.signed_headers.len());
    for name in &auth.signed_headers {
        let mut values = headers.get_all(*name).iter();
        let Some(first) = values.next() else {
            return Err(signature_error(format!(
                "the signed header {name} is not in the request"
            )));
        };
        let mut value = first
            .to_str()
            .map_err(|_| signature_error(format!("header {name} is not text")))?
            .to_string();
        for more in values {
            value.push(',');
            value.push_str(more.to_str().unwrap_or_default());
        }
        signed_headers.push((*name, value));
    }
    let path_and_query = uri.path_and_query().map_or("/", |pq| pq.as_str());
    let request = SignableRequest::new(
        method.as_str(),
        path_and_query,
        signed_headers
            .iter()
            .map(|(name, value)| (*name, value.as_str())),
        SignableBody::Bytes(body),
    )
    .map_err(|error| signature_error(format!("the request cannot be signed: {error}")))?;
    let identity = Credentials::new(auth.key_id, key.secret.clone(), None, None, "quotient").into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(SERVICE)
        .time(signed_at)
        .settings(SigningSettings::default())
        .build()
        .map_err(|error| AwsError::server(format!("cannot set up SigV4: {error}")))?
        .into();
    let expected = sign(request, &params)
        .map_err(|error| signature_error(format!("the request cannot be signed: {error}")))?
        .signature()
        .to_string();
    if !same(expected.as_bytes(), auth.signature.as_bytes()) {
        return Err(signature_error(
            "The request signature we calculated does not match the signature you provided. \
             Check your AWS Secret Access Key and signing method.",
        ));
    }
    Ok(PeerIdentity {
        role: if key.admin { Role::Admin } else { Role::User },
        name: key.user,
    })
}

/// Whether two signatures are equal, in time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";

    fn key() -> AccessKey {
        AccessKey {
            user: "alice".into(),
            admin: false,
            secret: SECRET.into(),
            created_ms: 0,
        }
    }

    /// A request signed with aws-sigv4 as a client would, at `at`.
    fn signed(secret: &str, region: &str, at: SystemTime, body: &[u8]) -> HeaderMap {
        let identity = Credentials::new("AKQTEXAMPLE", secret, None, None, "test").into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(region)
            .name(SERVICE)
            .time(at)
            .settings(SigningSettings::default())
            .build()
            .unwrap()
            .into();
        let headers = [
            ("host", "127.0.0.1:9443"),
            ("content-type", "application/json"),
        ];
        let request = SignableRequest::new(
            "POST",
            "https://127.0.0.1:9443/v1/listquotashares",
            headers.iter().copied(),
            SignableBody::Bytes(body),
        )
        .unwrap();
        let (instructions, _) = sign(request, &params).unwrap().into_parts();
        let mut request = axum::http::Request::builder()
            .method("POST")
            .uri("/v1/listquotashares")
            .body(())
            .unwrap();
        for (name, value) in headers {
            request
                .headers_mut()
                .insert(name, HeaderValue::from_static(value));
        }
        instructions.apply_to_request_http1x(&mut request);
        request.headers().clone()
    }

    fn check(headers: &HeaderMap, body: &[u8], now: SystemTime) -> Result<PeerIdentity, AwsError> {
        let uri: Uri = "/v1/listquotashares".parse().unwrap();
        verify(&Method::POST, &uri, headers, body, "us-east-1", now, |id| {
            (id == "AKQTEXAMPLE").then(key)
        })
    }

    #[test]
    fn a_good_signature_names_the_keys_user() {
        let now = SystemTime::now();
        let headers = signed(SECRET, "us-east-1", now, b"{}");
        let caller = check(&headers, b"{}", now).unwrap();
        assert_eq!(caller.name, "alice");
        assert_eq!(caller.role, Role::User);
    }

    #[test]
    fn a_wrong_secret_a_changed_body_an_old_date_and_another_region_are_refused() {
        let now = SystemTime::now();
        let wrong = signed("x".repeat(40).as_str(), "us-east-1", now, b"{}");
        assert_eq!(
            check(&wrong, b"{}", now).unwrap_err().code,
            "InvalidSignatureException"
        );
        let good = signed(SECRET, "us-east-1", now, b"{}");
        let changed = check(&good, b"{\"a\":1}", now).unwrap_err();
        assert_eq!(changed.code, "InvalidSignatureException");
        let later = now + Duration::from_secs(16 * 60);
        let expired = check(&good, b"{}", later).unwrap_err();
        assert!(
            expired.message.starts_with("Signature expired"),
            "{expired:?}"
        );
        let elsewhere = signed(SECRET, "eu-west-1", now, b"{}");
        assert!(check(&elsewhere, b"{}", now)
            .unwrap_err()
            .message
            .contains("region"));
    }

    #[test]
    fn an_unknown_key_and_a_missing_header_are_refused() {
        let now = SystemTime::now();
        let mut headers = signed(SECRET, "us-east-1", now, b"{}");
        let auth = headers["authorization"]
            .to_str()
            .unwrap()
            .replace("AKQTEXAMPLE", "AKQTOTHER");
        headers.insert("authorization", HeaderValue::from_str(&auth).unwrap());
        assert_eq!(
            check(&headers, b"{}", now).unwrap_err().code,
            "UnrecognizedClientException"
        );
        headers.remove("authorization");
        assert_eq!(
            check(&headers, b"{}", now).unwrap_err().code,
            "MissingAuthenticationTokenException"
        );
    }

    #[test]
    fn amz_dates_parse() {
        let at = parse_amz_date("19700102T000001Z").unwrap();
        assert_eq!(at, UNIX_EPOCH + Duration::from_secs(86_401));
        let at = parse_amz_date("20261205T090000Z").unwrap();
        assert_eq!(
            at.duration_since(UNIX_EPOCH).unwrap().as_secs(),
            1_796_461_200
        );
        assert!(parse_amz_date("2026-12-05T09:00:00Z").is_none());
        assert!(parse_amz_date("20261305T090000Z").is_none());
    }
}
