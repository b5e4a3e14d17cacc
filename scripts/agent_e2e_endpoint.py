#!/usr/bin/env python3
"""A scripted OpenAI-compatible chat endpoint for scripts/agent_e2e.sh (python3 stdlib only).

Serves POST /v1/chat/completions from a replies file (scripts/agent_e2e_replies.json), one
reply per request in order: {"choices": [...], "usage": {...}} becomes a chat completion,
{"status": 429, "retry_after": 1} an error with Retry-After. Past the last reply: 503.
Each request is appended to --log as one JSON line (model, n, prompt sha256, whether the
prompt held the template and the diagnosis), never the whole prompt.
"""
import argparse
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replies", required=True)
    ap.add_argument("--port-file", required=True, help="the chosen port is written here once listening")
    ap.add_argument("--log", required=True)
    args = ap.parse_args()
    replies = json.load(open(args.replies))["replies"]
    lock = threading.Lock()
    state = {"next": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def send(self, code, body, headers=()):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != "/v1/chat/completions":
                return self.send(404, {"error": f"no route {self.path}"})
            req = json.loads(body)
            user = "".join(m.get("content", "") for m in req.get("messages", []))
            with lock:
                i = state["next"]
                state["next"] += 1
                with open(args.log, "a") as f:
                    f.write(json.dumps({
                        "request": i + 1, "model": req.get("model"), "n": req.get("n"),
                        "prompt_sha256": hashlib.sha256(body).hexdigest(), "prompt_chars": len(user),
                        "has_template": "optimizerd:spec" in user and "baseline_fwd" in user,
                        "has_diagnosis": "Diagnosis" in user, "has_rules": "Include only" in user,
                    }) + "\n")
            if i >= len(replies):
                return self.send(503, {"error": "script exhausted"})
            r = replies[i]
            if "status" in r:
                return self.send(r["status"], {"error": "scripted"}, [("Retry-After", str(r.get("retry_after", 1)))])
            choices = [{"index": k, "message": {"role": "assistant", "content": c}, "finish_reason": "stop"} for k, c in enumerate(r["choices"])]
            u = r.get("usage", {})
            self.send(200, {"id": f"e2e-{i + 1}", "object": "chat.completion", "model": req.get("model"), "choices": choices,
                            "usage": {**u, "total_tokens": u.get("prompt_tokens", 0) + u.get("completion_tokens", 0)}})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(args.port_file, "w") as f:
        f.write(str(server.server_address[1]))
    server.serve_forever()


if __name__ == "__main__":
    main()
