//! `onepass serve` end to end: the real binary on a free port over a synthetic checkpoint with the real tokenizer;
//! waits for /health, drives /v1/systemone (plain and zstd), /decide, /v1/models and /metrics over HTTP, then stops
//! it with SIGTERM and checks a clean exit; a second test sends SIGTERM with requests in flight and checks that each
//! is still answered in full; a third checks that `onepass systemone` applies the server's limits (the same 413 body, the
//! same state cut). Needs testdata/qwen3_5-tokenizer (tools/setup-testdata.sh).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{checkpoint, http, Server};

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const REQ: &str = r#"{"state":{"ticket":"My card was charged twice","tier":"gold"},"questions":{"topic":{"type":"choice","instructions":"What is the ticket about?","criteria":["billing","shipping","login"]},"urgent":{"type":"noul","instructions":"Is it urgent?"}}}"#;

#[test]
fn serve_end_to_end() {
    let dir = checkpoint();
    let want = {
        let e = onepass_decide::Engine::load(dir.path(), Default::default()).unwrap();
        onepass_decide::pyjson::dumps_compact(&e.system_one(REQ.as_bytes()).unwrap()).unwrap()
    };
    let mut srv = Server::start(dir.path(), &["--max-queue-rows", "100"]);
    let addr = srv.addr.clone();
    let json = [("content-type", "application/json")];
    let (status, head, body) = http(&addr, "POST", "/v1/systemone", &json, REQ.as_bytes());
    assert_eq!(status, 200);
    assert_eq!(String::from_utf8(body).unwrap(), want);
    assert!(head.contains("x-request-id: "), "{head}");
    let z = zstd::encode_all(REQ.as_bytes(), 3).unwrap();
    let (status, _, body) = http(
        &addr,
        "POST",
        "/v1/systemone",
        &[
            ("content-type", "application/json"),
            ("content-encoding", "zstd"),
            ("x-request-id", "e2e-1"),
        ],
        &z,
    );
    assert_eq!((status, String::from_utf8(body).unwrap()), (200, want));
    let (status, _, body) = http(
        &addr,
        "POST",
        "/decide",
        &json,
        br#"{"context":"The cat sat.","schema":{"cat?":{"type":"bool"}}}"#,
    );
    assert_eq!(status, 200);
    assert!(body.starts_with(br#"{"cat?":{"noul":"#));
    let (status, _, body) = http(&addr, "GET", "/v1/models", &[], b"");
    assert_eq!(status, 200);
    assert!(body.starts_with(br#"{"models":[{"name":"decider-dev""#));
    let (_, _, body) = http(&addr, "GET", "/metrics", &[], b"");
    let metrics = String::from_utf8(body).unwrap();
    assert!(
        metrics.contains(r#"onepass_requests_total{route="/v1/systemone",status="200"} 2"#),
        "{metrics}"
    );

    // SIGTERM: drains and exits 0.
    let log = srv.stop();
    assert!(
        log.contains("id=e2e-1 POST /v1/systemone status=200 rows=2"),
        "{log}"
    );
    assert!(log.contains("onepass serve: stopped"), "{log}");
}

/// SIGTERM while requests are in flight: every admitted request still gets its full, correct answer, then the
/// server exits 0. Four requests of 40 rows over a ~2,300-token state run one engine call each (each over the
/// 64-row batch cap together), so the last answers arrive well after the signal; the test checks that at least
/// one did (else it proved nothing) and that all four equal the engine's own answer.
#[test]
fn sigterm_drains_requests_in_flight() {
    let dir = checkpoint();
    let notes: Vec<String> = (0..230)
        .map(|i| format!("event{i} happened at the store and the customer asked about parcel {i}"))
        .collect();
    let questions: serde_json::Map<String, serde_json::Value> = (0..40)
        .map(|i| {
            (
                format!("q{i}"),
                serde_json::json!({"type": "choice", "instructions": format!("Which option {i}?"), "criteria": ["a", "b", "c"]}),
            )
        })
        .collect();
    let bodies: Vec<Vec<u8>> = (0..4)
        .map(|k| {
            serde_json::to_vec(&serde_json::json!({
                "state": {"notes": notes.join(" "), "request": k},
                "questions": questions,
            }))
            .unwrap()
        })
        .collect();
    let want: Vec<String> = {
        let e = onepass_decide::Engine::load(dir.path(), Default::default()).unwrap();
        bodies
            .iter()
            .map(|b| onepass_decide::pyjson::dumps_compact(&e.system_one(b).unwrap()).unwrap())
            .collect()
    };
    let mut srv = Server::start(dir.path(), &["--quiet"]);
    let (tx, rx) = mpsc::channel();
    let clients: Vec<_> = bodies
        .into_iter()
        .enumerate()
        .map(|(k, b)| {
            let (addr, tx) = (srv.addr.clone(), tx.clone());
            std::thread::spawn(move || {
                let (status, _, body) = http(
                    &addr,
                    "POST",
                    "/v1/systemone",
                    &[("content-type", "application/json")],
                    &b,
                );
                tx.send((k, status, String::from_utf8(body).unwrap(), Instant::now()))
                    .unwrap();
            })
        })
        .collect();
    // Let the requests reach the server, then stop it with all of them admitted.
    std::thread::sleep(Duration::from_millis(150));
    let signalled = Instant::now();
    srv.term();
    for c in clients {
        c.join().unwrap();
    }
    let log = srv.wait();
    let answers: Vec<_> = rx.try_iter().collect();
    assert_eq!(answers.len(), 4, "{log}");
    for (k, status, body, _) in &answers {
        assert_eq!((*status, body), (200, &want[*k]), "request {k}; {log}");
    }
    assert!(
        answers.iter().any(|a| a.3 > signalled),
        "every answer came before the signal: nothing was in flight (make the requests heavier)"
    );
    assert!(log.contains("draining in-flight requests"), "{log}");
}

/// The variables of the request limits (decider-contract §1.10).
const LIMIT_VARS: [&str; 4] = [
    "DECIDER_MAX_ROWS",
    "DECIDER_MAX_ROW_TOKENS",
    "DECIDER_MAX_REQUEST_TOKENS",
    "DECIDER_MAX_STATE_TOKENS",
];

/// `onepass systemone --model DIR - <extra>` with `body` on stdin, the limit variables cleared and then `env` set.
fn systemone(
    dir: &Path,
    body: &[u8],
    extra: &[&str],
    env: &[(&str, &str)],
) -> std::process::Output {
    one_shot("systemone", dir, body, extra, env)
}

/// `onepass <sub> --model DIR - EXTRA` (systemone or render) with `body` on stdin, the limit variables cleared.
fn one_shot(
    sub: &str,
    dir: &Path,
    body: &[u8],
    extra: &[&str],
    env: &[(&str, &str)],
) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_onepass"));
    cmd.args([sub, "--model", dir.to_str().unwrap(), "-"])
        .args(extra);
    for v in LIMIT_VARS {
        cmd.env_remove(v);
    }
    let mut child = cmd
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(body).unwrap();
    child.wait_with_output().unwrap()
}

/// The answer body `onepass systemone` printed (it must have succeeded).
fn stdout_ok(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "onepass systemone failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// The last line on stderr, the error `onepass systemone` printed (it must have failed, with nothing on stdout).
fn stderr_err(out: &std::process::Output) -> String {
    assert!(
        !out.status.success(),
        "onepass systemone should fail; it printed {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(out.stdout.is_empty(), "stdout on failure");
    let err = String::from_utf8(out.stderr.clone()).unwrap();
    err.lines().last().unwrap_or_default().to_string()
}

/// `onepass systemone` reads the limits `onepass serve` reads, from the same flags and variables: a body over
/// `--max-rows 1` / `DECIDER_MAX_ROWS=1` fails with the server's 413 body, and `DECIDER_MAX_STATE_TOKENS` /
/// `--max-state-tokens` cut the state as the server's does (a different answer from the default cap's).
#[test]
fn systemone_applies_the_servers_limits() {
    let dir = checkpoint();
    let d = dir.path();
    // One row (one question) over a state far longer than 8 tokens.
    let one = br#"{"state":{"ticket":"My card was charged twice for the same order and nobody answers the phone","tier":"gold"},"questions":{"urgent":{"type":"noul","instructions":"Is it urgent?"}}}"#;
    let mut srv = Server::start(
        d,
        &["--quiet", "--max-rows", "1", "--max-state-tokens", "8"],
    );
    let json = [("content-type", "application/json")];
    let (status, _, too_many) = http(&srv.addr, "POST", "/v1/systemone", &json, REQ.as_bytes());
    let too_many = String::from_utf8(too_many).unwrap();
    assert_eq!(
        (status, too_many.as_str()),
        (
            413,
            r#"{"detail":"too many questions: the request expands to 2 scoring rows, the limit is 1 (DECIDER_MAX_ROWS)"}"#
        )
    );
    let (status, _, cut) = http(&srv.addr, "POST", "/v1/systemone", &json, one);
    assert_eq!(status, 200);
    let cut = String::from_utf8(cut).unwrap();
    srv.stop();

    // The 413: the server's status and body, as the CLI prints every error answer (`HTTP <status>: <body>`).
    let want = format!("error: HTTP 413: {too_many}");
    let req = REQ.as_bytes();
    assert_eq!(
        stderr_err(&systemone(d, req, &["--max-rows", "1"], &[])),
        want
    );
    assert_eq!(
        stderr_err(&systemone(d, req, &[], &[("DECIDER_MAX_ROWS", "1")])),
        want
    );
    // The flag wins over the variable, as in `onepass serve`.
    stdout_ok(&systemone(
        d,
        req,
        &["--max-rows", "2"],
        &[("DECIDER_MAX_ROWS", "1")],
    ));
    let bad = stderr_err(&systemone(d, req, &[], &[("DECIDER_MAX_ROWS", "x")]));
    assert!(
        bad.contains(r#"DECIDER_MAX_ROWS="x" is not a non-negative integer"#),
        "{bad}"
    );

    // The state cut: byte-equal to the server's answer, and not the default cap's answer.
    let env_cut = stdout_ok(&systemone(
        d,
        one,
        &[],
        &[("DECIDER_MAX_STATE_TOKENS", "8")],
    ));
    assert_eq!(env_cut.trim_end(), cut);
    let flag_cut = stdout_ok(&systemone(d, one, &["--max-state-tokens", "8"], &[]));
    assert_eq!(flag_cut.trim_end(), cut);
    let uncut = stdout_ok(&systemone(d, one, &[], &[]));
    assert_ne!(
        uncut.trim_end(),
        cut,
        "the state cap changed nothing: the test proves nothing"
    );

    // `onepass render` plans what the server runs: the same 413 and the same cut (its usage equals the answer's).
    let render =
        |body: &[u8], extra: &[&str], env: &[(&str, &str)]| one_shot("render", d, body, extra, env);
    assert_eq!(stderr_err(&render(req, &["--max-rows", "1"], &[])), want);
    let usage = |s: &str| {
        serde_json::from_str::<serde_json::Value>(s).unwrap()["usage"]["input_tokens"].clone()
    };
    let planned = stdout_ok(&render(one, &[], &[("DECIDER_MAX_STATE_TOKENS", "8")]));
    assert_eq!(usage(&planned), usage(&cut));
    assert_ne!(usage(&stdout_ok(&render(one, &[], &[]))), usage(&cut));
}

/// Reads from `s` until the peer closes (→ the bytes), or `None` when nothing closes it within `limit`.
fn read_until_closed(s: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut out = Vec::new();
    match s.read_to_end(&mut out) {
        Ok(_) => Some(out),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Some(out),
        Err(_) => None,
    }
}

/// A fresh connection that has sent `raw`, held open.
fn hold(addr: &str, raw: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(raw).unwrap();
    s
}

/// Sends `raw` on a fresh connection (then half-closes it when `fin`) → what the server sent before closing it,
/// or `None` when it does not close it within 20 s.
fn send_raw(addr: &str, raw: &[u8], fin: bool) -> Option<String> {
    let mut s = hold(addr, raw);
    if fin {
        s.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let got = read_until_closed(&mut s, Duration::from_secs(20))?;
    Some(String::from_utf8_lossy(&got).into_owned())
}

/// A drip-fed head and an idle kept-alive connection are closed after --header-timeout; a body shorter than its
/// Content-Length and then a FIN is a 400, not a 413; a bad chunk-size line is a 400.
#[test]
fn connection_timeouts_and_broken_bodies() {
    let dir = checkpoint();
    let mut srv = Server::start(
        dir.path(),
        &["--header-timeout", "1", "--body-timeout", "2"],
    );
    // A head that never ends: one header line, then nothing.
    let head_only = b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\n";
    assert!(
        send_raw(&srv.addr, head_only, false).is_some(),
        "a partial head was never cut"
    );
    // Idle after one answered request on a kept-alive connection.
    let got = send_raw(&srv.addr, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", false)
        .expect("idle connection never closed");
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    let short_body =
        b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"state\":1";
    let bad_chunk =
        b"POST /decide HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n";
    for (what, raw, fin, status) in [
        (
            "a body cut short: Content-Length 100, 10 bytes, then FIN",
            &short_body[..],
            true,
            "400",
        ),
        ("a bad chunk-size line", &bad_chunk[..], false, "400"),
        ("a body that stops coming", &short_body[..], false, "408"),
    ] {
        let text = send_raw(&srv.addr, raw, fin).expect("answer");
        assert!(
            text.starts_with(&format!("HTTP/1.1 {status}")),
            "{what}: {text}"
        );
    }
    let (_, _, m) = http(&srv.addr, "GET", "/metrics", &[], b"");
    let m = String::from_utf8(m).unwrap();
    assert!(m.contains(r#"onepass_errors_total{status="400"} 2"#), "{m}");
    assert!(m.contains(r#"onepass_errors_total{status="408"} 1"#), "{m}");
    assert!(!m.contains(r#"status="413""#), "{m}");
    srv.stop();
}

/// A request whose body never comes.
const IN_BODY: &[u8] = b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{";

/// SIGTERM with a connection holding a partial request exits (cleanly) within the shutdown timeout, and a second
/// signal exits at once even while a request is stuck.
#[test]
fn shutdown_is_bounded_whatever_connections_do() {
    let dir = checkpoint();
    // The head timeout is long, so only the shutdown timeout can end the partial request.
    let mut srv = Server::start(
        dir.path(),
        &["--header-timeout", "600", "--shutdown-timeout", "1"],
    );
    let held = hold(&srv.addr, b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\n");
    // A body that never comes: the request is in the route, past its head.
    let in_body = hold(&srv.addr, IN_BODY);
    std::thread::sleep(Duration::from_millis(200));
    let log = srv.stop();
    assert!(log.contains("onepass serve: stopped"), "{log}");
    drop((held, in_body));

    let mut srv = Server::start(
        dir.path(),
        &["--header-timeout", "600", "--shutdown-timeout", "600"],
    );
    let held = hold(&srv.addr, IN_BODY);
    std::thread::sleep(Duration::from_millis(200));
    srv.term();
    // Wait for the first signal to be taken before sending the second.
    loop {
        let line = srv
            .rx
            .recv_timeout(Duration::from_secs(30))
            .expect("no shutdown line");
        srv.log.push(line.clone());
        if line.contains("shutting down") {
            break;
        }
    }
    srv.term();
    let status = srv.exit_status("a second SIGTERM did not stop the server");
    assert_eq!(status.code(), Some(130));
    drop(held);
}

/// `onepass serve --model MODEL ARGS` run until it exits by itself (MODEL does not load) → (success, stderr)
fn serve_to_exit(model: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_onepass"))
        .arg("serve")
        .arg("--model")
        .arg(model)
        .args(args)
        .env_remove("ONEPASS_API_KEY")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), err)
}

/// The port is bound before the model loads (a taken port is the error, even with a model folder that does not
/// load); an empty API key is an error; a key from a file works; /health names the folder, not its path.
#[test]
fn bind_first_auth_fails_closed_and_health_hides_paths() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let missing = tempfile::tempdir().unwrap();
    let (ok, err) = serve_to_exit(missing.path(), &["--port", &port]);
    assert!(!ok);
    assert!(err.contains(&format!("binding 127.0.0.1:{port}")), "{err}");
    // Warnings before anything loads: a queue smaller than one request may be, a public bind without a key.
    let (_, err) = serve_to_exit(
        missing.path(),
        &["--port", "0", "--max-queue-rows", "10", "--host", "0.0.0.0"],
    );
    assert!(
        err.contains("--max-queue-rows (10) is below --max-rows (1024)"),
        "{err}"
    );
    assert!(
        err.contains("listening on 0.0.0.0 without an API key"),
        "{err}"
    );
    for blank in ["", "   "] {
        let (ok, err) = serve_to_exit(missing.path(), &["--port", "0", "--api-key", blank]);
        assert!(
            !ok && err.contains("API key") && err.contains("empty"),
            "{err}"
        );
    }
    let dir = checkpoint();
    let keyfile = dir.path().join("key.txt");
    std::fs::write(&keyfile, "s3cret\n").unwrap();
    let mut srv = Server::start(
        dir.path(),
        &[
            "--api-key-file",
            keyfile.to_str().unwrap(),
            "--host",
            "127.0.0.1",
        ],
    );
    let (status, _, _) = http(&srv.addr, "GET", "/v1/models", &[], b"");
    assert_eq!(status, 401);
    let (status, _, _) = http(
        &srv.addr,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer s3cret")],
        b"",
    );
    assert_eq!(status, 200);
    let (_, _, health) = http(&srv.addr, "GET", "/health", &[], b"");
    let health = String::from_utf8(health).unwrap();
    let name = dir.path().file_name().unwrap().to_str().unwrap();
    assert!(health.contains(&format!(r#""model":"{name}""#)), "{health}");
    assert!(!health.contains(dir.path().to_str().unwrap()), "{health}");
    srv.stop();
}

/// The issue's reproducer (a million-zero state with real questions) is answered, with the same answer as a state
/// cut by hand to what the cap keeps, and a body of more than 2,000,000 values is a 413.
#[test]
fn a_huge_state_is_answered_and_too_many_values_is_a_413() {
    let dir = checkpoint();
    let mut srv = Server::start(dir.path(), &["--max-state-tokens", "3000"]);
    let questions = r#"{"topic":{"type":"choice","instructions":"What is the ticket about?","criteria":["billing","shipping","login"]}}"#;
    let zeros = |n: usize| {
        format!(
            r#"{{"state":[{}],"questions":{questions}}}"#,
            vec!["0"; n].join(",")
        )
    };
    // 1,000,000 zeros and 1,000 zeros render the same first 3,000 ids, so they answer alike.
    let (s1, _, big) = http(
        &srv.addr,
        "POST",
        "/v1/systemone",
        &[],
        zeros(1_000_000).as_bytes(),
    );
    let (s2, _, small) = http(
        &srv.addr,
        "POST",
        "/v1/systemone",
        &[],
        zeros(1_000).as_bytes(),
    );
    assert_eq!((s1, s2), (200, 200), "{}", String::from_utf8_lossy(&big));
    assert_eq!(big, small);
    let (s, _, body) = http(
        &srv.addr,
        "POST",
        "/v1/systemone",
        &[],
        zeros(2_000_001).as_bytes(),
    );
    assert_eq!(s, 413, "{}", String::from_utf8_lossy(&body));
    srv.stop();
}

/// The body of a chunked response, de-chunked (a server-sent event stream comes chunked).
fn dechunk(head: &str, body: &[u8]) -> Vec<u8> {
    if !head.contains("transfer-encoding: chunked") {
        return body.to_vec();
    }
    let (mut out, mut at) = (Vec::new(), 0);
    loop {
        let eol = at + body[at..].windows(2).position(|w| w == b"\r\n").unwrap();
        let n =
            usize::from_str_radix(std::str::from_utf8(&body[at..eol]).unwrap().trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&body[eol + 2..eol + 2 + n]);
        at = eol + 2 + n + 2;
    }
}

/// The `data:` payloads of an event stream, in order.
fn events(body: &[u8]) -> Vec<String> {
    String::from_utf8(body.to_vec())
        .unwrap()
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not an event: {e:?}"))
                .to_string()
        })
        .collect()
}

/// `/v1/chat/completions` (stream off and on) and `/v1/completions` against the real server: the text is the
/// library's own greedy generation, the stream adds up to it and ends with `data: [DONE]`, usage counts the ids, bad
/// bodies are 400s in the OpenAI error shape, and System One answers exactly while a generation runs.
#[test]
fn chat_completions_end_to_end() {
    let dir = checkpoint();
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}\
         {%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
    )
    .unwrap();
    let messages = vec![(
        "user".to_string(),
        "Write a line about the sea.".to_string(),
    )];
    let (want, want_sys, n_prompt, raw_want) = {
        use onepass_decide::generate::{GenerateRequest, Input};
        let e = onepass_decide::Engine::load(dir.path(), Default::default()).unwrap();
        let mut s = e.session(Default::default());
        let req = GenerateRequest {
            input: Input::Messages(messages.clone()),
            ..GenerateRequest::greedy("", 12)
        };
        let g = s.generate(&req, &mut |_| true).unwrap();
        let raw = s
            .generate(&GenerateRequest::greedy("The sea is", 8), &mut |_| true)
            .unwrap();
        let sys =
            onepass_decide::pyjson::dumps_compact(&e.system_one(REQ.as_bytes()).unwrap()).unwrap();
        (
            g,
            sys,
            e.generator().unwrap().prompt_ids(&req.input).unwrap().len(),
            raw,
        )
    };
    let mut srv = Server::start(dir.path(), &[]);
    let addr = srv.addr.clone();
    let json_h = [("content-type", "application/json")];
    let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": messages[0].1}],
        "max_tokens": 12, "temperature": 0});
    let (status, head, raw) = http(
        &addr,
        "POST",
        "/v1/chat/completions",
        &json_h,
        body.to_string().as_bytes(),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&raw));
    assert!(head.contains("content-type: application/json"), "{head}");
    let v: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], want.text.as_str());
    assert_eq!(v["choices"][0]["finish_reason"], want.finish.as_str());
    assert_eq!(v["usage"]["prompt_tokens"], n_prompt);
    assert_eq!(v["usage"]["completion_tokens"], want.tokens.len());
    assert_eq!(v["usage"]["total_tokens"], n_prompt + want.tokens.len());

    // Streamed: role first, the pieces, the finish reason, usage on request, then [DONE].
    let mut sbody = body.clone();
    sbody["stream"] = true.into();
    sbody["stream_options"] = serde_json::json!({"include_usage": true});
    let (status, head, raw) = http(
        &addr,
        "POST",
        "/v1/chat/completions",
        &json_h,
        sbody.to_string().as_bytes(),
    );
    assert_eq!(status, 200);
    assert!(head.contains("content-type: text/event-stream"), "{head}");
    let ev = events(&dechunk(&head, &raw));
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let chunks: Vec<serde_json::Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| {
            c["choices"]
                .get(0)
                .and_then(|ch| ch["delta"]["content"].as_str())
        })
        .collect();
    assert_eq!(text, want.text);
    let fin = &chunks[chunks.len() - 2];
    assert_eq!(fin["choices"][0]["finish_reason"], want.finish.as_str());
    assert_eq!(
        chunks.last().unwrap()["usage"]["completion_tokens"],
        want.tokens.len()
    );

    // /v1/completions: a raw prompt.
    let cbody = serde_json::json!({"model": "m", "prompt": "The sea is", "max_tokens": 8, "temperature": 0});
    let (status, _, raw) = http(
        &addr,
        "POST",
        "/v1/completions",
        &json_h,
        cbody.to_string().as_bytes(),
    );
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(
        (v["object"].as_str(), v["choices"][0]["text"].as_str()),
        (Some("text_completion"), Some(raw_want.text.as_str()))
    );

    // Refused before any model work, in the OpenAI error shape.
    for (path, bad) in [
        ("/v1/chat/completions", r#"{"prompt":"x"}"#),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}],"temperature":9}"#,
        ),
        ("/v1/completions", "{not json"),
        ("/v1/completions", r#"{"prompt":"x","n":3}"#),
    ] {
        let (status, _, raw) = http(&addr, "POST", path, &json_h, bad.as_bytes());
        assert_eq!(status, 400, "{path} {bad}");
        let v: serde_json::Value = serde_json::from_slice(&raw).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    }

    // System One while a long generation runs: the batching worker answers exactly, and the generation completes.
    let a2 = addr.clone();
    let long = serde_json::json!({"messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 150,
        "temperature": 0.8, "seed": 3});
    let gen = std::thread::spawn(move || {
        http(
            &a2,
            "POST",
            "/v1/chat/completions",
            &json_h,
            long.to_string().as_bytes(),
        )
    });
    std::thread::sleep(Duration::from_millis(100));
    let (status, _, raw) = http(&addr, "POST", "/v1/systemone", &json_h, REQ.as_bytes());
    assert_eq!((status, String::from_utf8(raw).unwrap()), (200, want_sys));
    let (status, _, raw) = gen.join().unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&raw));
    let (_, _, m) = http(&addr, "GET", "/metrics", &[], b"");
    let m = String::from_utf8(m).unwrap();
    assert!(
        m.contains(r#"route="/v1/chat/completions",status="200"} 3"#),
        "{m}"
    );
    srv.stop();
}

/// `POST /v1/decide` against the real server: an agent's growing prefix answers as the library's engine does (the
/// server's LRU restoring each step's prefix), a whole decision is the log-softmax of `onepass logits --last` on the
/// same ids bit for bit, refusals are 400s naming the cause, the prefix cache shows in /metrics, and
/// `--prefix-cache-mb 0` keeps nothing.
#[test]
fn decide_end_to_end() {
    let dir = checkpoint();
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        onepass_tokenizer::QWEN3_CHAT_TEMPLATE,
    )
    .unwrap();
    let task = "Task: turn on Wi-Fi. History: none. ";
    let steps = [
        serde_json::json!({"id": 1, "prefix": task, "suffix": "Screen: Home. Options: A) Settings B) Camera C) Clock.", "choices": ["A", "B", "C"]}),
        serde_json::json!({"id": "two", "prefix": task, "suffix": "Screen: Settings. Options: A) Network B) Display.", "choices": ["A", "B"]}),
        serde_json::json!({"id": 3, "prefix": format!("{task}Opened Settings. "), "suffix": "Screen: Network. Options: A) Airplane B) Internet C) Hotspot D) VPN.", "choices": ["A", "B", "C", "D"]}),
        serde_json::json!({"id": 4, "prefix": format!("{task}Opened Settings. Opened Network. "), "suffix": "Screen: Internet. Options: A) Wi-Fi on B) Back.", "choices": ["A", "B"], "reuse_prefix": false}),
    ];
    let (want, ids4) = {
        use onepass_decide::choice::DecideRequest;
        let e = onepass_decide::Engine::load(dir.path(), Default::default()).unwrap();
        let want: Vec<serde_json::Value> = steps
            .iter()
            .map(|s| {
                e.choose(&DecideRequest::from_json(s, &[]).unwrap())
                    .unwrap()
                    .to_json()
            })
            .collect();
        let gen = e.generator().unwrap();
        let ids = gen
            .decide_prompt()
            .split(
                &gen.tokenizer,
                steps[3]["prefix"].as_str().unwrap(),
                steps[3]["suffix"].as_str().unwrap(),
            )
            .unwrap()
            .ids;
        (want, ids)
    };
    let mut srv = Server::start(dir.path(), &["--prefix-cache-mb", "64"]);
    let addr = srv.addr.clone();
    let json_h = [("content-type", "application/json")];
    let post = |body: &serde_json::Value| {
        let (status, _, raw) = http(
            &addr,
            "POST",
            "/v1/decide",
            &json_h,
            body.to_string().as_bytes(),
        );
        (
            status,
            serde_json::from_slice::<serde_json::Value>(&raw).unwrap(),
        )
    };
    for (s, w) in steps.iter().zip(&want) {
        let (status, v) = post(s);
        assert_eq!(status, 200, "{v}");
        for k in ["id", "best", "choice_logp", "n_tokens", "n_reused"] {
            assert_eq!(v[k], w[k], "step {}: {k}", s["id"]);
        }
    }
    let reused: Vec<u64> = want
        .iter()
        .map(|w| w["n_reused"].as_u64().unwrap())
        .collect();
    assert!(
        reused[0] == 0 && reused[1] > 0 && reused[2] == reused[1] && reused[3] == 0,
        "{reused:?}"
    );
    // The whole decision against the teacher-forced logits of the same ids.
    let ids: Vec<String> = ids4.iter().map(u32::to_string).collect();
    let out = Command::new(env!("CARGO_BIN_EXE_onepass"))
        .args([
            "logits",
            "--model",
            dir.path().to_str().unwrap(),
            "--last",
            "--ids",
            &ids.join(","),
        ])
        .output()
        .unwrap();
    let logits: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row: Vec<f32> = logits["logits"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    let tok = onepass_tokenizer::Tokenizer::from_dir(dir.path(), Some("qwen3_5_text")).unwrap();
    let firsts: Vec<u32> = ["A", "B"]
        .iter()
        .map(|c| tok.encode(c).unwrap()[0])
        .collect();
    let lp = onepass_decide::choice::score::log_softmax_at(&row, &firsts);
    assert_eq!(want[3]["choice_logp"], serde_json::json!(lp));
    // Refusals: 400, the request's id, the cause named.
    for (body, cause) in [
        (
            serde_json::json!({"id": 7, "prefix": "p", "choices": []}),
            "choices is empty",
        ),
        (
            serde_json::json!({"id": 8, "prefix": "p", "choices": ["Yes", "Yes, always"]}),
            "both begin with token",
        ),
        (
            serde_json::json!({"id": 9, "prefix": "p", "choices": ["A"], "sufix": "s"}),
            "unknown field \"sufix\"",
        ),
    ] {
        let (status, v) = post(&body);
        assert_eq!(status, 400, "{v}");
        assert_eq!(
            (v["id"].clone(), v["error"]["type"].clone()),
            (body["id"].clone(), "invalid_request".into())
        );
        assert!(
            v["error"]["message"].as_str().unwrap().contains(cause),
            "{v}"
        );
    }
    let (status, _, raw) = http(&addr, "POST", "/v1/decide", &json_h, b"{not json");
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&raw));
    let (_, _, metrics) = http(&addr, "GET", "/metrics", &[], b"");
    let metrics = String::from_utf8(metrics).unwrap();
    for line in [
        "onepass_prefix_cache_hits_total 2",
        "onepass_prefix_cache_misses_total 1",
        "onepass_prefix_cache_entries 2",
        "onepass_prefix_cache_capacity_bytes 67108864",
        "onepass_requests_total{route=\"/v1/decide\",status=\"200\"} 4",
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
    srv.stop();
    // Nothing kept: every step prefilled whole, the same answers within f32 rounding of the pieces.
    let mut srv = Server::start(dir.path(), &["--prefix-cache-mb", "0", "--quiet"]);
    let addr = srv.addr.clone();
    for (s, w) in steps.iter().zip(&want) {
        let (status, _, raw) = http(
            &addr,
            "POST",
            "/v1/decide",
            &json_h,
            s.to_string().as_bytes(),
        );
        assert_eq!(status, 200);
        let v: serde_json::Value = serde_json::from_slice(&raw).unwrap();
        assert_eq!(
            (v["n_reused"].as_u64(), v["best"].clone()),
            (Some(0), w["best"].clone())
        );
        for (a, b) in v["choice_logp"]
            .as_array()
            .unwrap()
            .iter()
            .zip(w["choice_logp"].as_array().unwrap())
        {
            assert!((a.as_f64().unwrap() - b.as_f64().unwrap()).abs() <= 1e-4);
        }
    }
    srv.stop();
}
