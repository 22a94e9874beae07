//! docs/api.md is true: every `curl` example in it is sent, as curl would send it, to a real `onepass serve` on a
//! synthetic checkpoint with the real Qwen3.5 tokenizer, and the answer is checked against the response shown under
//! it. A synthetic model's probabilities mean nothing, so for a 200 JSON answer the check is structural: the same
//! keys in the same order at every level, the same kind of value (string, integer, float, ...), equal strings (but
//! the chosen name and the machine-dependent `/health` fields) and equal integers (token counts); an error answer
//! must be the shown body byte for byte, and a text answer (`/metrics`) must hold every metric the doc shows.
//! Needs testdata/qwen3_5-tokenizer (tools/setup-testdata.sh).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One example of the doc: the curl command and the response shown under it.
#[derive(Debug)]
struct Example {
    line: usize,
    curl: String,
    /// The response block's language (`json`, `text`).
    lang: String,
    status: u16,
    /// Which test server answers it (`server=NAME` in the block's info string; default `default`).
    server: String,
    expected: String,
}

/// The ```sh blocks that are one curl command, each followed by a ```LANG status=N [server=S] block.
fn examples(doc: &str) -> Vec<Example> {
    let mut blocks = Vec::new(); // (line, info, body)
    let mut lines = doc.lines().enumerate();
    while let Some((i, l)) = lines.next() {
        if let Some(info) = l.strip_prefix("```") {
            let mut body = Vec::new();
            for (_, l) in lines.by_ref() {
                if l.starts_with("```") {
                    break;
                }
                body.push(l);
            }
            blocks.push((i + 1, info.trim().to_string(), body.join("\n")));
        }
    }
    let mut out = Vec::new();
    for (k, (line, info, body)) in blocks.iter().enumerate() {
        if info != "sh" || !body.trim_start().starts_with("curl ") {
            continue;
        }
        let (_, rinfo, expected) = blocks.get(k + 1).unwrap_or_else(|| {
            panic!("docs/api.md:{line}: a curl example without a response block")
        });
        let mut words = rinfo.split_whitespace();
        let lang = words.next().unwrap_or("").to_string();
        let attrs: BTreeMap<&str, &str> = words.filter_map(|w| w.split_once('=')).collect();
        let status = attrs
            .get("status")
            .unwrap_or_else(|| panic!("docs/api.md:{line}: the response block says no status=N"))
            .parse()
            .unwrap();
        out.push(Example {
            line: *line,
            curl: body.trim().to_string(),
            lang,
            status,
            server: attrs.get("server").unwrap_or(&"default").to_string(),
            expected: expected.clone(),
        });
    }
    out
}

/// Shell words of one command line: single and double quotes, no expansions.
fn shell_words(s: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    cur.push(c);
                }
            }
            '"' => {
                in_word = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => cur.push(chars.next().unwrap()),
                        c => cur.push(c),
                    }
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    words
}

/// What curl sends for `curl -s [-H 'K: V']... [-d DATA] HOST:PORT/PATH`: (method, path, headers, body).
/// `-d @FILE` reads FILE (from the repository root) and drops its line breaks, as curl does.
fn curl_request(cmd: &str) -> (String, String, Vec<(String, String)>, Vec<u8>) {
    let words = shell_words(cmd);
    assert_eq!(words[0], "curl", "{cmd}");
    let (mut headers, mut body, mut path, mut method) = (Vec::new(), None, None, None);
    let mut it = words[1..].iter();
    while let Some(w) = it.next() {
        match w.as_str() {
            "-s" => {}
            "-H" => {
                let h = it.next().unwrap();
                let (k, v) = h.split_once(':').unwrap();
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
            "-X" => method = Some(it.next().unwrap().clone()),
            "-d" => {
                let d = it.next().unwrap();
                let bytes = match d.strip_prefix('@') {
                    Some(f) => std::fs::read(repo().join(f))
                        .unwrap_or_else(|e| panic!("{cmd}: {f}: {e}"))
                        .into_iter()
                        .filter(|b| *b != b'\n' && *b != b'\r')
                        .collect(),
                    None => d.as_bytes().to_vec(),
                };
                body = Some(bytes);
            }
            url => {
                let rest = url.strip_prefix("http://").unwrap_or(url);
                assert!(
                    rest.starts_with("localhost:8000/"),
                    "{cmd}: the examples use localhost:8000"
                );
                path = Some(rest["localhost:8000".len()..].to_string());
            }
        }
    }
    if body.is_some() {
        headers.push((
            "Content-Type".into(),
            "application/x-www-form-urlencoded".into(),
        ));
    }
    let method = method.unwrap_or_else(|| if body.is_some() { "POST" } else { "GET" }.into());
    (
        method,
        path.expect("a URL"),
        headers,
        body.unwrap_or_default(),
    )
}

/// One HTTP/1.1 request on a fresh connection → (status, body).
fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> (u16, Vec<u8>) {
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let (status, _head, body) = common::http(addr, method, path, &headers, body);
    // The server answers with Content-Length, never chunked, on these routes.
    (status, body)
}

/// `onepass serve` over `dir` with `args` on a free port; stopped (killed) on drop.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(dir: &Path, args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_onepass"))
            .args([
                "serve", "--device", "cpu", "--quiet", "--port", "0", "--model",
            ])
            .arg(dir)
            .args(args)
            .env_remove("ONEPASS_API_KEY")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                if let Some(a) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(a.trim().to_string());
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(180))
            .expect("onepass serve never said 'listening on'");
        let t0 = Instant::now();
        while !http(&addr, "GET", "/health", &[], b"")
            .1
            .starts_with(br#"{"ok":true"#)
        {
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "/health never became ok"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Server { child, addr }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A synthetic checkpoint with the real tokenizer and `decider_config.json` = `config`.
fn checkpoint(config: &str) -> tempfile::TempDir {
    let tok = repo().join("testdata/qwen3_5-tokenizer");
    assert!(
        tok.join("tokenizer.json").is_file(),
        "{} is missing: run tools/setup-testdata.sh to build the Qwen3.5 test tokenizer",
        tok.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let spec = onepass_model::synth::preset("tiny-qwen-vocab").unwrap();
    onepass_model::synth::write_checkpoint(&spec, dir.path(), &mut |_, _| {}).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tok.join(f), dir.path().join(f)).unwrap();
    }
    std::fs::write(dir.path().join("decider_config.json"), config).unwrap();
    // ChatML, for the generation routes' examples (System One's plain layout does not read it).
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}\
         {%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
    )
    .unwrap();
    dir
}

/// `got` has `want`'s shape (see the file's doc); `loose` strings may differ. → the first difference
fn same_shape(want: &Value, got: &Value, at: &str, loose: &[&str]) -> Result<(), String> {
    let key = at.rsplit('.').next().unwrap_or("");
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            let (wk, gk): (Vec<_>, Vec<_>) = (w.keys().collect(), g.keys().collect());
            if wk != gk {
                return Err(format!(
                    "{at}: keys {wk:?} in the doc, {gk:?} from the server"
                ));
            }
            for (k, v) in w {
                same_shape(v, &g[k], &format!("{at}.{k}"), loose)?;
            }
            Ok(())
        }
        (Value::Array(w), Value::Array(g)) if w.len() == g.len() => w
            .iter()
            .zip(g)
            .enumerate()
            .try_for_each(|(i, (w, g))| same_shape(w, g, &format!("{at}[{i}]"), loose)),
        (Value::String(w), Value::String(g)) if w == g || loose.contains(&key) => Ok(()),
        (Value::Number(w), Value::Number(g)) if w.is_f64() && g.is_f64() => Ok(()),
        (Value::Number(w), Value::Number(g)) if !w.is_f64() && (w == g || loose.contains(&key)) => {
            Ok(())
        }
        (Value::Bool(w), Value::Bool(g)) if w == g => Ok(()),
        (Value::Null, Value::Null) => Ok(()),
        _ => Err(format!("{at}: {want} in the doc, {got} from the server")),
    }
}

#[test]
fn every_example_in_docs_api_md_is_what_the_server_answers() {
    let doc = std::fs::read_to_string(repo().join("docs/api.md")).unwrap();
    let examples = examples(&doc);
    assert!(examples.len() >= 15, "{} examples", examples.len());
    // Every example request file is shown in the doc.
    for e in std::fs::read_dir(repo().join("examples/api")).unwrap() {
        let name = format!("examples/api/{}", e.unwrap().file_name().to_string_lossy());
        assert!(
            examples.iter().any(|x| x.curl.contains(&name)),
            "docs/api.md shows no example with {name}"
        );
    }
    let plain = checkpoint(r#"{"version": "0.8b"}"#);
    let isolated = checkpoint(r#"{"version": "0.8b", "isolated_levels": true}"#);
    let servers: BTreeMap<&str, Server> = [
        ("default", Server::start(plain.path(), &[])),
        ("isolated", Server::start(isolated.path(), &[])),
        (
            "limited",
            Server::start(plain.path(), &["--api-key", "sk-local", "--max-rows", "2"]),
        ),
    ]
    .into_iter()
    .collect();
    let mut failures = Vec::new();
    for ex in &examples {
        let srv = servers
            .get(ex.server.as_str())
            .unwrap_or_else(|| panic!("docs/api.md:{}: no test server {:?}", ex.line, ex.server));
        let (method, path, headers, body) = curl_request(&ex.curl);
        let (status, got) = http(&srv.addr, &method, &path, &headers, &body);
        let got = String::from_utf8(got).unwrap();
        let fail = |why: String| format!("docs/api.md:{} `{}`: {why}", ex.line, ex.curl);
        if status != ex.status {
            failures.push(fail(format!(
                "status {status}, the doc says {}; body {got}",
                ex.status
            )));
            continue;
        }
        match (ex.lang.as_str(), status) {
            ("json", 200) => {
                let want: Value = serde_json::from_str(&ex.expected).unwrap_or_else(|e| {
                    panic!(
                        "docs/api.md:{}: the shown response is not JSON: {e}",
                        ex.line
                    )
                });
                let got: Value = serde_json::from_str(&got).unwrap();
                // Generated text, ids and times differ from run to run of the doc's made-up examples.
                let loose: &[&str] = if path == "/health" {
                    &["model", "device"]
                } else if path.ends_with("/completions") {
                    &["id", "created", "model", "content", "text"]
                } else {
                    &["choice"]
                };
                if let Err(why) = same_shape(&want, &got, "", loose) {
                    failures.push(fail(why));
                }
            }
            ("json", _) => {
                if got != ex.expected.trim() {
                    failures.push(fail(format!("the server answers {got}")));
                }
            }
            ("text", _) => {
                for l in ex.expected.lines().map(str::trim).filter(|l| !l.is_empty()) {
                    let ok = if l.starts_with('#') {
                        got.lines().any(|g| g == l)
                    } else {
                        let name = l.split(['{', ' ']).next().unwrap();
                        got.lines()
                            .any(|g| g.split(['{', ' ']).next() == Some(name))
                    };
                    if !ok {
                        failures.push(fail(format!("no line like {l:?} in the answer")));
                    }
                }
            }
            (lang, _) => panic!("docs/api.md:{}: response block language {lang:?}", ex.line),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The checker itself: a doc response with a key the server lacks, a key order the server does not use, an integer
/// where the server sends a float, or a changed message is a difference.
#[test]
fn the_shape_check_finds_differences() {
    let got: Value =
        serde_json::from_str(r#"{"a":{"type":"score","score":1.5,"n":3,"choice":"x"}}"#).unwrap();
    let ok: Value =
        serde_json::from_str(r#"{"a":{"type":"score","score":0.25,"n":3,"choice":"y"}}"#).unwrap();
    assert_eq!(same_shape(&ok, &got, "", &["choice"]), Ok(()));
    for bad in [
        r#"{"a":{"type":"score","score":1.5,"n":3}}"#,
        r#"{"a":{"score":1.5,"type":"score","n":3,"choice":"x"}}"#,
        r#"{"a":{"type":"score","score":1,"n":3,"choice":"x"}}"#,
        r#"{"a":{"type":"score","score":1.5,"n":4,"choice":"x"}}"#,
        r#"{"a":{"type":"noul","score":1.5,"n":3,"choice":"x"}}"#,
    ] {
        let want: Value = serde_json::from_str(bad).unwrap();
        assert!(same_shape(&want, &got, "", &["choice"]).is_err(), "{bad}");
    }
    let (m, p, h, b) = curl_request(
        r#"curl -s -H 'Authorization: Bearer k' localhost:8000/v1/systemone -d '{"state": "a b"}'"#,
    );
    assert_eq!((m.as_str(), p.as_str()), ("POST", "/v1/systemone"));
    assert_eq!(h[0], ("Authorization".to_string(), "Bearer k".to_string()));
    assert_eq!(b, br#"{"state": "a b"}"#);
    assert_eq!(curl_request("curl -s localhost:8000/health").0, "GET");
}
