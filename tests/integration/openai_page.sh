#!/usr/bin/env bash
# sil-openai's chat page at / with its style sheet and script (/chat.css, /chat.js): their
# headers (type, a Content-Security-Policy with nothing inline, ETag and 304), served without the
# token, gone with --no-ui; then the page itself in headless Chromium (make deps
# installs it), driven with clicks and typed text over the DevTools protocol (cdp.py): on the
# demo model a question's streamed answer and folded reasoning equal curl's, a second question
# carries the conversation, nothing is loaded from elsewhere; on qwen3-tiny Stop ends a long
# answer and the daemon cancels it; with --token-file the page asks for the key.
. "$(dirname "$0")/lib.bash"
[ -x "$SIL_BUILD/bin/sil-openai" ] || { echo "skip: sil-openai not built"; exit 0; }
command -v curl >/dev/null || fail "curl missing (make deps)"
DEMO=$ROOT/models/siliceo-demo-qwen35moe-Q8_0.gguf
[ -f "$DEMO" ] || fail "$DEMO missing"
OPIDS=()
trap 'for p in "${OPIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done; cleanup' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start_bridge() { # log name, port, flags...
    local name=$1 port=$2; shift 2
    "$SIL_BUILD/bin/sil-openai" --port "$port" "$@" >"$T/$name.log" 2>&1 &
    OPIDS+=($!)
    local i
    for i in $(seq 100); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ] && return 0
        sleep 0.1
    done
    fail "sil-openai ($name) not ready: $(cat "$T/$name.log")"
}
stop_bridges() {
    local p rc
    for p in "${OPIDS[@]}"; do
        kill -TERM "$p"
        rc=0
        wait "$p" || rc=$?
        [ "$rc" -eq 0 ] || fail "sil-openai exited $rc"
    done
    OPIDS=()
    ! grep -q 'Sanitizer\|runtime error' "$T"/*.log || fail "sanitizer report: $(cat "$T"/*.log)"
}

start_daemon --model "$DEMO"
P=$(free_port)
start_bridge page "$P"
grep -q "listening on 127.0.0.1:$P, chat page at http://127.0.0.1:$P/$" "$T/page.log" ||
    fail "no address of the page in the log: $(cat "$T/page.log")"
URL=http://127.0.0.1:$P

# The page as a browser gets it.
curl -sS -D "$T/h" -o "$T/page.html" "$URL/"
h() { grep -i "^$1:" "$T/h" | head -n 1 | cut -d' ' -f2- | tr -d '\r'; }
grep -q '^HTTP/1.1 200' "$T/h" || fail "GET /: $(head -n 1 "$T/h")"
[ "$(h Content-Type)" = "text/html; charset=utf-8" ] || fail "Content-Type $(h Content-Type)"
cmp -s "$T/page.html" "$ROOT/client/sil-openai/chat.html" || fail "GET / is not client/sil-openai/chat.html"
csp=$(h Content-Security-Policy)
case $csp in "default-src 'none';"*"script-src 'self';"*"style-src 'self';"*"connect-src 'self';"*) ;;
    *) fail "Content-Security-Policy: $csp" ;; esac
case $csp in *unsafe*) fail "Content-Security-Policy allows something unsafe: $csp" ;; esac
# Nothing inline for that policy to refuse: a script only by src, no style element or attribute,
# no event handler attribute.
! grep -Eiq '<script( [^>]*)?>[^<]|<script>|<style|[[:space:]]style=|[[:space:]]on[a-z]+=' "$T/page.html" ||
    fail "inline script or style in the page: $(grep -Ein '<script|<style|style=|[[:space:]]on[a-z]+=' "$T/page.html")"
grep -q '<script src="/chat.js"></script>' "$T/page.html" && grep -q '<link rel="stylesheet" href="/chat.css">' "$T/page.html" ||
    fail "the page does not load /chat.js and /chat.css"
[ "$(h Cache-Control)" = no-cache ] || fail "Cache-Control $(h Cache-Control)"
[ "$(h X-Content-Type-Options)" = nosniff ] || fail "X-Content-Type-Options $(h X-Content-Type-Options)"
etag=$(h ETag)
[[ $etag =~ ^\"[0-9a-f]{16}\"$ ]] || fail "ETag '$etag'"
# Nothing in the file names another origin for the browser to load.
! grep -Eiq '(src|href|action)=["'\'']?(https?:)?//|@import|url\(' "$T/page.html" || fail "the page refers elsewhere"
code=$(curl -s -o "$T/304" -w '%{http_code}' -H "If-None-Match: \"0000\", $etag" "$URL/")
[ "$code" = 304 ] && [ ! -s "$T/304" ] || fail "If-None-Match with its ETag: $code"
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'If-None-Match: "0000"' "$URL/")
[ "$code" = 200 ] || fail "If-None-Match with another ETag: $code"
[ "$(curl -s -o /dev/null -w '%{http_code}' -I "$URL/")" = 200 ] || fail "HEAD /"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/index.html")" = 200 ] || fail "GET /index.html"
[ "$(curl -s -o /dev/null -w '%{http_code}' -d x "$URL/")" = 405 ] || fail "POST / is not 405"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/index.htm")" = 404 ] || fail "GET /index.htm is not 404"
echo "ok: GET / is chat.html as text/html with a Content-Security-Policy, no-cache and an ETag (304 when unchanged); HEAD, /index.html; POST 405"
# Its style sheet and script: the files, with their types and the same headers.
for f in chat.css:text/css chat.js:text/javascript; do
    name=${f%%:*} type=${f#*:}
    curl -sS -D "$T/h" -o "$T/$name" "$URL/$name"
    grep -q '^HTTP/1.1 200' "$T/h" || fail "GET /$name: $(head -n 1 "$T/h")"
    cmp -s "$T/$name" "$ROOT/client/sil-openai/$name" || fail "GET /$name is not client/sil-openai/$name"
    [ "$(h Content-Type)" = "$type; charset=utf-8" ] || fail "/$name: Content-Type $(h Content-Type)"
    [ "$(h X-Content-Type-Options)" = nosniff ] && [ "$(h Cache-Control)" = no-cache ] ||
        fail "/$name: X-Content-Type-Options $(h X-Content-Type-Options), Cache-Control $(h Cache-Control)"
    [ "$(h Content-Security-Policy)" = "$csp" ] || fail "/$name: Content-Security-Policy $(h Content-Security-Policy)"
    e=$(h ETag)
    [[ $e =~ ^\"[0-9a-f]{16}\"$ ]] && [ "$e" != "$etag" ] || fail "/$name: ETag '$e' (the page's $etag)"
    code=$(curl -s -o "$T/304" -w '%{http_code}' -H "If-None-Match: $e" "$URL/$name")
    [ "$code" = 304 ] && [ ! -s "$T/304" ] || fail "/$name: If-None-Match with its ETag: $code"
done
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/chat.jsx")" = 404 ] || fail "GET /chat.jsx is not 404"
echo "ok: /chat.css and /chat.js are the files, as text/css and text/javascript with the page's headers and their own ETags"

P2=$(free_port)
printf 'page-token\n' >"$T/token"
start_bridge token "$P2" --token-file "$T/token"
for u in / /chat.css /chat.js; do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P2$u")" = 200 ] || fail "$u wants the token"
done
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P2/v1/models")" = 401 ] || fail "the API without the token"
P3=$(free_port)
start_bridge noui "$P3" --no-ui
for u in / /chat.css /chat.js; do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P3$u")" = 404 ] || fail "--no-ui still serves $u"
done
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P3/v1/models")" = 200 ] || fail "--no-ui: /v1/models"
grep -q "listening on 127.0.0.1:$P3$" "$T/noui.log" || fail "--no-ui: the log names a page: $(cat "$T/noui.log")"
echo "ok: the page needs no token (the API does), --no-ui serves none"

CHROMIUM=$(python3 -c 'import cdp; print(cdp.find() or "")')
if [ -z "$CHROMIUM" ]; then
    case ${CI:-} in true | TRUE | True | 1) fail "chromium missing (make deps)" ;; esac
    stop_bridges
    stop_daemon
    echo "skip: chromium not installed (make deps): the page was not driven in a browser"
    exit 0
fi
mkdir -p "$T/b1" "$T/b2" "$T/b3"
python3 "$HERE/openai_page_tests.py" "$T/b1" answer "$URL" || fail "the page on the demo model"
python3 "$HERE/openai_page_tests.py" "$T/b3" key "http://127.0.0.1:$P2" page-token || fail "the page with a token"
stop_bridges
stop_daemon

start_daemon --model "$MODEL"
P4=$(free_port)
start_bridge stop "$P4"
python3 "$HERE/openai_page_tests.py" "$T/b2" stop "http://127.0.0.1:$P4" || fail "Stop"
grep -q "POST /v1/chat/completions chatcmpl-[0-9a-f]*: 200, .*, streamed, .*client gone" "$T/stop.log" ||
    fail "the bridge's log has no stream ended by its client: $(cat "$T/stop.log")"
stop_bridges
stop_daemon
