#!/usr/bin/env python3
"""Run llama.cpp's llama-server with a DFlash GGUF drafter on a few prompts and write what it did.

Used by scripts/llamacpp-e2e.sh (docs/traces.md §7). Standard library only.

    capture.py --server BUILD/bin/llama-server --target TARGET.gguf --drafter DRAFTER.gguf \\
        --prompts data/prompts/humaneval.jsonl --limit 8 --max-new-tokens 64 --out DIR

The server is started with LLAMA_TRACE=1, which makes it log every verify round of a slot
("accepted  A/ D draft tokens", vendor/llama.cpp/tools/server/server-context.cpp), and each prompt is sent on its
own, one after the other: the chat messages rendered by the server's own template
(`/apply-template`, the target GGUF's tokenizer.chat_template), then the native `/completion`
with `return_tokens`, greedy. Written to --out:

    llamacpp.jsonl   the `/completion` response bodies as the server returned them, each with the
                     "prompt_id" key added (`draftlens trace import --format llamacpp`)
    rounds.jsonl     the same requests in draftlens's neutral JSONL (`--format jsonl`): the
                     generated ids and the tokens each verify round committed, in decode order,
                     from the server's round log
    server.log       the server's log

The round log and the response must agree: per request, the accepted drafts of the logged rounds
add up to the response's timings.draft_n_accepted, else this stops with an error. A decode step
that drafted nothing is not logged; llama.cpp drafts at every step while the token budget allows
a draft, so such steps are the last ones of a request (its final token, when the budget leaves no
room for a draft): they are one-token rounds appended at the end.
"""

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

ROUND = re.compile(r"accepted +(\d+)/ *(\d+) draft tokens")
STOP = "stop processing"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, timeout=600):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_healthy(url, proc, log_path, seconds=300):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"capture: llama-server exited with status {proc.returncode} while loading; its log: {log_path}\n"
                     + open(log_path, errors="replace").read()[-3000:])
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    sys.exit(f"capture: llama-server not healthy after {seconds} s; its log: {log_path}")


def rounds_per_request(log_text, n_requests):
    """The accepted-draft counts of each request's rounds, in order: rounds are logged between
    one request's start and its slot's "stop processing" line; requests run one at a time."""
    per_request, current = [], []
    for line in log_text.splitlines():
        m = ROUND.search(line)
        if m:
            if "restore checkpoint" in line:
                sys.exit("capture: the server restored a checkpoint after a partial acceptance (a target "
                         "without partial KV removal): its rounds are logged twice; not handled here")
            current.append(int(m.group(1)))
        elif STOP in line:
            per_request.append(current)
            current = []
    if len(per_request) != n_requests:
        sys.exit(f"capture: the server log holds {len(per_request)} finished requests, expected {n_requests}")
    return per_request


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--prompts", required=True, help="a prompt set JSONL (id, messages)")
    ap.add_argument("--limit", type=int, required=True)
    ap.add_argument("--max-new-tokens", type=int, required=True)
    ap.add_argument("--draft-max", type=int, default=15, help="γ: the drafter's block size - 1")
    # One thread: the model is tiny, and llama.cpp's worker threads spin while they wait, which on
    # a busy machine made 2 threads 3x slower than 1 (measured here; docs/traces.md §7).
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    prompts = [json.loads(line) for line in open(a.prompts) if line.strip()][: a.limit]
    os.makedirs(a.out, exist_ok=True)
    log_path = os.path.join(a.out, "server.log")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        a.server, "-m", a.target, "-md", a.drafter, "--spec-type", "draft-dflash",
        # The full block, as draftlens drafts it: no early stop on the drafter's confidence
        # (p_min, 0.75 by default) and no minimum.
        "--spec-draft-n-max", str(a.draft_max), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0",
        "-c", "2048", "-np", "1", "-t", str(a.threads), "-tb", str(a.threads),
        "-td", str(a.threads), "--host", "127.0.0.1", "--port", str(port), "--no-warmup",
    ]
    env = dict(os.environ, LLAMA_TRACE="1")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_healthy(url, proc, log_path)
        responses = []
        for p in prompts:
            prompt = post(url + "/apply-template", {"messages": p["messages"]})["prompt"]
            body = {
                "prompt": prompt, "n_predict": a.max_new_tokens, "temperature": 0.0, "top_k": 1,
                "return_tokens": True, "cache_prompt": False, "stream": False, "seed": 0,
            }
            r = post(url + "/completion", body)
            r["prompt_id"] = p["id"]
            responses.append(r)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    rounds = rounds_per_request(open(log_path, errors="replace").read(), len(responses))
    with open(os.path.join(a.out, "llamacpp.jsonl"), "w") as f:
        for r in responses:
            f.write(json.dumps(r) + "\n")
    with open(os.path.join(a.out, "rounds.jsonl"), "w") as f:
        for r, accepted in zip(responses, rounds):
            tokens = r["tokens"]
            reported = r.get("timings", {}).get("draft_n_accepted", 0)
            if sum(accepted) != reported:
                sys.exit(f"capture: {r['prompt_id']}: the logged rounds accept {sum(accepted)} drafts, "
                         f"the response's timings.draft_n_accepted says {reported}")
            committed = [k + 1 for k in accepted]
            rest = len(tokens) - 1 - sum(committed)
            if rest < 0:
                sys.exit(f"capture: {r['prompt_id']}: the logged rounds commit {sum(committed)} tokens, "
                         f"more than the {len(tokens) - 1} after the prefill token")
            committed += [1] * rest
            f.write(json.dumps({"prompt_id": r["prompt_id"], "token_ids": tokens, "rounds": committed,
                                "block_size": a.draft_max + 1}) + "\n")
    drafted = sum(r.get("timings", {}).get("draft_n", 0) for r in responses)
    accepted = sum(r.get("timings", {}).get("draft_n_accepted", 0) for r in responses)
    print(f"capture: {len(responses)} requests, {sum(len(r['tokens']) for r in responses)} tokens, "
          f"{sum(len(x) for x in rounds)} logged rounds, {accepted}/{drafted} drafts accepted")


if __name__ == "__main__":
    main()
