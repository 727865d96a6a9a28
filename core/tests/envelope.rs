//! The envelope contract: every acceptance and rejection rule, one test each, plus properties
//! tying the validator to Zod's patterns and proving that encoding round-trips.

use jobs_core::{
    DecodeLimits, Envelope, EnvelopeError, Field, JobId, NameError, Problem, UUID_PATTERN,
    UUIDV7_PATTERN, UuidError,
};
use proptest::prelude::*;
use serde_json::{Value, json};

const JOB: &str = "017f22e2-79b0-7cc3-98c4-dc0c0c07398f";
const TENANT: &str = "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90";
const CORRELATION: &str = "0192f0a4-8d7e-7c3b-a1f2-6e5d4c3b2a19";

fn valid() -> Value {
    json!({
        "job_id": JOB,
        "tenant_id": TENANT,
        "correlation_id": CORRELATION,
        "kind": "billing.invoice_issued",
        "data": {"invoice": 42},
    })
}

fn with(field: &str, value: Value) -> Vec<u8> {
    let mut envelope = valid();
    envelope[field] = value;
    serde_json::to_vec(&envelope).expect("a Value serialises")
}

fn without(field: &str) -> Vec<u8> {
    let mut envelope = valid();
    envelope.as_object_mut().expect("an object").remove(field);
    serde_json::to_vec(&envelope).expect("a Value serialises")
}

fn decode(bytes: &[u8]) -> Result<Envelope, EnvelopeError> {
    Envelope::decode(bytes)
}

/// The envelope is refused with exactly one issue, about `field`.
#[track_caller]
fn rejected(bytes: &[u8], field: Field) -> Problem {
    let err = decode(bytes).expect_err("must be rejected");
    assert_eq!(err.issues().len(), 1, "one issue expected: {err}");
    let issue = &err.issues()[0];
    assert_eq!(issue.field, field, "wrong field named: {err}");
    issue.problem.clone()
}

#[test]
fn a_valid_envelope_decodes() {
    let envelope = decode(&serde_json::to_vec(&valid()).expect("serialises")).expect("valid");
    assert_eq!(envelope.job_id.to_string(), JOB);
    assert_eq!(envelope.tenant_id.to_string(), TENANT);
    assert_eq!(envelope.correlation_id.to_string(), CORRELATION);
    assert_eq!(envelope.kind.as_str(), "billing.invoice_issued");
    assert_eq!(envelope.data, json!({"invoice": 42}));
}

#[test]
fn upper_case_uuids_are_accepted_and_printed_in_lower_case() {
    let bytes = with("job_id", json!(JOB.to_uppercase()));
    let envelope = decode(&bytes).expect("upper-case hex is accepted");
    assert_eq!(envelope.job_id.to_string(), JOB);
    let bytes = with("tenant_id", json!(TENANT.to_uppercase()));
    assert_eq!(
        decode(&bytes).expect("accepted").tenant_id.to_string(),
        TENANT
    );
}

#[test]
fn job_id_must_be_a_version_7() {
    let v4 = "a5b6c7d8-1234-4abc-8def-0123456789ab";
    assert_eq!(
        rejected(&with("job_id", json!(v4)), Field::JobId),
        Problem::Uuid(UuidError::WrongVersion {
            expected: "7",
            found: '4'
        })
    );
    for other in [
        "00000000-0000-0000-0000-000000000000",
        "ffffffff-ffff-ffff-ffff-ffffffffffff",
        "017f22e2-79b0-1cc3-98c4-dc0c0c07398f",
    ] {
        assert!(matches!(
            rejected(&with("job_id", json!(other)), Field::JobId),
            Problem::Uuid(UuidError::WrongVersion { .. })
        ));
    }
}

#[test]
fn job_id_must_carry_the_rfc_variant() {
    let ncs = "017f22e2-79b0-7cc3-58c4-dc0c0c07398f";
    let microsoft = "017f22e2-79b0-7cc3-c8c4-dc0c0c07398f";
    for id in [ncs, microsoft] {
        assert!(matches!(
            rejected(&with("job_id", json!(id)), Field::JobId),
            Problem::Uuid(UuidError::WrongVariant { .. })
        ));
    }
}

#[test]
fn job_id_must_be_the_plain_hyphenated_form() {
    for id in [
        "017f22e279b07cc398c4dc0c0c07398f",
        "{017f22e2-79b0-7cc3-98c4-dc0c0c07398f}",
        "urn:uuid:017f22e2-79b0-7cc3-98c4-dc0c0c07398f",
        " 017f22e2-79b0-7cc3-98c4-dc0c0c07398f",
        "017f22e2-79b0-7cc3-98c4-dc0c0c07398f ",
        "017f22e2-79b0-7cc3-98c4-dc0c0c07398f\n",
        "017f22e2-79b0-7cc3-98c4-dc0c0c07398g",
        "017f22e2-79b07-cc3-98c4-dc0c0c07398f",
        "",
    ] {
        assert_eq!(
            rejected(&with("job_id", json!(id)), Field::JobId),
            Problem::Uuid(UuidError::NotHyphenatedHex),
            "{id:?}"
        );
    }
}

#[test]
fn tenant_and_correlation_ids_accept_what_zod_uuid_accepts() {
    for id in [
        "00000000-0000-0000-0000-000000000000",
        "ffffffff-ffff-ffff-ffff-ffffffffffff",
        "6ba7b810-9dad-11d1-80b4-00c04fd430c8",
        "a5b6c7d8-1234-4abc-8def-0123456789ab",
        "A5B6C7D8-1234-4ABC-BDEF-0123456789AB",
        "a5b6c7d8-1234-8abc-9def-0123456789ab",
        JOB,
    ] {
        for field in ["tenant_id", "correlation_id"] {
            decode(&with(field, json!(id))).unwrap_or_else(|e| panic!("{field} {id}: {e}"));
        }
    }
}

#[test]
fn tenant_and_correlation_ids_reject_what_zod_uuid_rejects() {
    for (id, wrong_version) in [
        ("FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF", true),
        ("a5b6c7d8-1234-9abc-8def-0123456789ab", true),
        ("a5b6c7d8-1234-0abc-8def-0123456789ab", true),
        ("a5b6c7d8-1234-4abc-cdef-0123456789ab", false),
        ("a5b6c7d8-1234-4abc-7def-0123456789ab", false),
    ] {
        for (key, field) in [
            ("tenant_id", Field::TenantId),
            ("correlation_id", Field::CorrelationId),
        ] {
            let problem = rejected(&with(key, json!(id)), field);
            if wrong_version {
                assert!(
                    matches!(problem, Problem::Uuid(UuidError::WrongVersion { .. })),
                    "{id}"
                );
            } else {
                assert!(
                    matches!(problem, Problem::Uuid(UuidError::WrongVariant { .. })),
                    "{id}"
                );
            }
        }
    }
}

#[test]
fn kind_follows_the_naming_rules() {
    let longest = format!("a{}", "b".repeat(127));
    for kind in ["a", "billing.invoice_issued", "a1.b_2.c", longest.as_str()] {
        decode(&with("kind", json!(kind))).unwrap_or_else(|e| panic!("{kind}: {e}"));
    }
    let too_long = format!("a{}", "b".repeat(128));
    let cases: [(&str, NameError); 7] = [
        ("", NameError::Empty),
        (&too_long, NameError::TooLong { len: 129 }),
        (
            "Billing.invoice",
            NameError::BadChar {
                found: 'B',
                position: 1,
            },
        ),
        (
            "billing-invoice",
            NameError::BadChar {
                found: '-',
                position: 8,
            },
        ),
        (
            "billing..invoice",
            NameError::BadSegment {
                segment: 2,
                found: String::new(),
            },
        ),
        (
            "billing.1st",
            NameError::BadSegment {
                segment: 2,
                found: "1st".into(),
            },
        ),
        (
            "_billing",
            NameError::BadSegment {
                segment: 1,
                found: "_billing".into(),
            },
        ),
    ];
    for (kind, error) in cases {
        assert_eq!(
            rejected(&with("kind", json!(kind)), Field::Kind),
            Problem::Name(error),
            "{kind:?}"
        );
    }
    assert!(matches!(
        rejected(&with("kind", json!("billing.")), Field::Kind),
        Problem::Name(NameError::BadSegment { segment: 2, .. })
    ));
}

#[test]
fn data_must_be_present_but_may_be_null_or_anything() {
    assert_eq!(rejected(&without("data"), Field::Data), Problem::Missing);
    for data in [
        json!(null),
        json!(0),
        json!("x"),
        json!([1, [2]]),
        json!({"a": {"b": null}}),
    ] {
        let envelope = decode(&with("data", data.clone())).expect("any data is accepted");
        assert_eq!(envelope.data, data);
    }
}

#[test]
fn every_missing_field_is_named() {
    for (key, field) in [
        ("job_id", Field::JobId),
        ("tenant_id", Field::TenantId),
        ("correlation_id", Field::CorrelationId),
        ("kind", Field::Kind),
        ("data", Field::Data),
    ] {
        assert_eq!(rejected(&without(key), field), Problem::Missing, "{key}");
    }
}

#[test]
fn null_and_wrong_types_are_refused_for_the_string_fields() {
    for (key, field) in [
        ("job_id", Field::JobId),
        ("tenant_id", Field::TenantId),
        ("correlation_id", Field::CorrelationId),
        ("kind", Field::Kind),
    ] {
        for (value, found) in [
            (json!(null), "null"),
            (json!(7), "number"),
            (json!(true), "boolean"),
            (json!([JOB]), "array"),
            (json!({"id": JOB}), "object"),
        ] {
            assert_eq!(
                rejected(&with(key, value), field.clone()),
                Problem::WrongType {
                    expected: "string",
                    found
                }
            );
        }
    }
}

#[test]
fn unknown_top_level_fields_are_refused() {
    let problem = rejected(
        &with("priority", json!(1)),
        Field::Unknown("priority".into()),
    );
    assert_eq!(problem, Problem::UnknownField);
}

#[test]
fn duplicate_keys_are_refused_at_the_top_level_and_inside_data() {
    let top = format!(
        r#"{{"job_id":"{JOB}","tenant_id":"{TENANT}","correlation_id":"{CORRELATION}","kind":"a.b","kind":"a.c","data":null}}"#
    );
    assert_eq!(
        rejected(top.as_bytes(), Field::Kind),
        Problem::DuplicateKey {
            path: "kind".into()
        }
    );
    let nested = format!(
        r#"{{"job_id":"{JOB}","tenant_id":"{TENANT}","correlation_id":"{CORRELATION}","kind":"a","data":{{"items":[{{"sku":1}},{{"sku":2,"sku":3}}]}}}}"#
    );
    assert_eq!(
        rejected(nested.as_bytes(), Field::Data),
        Problem::DuplicateKey {
            path: "data.items[1].sku".into()
        }
    );
}

#[test]
fn oversized_payloads_are_refused_before_parsing() {
    let limits = DecodeLimits::default().max_bytes(64);
    let garbage = vec![b'{'; 65];
    let err = Envelope::decode_with(&garbage, &limits).expect_err("too large");
    assert_eq!(
        err.issues()[0].problem,
        Problem::TooLarge {
            size: 65,
            limit: 64
        }
    );
    let big = with(
        "data",
        json!("x".repeat(jobs_core::DEFAULT_MAX_ENVELOPE_BYTES)),
    );
    assert!(matches!(
        rejected(&big, Field::Envelope),
        Problem::TooLarge { .. }
    ));
}

#[test]
fn non_objects_and_broken_json_are_refused() {
    assert_eq!(
        rejected(b"[1,2]", Field::Envelope),
        Problem::NotAnObject { found: "array" }
    );
    assert_eq!(
        rejected(b"null", Field::Envelope),
        Problem::NotAnObject { found: "null" }
    );
    for broken in [
        &b""[..],
        b"{",
        b"{\"job_id\":}",
        b"\xff\xfe",
        b"{} {}",
        b"{}x",
    ] {
        assert!(
            matches!(rejected(broken, Field::Envelope), Problem::Syntax(_)),
            "{broken:?}"
        );
    }
}

#[test]
fn all_problems_are_reported_at_once() {
    let bytes =
        serde_json::to_vec(&json!({"job_id": "nope", "kind": "Bad", "x": 1})).expect("serialises");
    let err = decode(&bytes).expect_err("invalid");
    for field in [
        Field::JobId,
        Field::TenantId,
        Field::CorrelationId,
        Field::Kind,
        Field::Data,
        Field::Unknown("x".into()),
    ] {
        assert!(err.names(&field), "{field} not named in: {err}");
    }
    let message = err.to_string();
    assert!(
        message.contains("`job_id`") && message.contains("`tenant_id` is missing"),
        "{message}"
    );
}

#[test]
fn typed_data_failures_name_the_kind() {
    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Invoice {
        invoice: u64,
        currency: String,
    }
    let envelope = decode(&serde_json::to_vec(&valid()).expect("serialises")).expect("valid");
    let err = envelope
        .into_typed::<Invoice>()
        .expect_err("currency is missing");
    assert!(err.to_string().contains("currency"), "{err}");
    assert!(err.to_string().contains("billing.invoice_issued"), "{err}");
}

#[test]
fn typed_data_failures_name_the_path_and_the_expected_type_never_the_value() {
    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Line {
        sku: u64,
    }
    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    enum Currency {
        Eur,
    }
    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Order {
        lines: Vec<Line>,
        currency: Option<Currency>,
    }
    let with_data = |data: Value| {
        let mut envelope = valid();
        envelope["data"] = data;
        decode(&serde_json::to_vec(&envelope).expect("serialises"))
            .expect("valid")
            .into_typed::<Order>()
            .expect_err("does not fit")
    };
    for (data, path, expected) in [
        (
            json!({"lines": [{"sku": 1}, {"sku": "<script>\"x`y"}]}),
            "data.lines[1].sku",
            "invalid type: string, expected u64",
        ),
        (
            json!({"lines": [{"sku": -4_242}]}),
            "data.lines[0].sku",
            "invalid value: integer, expected u64",
        ),
        (
            json!({"lines": [], "currency": "Secret_Tag"}),
            "data.currency",
            "unknown variant, expected `Eur`",
        ),
        (
            json!({"lines": true}),
            "data.lines",
            "invalid type: boolean, expected a sequence",
        ),
    ] {
        let err = with_data(data.clone());
        let message = err.to_string();
        assert!(message.contains(&format!("at `{path}`")), "{message}");
        assert!(message.contains(expected), "{message}");
        for value in ["script", "4242", "Secret_Tag", "true"] {
            assert!(!message.contains(value), "{value} leaked: {message}");
        }
        assert!(
            err.with_values().contains(&format!("at `{path}`")),
            "{}",
            err.with_values()
        );
    }
    let missing = with_data(json!({}));
    assert!(
        missing
            .to_string()
            .contains("missing field `lines` at `data`"),
        "{missing}"
    );
    assert!(
        with_data(json!({"lines": [{"sku": "<b>"}]}))
            .with_values()
            .contains("<b>"),
        "the debugging form keeps the value"
    );
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        (-1e12f64..1e12).prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Any string `z.uuid()` accepts, in either case.
fn zod_uuid() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}",
        1 => Just("00000000-0000-0000-0000-000000000000".to_owned()),
        1 => Just("ffffffff-ffff-ffff-ffff-ffffffffffff".to_owned()),
    ]
}

/// Strings near the UUID shape: mostly hex and hyphens, with the odd stray character.
fn uuid_like() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
        "[0-9a-fA-F\\-]{30,40}",
        "[0-9a-gA-G\\- {}:]{34,38}",
        zod_uuid(),
    ]
}

proptest! {
    #[test]
    fn encoding_then_decoding_is_the_identity(
        ms in 0u64..(1 << 48),
        random in any::<u128>(),
        tenant in zod_uuid(),
        correlation in zod_uuid(),
        kind in "[a-z][a-z0-9_]{0,20}(\\.[a-z][a-z0-9_]{0,20}){0,4}",
        data in json_value(),
    ) {
        let envelope = Envelope {
            job_id: JobId::from_parts(ms, random),
            tenant_id: tenant.parse().expect("a z.uuid() string"),
            correlation_id: correlation.parse().expect("a z.uuid() string"),
            kind: kind.parse().expect("matches the grammar"),
            data,
        };
        let bytes = envelope.to_json_bytes().expect("serialises");
        prop_assert_eq!(Envelope::decode(&bytes).expect("round-trips"), envelope);
    }

    #[test]
    fn id_validators_agree_with_zods_patterns(s in uuid_like()) {
        let v7 = regex::Regex::new(UUIDV7_PATTERN).expect("valid regex");
        let any = regex::Regex::new(UUID_PATTERN).expect("valid regex");
        prop_assert_eq!(s.parse::<JobId>().is_ok(), v7.is_match(&s), "job_id {:?}", s);
        prop_assert_eq!(
            s.parse::<jobs_core::TenantId>().is_ok(),
            any.is_match(&s),
            "tenant_id {:?}",
            s
        );
    }

    #[test]
    fn an_accepted_id_is_the_uuid_its_text_spells(s in uuid_like()) {
        if let Ok(id) = s.parse::<jobs_core::TenantId>() {
            prop_assert_eq!(Some(id.as_uuid()), uuid::Uuid::try_parse(&s).ok(), "{}", s);
        }
        if let Ok(id) = s.parse::<JobId>() {
            prop_assert_eq!(Some(id.as_uuid()), uuid::Uuid::try_parse(&s).ok(), "{}", s);
        }
    }

    #[test]
    fn kind_validator_agrees_with_the_schema(s in "[a-z0-9_.A-Z\\-]{0,130}|[a-z][a-z_.]{100,140}") {
        let pattern = regex::Regex::new(jobs_core::NAME_PATTERN).expect("valid regex");
        let expected = pattern.is_match(&s) && s.chars().count() <= jobs_core::MAX_NAME_LEN;
        prop_assert_eq!(s.parse::<jobs_core::Kind>().is_ok(), expected, "{:?}", s);
    }
}

#[test]
fn a_publish_is_held_to_the_limit_a_consumer_decodes_with() {
    let queue: jobs_core::QueueName = "billing".parse().expect("a valid name");
    let envelope = decode(&serde_json::to_vec(&valid()).expect("a Value serialises"))
        .expect("the valid envelope decodes");
    let size = envelope.to_json_bytes().expect("it encodes").len();

    let at_the_limit = DecodeLimits::default().max_bytes(size);
    let bytes = envelope
        .encode_for(&queue, &at_the_limit)
        .expect("an envelope exactly at the limit is published");
    assert_eq!(
        Envelope::decode_with(&bytes, &at_the_limit).expect("and decodes"),
        envelope
    );

    let under = DecodeLimits::default().max_bytes(size - 1);
    match envelope.encode_for(&queue, &under) {
        Err(jobs_core::QueueError::TooLarge {
            queue: named,
            size: said,
            limit,
        }) => {
            assert_eq!((named, said, limit), (queue.clone(), size, size - 1));
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    let error = envelope.encode_for(&queue, &under).expect_err("refused");
    assert_eq!(error.class(), jobs_core::ErrorClass::Permanent);
    assert!(error.to_string().contains(&size.to_string()), "{error}");
    assert_eq!(under.max_envelope_bytes(), size - 1);
}
