//! Signature verification: the cases of issue 9, against known-answer vectors computed with an
//! independent JWT implementation.
//!
//! The vectors were computed with PyJWT 2.15.1 (`jwt.encode(claims, key, algorithm="HS256")`)
//! and Python's `hashlib.sha256` + `base64.urlsafe_b64encode` for the `body` claim, with the
//! published local-development signing keys, `sub` = `https://example.com/api/qstash`,
//! `iat` = `nbf` = 1700000000, `exp` = 1700000300, `jti` = `jwt_kat`, and the body
//! `{"hello":"world"}` (`EMPTY_BODY`: the empty body). `UNPADDED_CURRENT` has the `body` claim
//! without its `=`; `OTHER_KEY` is signed with `sig_someoneElsesKey000000000000`;
//! `WRONG_ISS` has `iss` = `NotUpstash`; `HS512` is signed with HS512.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jobs_adapter_qstash::{KeyUsed, SignatureError, SigningKeys, body_hash, verify_signature};

const BODY_HASH_PADDED: &str = "k6I5cakU5erL8KjSUVTNownDwccvu5kU1Hxg88toFYg=";
const PADDED_CURRENT: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJpc3MiOiJVcHN0YXNoIiwic3ViIjoiaHR0cHM6Ly9leGFtcGxlLmNvbS9hcGkvcXN0YXNoIiwiZXhwIjoxNzAwMDAwMzAwLCJuYmYiOjE3MDAwMDAwMDAsImlhdCI6MTcwMDAwMDAwMCwianRpIjoiand0X2thdCIsImJvZHkiOiJrNkk1Y2FrVTVlckw4S2pTVVZUTm93bkR3Y2N2dTVrVTFIeGc4OHRvRllnPSJ9.PyHUNeAYGeN8_QgZJwkKS9o9OHfyG4flmyx06Cw6fbM";
const UNPADDED_CURRENT: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJpc3MiOiJVcHN0YXNoIiwic3ViIjoiaHR0cHM6Ly9leGFtcGxlLmNvbS9hcGkvcXN0YXNoIiwiZXhwIjoxNzAwMDAwMzAwLCJuYmYiOjE3MDAwMDAwMDAsImlhdCI6MTcwMDAwMDAwMCwianRpIjoiand0X2thdCIsImJvZHkiOiJrNkk1Y2FrVTVlckw4S2pTVVZUTm93bkR3Y2N2dTVrVTFIeGc4OHRvRllnIn0.JJx-h2F9twJMyeWQkaw44AY84gG4PsTfWcVXrMYZMpo";
const PADDED_NEXT: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJpc3MiOiJVcHN0YXNoIiwic3ViIjoiaHR0cHM6Ly9leGFtcGxlLmNvbS9hcGkvcXN0YXNoIiwiZXhwIjoxNzAwMDAwMzAwLCJuYmYiOjE3MDAwMDAwMDAsImlhdCI6MTcwMDAwMDAwMCwianRpIjoiand0X2thdCIsImJvZHkiOiJrNkk1Y2FrVTVlckw4S2pTVVZUTm93bkR3Y2N2dTVrVTFIeGc4OHRvRllnPSJ9.ZhrK3VBAxOZy3Sb-SK3m_sHLR4N9tnREQk7czH_dTXY";
const OTHER_KEY: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJpc3MiOiJVcHN0YXNoIiwic3ViIjoiaHR0cHM6Ly9leGFtcGxlLmNvbS9hcGkvcXN0YXNoIiwiZXhwIjoxNzAwMDAwMzAwLCJuYmYiOjE3MDAwMDAwMDAsImlhdCI6MTcwMDAwMDAwMCwianRpIjoiand0X2thdCIsImJvZHkiOiJrNkk1Y2FrVTVlckw4S2pTVVZUTm93bkR3Y2N2dTVrVTFIeGc4OHRvRllnPSJ9.TiFYoJdmnHlyzFQSyemmwwHEZkgwr6VXYYXa_FA6Awg";
const WRONG_ISS: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJpc3MiOiJOb3RVcHN0YXNoIiwic3ViIjoiaHR0cHM6Ly9leGFtcGxlLmNvbS9hcGkvcXN0YXNoIiwiZXhwIjoxNzAwMDAwMzAwLCJuYmYiOjE3MDAwMDAwMDAsImlhdCI6MTcwMDAwMDAwMCwianRpIjoiand0X2thdCIsImJvZHkiOiJrNkk1Y2FrVTVlckw4S2pTVVZUTm93bkR3Y2N2dTVrVTFIeGc4OHRvRllnPSJ9.nX5GNFZB0_mdSfydXfnHR_ocBLNY6WNSfq-acL4mFsE";
const EMPTY_BODY: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJpc3MiOiJVcHN0YXNoIiwic3ViIjoiaHR0cHM6Ly9leGFtcGxlLmNvbS9hcGkvcXN0YXNoIiwiZXhwIjoxNzAwMDAwMzAwLCJuYmYiOjE3MDAwMDAwMDAsImlhdCI6MTcwMDAwMDAwMCwianRpIjoiand0X2thdCIsImJvZHkiOiI0N0RFUXBqOEhCU2EtX1RJbVctNUpDZXVRZVJrbTVOTXBKV1pHM2hTdUZVPSJ9.KUHDFhrgzn6VenMpZ0IVMOKv_tyN9AnlUurTV3uHdu0";
const HS512: &str = "eyJhbGciOiJIUzUxMiIsInR5cCI6IkpXVCJ9.eyJpc3MiOiJVcHN0YXNoIiwic3ViIjoiaHR0cHM6Ly9leGFtcGxlLmNvbS9hcGkvcXN0YXNoIiwiZXhwIjoxNzAwMDAwMzAwLCJuYmYiOjE3MDAwMDAwMDAsImlhdCI6MTcwMDAwMDAwMCwianRpIjoiand0X2thdCIsImJvZHkiOiJrNkk1Y2FrVTVlckw4S2pTVVZUTm93bkR3Y2N2dTVrVTFIeGc4OHRvRllnPSJ9.qRt0xJ1ksiBNkVCtKiEqXoZmhf1kYmSgrKh-0BHbq86LqcDMCgE6J1p8NqvGSFvYeAA706Bjt_3GGEwmTwsvnw";

const CURRENT_KEY: &str = "sig_7kYjw48mhY7kAjqNGcy6cr29RJ6r";
const NEXT_KEY: &str = "sig_5ZB6DVzB1wjE8S6rZ7eenA8Pdnhs";
const URL: &str = "https://example.com/api/qstash";
const BODY: &[u8] = br#"{"hello":"world"}"#;
const IAT: u64 = 1_700_000_000;
const EXP: u64 = 1_700_000_300;

fn keys() -> SigningKeys {
    SigningKeys::new(CURRENT_KEY, NEXT_KEY)
}

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn verify(jwt: &str, body: &[u8], when: u64) -> Result<KeyUsed, SignatureError> {
    verify_signature(jwt, Some(URL), body, at(when), &keys(), Duration::ZERO).map(|v| v.key)
}

#[test]
fn body_hash_matches_the_independent_computation() {
    assert_eq!(body_hash(BODY), BODY_HASH_PADDED);
}

#[test]
fn a_valid_signature_is_accepted_with_its_claims() {
    let verified = verify_signature(
        PADDED_CURRENT,
        Some(URL),
        BODY,
        at(IAT + 10),
        &keys(),
        Duration::ZERO,
    )
    .expect("valid");
    assert_eq!(verified.key, KeyUsed::Current);
    assert_eq!(verified.claims.sub, URL);
    assert_eq!(verified.claims.iss, "Upstash");
    assert_eq!(verified.claims.exp, EXP);
    assert_eq!(verified.claims.jti, "jwt_kat");
    assert_eq!(verify(EMPTY_BODY, b"", IAT), Ok(KeyUsed::Current));
}

#[test]
fn padded_and_unpadded_body_hashes_are_both_accepted() {
    assert_eq!(verify(PADDED_CURRENT, BODY, IAT + 1), Ok(KeyUsed::Current));
    assert_eq!(
        verify(UNPADDED_CURRENT, BODY, IAT + 1),
        Ok(KeyUsed::Current)
    );
}

#[test]
fn a_tampered_body_is_refused() {
    assert_eq!(
        verify(PADDED_CURRENT, br#"{"hello":"World"}"#, IAT + 1),
        Err(SignatureError::BodyMismatch)
    );
    assert_eq!(
        verify(EMPTY_BODY, b" ", IAT + 1),
        Err(SignatureError::BodyMismatch)
    );
}

#[test]
fn tampered_claims_are_refused() {
    let parts: Vec<&str> = PADDED_CURRENT.split('.').collect();
    let claims = URL_SAFE_NO_PAD.decode(parts[1]).unwrap();
    let forged = String::from_utf8(claims)
        .unwrap()
        .replace("1700000300", "1900000300");
    let forged = format!(
        "{}.{}.{}",
        parts[0],
        URL_SAFE_NO_PAD.encode(forged),
        parts[2]
    );
    assert_eq!(
        verify(&forged, BODY, IAT + 1),
        Err(SignatureError::BadSignature)
    );
    let mut sig = parts[2].to_owned();
    let last = sig.pop().unwrap();
    sig.push(if last == 'A' { 'B' } else { 'A' });
    let flipped = format!("{}.{}.{sig}", parts[0], parts[1]);
    assert!(verify(&flipped, BODY, IAT + 1).is_err());
}

#[test]
fn a_wrong_key_is_refused() {
    assert_eq!(
        verify(OTHER_KEY, BODY, IAT + 1),
        Err(SignatureError::BadSignature)
    );
    let only_others = SigningKeys::new("sig_a", "sig_b");
    assert_eq!(
        verify_signature(
            PADDED_CURRENT,
            Some(URL),
            BODY,
            at(IAT),
            &only_others,
            Duration::ZERO
        )
        .map(|v| v.key),
        Err(SignatureError::BadSignature)
    );
}

#[test]
fn the_next_key_verifies_after_a_rotation() {
    assert_eq!(verify(PADDED_NEXT, BODY, IAT + 1), Ok(KeyUsed::Next));
    // Without the next key configured, the rotated signature is refused.
    let current_only = SigningKeys::new(CURRENT_KEY, "sig_unrelated");
    assert_eq!(
        verify_signature(
            PADDED_NEXT,
            Some(URL),
            BODY,
            at(IAT),
            &current_only,
            Duration::ZERO
        )
        .map(|v| v.key),
        Err(SignatureError::BadSignature)
    );
}

#[test]
fn expiry_is_checked_with_the_tolerance() {
    assert!(verify(PADDED_CURRENT, BODY, EXP - 1).is_ok());
    assert_eq!(
        verify(PADDED_CURRENT, BODY, EXP),
        Err(SignatureError::Expired { exp: EXP, at: EXP })
    );
    let tolerant = |when| {
        verify_signature(
            PADDED_CURRENT,
            Some(URL),
            BODY,
            at(when),
            &keys(),
            Duration::from_secs(5),
        )
        .map(|v| v.key)
    };
    assert!(tolerant(EXP + 4).is_ok());
    assert!(matches!(
        tolerant(EXP + 5),
        Err(SignatureError::Expired { .. })
    ));
}

#[test]
fn not_before_is_checked_with_the_tolerance() {
    assert_eq!(
        verify(PADDED_CURRENT, BODY, IAT - 1),
        Err(SignatureError::NotYetValid {
            nbf: IAT,
            at: IAT - 1
        })
    );
    let tolerant = |when| {
        verify_signature(
            PADDED_CURRENT,
            Some(URL),
            BODY,
            at(when),
            &keys(),
            Duration::from_secs(5),
        )
        .map(|v| v.key)
    };
    assert!(tolerant(IAT - 5).is_ok());
    assert!(matches!(
        tolerant(IAT - 6),
        Err(SignatureError::NotYetValid { .. })
    ));
}

#[test]
fn a_wrong_subject_is_refused_and_no_url_skips_the_check() {
    let other = "https://example.com/api/other";
    assert_eq!(
        verify_signature(
            PADDED_CURRENT,
            Some(other),
            BODY,
            at(IAT),
            &keys(),
            Duration::ZERO
        )
        .map(|v| v.key),
        Err(SignatureError::Subject {
            expected: other.to_owned(),
            got: URL.to_owned()
        })
    );
    assert!(verify_signature(PADDED_CURRENT, None, BODY, at(IAT), &keys(), Duration::ZERO).is_ok());
}

#[test]
fn a_wrong_issuer_or_algorithm_is_refused() {
    assert_eq!(
        verify(WRONG_ISS, BODY, IAT + 1),
        Err(SignatureError::Issuer("NotUpstash".into()))
    );
    assert_eq!(
        verify(HS512, BODY, IAT + 1),
        Err(SignatureError::Algorithm("HS512".into()))
    );
}

#[test]
fn malformed_tokens_are_refused() {
    for jwt in ["", "abc", "a.b", "a.b.c.d", "!!.??.**"] {
        assert!(
            matches!(verify(jwt, BODY, IAT), Err(SignatureError::Malformed(_))),
            "{jwt:?}"
        );
    }
}
