"""Start `onepass serve` on a free port for a benchmark and read back the port it bound (shared by soak.py and
state_rss.py)."""
import argparse
import re
import subprocess
import threading


def serve_parser():
    """An argument parser holding what start_serve takes: --onepass, --model, and the arguments after `--` (for
    `onepass serve`). A benchmark adds its own options to it."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--onepass", default="target/release/onepass")
    ap.add_argument("--model", required=True)
    ap.add_argument("serve_args", nargs="*")
    return ap


def start_serve(onepass, model, serve_args):
    """→ (process, port). The server's stderr is drained in the background after the listening line."""
    srv = subprocess.Popen([onepass, "serve", "--model", model, "--port", "0", "--quiet", *serve_args],
                           stderr=subprocess.PIPE, text=True)
    port = None
    for line in srv.stderr:
        m = re.search(r"listening on http://[^\s]+:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        raise SystemExit(f"onepass serve exited ({srv.wait()}) before it listened")
    threading.Thread(target=lambda: [None for _ in srv.stderr], daemon=True).start()
    return srv, port
