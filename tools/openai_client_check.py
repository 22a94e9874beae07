#!/usr/bin/env python3
"""The official `openai` Python client, unchanged, against `onepass serve`'s /v1/chat/completions and /v1/completions.

    python3 -m venv /work/venv-openai && /work/venv-openai/bin/pip install openai==2.54.0
    cargo build --release -p onepass
    /work/venv-openai/bin/python tools/openai_client_check.py [--onepass target/release/onepass] [--work DIR]

Writes a synthetic checkpoint (`onepass synth --preset tiny-qwen-vocab --tokenizer testdata/qwen3_5-tokenizer`: the
real Qwen3.5 vocabulary, and the synthetic ChatML chat template), starts `onepass serve` on it on a free loopback port,
and drives the client through: chat and completions, non-streamed and streamed (the streamed text equals the
non-streamed text, greedy), usage (prompt/completion/total tokens, also as the last chunk of a stream with
`stream_options.include_usage`), finish_reason `length` (max_tokens reached) and `stop` (a stop string cut from the
greedy text: the text ends before it), seeded sampling that reproduces (and another seed that does not), and bad
requests raised as `openai.BadRequestError` carrying the server's message. Prints one line per check and exits 1 on
the first failure. Not part of CI (it needs the `openai` package).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading

import openai

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        raise SystemExit(1)


def serve(onepass, model):
    srv = subprocess.Popen([onepass, "serve", "--model", model, "--port", "0", "--device", "cpu", "--quiet"],
                           stderr=subprocess.PIPE, text=True)
    for line in srv.stderr:
        m = re.search(r"listening on http://[^\s]+:(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in srv.stderr], daemon=True).start()
            return srv, int(m.group(1))
    raise SystemExit(f"onepass serve exited ({srv.wait()}) before it listened")


def streamed_chat(client, **kw):
    text, finish, usage, chunks = "", None, None, 0
    for c in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        chunks += 1
        if c.usage is not None:
            usage = c.usage
        for ch in c.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    return text, finish, usage, chunks


def streamed_completion(client, **kw):
    text, finish, usage, chunks = "", None, None, 0
    for c in client.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        chunks += 1
        if c.usage is not None:
            usage = c.usage
        for ch in c.choices:
            text += ch.text or ""
            finish = ch.finish_reason or finish
    return text, finish, usage, chunks


def usage_ok(u, n_max):
    return (u is not None and u.prompt_tokens > 0 and 0 < u.completion_tokens <= n_max
            and u.total_tokens == u.prompt_tokens + u.completion_tokens)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--onepass", default=os.path.join(ROOT, "target/release/onepass"))
    ap.add_argument("--work", default=None, help="folder for the checkpoint (default: a temporary one)")
    a = ap.parse_args()
    print(f"openai {openai.__version__}")
    work = a.work or tempfile.mkdtemp(prefix="onepass-openai-")
    ck = os.path.join(work, "tiny-qwen-vocab")
    if not os.path.isfile(os.path.join(ck, "config.json")):
        subprocess.run([a.onepass, "synth", "--preset", "tiny-qwen-vocab", "--tokenizer",
                        os.path.join(ROOT, "testdata/qwen3_5-tokenizer"), "--out", ck], check=True)
    srv, port = serve(a.onepass, ck)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-unused", max_retries=0)
        msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colours."}]
        n = 24

        # Chat, greedy: whole, then streamed.
        r = client.chat.completions.create(model="onepass", messages=msgs, max_tokens=n, temperature=0)
        text = r.choices[0].message.content
        check(r.object == "chat.completion" and r.choices[0].message.role == "assistant" and len(text) > 0,
              f"chat: {r.choices[0].finish_reason}, {r.usage.completion_tokens} tokens, {text[:40]!r}")
        check(usage_ok(r.usage, n), f"chat usage {r.usage.prompt_tokens}+{r.usage.completion_tokens}"
              f"={r.usage.total_tokens}")
        want_finish = "length" if r.usage.completion_tokens == n else "stop"
        check(r.choices[0].finish_reason == want_finish, f"chat finish_reason {want_finish}")
        s_text, s_finish, s_usage, chunks = streamed_chat(client, model="onepass", messages=msgs, max_tokens=n,
                                                          temperature=0)
        check(s_text == text, f"chat stream ({chunks} chunks) equals the whole text")
        check(s_finish == r.choices[0].finish_reason, "chat stream finish_reason")
        check(s_usage is not None and s_usage.model_dump() == r.usage.model_dump(), "chat stream usage chunk")

        # A stop string from the middle of the greedy text: cut before it, finish_reason stop.
        mid = len(text) // 2
        stop = text[mid:mid + 3]
        if len(stop.strip()) == 3:
            r2 = client.chat.completions.create(model="onepass", messages=msgs, max_tokens=n, temperature=0,
                                                stop=[stop])
            check(r2.choices[0].message.content == text[:text.find(stop)] and r2.choices[0].finish_reason == "stop",
                  f"chat stop {stop!r}: cut before it, finish_reason stop")
            s2, f2, _, _ = streamed_chat(client, model="onepass", messages=msgs, max_tokens=n, temperature=0,
                                         stop=stop)
            check(s2 == r2.choices[0].message.content and f2 == "stop", "chat stream stop (a string, not a list)")

        # Completions: whole, streamed, finish_reason length with max_tokens 1.
        prompt = "The capital of France is"
        c = client.completions.create(model="onepass", prompt=prompt, max_tokens=n, temperature=0)
        ctext = c.choices[0].text
        check(c.object == "text_completion" and usage_ok(c.usage, n),
              f"completion: {c.choices[0].finish_reason}, {c.usage.completion_tokens} tokens, {ctext[:40]!r}")
        cs, cf, cu, chunks = streamed_completion(client, model="onepass", prompt=prompt, max_tokens=n, temperature=0)
        check(cs == ctext and cf == c.choices[0].finish_reason, f"completion stream ({chunks} chunks) equals the whole")
        check(cu is not None and cu.model_dump() == c.usage.model_dump(), "completion stream usage chunk")
        one = client.completions.create(model="onepass", prompt=prompt, max_tokens=1, temperature=0)
        check(one.choices[0].finish_reason == "length" and one.usage.completion_tokens == 1,
              "completion max_tokens 1: finish_reason length")

        # Seeded sampling reproduces.
        samp = dict(model="onepass", messages=msgs, max_tokens=n, temperature=1.0, top_p=0.95)
        a1 = client.chat.completions.create(seed=7, **samp).choices[0].message.content
        a2 = client.chat.completions.create(seed=7, **samp).choices[0].message.content
        a3 = client.chat.completions.create(seed=8, **samp).choices[0].message.content
        st, _, _, _ = streamed_chat(client, seed=7, **samp)
        check(a1 == a2 == st, "seed 7 twice (and streamed): the same text")
        check(a1 != a3, "seed 8: another text")

        # Bad requests: the client's BadRequestError, with the server's message.
        for what, call, says in [
            ("max_tokens 0", lambda: client.chat.completions.create(model="onepass", messages=msgs, max_tokens=0),
             "max_tokens"),
            ("n 2", lambda: client.chat.completions.create(model="onepass", messages=msgs, n=2), "one choice"),
            ("no messages", lambda: client.chat.completions.create(model="onepass", messages=[]), "messages"),
            ("temperature -1", lambda: client.completions.create(model="onepass", prompt="x", temperature=-1),
             "temperature"),
            ("stream, max_tokens 0",
             lambda: list(client.chat.completions.create(model="onepass", messages=msgs, max_tokens=0, stream=True)),
             "max_tokens"),
        ]:
            try:
                call()
                check(False, f"{what}: refused")
            except openai.BadRequestError as e:
                msg = e.body.get("message", "") if isinstance(e.body, dict) else str(e)
                check(e.status_code == 400 and says in msg, f"{what}: BadRequestError 400 {msg!r}")
        print("all checks passed")
    finally:
        srv.terminate()
        srv.wait()


if __name__ == "__main__":
    main()
