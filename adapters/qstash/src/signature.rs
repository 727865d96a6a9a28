//! `Upstash-Signature`: the JWT HS256 QStash signs every delivery with.
//!
//! The HMAC key is the UTF-8 bytes of the whole signing-key string (`sig_…`). A signature is
//! valid when its HMAC matches the current key or, after a rotation, the next key, and its
//! claims hold: `iss` is `Upstash`, `sub` is the URL we expect, `exp` is not past and `nbf`
//! not ahead (each with a clock tolerance), and `body` is the base64url SHA-256 of the raw
//! body, compared with its `=` padding stripped on both sides as QStash's SDK does.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::{URL_SAFE, URL_SAFE_NO_PAD};
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use thiserror::Error;

/// The issuer QStash puts in every signature.
pub const ISSUER: &str = "Upstash";

/// The clock tolerance of the receiver by default: how far our clock may be behind or ahead of
/// QStash's for `exp` and `nbf`.
pub const DEFAULT_CLOCK_TOLERANCE: Duration = Duration::from_secs(5);

/// The current and next signing keys of a QStash account.
///
/// Secrets: `Debug` prints `<redacted>`.
#[derive(Clone)]
pub struct SigningKeys {
    current: String,
    next: String,
}

impl SigningKeys {
    /// The keys as QStash shows them (`QSTASH_CURRENT_SIGNING_KEY`, `QSTASH_NEXT_SIGNING_KEY`).
    pub fn new(current: impl Into<String>, next: impl Into<String>) -> Self {
        SigningKeys {
            current: current.into(),
            next: next.into(),
        }
    }
}

impl fmt::Debug for SigningKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKeys")
            .field("current", &"<redacted>")
            .field("next", &"<redacted>")
            .finish()
    }
}

/// Which key verified a signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyUsed {
    /// The current signing key.
    Current,
    /// The next signing key (QStash has rotated).
    Next,
}

/// The claims of a valid signature.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct Claims {
    /// Always `Upstash`.
    pub iss: String,
    /// The destination URL QStash called.
    pub sub: String,
    /// Expiry, unix seconds.
    pub exp: u64,
    /// Not before, unix seconds.
    pub nbf: u64,
    /// Issued at, unix seconds.
    #[serde(default)]
    pub iat: u64,
    /// The token's id.
    #[serde(default)]
    pub jti: String,
    /// base64url(SHA-256(body)), padded or not.
    pub body: String,
}

/// A valid signature: its claims and the key that verified it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Verified {
    /// The claims.
    pub claims: Claims,
    /// The key whose HMAC matched.
    pub key: KeyUsed,
}

/// Why a signature was refused. The texts are meant for operators; none repeats a key.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum SignatureError {
    /// The request has no `Upstash-Signature` header.
    #[error("missing Upstash-Signature header")]
    Missing,
    /// Not three base64url parts, or a header or claims that are not the expected JSON.
    #[error("malformed signature: {0}")]
    Malformed(String),
    /// The JWT header names another algorithm than HS256.
    #[error("unsupported algorithm `{0}` (QStash signs with HS256)")]
    Algorithm(String),
    /// The HMAC matches neither the current nor the next signing key.
    #[error("the signature matches neither the current nor the next signing key")]
    BadSignature,
    /// `iss` is not `Upstash`.
    #[error("issuer is `{0}`, expected `Upstash`")]
    Issuer(String),
    /// `sub` is not the URL the receiver serves.
    #[error("subject is `{got}`, expected `{expected}`")]
    Subject {
        /// The URL expected.
        expected: String,
        /// The URL signed.
        got: String,
    },
    /// `exp` is past (beyond the tolerance).
    #[error("expired at {exp} (unix seconds), checked at {at}")]
    Expired {
        /// The claim.
        exp: u64,
        /// When it was checked.
        at: u64,
    },
    /// `nbf` is ahead (beyond the tolerance).
    #[error("not valid before {nbf} (unix seconds), checked at {at}")]
    NotYetValid {
        /// The claim.
        nbf: u64,
        /// When it was checked.
        at: u64,
    },
    /// The body's hash differs from the `body` claim: the body was altered.
    #[error("the body does not match the signed hash")]
    BodyMismatch,
}

#[derive(Deserialize)]
struct JwtHeader {
    alg: String,
}

/// Verifies `jwt` for a delivery of `body` to `url` at time `at`.
///
/// `url` is compared with `sub` exactly; `None` skips that check (as QStash's SDK when no URL
/// is given). `tolerance` widens `exp` and `nbf`. The body is only hashed, never parsed.
///
/// ```
/// use jobs_adapter_qstash::{SignatureError, SigningKeys, verify_signature};
/// use std::time::{Duration, SystemTime};
///
/// let keys = SigningKeys::new("sig_current", "sig_next");
/// let refused = verify_signature("not.a.jwt", None, b"{}", SystemTime::now(), &keys, Duration::ZERO);
/// assert!(matches!(refused, Err(SignatureError::Malformed(_))));
/// ```
pub fn verify_signature(
    jwt: &str,
    url: Option<&str>,
    body: &[u8],
    at: SystemTime,
    keys: &SigningKeys,
    tolerance: Duration,
) -> Result<Verified, SignatureError> {
    let jwt = jwt.trim();
    let mut parts = jwt.split('.');
    let (Some(header), Some(claims), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(SignatureError::Malformed(
            "a JWT has three dot-separated parts".into(),
        ));
    };
    let header: JwtHeader = decode_json(header, "header")?;
    if header.alg != "HS256" {
        return Err(SignatureError::Algorithm(header.alg));
    }
    let signature = URL_SAFE_NO_PAD
        .decode(signature.trim_end_matches('='))
        .map_err(|e| SignatureError::Malformed(format!("signature is not base64url: {e}")))?;
    let signing_input = jwt.rsplit_once('.').map_or("", |(input, _)| input);
    let key = if hmac_matches(&keys.current, signing_input, &signature) {
        KeyUsed::Current
    } else if hmac_matches(&keys.next, signing_input, &signature) {
        KeyUsed::Next
    } else {
        return Err(SignatureError::BadSignature);
    };
    let claims: Claims = decode_json(claims, "claims")?;
    if claims.iss != ISSUER {
        return Err(SignatureError::Issuer(claims.iss));
    }
    if let Some(expected) = url
        && claims.sub != expected
    {
        return Err(SignatureError::Subject {
            expected: expected.to_owned(),
            got: claims.sub,
        });
    }
    let now = at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let tol = tolerance.as_secs();
    // As `jose`, which QStash's SDK uses: expired when exp <= now - tolerance.
    if claims.exp.saturating_add(tol) <= now {
        return Err(SignatureError::Expired {
            exp: claims.exp,
            at: now,
        });
    }
    if claims.nbf > now.saturating_add(tol) {
        return Err(SignatureError::NotYetValid {
            nbf: claims.nbf,
            at: now,
        });
    }
    if claims.body.trim_end_matches('=') != body_hash(body).trim_end_matches('=') {
        return Err(SignatureError::BodyMismatch);
    }
    Ok(Verified { claims, key })
}

/// base64url(SHA-256(`body`)), padded, as the `body` claim.
pub fn body_hash(body: &[u8]) -> String {
    URL_SAFE.encode(Sha256::digest(body))
}

fn hmac_matches(key: &str, signing_input: &str, signature: &[u8]) -> bool {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key.as_bytes()) else {
        return false;
    };
    mac.update(signing_input.as_bytes());
    // Constant-time comparison.
    mac.verify_slice(signature).is_ok()
}

fn decode_json<T: serde::de::DeserializeOwned>(
    part: &str,
    what: &str,
) -> Result<T, SignatureError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .map_err(|e| SignatureError::Malformed(format!("{what} is not base64url: {e}")))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| SignatureError::Malformed(format!("{what} is not the expected JSON: {e}")))
}

/// Signs like QStash, for this crate's tests only.
#[cfg(test)]
pub(crate) fn sign_for_tests(key: &str, claims: &serde_json::Value) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let claims = URL_SAFE_NO_PAD.encode(claims.to_string());
    let input = format!("{header}.{claims}");
    let mut mac = Hmac::<Sha256>::new_from_slice(key.as_bytes()).expect("any key length");
    mac.update(input.as_bytes());
    format!(
        "{input}.{}",
        URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const CURRENT: &str = "sig_7kYjw48mhY7kAjqNGcy6cr29RJ6r";
    const NEXT: &str = "sig_5ZB6DVzB1wjE8S6rZ7eenA8Pdnhs";
    const URL: &str = "https://example.com/qstash/jobs";

    fn keys() -> SigningKeys {
        SigningKeys::new(CURRENT, NEXT)
    }

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(
            std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(64)
        ))]

        /// Any body verifies with its own signature, padded or not, and fails once one byte changes.
        #[test]
        fn random_bodies_verify_and_tampering_is_caught(
            body in prop::collection::vec(any::<u8>(), 0..512),
            flip in any::<prop::sample::Index>(),
            pad in any::<bool>(),
        ) {
            let hash = if pad { body_hash(&body) } else { body_hash(&body).trim_end_matches('=').to_owned() };
            let jwt = sign_for_tests(CURRENT, &json!({
                "iss": "Upstash", "sub": URL, "exp": 1_000_300u64, "nbf": 1_000_000u64,
                "iat": 1_000_000u64, "jti": "jwt_x", "body": hash,
            }));
            let ok = verify_signature(&jwt, Some(URL), &body, at(1_000_100), &keys(), Duration::ZERO);
            prop_assert!(ok.is_ok(), "{ok:?}");
            let mut tampered = body;
            if tampered.is_empty() {
                tampered.push(0);
            } else {
                let i = flip.index(tampered.len());
                tampered[i] ^= 0x01;
            }
            prop_assert_eq!(
                verify_signature(&jwt, Some(URL), &tampered, at(1_000_100), &keys(), Duration::ZERO),
                Err(SignatureError::BodyMismatch)
            );
        }
    }
}
