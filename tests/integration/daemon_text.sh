#!/usr/bin/env bash
# Text safety: chat message contents never become control tokens (Qwen3 vocab, then the Qwen3.5
# flavour of a generated model); every str the daemon sends is valid UTF-8, even when a model with
# random weights emits byte tokens that do not form it (sil-mkmodel's tiny preset).
. "$(dirname "$0")/lib.bash"
start_daemon --model "$MODEL"
python3 "$HERE/daemon_tests.py" chat_injection
stop_daemon
"$SIL_BUILD/bin/sil-mkmodel" --preset tiny --quiet --out "$T/random.gguf" || fail "sil-mkmodel"
start_daemon --model "$T/random.gguf"
python3 "$HERE/daemon_tests.py" chat_injection
python3 "$HERE/daemon_tests.py" utf8
python3 "$HERE/daemon_tests.py" generate_text
stop_daemon
