#!/usr/bin/env bash
# Runs the test suites of `make check`. With an argument, only that part: unit, asan, integration,
# fuzz, mandoc; or asan-integration / tsan-integration (not in `all`): the integration tests
# against the ASan or the ThreadSanitizer build.
# Environment: B (build dir), ASAN_B (the ASan + UBSan build, default $B/asan: its tests/ and the
# bin/ they start), SHARED (../shared), CHECK_FUZZ_SECONDS.
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
export SHARED=${SHARED:-$(cd .. && pwd)/shared}
export SIL_BUILD=$(cd "$B" && pwd)
only=${1:-all}
pass=0 fail=0 failed=()

run() { # name, command...
    local name=$1; shift
    local log; log=$(mktemp)
    local t0=$SECONDS
    if "$@" >"$log" 2>&1; then
        pass=$((pass + 1)); printf 'PASS %-40s %4ss\n' "$name" $((SECONDS - t0))
    else
        fail=$((fail + 1)); failed+=("$name"); printf 'FAIL %-40s %4ss\n' "$name" $((SECONDS - t0))
        tail -n 40 "$log" | sed 's/^/    | /'
    fi
    rm -f "$log"
}

if [ "$only" = all ] || [ "$only" = unit ]; then
    for t in "$B"/tests/test_*; do
        [ -x "$t" ] || continue
        run "unit/$(basename "$t")" "$t"
    done
fi
if [ "$only" = all ] || [ "$only" = asan ]; then
    ASAN_B=${ASAN_B:-$B/asan}
    # Leaks fail a test; UBSan (built with -fno-sanitize-recover) stops at its first report.
    for t in "$ASAN_B"/tests/test_*; do
        [ -x "$t" ] || continue
        run "asan/$(basename "$t")" env SIL_BUILD="$(cd "$ASAN_B" && pwd)" \
            ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1 \
            UBSAN_OPTIONS=print_stacktrace=1 "$t"
    done
fi
if [ "$only" = all ] || [ "$only" = integration ]; then
    for t in tests/integration/*.sh; do
        [ -f "$t" ] || continue
        run "integration/$(basename "$t" .sh)" bash "$t"
    done
fi
if [ "$only" = asan-integration ]; then
    ASAN_B=${ASAN_B:-$B/asan}
    # No quarantine: freed memory held back by ASan would fail daemon_load's flat-RSS check; a use
    # right after a free is still caught.
    for t in tests/integration/*.sh; do
        [ -f "$t" ] || continue
        run "asan-integration/$(basename "$t" .sh)" env SIL_BUILD="$(cd "$ASAN_B" && pwd)" SIL_SANITIZER=address \
            ASAN_OPTIONS=detect_leaks=1:quarantine_size_mb=0 UBSAN_OPTIONS=print_stacktrace=1 bash "$t"
    done
fi
if [ "$only" = tsan-integration ]; then
    TSAN_B=${TSAN_B:-$B/tsan}
    # The scripts that run the daemon with concurrent clients. Left out: daemon_watchdog (it
    # times the watchdog, and the sanitizer slows every step), and the packaging, training and
    # tokenizer scripts, which run no daemon under load.
    for n in clients daemon_chat_session daemon_heat daemon_hybrid daemon_kv daemon_lifecycle \
        daemon_limits daemon_load daemon_methods daemon_modelfile daemon_prefix \
        daemon_reload_retry daemon_saved_sessions daemon_sched daemon_shutdown daemon_soak daemon_text \
        daemon_tier daemon_progress chat_context openai; do
        t=tests/integration/$n.sh
        [ -f "$t" ] || continue
        run "tsan-integration/$n" env SIL_BUILD="$(cd "$TSAN_B" && pwd)" SIL_SANITIZER=thread \
            TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp" \
            bash "$t"
    done
fi
if [ "$only" = all ] || [ "$only" = fuzz ]; then
    for f in "$B"/fuzz/fuzz_*; do
        [ -x "$f" ] || continue
        name=$(basename "$f")
        corpus=$(mktemp -d)
        seeds=tests/fuzz/corpus/${name#fuzz_}
        [ -d "$seeds" ] || seeds=
        mkdir -p "$B/fuzz-artifacts"
        run "fuzz/$name" "$f" -max_total_time="${CHECK_FUZZ_SECONDS:-30}" -rss_limit_mb=2048 -timeout=10 \
            -artifact_prefix="$B/fuzz-artifacts/$name-" \
            -print_final_stats=1 "$corpus" $seeds
        rm -rf "$corpus"
    done
fi
if [ "$only" = all ] || [ "$only" = mandoc ]; then
    for m in man/*.[1-8]; do
        [ -f "$m" ] || continue
        run "mandoc/$(basename "$m")" sh -c "out=\$(mandoc -Tlint -Wwarning '$m' 2>&1); echo \"\$out\"; [ -z \"\$out\" ]"
    done
fi
echo
[ ${#failed[@]} -eq 0 ] || echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
