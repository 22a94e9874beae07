//! The library API end to end without a model: empty requests, 413 limits, the `render` view.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use onepass_decide::pyjson::dumps_compact;
use onepass_decide::{assemble, check_size, parse_request, plan, ApiError, DecideConfig, Limits};
use onepass_tokenizer::Tokenizer;
use std::path::PathBuf;

fn tok() -> Tokenizer {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/qwen3_5-tokenizer");
    Tokenizer::from_dir(&dir, None).expect("run tools/setup-testdata.sh")
}

#[test]
fn empty_questions_answer_without_model() {
    // decider-contract R1.9.2
    let req = parse_request(br#"{"state": "s", "questions": {}}"#).unwrap();
    let p = plan(&req, &tok(), &DecideConfig::default()).unwrap();
    assert_eq!(p.slot_count(), 0);
    let resp = assemble(&p, &[], &DecideConfig::default().model_name).unwrap();
    assert_eq!(
        dumps_compact(&resp).unwrap(),
        r#"{"model":"decider-dev","answers":{},"usage":{"input_tokens":0,"output_tokens":0}}"#
    );
}

#[test]
fn limits_are_413_in_reference_order() {
    let req = parse_request(
        br#"{"state": "s", "questions": {"a": {"instructions": "i", "criteria": ["x", "y"]}, "b": {"type": "noul", "instructions": "j"}}}"#,
    )
    .unwrap();
    let p = plan(&req, &tok(), &DecideConfig::default()).unwrap();
    assert!(check_size(&p, &Limits::default()).is_ok());
    // The refusal under the default limits but one.
    let refused = |edit: fn(&mut Limits, usize), n: usize| {
        let mut limits = Limits::default();
        edit(&mut limits, n);
        check_size(&p, &limits).unwrap_err()
    };
    let e: ApiError = refused(|l, n| l.max_rows = n, 1).into();
    assert_eq!(e.status, 413);
    assert_eq!(
        e.message(),
        Some("too many questions: the request expands to 2 scoring rows, the limit is 1 (DECIDER_MAX_ROWS)")
    );
    let longest = p.rows.iter().map(|r| r.ids.len()).max().unwrap();
    let e = refused(|l, n| l.max_row_tokens = n, longest - 1);
    assert!(e
        .to_string()
        .starts_with(&format!("too many tokens: one row has {longest} tokens")));
    let total: usize = p.rows.iter().map(|r| r.ids.len()).sum();
    let e = refused(|l, n| l.max_request_tokens = n, total - 1);
    assert_eq!(
        e.to_string(),
        format!("too many tokens: the request has {total} tokens over 2 rows, the limit is {} (DECIDER_MAX_REQUEST_TOKENS)", total - 1)
    );
    let v = dumps_compact(&p.to_value()).unwrap();
    assert!(
        v.starts_with(r#"{"rows":[{"ids":[1905,25,"#)
            && v.ends_with(&format!(
                r#""usage":{{"input_tokens":{}}}}}"#,
                p.input_tokens
            )),
        "{v}"
    );
}

#[test]
fn non_object_spec_is_a_422() {
    let req = parse_request(br#"{"state": "s", "questions": {"q": "text"}}"#).unwrap();
    let e = plan(&req, &tok(), &DecideConfig::default()).unwrap_err();
    assert_eq!(e.http_body().0, 422);
    assert_eq!(
        e.message(),
        Some("question 'q': a question must be a JSON object, got a string")
    );
}

#[test]
fn decider_temperature_overrides_the_config_and_its_maps() {
    // decider-contract R3.2.1 / R6.3: the override replaces `temperature` and switches the by-type map off.
    use onepass_decide::render::QType;
    let dir = tempfile_dir();
    std::fs::write(
        dir.join("decider_config.json"),
        r#"{"temperature": 1.3, "temperature_by_type": {"choice": 2.0, "noul": 3.0, "score": 4.0}}"#,
    )
    .unwrap();
    let tk = tok();
    let plain = DecideConfig::load(&dir, &tk, None, None).unwrap();
    assert_eq!(plain.temperature.for_slot(QType::Noul, 2), 3.0);
    let over = DecideConfig::load(&dir, &tk, None, Some("2.5")).unwrap();
    for q in [QType::Choice, QType::Noul, QType::Score] {
        assert_eq!(over.temperature.for_slot(q, 7), 2.5);
    }
    let err = DecideConfig::load(&dir, &tk, None, Some("-1"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("must be a finite number > 0"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("onepass-decide-api-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
