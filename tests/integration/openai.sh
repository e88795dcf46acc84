#!/usr/bin/env bash
# sil-openai, the OpenAI-compatible HTTP bridge, in front of the real daemon: every endpoint by
# curl and http.client, bad input, cancellation on disconnect, the token check, a Unix socket
# listener, /health while the daemon is missing or not answering, the concurrency limit, the
# request log, and the official openai JavaScript SDK (installed by `make deps` into build/npm).
. "$(dirname "$0")/lib.bash"
[ -x "$SIL_BUILD/bin/sil-openai" ] || { echo "skip: sil-openai not built"; exit 0; }
command -v curl >/dev/null || fail "curl missing (make deps)"
OPIDS=()
start_bridge() { # log name, flags...
    local name=$1; shift
    "$SIL_BUILD/bin/sil-openai" "$@" >"$T/$name.log" 2>&1 &
    OPIDS+=($!)
    OLOGS+=("$T/$name.log")
}
OLOGS=()
stop_bridges() { # each must exit 0 on SIGTERM, without a sanitizer report in its log
    local p rc l
    for p in "${OPIDS[@]}"; do
        kill -TERM "$p" 2>/dev/null || true
        rc=0
        wait "$p" 2>/dev/null || rc=$?
        [ "$rc" -eq 0 ] || { echo "FAIL: sil-openai exited $rc"; cat "$T"/*.log; exit 1; }
    done
    OPIDS=()
    for l in "${OLOGS[@]}"; do
        if grep -q 'Sanitizer\|runtime error' "$l"; then echo "FAIL: sanitizer report"; cat "$l"; exit 1; fi
    done
}
trap 'for p in "${OPIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done; cleanup' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { # url, want status
    local i code
    for i in $(seq 100); do
        code=$(curl -s -o /dev/null -w '%{http_code}' "$1" || true)
        [ "$code" = "$2" ] && return 0
        sleep 0.1
    done
    fail "$1 gave $code, want $2"
}

# /health before the daemon exists: 503 unavailable; with a socket that accepts but never
# answers (a daemon still loading its model): 503 loading.
P=$(free_port)
start_bridge early --port "$P" --health-timeout 300
wait_http "http://127.0.0.1:$P/health" 503
curl -s "http://127.0.0.1:$P/health" | grep -q '"status":"unavailable"' || fail "health without daemon"
mkdir -p "$(dirname "$SILICEO_SOCKET")"
python3 -c "
import socket,sys,time
s=socket.socket(socket.AF_UNIX); s.bind('$SILICEO_SOCKET'); s.listen(8); time.sleep(30)" &
SILENT=$!
for i in $(seq 100); do [ -S "$SILICEO_SOCKET" ] && break; sleep 0.05; done
body=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$P/health")
case $body in *'"status":"loading"'*' 503') ;; *) fail "health while loading: $body" ;; esac
kill "$SILENT"; wait "$SILENT" 2>/dev/null || true
rm -f "$SILICEO_SOCKET"
echo "ok: /health is 503 (unavailable, then loading) until the daemon answers"

start_daemon --model "$MODEL"
wait_http "http://127.0.0.1:$P/health" 200
echo "ok: /health turns 200 once the daemon is ready"
python3 "$HERE/openai_tests.py" "http://127.0.0.1:$P" || fail "openai_tests.py"
# Its two disconnects in the request log: the stream's after its 200, the other without an answer
# (a line is written once the bridge has closed the connection: waited for a moment).
wait_grep() { # extended regex, file
    local i
    for i in $(seq 50); do grep -qE "$1" "$2" && return 0; sleep 0.1; done
    return 1
}
wait_grep '^sil-openai: info: POST /v1/chat/completions chatcmpl-[0-9a-f]+: 200, model .*, streamed, .*(client gone|connection closed)$' \
    "$T/early.log" || fail "no line for the stream cut by its client: $(cat "$T/early.log")"
wait_grep '^sil-openai: info: POST /v1/chat/completions chatcmpl-[0-9a-f]+: no answer, model .*, client gone$' \
    "$T/early.log" || fail "no line for the request whose client left first: $(cat "$T/early.log")"
echo "ok: the request log tells a client gone mid-stream and one gone before the answer"

# The request log at the default level (info): openai_tests.py checks each line against the
# response; at --log-level debug /health gets a line too, at warning no request does.
P5=$(free_port)
start_bridge logged --port "$P5"
wait_http "http://127.0.0.1:$P5/health" 200
python3 "$HERE/openai_tests.py" "http://127.0.0.1:$P5" log "$T/logged.log" || fail "request log"
P6=$(free_port)
start_bridge debuglog --port "$P6" --log-level debug
wait_http "http://127.0.0.1:$P6/health" 200
P7=$(free_port)
start_bridge quiet --port "$P7" --log-level warning
wait_http "http://127.0.0.1:$P7/health" 200
curl -s -o /dev/null "http://127.0.0.1:$P7/v1/models"
wait_grep '^sil-openai: debug: GET /health: 200, [0-9.]+ ms$' "$T/debuglog.log" ||
    fail "--log-level debug: no /health line: $(cat "$T/debuglog.log")"
! grep -q ': info: ' "$T/quiet.log" || fail "--log-level warning logged requests: $(cat "$T/quiet.log")"
rc=0
"$SIL_BUILD/bin/sil-openai" --log-level loud 2>"$T/err" || rc=$?
[ "$rc" = 2 ] && grep -q -- "--log-level: .*'loud'; try 'sil-openai --help'" "$T/err" ||
    fail "--log-level loud: $rc $(cat "$T/err")"
echo "ok: --log-level debug logs /health, warning no request line, a bad level is a usage error"

# Bearer token from a file (never argv); /health stays open for probes.
P2=$(free_port)
printf 'sekrit-token\n' > "$T/token"
start_bridge token --port "$P2" --token-file "$T/token"
wait_http "http://127.0.0.1:$P2/health" 200
code=$(curl -s -o "$T/401" -w '%{http_code}' "http://127.0.0.1:$P2/v1/models")
[ "$code" = 401 ] && grep -q '"invalid_api_key"' "$T/401" || fail "no token: $code $(cat "$T/401")"
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer wrong' "http://127.0.0.1:$P2/v1/models")
[ "$code" = 401 ] || fail "wrong token: $code"
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer sekrit-token' "http://127.0.0.1:$P2/v1/models")
[ "$code" = 200 ] || fail "right token: $code"
echo "ok: --token-file: 401 without or with a wrong token, 200 with it"

# A Unix socket listener.
start_bridge unix --unix "$T/openai.sock"
for i in $(seq 50); do [ -S "$T/openai.sock" ] && break; sleep 0.1; done
curl -s --unix-socket "$T/openai.sock" http://x/v1/models | grep -q '"object":"list"' || fail "unix socket"
echo "ok: --unix serves the API on a Unix socket"

# Concurrency limit.
P3=$(free_port)
start_bridge limited --port "$P3" --max-concurrent 1
wait_http "http://127.0.0.1:$P3/health" 200
python3 "$HERE/openai_tests.py" "http://127.0.0.1:$P3" concurrency || fail "concurrency"

# Socket activation, as contrib/systemd/sil-openai.socket does it: the listening socket is fd 3.
if command -v systemd-socket-activate >/dev/null; then
    P4=$(free_port)
    systemd-socket-activate -l "127.0.0.1:$P4" "$SIL_BUILD/bin/sil-openai" --socket "$SILICEO_SOCKET" >"$T/activated.log" 2>&1 &
    OPIDS+=($!)
    OLOGS+=("$T/activated.log")
    wait_http "http://127.0.0.1:$P4/health" 200
    curl -s "http://127.0.0.1:$P4/v1/models" | grep -q '"object":"list"' || fail "socket activation"
    echo "ok: a socket-activated sil-openai serves on the socket it was passed"
fi

# The official openai JavaScript SDK, a client written elsewhere.
NPM=$SIL_BUILD/npm
[ -d "$NPM/node_modules/openai" ] || NPM=$ROOT/build/npm
SDK=$NPM/node_modules/openai
if [ -d "$SDK" ] && command -v node >/dev/null; then
    NODE_PATH=$NPM/node_modules node "$HERE/openai_sdk.mjs" "http://127.0.0.1:$P/v1" ||
        fail "openai SDK"
else
    case ${CI:-} in true | TRUE | True | 1) fail "openai SDK missing (make deps)" ;; esac
    echo "skip: openai JavaScript SDK not installed (make deps)"
fi
stop_bridges
echo "ok: every sil-openai exited 0 on SIGTERM"
stop_daemon
