#!/usr/bin/env bash
# sil-openai benchmark: the latency the HTTP bridge adds over talking to siliceod's socket
# directly, in the same run on the same daemon.
#   latency per streamed token: a second bridge talks to a stand-in daemon played by this script,
#     which sends one token notification and times until its SSE chunk arrives on the HTTP side,
#     token after token (nothing batched); the direct figure is the same notification over one
#     Unix socket hop. added = bridge - direct, medians.
#   throughput per token: the real daemon's debug.stream (no model) of N pieces read raw from the
#     socket vs as SSE through POST /v1/debug/stream (sil-openai --debug-stream).
#   per request: one debug.stream of 0 pieces, and one real chat of 1 token on the tiny model,
#     on a fresh daemon connection vs through the bridge on a kept-alive HTTP connection,
#     alternating request by request.
# Clients are minimal Python readers of raw bytes, so neither side pays for a full parser.
#
# usage: bench/run-openai.sh [MODEL.gguf]   (default $SHARED/refdata/models/qwen3-tiny-Q8_0.gguf)
# Environment: B (build dir), RUNS (default 5), TOKENS (pieces per stream, default 20000),
#              REQUESTS (per run, default 300), MACHINE (default vm), OUT (results file).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SHARED=${SHARED:-$(cd "$ROOT/.." && pwd)/shared}
model=${1:-$SHARED/refdata/models/qwen3-tiny-Q8_0.gguf}
B=${B:-build}
RUNS=${RUNS:-5}
TOKENS=${TOKENS:-20000}
REQUESTS=${REQUESTS:-300}
MACHINE=${MACHINE:-vm}
OUT=${OUT:-bench/results/openai-$MACHINE-$(date -u +%Y%m%d).json}
[ -f "$model" ] || { echo "run-openai.sh: no model at $model" >&2; exit 1; }
make -s B="$B" "$B/bin/siliceod" "$B/bin/sil-openai" >&2

tmp=$(mktemp -d)
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
sock=$tmp/siliceod.sock
printf 'threads = 2\nlog_level = warning\n' > "$tmp/siliceod.conf"
"$B/bin/siliceod" --config "$tmp/siliceod.conf" --socket "$sock" --model "$model" 2> "$tmp/daemon.log" &
pids+=($!)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$B/bin/sil-openai" --socket "$sock" --port "$port" --debug-stream 2> "$tmp/openai.log" &
pids+=($!)
fake=$tmp/fake.sock
port2=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$B/bin/sil-openai" --socket "$fake" --port "$port2" 2> "$tmp/openai2.log" &
pids+=($!)
for _ in $(seq 300); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health" || true)" = 200 ] && break
    sleep 0.1
done

python3 - "$sock" "$port" "$RUNS" "$TOKENS" "$REQUESTS" "$model" "$OUT" "$0 $*" "$fake" "$port2" <<'PY'
import datetime, json, os, socket, statistics, struct, subprocess, sys, time
sys.path.insert(0, "tests/integration")
from siltest import pack, unpack, Incomplete
sock_path, port, runs, N, R, model, out, command, fake_path, port2 = sys.argv[1:11]
port, runs, N, R, port2 = int(port), int(runs), int(N), int(R), int(port2)
K = 2000  # tokens timed one by one per run

def read_msg(c, buf):
    while True:
        try:
            o, n = unpack(buf)
            return o, buf[n:]
        except Incomplete:
            d = c.recv(1 << 16)
            if not d:
                raise RuntimeError("bridge closed the daemon connection")
            buf += d

def token_latency(fake):
    """One streamed chat through the bridge to the stand-in daemon: K single-token round trips."""
    h = socket.create_connection(("127.0.0.1", port2))
    h.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    b = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "stream": True}).encode()
    h.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(b), b))
    while True:
        c, _ = fake.accept()
        m, rest = read_msg(c, b"")
        if m[2] == "hello":
            c.sendall(pack([1, m[1], None, {"protocol": 1, "model": {"name": "stand-in"}, "capabilities": []}]))
            c.close()
            continue
        break
    mid = m[1]
    note = pack([2, "token", [{"id": mid, "text": "x", "ids": [1]}]])
    ts, hbuf = [], b""
    for i in range(K + 1):
        t = time.perf_counter()
        c.sendall(note)
        while b"\n\n" not in hbuf:
            hbuf += h.recv(1 << 16)
        ts.append((time.perf_counter() - t) * 1e6)
        hbuf = hbuf[hbuf.index(b"\n\n") + 2:]
    c.sendall(pack([1, mid, None, {"text": "x" * (K + 1), "stop_reason": "length", "n_prompt": 1, "n_generated": K + 1}]))
    while not hbuf.endswith(b"0\r\n\r\n"):
        hbuf = hbuf[-16:] + h.recv(1 << 16)
    c.close()
    h.close()
    return statistics.median(ts[1:])  # the first one also carries the HTTP headers

def hop_latency():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    note = pack([2, "token", [{"id": 1, "text": "x", "ids": [1]}]])
    ts = []
    for i in range(K):
        t = time.perf_counter()
        a.sendall(note)
        got = 0
        while got < len(note):
            got += len(b.recv(1 << 16))
        ts.append((time.perf_counter() - t) * 1e6)
    a.close(); b.close()
    return statistics.median(ts)

fake = socket.socket(socket.AF_UNIX)
fake.bind(fake_path)
fake.listen(8)
END = b"\x94\x01\x07\xc0"  # [1, 7, nil, ...]: the response to msgid 7

def direct(method, params):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock_path)
    s.sendall(pack([0, 7, method, params]))
    tail = b""
    while True:
        d = s.recv(1 << 16)
        if not d:
            raise RuntimeError("daemon closed")
        if END in tail + d:
            break
        tail = d[-8:]
    s.close()

class Http:
    def __init__(self):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    def post(self, path, body, stream):
        b = json.dumps(body).encode()
        self.s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(b), b))
        buf = b""
        if stream:  # chunked: ends with the zero-size chunk
            while not buf.endswith(b"0\r\n\r\n"):
                d = self.s.recv(1 << 16)
                if not d:
                    raise RuntimeError("bridge closed")
                buf = buf[-16:] + d
            return
        while b"\r\n\r\n" not in buf:
            buf += self.s.recv(1 << 16)
        head, _, rest = buf.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head[:200])
        n = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")][0].split(b":")[1])
        while len(rest) < n:
            rest += self.s.recv(1 << 16)

h = Http()
chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}
rchat = {"messages": chat["messages"], "max_tokens": 1, "grace_tokens": 0, "temperature": 0.0}
# warm-up
direct("debug.stream", {"count": 1000}); h.post("/v1/debug/stream", {"count": 1000}, True)
direct("chat", rchat); h.post("/v1/chat/completions", chat, False)
tok_d, tok_b, req_d, req_b, chat_d, chat_b, lat_b, lat_d = [], [], [], [], [], [], [], []
for r in range(runs):
    print("run %d/%d" % (r + 1, runs), file=sys.stderr)
    t = time.perf_counter(); direct("debug.stream", {"count": N}); tok_d.append((time.perf_counter() - t) / N * 1e6)
    t = time.perf_counter(); h.post("/v1/debug/stream", {"count": N}, True); tok_b.append((time.perf_counter() - t) / N * 1e6)
    lat_b.append(token_latency(fake))
    lat_d.append(hop_latency())
    def pair(fd, fb):
        td, tb = [], []
        for _ in range(R):
            t = time.perf_counter(); fd(); td.append((time.perf_counter() - t) * 1e6)
            t = time.perf_counter(); fb(); tb.append((time.perf_counter() - t) * 1e6)
        return statistics.median(td), statistics.median(tb)
    d, b = pair(lambda: direct("debug.stream", {"count": 0}),
                lambda: h.post("/v1/debug/stream", {"count": 0, "stream": False}, False))
    req_d.append(d); req_b.append(b)
    d, b = pair(lambda: direct("chat", rchat), lambda: h.post("/v1/chat/completions", chat, False))
    chat_d.append(d); chat_b.append(b)

def res(metric, config, vals, unit="us", **kw):
    d = {"metric": metric, "config": config, "value": round(statistics.median(vals), 2), "unit": unit,
         "runs": len(vals), "min": round(min(vals), 2), "max": round(max(vals), 2)}
    d.update(kw)
    return d

added_lat = [b - d for b, d in zip(lat_b, lat_d)]
added_tok = [b - d for b, d in zip(tok_b, tok_d)]
added_req = [b - d for b, d in zip(req_b, req_d)]
added_chat = [b - d for b, d in zip(chat_b, chat_d)]
results = [
    res("added_us_per_token", "latency,stream,one token at a time,median of %d per run" % K, added_lat,
        target=50.0, peer="one Unix socket hop, same run", peer_value=round(statistics.median(lat_d), 2)),
    res("us_per_token", "latency,bridge,stream,notification to SSE chunk", lat_b),
    res("added_us_per_token", "throughput,stream,debug.stream,tokens=%d,text=x" % N, added_tok,
        peer="direct socket, same run", peer_value=round(statistics.median(tok_d), 2)),
    res("us_per_token", "bridge,stream,debug.stream,tokens=%d" % N, tok_b),
    res("us_per_token", "direct socket,debug.stream,tokens=%d" % N, tok_d),
    res("added_us_per_request", "debug.stream count=0,non-stream,median of %d" % R, added_req,
        peer="direct socket (fresh connection)", peer_value=round(statistics.median(req_d), 2)),
    res("added_us_per_request", "chat max_tokens=1,tiny model,non-stream,median of %d" % R, added_chat,
        peer="direct socket (fresh connection)", peer_value=round(statistics.median(chat_d), 2)),
    res("us_per_request", "bridge,chat max_tokens=1,tiny model", chat_b),
]
def cpu():
    for l in open("/proc/cpuinfo"):
        if l.startswith("model name"):
            return l.split(":", 1)[1].strip()
def git(*a):
    return subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()
commit = git("rev-parse", "--short", "HEAD")
if git("status", "--porcelain", "--untracked-files=no", "--", "client", "libproto", "daemon"):
    commit += "-dirty"
doc = {"benchmark": "openai", "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
       "commit": commit, "command": command.strip(),
       "machine": {"cpu": cpu(), "cores": os.cpu_count(),
                   "ram_gib": round(int(open("/proc/meminfo").readline().split()[1]) / 1048576, 1)},
       "model": {"file": os.path.basename(model), "bytes": os.path.getsize(model)},
       "results": results,
       "notes": "Added latency of sil-openai over the daemon socket, same run. Latency per token: "
                "this script plays the daemon for a second bridge, sends one token notification "
                "and times until its SSE chunk is read from the HTTP connection, 2000 times per run, "
                "minus the same notification over one socketpair hop. Throughput per token: the "
                "daemon's debug.stream (no model) read raw vs as SSE "
                "chat.completion.chunk events through POST /v1/debug/stream (sil-openai "
                "--debug-stream) on kept-alive HTTP/1.1 over loopback TCP. Per request: a fresh "
                "daemon connection per request on both sides (the bridge opens one per request). "
                "Clients are raw-byte Python readers. Load: %s" % open("/proc/loadavg").read().strip()}
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
json.dump(doc, open(out, "w"), indent=2)
open(out, "a").write("\n")
for x in results:
    print("%-22s %-60s %10.2f %s" % (x["metric"], x["config"], x["value"], x["unit"]))
print("wrote " + out)
PY
