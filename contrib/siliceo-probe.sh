#!/bin/sh
# Sample probe for cron or a systemd timer: runs sil-probe, logs the verdict to syslog, and
# optionally writes Prometheus metrics for the node exporter's textfile collector.
#
#   */5 * * * *  siliceo /usr/local/share/siliceo/siliceo-probe.sh
#
# Environment (all optional):
#   SILICEO_SOCKET       daemon socket (else sil-probe's default)
#   SIL_PROBE_ARGS       thresholds, default "--warn-queue 8 --crit-queue 32 --crit-latency-ms 2000"
#   SIL_PROBE_GENERATE   1 to also time a tiny generation (-g)
#   SIL_PROBE_PROM_FILE  e.g. /var/lib/prometheus/node-exporter/siliceo.prom
#   SIL_PROBE_ON_CRITICAL  command run when the verdict is CRITICAL (e.g. a mail or a restart)
set -u

SIL_PROBE=${SIL_PROBE:-sil-probe}
args=${SIL_PROBE_ARGS:---warn-queue 8 --crit-queue 32 --crit-latency-ms 2000}
[ "${SIL_PROBE_GENERATE:-0}" = 1 ] && args="$args -g"

# shellcheck disable=SC2086 # args is a list of options
line=$($SIL_PROBE $args --timeout 10)
code=$?

case $code in
    0) prio=info ;;
    1) prio=warning ;;
    2) prio=crit ;;
    *) prio=err ;;
esac
if command -v logger >/dev/null 2>&1; then
    logger -t siliceo-probe -p "daemon.$prio" -- "$line"
else
    echo "$line"
fi

if [ -n "${SIL_PROBE_PROM_FILE:-}" ]; then
    # Write then rename, so the collector never reads a half-written file.
    tmp="$SIL_PROBE_PROM_FILE.$$"
    if $SIL_PROBE --prom --timeout 10 >"$tmp"; then :; fi
    echo "# HELP siliceo_probe_status sil-probe's exit code (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN)" >>"$tmp"
    echo "# TYPE siliceo_probe_status gauge" >>"$tmp"
    echo "siliceo_probe_status $code" >>"$tmp"
    mv -f "$tmp" "$SIL_PROBE_PROM_FILE"
fi

if [ "$code" -eq 2 ] && [ -n "${SIL_PROBE_ON_CRITICAL:-}" ]; then
    sh -c "$SIL_PROBE_ON_CRITICAL"
fi
exit "$code"
