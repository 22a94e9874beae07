//! What the CLI's end-to-end tests share: the binary, `onepass tokenize` fed on stdin, a synthetic checkpoint with the
//! real tokenizer, `onepass serve` started on a free port, and one raw HTTP/1.1 request to it.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The `onepass` binary under test.
pub fn onepass() -> Command {
    Command::new(env!("CARGO_BIN_EXE_onepass"))
}

/// `onepass tokenize --model MODEL` with `input` on stdin.
pub fn tokenize(model: &std::path::Path, input: &[u8]) -> std::process::Output {
    let mut child = onepass()
        .args(["tokenize", "--model"])
        .arg(model)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input)
        .expect("write");
    child.wait_with_output().expect("wait")
}

/// A synthetic checkpoint (`tiny-qwen-vocab`) with the real Qwen3.5 tokenizer (testdata/qwen3_5-tokenizer, made by
/// tools/setup-testdata.sh).
pub fn checkpoint() -> tempfile::TempDir {
    let tok = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/qwen3_5-tokenizer");
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
    dir
}

/// One HTTP/1.1 request on a fresh connection → (status, lower-cased head, body).
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("response head");
    let head = String::from_utf8_lossy(&raw[..split]).to_lowercase();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head, raw[split + 4..].to_vec())
}

/// `onepass serve` on a free port, its stderr collected (`log`, then `rx`); killed on drop if it still runs.
pub struct Server {
    pub child: std::process::Child,
    pub addr: String,
    pub rx: mpsc::Receiver<String>,
    reader: Option<std::thread::JoinHandle<()>>,
    pub log: Vec<String>,
}

impl Server {
    /// Starts the server over `dir` and waits until /health answers ok.
    pub fn start(dir: &std::path::Path, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_onepass"))
            .args(["serve", "--model", dir.to_str().unwrap(), "--port", "0"])
            .args(extra)
            .env_remove("ONEPASS_API_KEY")
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel::<String>();
        let stderr = child.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut log = Vec::new();
        let addr = loop {
            let line = rx
                .recv_timeout(Duration::from_secs(120))
                .expect("no 'listening on' line from onepass serve");
            log.push(line.clone());
            if let Some(a) = line.split("listening on http://").nth(1) {
                break a.trim().to_string();
            }
        };
        let t0 = Instant::now();
        loop {
            let (status, _, body) = http(&addr, "GET", "/health", &[], b"");
            if status == 200 && body.starts_with(br#"{"ok":true"#) {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "/health never became ok"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Server {
            child,
            addr,
            rx,
            reader: Some(reader),
            log,
        }
    }

    /// Sends SIGTERM (no wait).
    pub fn term(&self) {
        let pid = self.child.id() as i32;
        // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    }

    /// SIGTERM, then waits for a clean exit (status 0 within 30 s). → the whole stderr
    pub fn stop(&mut self) -> String {
        self.term();
        self.wait()
    }

    /// Waits for the exit after a SIGTERM and checks it is clean. → the whole stderr
    pub fn wait(&mut self) -> String {
        let status = self.exit_status("onepass serve did not exit after SIGTERM");
        if let Some(r) = self.reader.take() {
            r.join().unwrap();
        }
        self.log.extend(self.rx.try_iter());
        let log = self.log.join("\n");
        assert!(status.success(), "exit status {status:?}; stderr:\n{log}");
        log
    }

    /// Waits up to 30 s for the process to exit (`what`: the failure message otherwise). → its status
    pub fn exit_status(&mut self, what: &str) -> ExitStatus {
        let t0 = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "{what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
