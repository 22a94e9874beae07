//! onepass-decide against the decider-ai 1.10.0 golden files in tests/fixtures/systemone (made by
//! tools/oracle/decider_fixtures.py): ids, slots, nopts, types, temperatures, usage, response bytes, error answers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use onepass_decide::pyjson::{self, dumps, float_repr, py_float, py_round, py_str, Value};
use onepass_decide::render::strip_level_number;
use onepass_decide::{assemble, parse_request, plan, DecideConfig};
use serde_json::Value as J;

mod common;

use common::{array, check_rows, f64s, root, tok, u32s};

fn lines(name: &str) -> Vec<J> {
    common::jsonl(&root().join("tests/fixtures/systemone").join(name))
}

/// A file of the random-request golden files: tests/fixtures/systemone/fuzz (tools/oracle/decider_fuzz.py, seed 1),
/// or the folder ONEPASS_SYSTEMONE_FUZZ names (another seed or count of the same script).
fn fuzz_lines(name: &str) -> Vec<J> {
    let dir = std::env::var_os("ONEPASS_SYSTEMONE_FUZZ")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root().join("tests/fixtures/systemone/fuzz"));
    common::jsonl(&dir.join(name))
}

/// The temperature configs of decider_fixtures.py TEMP_CONFIGS.
const TEMP_CONFIGS: &[(&str, &str)] = &[
    ("scalar", r#"{"temperature": 1.3}"#),
    (
        "by_type",
        r#"{"temperature": 1.1, "temperature_by_type": {"choice": 1.48, "noul": 2.22, "score": 1.38}}"#,
    ),
    (
        "by_options",
        r#"{"temperature_by_options": {"a": 10.12, "b": -1.63, "min": 0.05}}"#,
    ),
];

fn config(text: &str, isolated: bool) -> DecideConfig {
    let Ok(Value::Object(o)) = pyjson::loads(text) else {
        panic!("config")
    };
    let mut c = DecideConfig::from_object(&o, None).expect("valid config");
    c.isolated_levels = isolated;
    c
}

#[test]
fn label_table_matches() {
    let want: J = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/fixtures/systemone/labels.json")).unwrap(),
    )
    .unwrap();
    let t = tok().label_table().unwrap();
    assert_eq!(t.ids, u32s(&want["ids"]));
    assert_eq!(t.open_ids, u32s(&want["open_ids"]));
}

#[test]
fn render_fixtures() {
    check_render(&lines("render.jsonl"));
}

/// Requests the reference answers with a 500 (an AttributeError on a question spec that is not an object): onepass
/// answers a 422 naming the question, as for the hand-written `divergence` cases.
#[test]
fn fuzz_left_out_are_422s() {
    for c in &fuzz_lines("left-out.jsonl") {
        let name = c["name"].as_str().unwrap();
        assert!(
            c["exception"]
                .as_str()
                .unwrap()
                .starts_with("AttributeError"),
            "{name}"
        );
        let iso = c["isolated_levels"].as_bool().unwrap();
        let e = parse_request(c["body"].as_str().unwrap().as_bytes())
            .and_then(|r| plan(&r, tok(), &config("{}", iso)))
            .expect_err(name);
        assert_eq!(e.status, 422, "{name}");
        assert!(e.message().unwrap().starts_with("question "), "{name}: {e}");
    }
}

fn check_render(cases: &[J]) {
    assert!(!cases.is_empty());
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let body = c["body"].as_str().unwrap().as_bytes();
        let iso = c["isolated_levels"].as_bool().unwrap();
        let got = parse_request(body).and_then(|r| plan(&r, tok(), &config("{}", iso)));
        if let Some(err) = c.get("error") {
            let e = got.expect_err(name);
            if err.get("divergence").is_some() {
                // The reference answers a non-object question spec with a 500; onepass with a 422 naming it.
                assert_eq!(e.status, 422, "{name}");
                assert!(e.message().unwrap().starts_with("question "), "{name}: {e}");
                continue;
            }
            let (status, _, text) = e.http_body();
            assert_eq!(status as u64, err["status"].as_u64().unwrap(), "{name}");
            assert_eq!(text, err["body"].as_str().unwrap(), "{name}");
            continue;
        }
        let p = got.unwrap_or_else(|e| panic!("{name}: {e}"));
        check_rows(name, &p, c);
        for (cfg_name, cfg_text) in TEMP_CONFIGS {
            let q = plan(&parse_request(body).unwrap(), tok(), &config(cfg_text, iso)).unwrap();
            let got: Vec<f64> = q
                .rows
                .iter()
                .flat_map(|r| r.temperatures.iter().copied())
                .collect();
            let want = f64s(&c["temperatures"][*cfg_name]);
            assert_eq!(got, want, "{name}: temperatures {cfg_name}");
        }
    }
}

#[test]
fn assemble_fixtures() {
    check_assemble(&lines("assemble.jsonl"));
}

/// The fuzzed requests' fixtures (tools/oracle/decider_fuzz.py): rendered, then assembled, as the reference did.
#[test]
fn fuzz_render_and_assemble_fixtures() {
    check_render(&fuzz_lines("render.jsonl"));
    check_assemble(&fuzz_lines("assemble.jsonl"));
}

fn check_assemble(cases: &[J]) {
    assert!(!cases.is_empty());
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let req = parse_request(c["body"].as_str().unwrap().as_bytes()).unwrap();
        let p = plan(
            &req,
            tok(),
            &config("{}", c["isolated_levels"].as_bool().unwrap()),
        )
        .unwrap();
        let probs: Vec<Vec<f32>> = array(&c["probs"], |v| array(v, |x| x.as_f64().unwrap() as f32));
        let resp = assemble(&p, &probs, "decider-1.10").unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            pyjson::dumps_compact(&resp).unwrap(),
            c["response"].as_str().unwrap(),
            "{name}"
        );
    }
}

#[test]
fn invalid_fixtures() {
    for c in &lines("invalid.jsonl") {
        let name = c["name"].as_str().unwrap();
        let e = parse_request(c["request"].as_str().unwrap().as_bytes()).expect_err(name);
        let (status, _, text) = e.http_body();
        assert_eq!(status as u64, c["status"].as_u64().unwrap(), "{name}");
        assert_eq!(text, c["response"].as_str().unwrap(), "{name}");
    }
}

#[test]
fn pyjson_fixtures() {
    for c in &lines("pyjson.jsonl") {
        match c["kind"].as_str().unwrap() {
            "dumps" => {
                let v = pyjson::loads(c["text"].as_str().unwrap()).unwrap();
                assert_eq!(dumps(&v), c["dumps"].as_str().unwrap());
                assert_eq!(py_str(&v), c["str"].as_str().unwrap());
            }
            "round" => {
                let x = py_float(c["x"].as_str().unwrap()).unwrap();
                assert_eq!(float_repr(x), c["repr"].as_str().unwrap());
                assert_eq!(
                    float_repr(py_round(x, 2)),
                    c["r2"].as_str().unwrap(),
                    "round({x:e}, 2)"
                );
                assert_eq!(
                    float_repr(py_round(x, 4)),
                    c["r4"].as_str().unwrap(),
                    "round({x:e}, 4)"
                );
            }
            "float" => {
                let s = c["s"].as_str().unwrap();
                match (py_float(s), c.get("ok")) {
                    (Ok(x), Some(ok)) => {
                        assert_eq!(float_repr(x), ok.as_str().unwrap(), "float({s:?})")
                    }
                    (Err(e), None) => {
                        assert_eq!(e.to_string(), c["error"].as_str().unwrap(), "float({s:?})")
                    }
                    (got, _) => panic!("float({s:?}): {got:?}"),
                }
            }
            "strip" => {
                assert_eq!(
                    strip_level_number(c["s"].as_str().unwrap()),
                    c["out"].as_str().unwrap()
                );
            }
            k => panic!("unknown kind {k}"),
        }
    }
}
