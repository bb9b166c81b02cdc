"""Diagnosis and the recording proxy (docs/diagnose.md).

1. A JSONL log of 200 requests of about 20k tokens each (an agent session that grows by a tool
   round per request, with a nonce in the system prompt every 10th request and the tools
   reordered once), diagnosed through `python -m checks diagnose` as a user runs it (interpreter
   start, parsing, the sandbox, every render compiled once), and through the library with a warm
   pool (the service's case).
2. The proxy in front of a local stub upstream: per request, the time to the last byte straight
   to the stub and through the proxy (without and with `--template`), streamed and not;
   medians and p90 of the difference, same run.

Run: `make bench BENCH=diagnose`.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx2  # noqa: E402

from checks import SandboxPool, TemplateSource, diagnose_requests, parse_text  # noqa: E402
from checks.proxy import drain, serve  # noqa: E402

CHATML = (
    "{%- if tools %}<|im_start|>system\n{{ tools | tojson }}<|im_end|>\n{% endif -%}\n"
    "{%- for m in messages -%}\n"
    "<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>"
    "{% endfor -%}"
    "<|im_end|>\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}\n"
)
SENTENCE = "the agent reads the file and runs the tests before it edits the code again"
WORDS = SENTENCE.split(" ")


def session(requests: int = 200, tokens: int = 20_000) -> list[dict[str, Any]]:
    """Requests that grow to about `tokens` tokens (~4 characters each) by the last one."""
    tools = [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in ("read", "run", "edit")
    ]
    base = " ".join(WORDS[i % len(WORDS)] for i in range(tokens // 2))  # ~half the budget
    system = f"You are a coding agent. cch=00000;\n{base}"
    step = " ".join(WORDS[i % len(WORDS)] for i in range(tokens // (2 * requests)))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Fix the failing test."},
    ]
    bodies = []
    for k in range(requests):
        sent = [dict(m) for m in messages]
        if k % 10 == 9:
            sent[0] = {"role": "system", "content": system.replace("00000", f"{k:05d}")}
        bodies.append(
            {"model": "m", "messages": sent, "tools": list(reversed(tools)) if k == 100 else tools}
        )
        messages += [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": f"c{k}",
                        "type": "function",
                        "function": {"name": "run", "arguments": {"cmd": "pytest"}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"c{k}", "content": f"step {k}: {step}"},
        ]
    return bodies


def bench_diagnosis() -> None:
    bodies = session()
    sizes = [len(json.dumps(b)) for b in bodies]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "requests.jsonl"
        log.write_text("".join(json.dumps(b) + "\n" for b in bodies))
        template = Path(tmp) / "chat_template.jinja"
        template.write_text(CHATML)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        tic = time.perf_counter()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "checks",
                "diagnose",
                str(log),
                "--template",
                str(template),
                "--json",
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            check=False,
        )
        cli_wall = time.perf_counter() - tic
    if done.returncode != 0:
        raise SystemExit(f"diagnose failed: {done.stderr}")
    pairs = json.loads(done.stdout)["pairs"]
    causes: dict[str, int] = {}
    for pair in pairs:
        causes[pair["cause"]] = causes.get(pair["cause"], 0) + 1
    print(
        f"1. {len(bodies)} requests, the last {sizes[-1] / 1024:.0f} KiB of JSON "
        f"(~{sizes[-1] // 4:,} tokens at 4 characters a token)"
    )
    print(f"   CLI (cold: interpreter, parsing, sandbox start): {cli_wall:.2f} s wall")
    print(f"   causes found: {dict(sorted(causes.items()))}")
    pool = SandboxPool(size=1)
    source = TemplateSource({"default": CHATML})
    requests = parse_text("\n".join(json.dumps(b) for b in bodies), "log")
    diagnose_requests(source, requests[:2], pool=pool)  # start the worker
    walls = []
    for _ in range(3):
        tic = time.perf_counter()
        diagnose_requests(source, requests, pool=pool)
        walls.append(time.perf_counter() - tic)
    pool.close()
    print(
        f"   library, warm pool: median {statistics.median(walls):.2f} s of 3 "
        f"({1000 * statistics.median(walls) / len(bodies):.1f} ms a request)"
    )


ANSWER = json.dumps(
    {
        "choices": [{"message": {"content": "ok"}}],
        "usage": {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 5}},
    }
).encode()
STREAM = (
    "".join(
        f"data: {json.dumps({'choices': [{'delta': {'content': str(i)}}]})}\n\n" for i in range(20)
    )
    + "data: [DONE]\n\n"
).encode()


class Stub(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        data = STREAM if body.get("stream") else ANSWER
        self.send_response(200)
        self.send_header(
            "Content-Type", "text/event-stream" if body.get("stream") else "application/json"
        )
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def start(server: ThreadingHTTPServer) -> str:
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.server_address[:2]
    return f"http://{host!s}:{port}"


def timed(client: httpx2.Client, url: str, body: dict[str, Any]) -> float:
    tic = time.perf_counter()
    with client.stream("POST", url, json=body) as answer:
        for _ in answer.iter_raw():
            pass
    return (time.perf_counter() - tic) * 1000


def bench_proxy(rounds: int = 200) -> None:
    stub = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    upstream = start(stub)
    bodies = session(requests=rounds, tokens=4_000)
    pool = SandboxPool(size=1)
    print(f"2. proxy in front of a local stub, {rounds} requests each way, one client")
    for label, template in (
        ("client side only", None),
        ("with --template", TemplateSource({"default": CHATML})),
    ):
        proxy = serve(upstream, ("127.0.0.1", 0), template=template, out=io.StringIO(), pool=pool)
        through = start(proxy)
        for stream in (False, True):
            direct, proxied = [], []
            with httpx2.Client() as client:
                for body in bodies[:5]:  # warm both paths
                    timed(client, upstream + "/v1/chat/completions", {**body, "stream": stream})
                for body in bodies:
                    request = {**body, "stream": stream}
                    direct.append(timed(client, upstream + "/v1/chat/completions", request))
                    proxied.append(timed(client, through + "/v1/chat/completions", request))
            added = sorted(p - d for p, d in zip(proxied, direct, strict=True))
            print(
                f"   {label:<17} {'streamed' if stream else 'JSON':<8}  direct p50 "
                f"{statistics.median(direct):5.2f} ms, through the proxy p50 "
                f"{statistics.median(proxied):5.2f} ms: added p50 "
                f"{statistics.median(added):5.2f} ms, p90 {added[int(0.9 * len(added))]:5.2f} ms"
            )
        drain(proxy)
        proxy.shutdown()
        proxy.server_close()
    pool.close()
    stub.shutdown()
    stub.server_close()


def main() -> None:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{os.cpu_count()} cores, load average {load}")
    bench_diagnosis()
    bench_proxy()


if __name__ == "__main__":
    main()
