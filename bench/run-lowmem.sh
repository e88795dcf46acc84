#!/bin/bash
# Issue 37: sil-mkmodel's Qwen3.5-35B-A3B shape at Q4_K_M (routing skew 0.46, ~19.7 GiB) on a
# host whose available RAM is held below the model's size. A tmpfs filled with zeros holds
# MemAvailable at SIZE (14G, 10G, ...); sil-eval then runs with the page cache dropped before
# each run: CUDA with --vram-budget BUDGET (512-token prompt, 128 greedy tokens, pass 1 cold and
# pass 2 warm in fresh sequences of one engine), a cold 4096-token prompt, and the CPU backend;
# llama.cpp's llama-bench runs on the same file under the same hold. Each run records
# MemAvailable before it, the bytes read from the model's disk during it (/proc/diskstats) and
# /usr/bin/time -v; the disk's direct-read bandwidth is measured once (prep).
#
# The machine this is made for takes one command of at most 10 minutes at a time, so the
# benchmark is a sequence of phases, each a separate command of a few minutes; the hold and
# the raw outputs stay under WORK between them (while the machine is up).
#
# usage: bench/run-lowmem.sh prep
#        bench/run-lowmem.sh hold SIZE|off       (e.g. hold 14G; hold off)
#        bench/run-lowmem.sh ours NAME [sil-eval args...]
#        bench/run-lowmem.sh prompt4k NAME [sil-eval args...]
#        bench/run-lowmem.sh cpu NAME [sil-eval args...]
#        bench/run-lowmem.sh peer NAME [cpu|4k|tg|cputg]
#        bench/run-lowmem.sh status
#        bench/run-lowmem.sh report FILE.json
# A session: prep; hold 14G; ours ours14; prompt4k p4k14; cpu cpu14; peer peer14;
#            peer peercpu14 cpu; hold 10G; ours ours10; ...; hold off; report FILE.json.
#
# Phases:
#  prep      makes MODEL if absent; drops the page cache and reads 4 GiB of MODEL with
#            dd iflag=direct (the disk's bandwidth, recorded); records the machine.
#  hold SIZE mounts a tmpfs at WORK/hold (size = RAM) and writes files of zeros into it (or
#            frees some) until MemAvailable is between SIZE and SIZE + 0.25 GiB; prints the
#            MemAvailable reached. The tmpfs's pages stay until `hold off` unmounts it.
#  ours      sil-eval --backend cuda --vram-budget BUDGET --passes 2, 512-token prompt,
#            --n-predict 128, then any extra args; OUTDIR/NAME.{json,err,time,meta,mem}
#            (.mem: every 0.5 s the seconds since the start, MemAvailable and sectors read).
#            With BASE_B the same with BASE_B's sil-eval as NAME-base.
#  prompt4k  the same with a 4096-token prompt, --n-predict 1, --passes 1 (--ctx 4608).
#  cpu       --backend cpu --threads 16, 128-token prompt, --n-predict 32, --passes 2.
#  peer      llama-bench -ngl 99 -fa 1 -ncmoe NCMOE -p 512 -n 128 -r 1 -o json; with cpu
#            -ngl 0 -fa 1 -t 16 -p 128 -n 32 and CUDA_VISIBLE_DEVICES empty; with 4k
#            -p 4096 -n 0; with tg -p 0 -n 32 and with cputg the cpu run's -p 0 -n 8 (decode
#            alone, where the prompt leaves no time for the tokens: its figure fills in the
#            decode of the run at the same hold). The page cache is dropped first. Skipped (and noted) without
#            PEER_DIR/llama-bench.
#  report    assembles bench/results JSON (BENCH.md) from every run in OUTDIR.
# Every run is under `timeout TIMEOUT`; one killed is recorded as timed out. A run's hold is
# the SIZE of the hold in place when it ran (its config: host_avail=SIZE).
#
# Environment: B (build dir, default build: $B/bin/sil-eval, $B/bin/sil-mkmodel),
#              BASE_B (optional: another build's dir, the same runs as NAME-base),
#              THIS_ARGS (more sil-eval args for this build's runs only, e.g. --cuda-pin off),
#              BASE_ENV (VAR=value words set for BASE_B's runs only, e.g. SIL_CUDA_PIN=0 for a
#              build that reads as a switch what this one takes as an option),
#              WHICH (both (default), this or base: which builds a phase runs when BASE_B is set),
#              MODEL (default /tmp/qwen35moe-35b-a3b-q4_k_m-s0.46.gguf, made by prep if absent
#              with sil-mkmodel --preset qwen35-35b-a3b --type q4_k_m --seed 1 --skew 0.46),
#              PEER_DIR (dir holding llama.cpp's llama-bench; optional), BUDGET (default 8G),
#              NCMOE (default 31: the llama-bench -ncmoe that fits 8 GiB), TIMEOUT (seconds a
#              run may take, default 240), THREADS (cpu phases, default 16),
#              WORK (default /tmp/lowmem), OUTDIR (raw outputs, default WORK/out),
#              COMMIT (report: the commit measured, default git rev-parse --short HEAD),
#              BASE_COMMIT (report: the commit BASE_B was built from; its runs' config build=),
#              DATE (report: when it was measured, ISO 8601; default now),
#              CACHE=warm (ours, prompt4k, cpu: read MODEL into the page cache before each run
#              instead of dropping it, as a host with the RAM keeps the file; config
#              page_cache=warm),
#              DRY=1 (print what would be done, change nothing; hold simulates its arithmetic
#              from MEMINFO, default /proc/meminfo, losing DRY_RATIO (default 1) of every
#              byte written from MemAvailable).
# Needs root (drop_caches, mount), GNU coreutils, /usr/bin/time, python3 (report).
set -u
B=${B:-build}
BASE_B=${BASE_B:-}
WHICH=${WHICH:-both}
DEFAULT_MODEL=/tmp/qwen35moe-35b-a3b-q4_k_m-s0.46.gguf
M=${MODEL:-$DEFAULT_MODEL}
PEER_DIR=${PEER_DIR:-}
BUDGET=${BUDGET:-8G}
NCMOE=${NCMOE:-31}
TIMEOUT=${TIMEOUT:-240}
THREADS=${THREADS:-16}
WORK=${WORK:-/tmp/lowmem}
OUTDIR=${OUTDIR:-$WORK/out}
DRY=${DRY:-0}
MEMINFO=${MEMINFO:-/proc/meminfo}
DRY_RATIO=${DRY_RATIO:-1}
CACHE=${CACHE:-drop}
HOLD=$WORK/hold
MADE_BY="sil-mkmodel --preset qwen35-35b-a3b --type q4_k_m --seed 1 --skew 0.46"

die() { echo "run-lowmem: $*" >&2; exit 1; }
say() { echo "run-lowmem: $*"; }
dry() { [ "$DRY" = 1 ]; }
# run a command, or print it under DRY=1
do_() { if dry; then echo "DRY: $*"; else "$@"; fi; }

mem_kib() { awk -v k="$1:" '$1 == k { print $2; exit }' "$MEMINFO"; }
gib() { awk -v k="$1" 'BEGIN { printf "%.2f", k / 1048576 }'; }
# SIZE (e.g. 14G, 10.5G, 512M, 1T, or bytes) in KiB
to_kib() {
    awk -v s="$1" 'BEGIN {
        if (!match(s, /^[0-9]+(\.[0-9]+)?/)) exit 1
        n = substr(s, 1, RLENGTH); u = toupper(substr(s, RLENGTH + 1)); sub(/I?B$/, "", u)
        if (u == "") f = 1 / 1024; else if (u == "K") f = 1; else if (u == "M") f = 1024
        else if (u == "G") f = 1048576; else if (u == "T") f = 1073741824; else exit 1
        printf "%d", n * f }'
}

drop_caches() {
    if dry; then echo "DRY: sync; echo 3 > /proc/sys/vm/drop_caches"; return 0; fi
    sync
    if ! echo 3 > /proc/sys/vm/drop_caches 2> /dev/null; then
        echo "run-lowmem: could not drop the page cache (not root?)" >&2
        return 1
    fi
}

# The machine, once per OUTDIR (the report reads it; it may run elsewhere).
record_machine() {
    [ -s "$OUTDIR/machine.txt" ] && return 0
    dry && return 0
    local gpu="" drv="" cuda=""
    if command -v nvidia-smi > /dev/null; then
        gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -1)
        drv=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2> /dev/null | head -1)
        cuda=$(nvidia-smi 2> /dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1)
    fi
    {
        echo "gpu=$gpu"
        echo "driver=$drv"
        echo "cuda=$cuda"
        echo "cpu=$(lscpu 2> /dev/null | sed -n 's/^Model name: *//p' | head -1)"
        echo "cores=$(nproc)"
        echo "mem_total_kib=$(mem_kib MemTotal)"
    } > "$OUTDIR/machine.txt"
}

# The block devices whose /proc/diskstats rows count MODEL's reads: the device of the file
# system holding it, else (overlay, btrfs, ...) every disk that is not virtual.
disk_devs() {
    local dev maj min name src d
    dev=$(stat -L -c %d "$M" 2> /dev/null) || return 0
    maj=$(((dev >> 8) & 0xfff | ((dev >> 32) & ~0xfff)))
    min=$(((dev & 0xff) | ((dev >> 12) & ~0xff)))
    if [ "$maj" != 0 ] && [ -e "/sys/dev/block/$maj:$min" ]; then
        name=$(basename "$(readlink -f "/sys/dev/block/$maj:$min")")
        if awk -v n="$name" '$3 == n { f = 1 } END { exit !f }' /proc/diskstats; then
            echo "$name"
            return 0
        fi
    fi
    src=$(df --output=source "$M" 2> /dev/null | tail -1)
    case $src in
    /dev/*)
        name=$(basename "$(readlink -f "$src")")
        if awk -v n="$name" '$3 == n { f = 1 } END { exit !f }' /proc/diskstats; then
            echo "$name"
            return 0
        fi
        ;;
    esac
    for d in /sys/block/*; do
        case $(readlink -f "$d") in */virtual/*) continue ;; esac
        echo "${d##*/}"
    done
}
# sectors (512 bytes) read from the devices named in $DEVS
sectors_read() {
    awk -v l=" $DEVS " 'index(l, " " $3 " ") { s += $6 } END { printf "%d", s }' /proc/diskstats
}

# OOM kills the kernel logged so far (0 where dmesg is not readable)
oom_kills() { dmesg 2> /dev/null | grep -c -i -e 'oom-kill' -e 'out of memory: kill'; }

hold_active() { [ -s "$WORK/hold.size" ] && [ -d "$(cat "$WORK/hold.dir" 2> /dev/null)" ]; }
hold_label() { if hold_active; then cat "$WORK/hold.size"; else echo none; fi; }

# --- prep ----------------------------------------------------------------------------------
phase_prep() {
    local made=0 made_by bytes
    grep -qs '^made=1' "$OUTDIR/model.txt" && made=1 # made by an earlier prep
    if [ -f "$M" ]; then
        say "model present: $M"
    else
        [ -x "$B/bin/sil-mkmodel" ] || dry || die "no $B/bin/sil-mkmodel (set B)"
        say "making $M"
        if ! do_ "$B/bin/sil-mkmodel" --preset qwen35-35b-a3b --type q4_k_m --seed 1 \
            --skew 0.46 --out "$M"; then
            rm -f "$M"
            die "sil-mkmodel failed"
        fi
        made=1
    fi
    if dry; then
        echo "DRY: sync; drop caches; dd if=$M of=/dev/null bs=4M count=1024 iflag=direct"
        return 0
    fi
    bytes=$(stat -L -c %s "$M")
    # a file given by MODEL and not made here: its recipe is not known
    made_by="unknown (given by MODEL)"
    { [ "$M" = "$DEFAULT_MODEL" ] || [ $made = 1 ]; } && made_by=$MADE_BY
    printf 'made=%s\nfile=%s\nbytes=%s\nmade_by=%s\n' $made "$(basename "$M")" "$bytes" \
        "$made_by" > "$OUTDIR/model.txt"
    drop_caches
    local out b s
    out=$(LC_ALL=C dd if="$M" of=/dev/null bs=4M count=1024 iflag=direct 2>&1)
    echo "$out" | tail -1
    b=$(echo "$out" | awk '/ copied/ { print $1 }' | tail -1)
    s=$(echo "$out" | sed -n 's/.* copied, \([0-9.e+-]*\) s,.*/\1/p' | tail -1)
    { [ -n "$b" ] && [ -n "$s" ]; } || die "could not read dd's figures: $out"
    # four readers at once (what an engine with several reads in flight can get): the disk's
    # bandwidth is the better of the two, so that no engine beats its floor
    local g1 g4 t0 t1 i
    g1=$(awk -v b="$b" -v s="$s" 'BEGIN { printf "%.3f", b / s / 1e9 }')
    drop_caches
    t0=$(date +%s.%N)
    for i in 0 1 2 3; do
        dd if="$M" of=/dev/null bs=4M count=256 skip=$((1024 + i * 256)) iflag=direct 2> /dev/null &
    done
    wait
    t1=$(date +%s.%N)
    g4=$(awk -v a="$t0" -v z="$t1" 'BEGIN { printf "%.3f", 4 * 256 * 4194304 / (z - a) / 1e9 }')
    {
        echo "disk_read_bytes=$b"
        echo "disk_read_s=$s"
        echo "disk_gbs_1=$g1"
        echo "disk_gbs_4=$g4"
        echo "disk_gbs=$(awk -v a="$g1" -v c="$g4" 'BEGIN { printf "%.3f", (a > c ? a : c) }')"
        echo "disk_devs=$(disk_devs | tr '\n' ' ')"
        echo "commit=$(git rev-parse --short HEAD 2> /dev/null)"
    } > "$OUTDIR/prep.txt"
    say "disk: $(sed -n 's/^disk_gbs=//p' "$OUTDIR/prep.txt") GB/s (O_DIRECT, 4 MiB reads; one reader $g1, four $g4)"
}

# --- hold ----------------------------------------------------------------------------------
# Under DRY the files and MemAvailable are simulated: SIM_AVAIL (KiB), SIM_FILES (sizes, KiB).
SIM_AVAIL=0
SIM_FILES=()
avail_now() { if dry; then echo "$SIM_AVAIL"; else mem_kib MemAvailable; fi; }

# the hold's files, newest first, as "KiB name" lines
hold_files() {
    local dir=$1 i
    if dry; then
        for ((i = ${#SIM_FILES[@]} - 1; i >= 0; i--)); do
            [ "${SIM_FILES[i]}" -gt 0 ] && echo "${SIM_FILES[i]} z.$i"
        done
        return 0
    fi
    find "$dir" -maxdepth 1 -name 'z.*' -type f -printf '%s %f\n' 2> /dev/null |
        sort -t. -k2,2nr | awk '{ printf "%d %s\n", $1 / 1024, $2 }'
}

# write KiB of zeros into new files, in up to 8 writers at once
hold_fill() {
    local dir=$1 kib=$2 n mib each i seq pids=() rc=0
    mib=$(((kib + 1023) / 1024))
    n=$(((mib + 4095) / 4096))
    [ "$n" -gt 8 ] && n=8
    each=$(((mib + n - 1) / n))
    if dry; then
        seq=${#SIM_FILES[@]}
    else
        seq=$(find "$dir" -maxdepth 1 -name 'z.*' | sed 's/.*z\.//' | sort -n | tail -1)
        seq=$((${seq:--1} + 1))
    fi
    for ((i = 0; i < n; i++)); do
        if dry; then
            echo "DRY: dd if=/dev/zero of=$dir/z.$((seq + i)) bs=1M count=$each"
            SIM_FILES+=($((each * 1024)))
            SIM_AVAIL=$(awk -v a="$SIM_AVAIL" -v w=$((each * 1024)) -v r="$DRY_RATIO" \
                'BEGIN { printf "%d", a - w * r }')
        else
            dd if=/dev/zero of="$dir/z.$((seq + i))" bs=1M count="$each" status=none &
            pids+=($!)
        fi
    done
    for i in "${pids[@]}"; do wait "$i" || rc=1; done
    return $rc
}

# free KiB: delete the newest files, truncate the last one touched
hold_free() {
    local dir=$1 kib=$2 size name i
    while [ "$kib" -gt 0 ] && read -r size name; do
        if [ "$size" -le "$kib" ]; then
            if dry; then
                echo "DRY: rm $dir/$name"
                i=${name#z.}
                SIM_FILES[i]=0
                SIM_AVAIL=$((SIM_AVAIL + size))
            else
                rm -f "$dir/$name"
            fi
            kib=$((kib - size))
        else
            if dry; then
                echo "DRY: truncate -s $((size - kib))K $dir/$name"
                i=${name#z.}
                SIM_FILES[i]=$((size - kib))
                SIM_AVAIL=$((SIM_AVAIL + kib))
            else
                truncate -s "$((size - kib))K" "$dir/$name"
            fi
            kib=0
        fi
    done < <(hold_files "$dir")
}

phase_hold() {
    local size=${1:?usage: bench/run-lowmem.sh hold SIZE|off}
    local dir total target hi mid avail it need
    dir=$(cat "$WORK/hold.dir" 2> /dev/null)
    if [ "$size" = off ]; then
        if [ -z "$dir" ]; then
            say "no hold"
        elif [ "$dir" = "$HOLD" ]; then
            do_ umount "$HOLD" || die "umount $HOLD failed"
        else
            do_ rm -rf "$dir"
        fi
        dry || rm -f "$WORK/hold.dir" "$WORK/hold.size"
        say "hold off: MemAvailable $(gib "$(mem_kib MemAvailable)") GiB"
        return 0
    fi
    target=$(to_kib "$size") || die "bad SIZE '$size' (e.g. 14G)"
    [ "$target" -ge 1048576 ] || die "SIZE below 1 GiB is not held (the OOM killer would act)"
    hi=$((target + 262144))
    mid=$((target + 131072))
    total=$(mem_kib MemTotal)
    # a hold recorded but not mounted (the machine restarted): start again, never on the disk
    if [ "$dir" = "$HOLD" ] && ! dry && ! mountpoint -q "$HOLD"; then dir=""; fi
    if [ -z "$dir" ]; then
        dir=$HOLD
        do_ mkdir -p "$HOLD"
        if dry; then
            echo "DRY: mount -t tmpfs -o size=${total}k lowmem-hold $HOLD"
        elif ! mountpoint -q "$HOLD" && ! mount -t tmpfs -o "size=${total}k" lowmem-hold "$HOLD"; then
            # no mount allowed (a container): /dev/shm, if it is a tmpfs; its size may be less
            [ "$(stat -f -c %T /dev/shm 2> /dev/null)" = tmpfs ] || die "cannot mount a tmpfs"
            dir=/dev/shm/lowmem-hold
            mkdir -p "$dir" || die "cannot use $dir"
            echo "run-lowmem: mount failed; holding in $dir ($(df -h --output=size /dev/shm | tail -1) tmpfs)" >&2
        fi
        dry || echo "$dir" > "$WORK/hold.dir"
    fi
    # what is reclaimable counts in MemAvailable only in part: start from a dropped cache
    drop_caches
    SIM_AVAIL=$(mem_kib MemAvailable)
    say "MemTotal $(gib "$total") GiB, MemAvailable $(gib "$(avail_now)") GiB, target $(gib "$target")-$(gib "$hi") GiB"
    for ((it = 0; it < 16; it++)); do
        avail=$(avail_now)
        if [ "$avail" -gt "$hi" ]; then
            need=$((avail - mid))
            say "writing $(gib "$need") GiB of zeros"
            hold_fill "$dir" "$need" || die "writing the hold failed (tmpfs full?): MemAvailable $(gib "$(avail_now)") GiB"
        elif [ "$avail" -lt "$target" ]; then
            need=$((mid - avail))
            say "freeing $(gib "$need") GiB"
            [ -n "$(hold_files "$dir")" ] || die "MemAvailable $(gib "$avail") GiB is below $size with nothing held"
            hold_free "$dir" "$need"
        else
            break
        fi
        dry || sleep 1
    done
    avail=$(avail_now)
    if [ "$avail" -lt "$target" ] || [ "$avail" -gt "$hi" ]; then
        die "MemAvailable $(gib "$avail") GiB not held at $size after $it steps"
    fi
    dry || echo "$size" > "$WORK/hold.size"
    dry || echo "hold=$size mem_available_kib=$avail held_kib=$(du -sk "$dir" | cut -f1)" > "$OUTDIR/hold-$size.txt"
    say "held: MemAvailable $(gib "$avail") GiB ($avail KiB) for hold $size"
}

# --- runs ----------------------------------------------------------------------------------
# measure NAME KIND BUILD NTOK NPRED PASSES -- command...: drop the cache, run the command
# under time and timeout with stdout to NAME.json, record NAME.meta
measure() {
    local name=$1 kind=$2 build=$3 ntok=$4 npred=$5 passes=$6
    shift 7
    local meta=$OUTDIR/$name.meta t0 t1 rc s0 s1 a0 a1 o0 wall tmo=0 sampler dropped=1
    if dry; then
        echo "DRY: drop caches; timeout -k 10 $TIMEOUT $(echo "$*" | sed -E 's/--tokens 1,[0-9,]*,([0-9]+)/--tokens 1..\1/') > $OUTDIR/$name.json"
        return 0
    fi
    if [ "$CACHE" = warm ]; then
        cat "$M" > /dev/null # the file in the page cache, as a machine with the RAM keeps it
        dropped=0
    else
        drop_caches || dropped=0
    fi
    DEVS=$(disk_devs | tr '\n' ' ')
    a0=$(mem_kib MemAvailable)
    s0=$(sectors_read)
    o0=$(oom_kills)
    t0=$(date +%s.%N)
    # every 0.5 s: seconds since the start, MemAvailable (KiB), sectors read from DEVS so far
    (while :; do
        echo "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }') $(mem_kib MemAvailable) $(($(sectors_read) - s0))"
        sleep 0.5
    done > "$OUTDIR/$name.mem") &
    sampler=$!
    if [ -x /usr/bin/time ]; then
        /usr/bin/time -v -o "$OUTDIR/$name.time" timeout -k 10 "$TIMEOUT" "$@" \
            > "$OUTDIR/$name.json" 2> "$OUTDIR/$name.err"
    else
        timeout -k 10 "$TIMEOUT" "$@" > "$OUTDIR/$name.json" 2> "$OUTDIR/$name.err"
    fi
    rc=$?
    t1=$(date +%s.%N)
    s1=$(sectors_read)
    a1=$(mem_kib MemAvailable)
    wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
    # 124: timeout's TERM; 137: its KILL 10 s later, or another SIGKILL (the OOM killer)
    if [ "$rc" = 124 ] || { [ "$rc" = 137 ] && awk -v w="$wall" -v t="$TIMEOUT" 'BEGIN { exit !(w >= t) }'; }; then
        tmo=1
    fi
    kill "$sampler" 2> /dev/null
    wait "$sampler" 2> /dev/null
    {
        echo "name=$name"
        echo "kind=$kind"
        echo "build=$build"
        echo "hold=$(hold_label)"
        echo "prompt_tokens=$ntok"
        echo "n_predict=$npred"
        echo "passes=$passes"
        echo "budget=$BUDGET"
        echo "ncmoe=$NCMOE"
        echo "threads=$THREADS"
        if [ "$build" = base ]; then
            echo "extra=$EXTRA${BASE_ENV:+ (env $BASE_ENV)}"
        else
            echo "extra=$EXTRA${THIS_ARGS:+ $THIS_ARGS}"
        fi
        echo "timeout_s=$TIMEOUT"
        echo "rc=$rc"
        echo "timed_out=$tmo"
        echo "oom_kills=$(($(oom_kills) - o0))"
        echo "caches_dropped=$dropped"
        echo "page_cache=$CACHE"
        echo "mem_available_kib=$a0"
        echo "mem_available_after_kib=$a1"
        echo "disk_devs=$DEVS"
        echo "disk_read_bytes=$(((s1 - s0) * 512))"
        echo "wall_s=$wall"
        echo "started=$(date -u -d "@${t0%.*}" +%Y-%m-%dT%H:%M:%SZ)"
        echo "args=$(echo "$*" | sed -E 's/--tokens 1,[0-9,]*,([0-9]+)/--tokens 1..\1/')"
    } > "$meta"
    say "$name: rc=$rc in $(sed -n 's/^wall_s=//p' "$meta") s, MemAvailable before $(gib "$a0") GiB, $(awk -v b=$(((s1 - s0) * 512)) 'BEGIN { printf "%.2f", b / 1e9 }') GB read from disk${DEVS:+ ($DEVS)}"
    [ "$rc" = 0 ] || tail -3 "$OUTDIR/$name.err" >&2
}

# eval_runs KIND NAME NTOK NPRED PASSES [sil-eval args...]
eval_runs() {
    local kind=$1 name=$2 ntok=$3 npred=$4 passes=$5 toks bin
    shift 5
    [ -f "$M" ] || dry || die "no model $M (run prep)"
    toks=$(seq -s, 1 "$ntok")
    case $WHICH in both | this | base) ;; *) die "WHICH must be both, this or base" ;; esac
    if [ -n "$BASE_B" ] && [ "$WHICH" = both ] && [ $((2 * (TIMEOUT + 10))) -gt 510 ]; then
        say "two runs of up to $((TIMEOUT + 10)) s: this phase may pass 9 minutes (WHICH=this, then WHICH=base)"
    fi
    if [ "$WHICH" != base ] || [ -z "$BASE_B" ]; then
        bin=$B/bin/sil-eval
        [ -x "$bin" ] || dry || die "no $bin (set B)"
        # shellcheck disable=SC2086 # THIS_ARGS is a list of arguments
        measure "$name" "$kind" this "$ntok" "$npred" "$passes" -- "$bin" --model "$M" \
            --tokens "$toks" --n-predict "$npred" --logits none "$@" ${THIS_ARGS:-}
    fi
    if [ -n "$BASE_B" ] && [ "$WHICH" != this ]; then
        bin=$BASE_B/bin/sil-eval
        [ -x "$bin" ] || dry || die "no $bin (set BASE_B)"
        # shellcheck disable=SC2086 # BASE_ENV is a list of VAR=value words
        measure "$name-base" "$kind" base "$ntok" "$npred" "$passes" -- env ${BASE_ENV:-} "$bin" \
            --model "$M" --tokens "$toks" --n-predict "$npred" --logits none "$@"
    fi
}

phase_peer() {
    local name=$1 mode=${2:-gpu} lb=${PEER_DIR:+$PEER_DIR/llama-bench}
    if [ -z "$lb" ] || [ ! -x "$lb" ]; then
        say "peer skipped: no llama-bench (PEER_DIR='$PEER_DIR')"
        local kind=peer
        [ "$mode" = gpu ] || kind=peer-$mode
        dry || printf 'name=%s\nkind=%s\nhold=%s\nskipped=1\n' "$name" "$kind" \
            "$(hold_label)" > "$OUTDIR/$name.meta"
        return 0
    fi
    case $mode in
    gpu) measure "$name" peer peer 512 128 1 -- "$lb" -m "$M" -ngl 99 -fa 1 -ncmoe "$NCMOE" \
        -p 512 -n 128 -r 1 -o json ;;
    4k) measure "$name" peer-4k peer 4096 0 1 -- "$lb" -m "$M" -ngl 99 -fa 1 -ncmoe "$NCMOE" \
        -p 4096 -n 0 -r 1 -o json ;;
    cpu) measure "$name" peer-cpu peer 128 32 1 -- env CUDA_VISIBLE_DEVICES= "$lb" -m "$M" \
        -ngl 0 -fa 1 -t "$THREADS" -p 128 -n 32 -r 1 -o json ;;
    # decode alone, for a cap where the prompt leaves no time for the tokens
    tg) measure "$name" peer peer 0 32 1 -- "$lb" -m "$M" -ngl 99 -fa 1 -ncmoe "$NCMOE" \
        -p 0 -n 32 -r 1 -o json ;;
    cputg) measure "$name" peer-cpu peer 0 8 1 -- env CUDA_VISIBLE_DEVICES= "$lb" -m "$M" \
        -ngl 0 -fa 1 -t "$THREADS" -p 0 -n 8 -r 1 -o json ;;
    *) die "peer mode must be gpu, cpu, 4k, tg or cputg" ;;
    esac
}

phase_status() {
    say "hold: $(hold_label) ($(cat "$WORK/hold.dir" 2> /dev/null || echo none)), MemAvailable $(gib "$(mem_kib MemAvailable)") GiB"
    say "model: $M $([ -f "$M" ] && stat -L -c %s "$M" || echo absent)"
    local f
    for f in "$OUTDIR"/*.meta; do
        [ -f "$f" ] || continue
        awk -F= '{ v[$1] = $2 } END { printf "  %-16s %-8s hold=%-5s rc=%s wall=%ss%s\n", v["name"], v["kind"], v["hold"], v["rc"], v["wall_s"], v["skipped"] ? " skipped" : "" }' "$f"
    done
}

# --- report --------------------------------------------------------------------------------
phase_report() {
    local file=${1:?usage: bench/run-lowmem.sh report FILE.json}
    local commit=${COMMIT:-$(git rev-parse --short HEAD 2> /dev/null)}
    [ -n "$commit" ] || commit=$(sed -n 's/^commit=//p' "$OUTDIR/prep.txt" 2> /dev/null)
    python3 - "$OUTDIR" "$file" "${commit:-unknown}" "$BUDGET" "$NCMOE" "$THREADS" << 'PY'
import datetime, glob, json, os, statistics, sys

outdir, dest, commit, budget, ncmoe, threads = sys.argv[1:7]
notes = []


def kv(path):
    d = {}
    try:
        with open(path) as f:
            for line in f:
                k, sep, v = line.rstrip("\n").partition("=")
                if sep:
                    d[k] = v
    except OSError:
        pass
    return d


def num(x):
    try:
        v = float(x)
        return v if v == v else None
    except (TypeError, ValueError):
        return None


def dig(o, *path):
    for k in path:
        if isinstance(o, dict) and k in o:
            o = o[k]
        elif isinstance(o, list) and isinstance(k, int) and -len(o) <= k < len(o):
            o = o[k]
        else:
            return None
    return o


def load_json(path):
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None, "no output"
    if not text.strip():
        return None, "empty output"
    try:
        return json.loads(text), None
    except ValueError:
        pass
    # llama-bench prints its array as it goes: keep the tests that finished
    t = text.rstrip().rstrip(",")
    for tail in ("]", "}]"):
        try:
            return json.loads(t + tail), "output cut short; the finished tests kept"
        except ValueError:
            pass
    return None, "output is not JSON"


def time_v(path):
    d = {}
    try:
        with open(path) as f:
            for line in f:
                k, sep, v = line.strip().rpartition(": ")
                if sep:
                    d[k] = v
    except OSError:
        pass
    return d


def r1(x, nd=1):
    return None if x is None else round(x, nd)


machine_kv = kv(os.path.join(outdir, "machine.txt"))
if not machine_kv:
    notes.append("the machine was not recorded in OUTDIR (machine.txt)")
prep = kv(os.path.join(outdir, "prep.txt"))
model_kv = kv(os.path.join(outdir, "model.txt"))
disk_gbs = num(prep.get("disk_gbs"))
if disk_gbs is None:
    notes.append("no disk bandwidth recorded (prep not run in this OUTDIR): floors leave the disk out")

machine = {
    "cpu": machine_kv.get("cpu") or None,
    "cores": int(machine_kv["cores"]) if machine_kv.get("cores", "").isdigit() else None,
    "ram_gib": r1(num(machine_kv.get("mem_total_kib")) / 1048576) if num(machine_kv.get("mem_total_kib")) else None,
    "gpu": machine_kv.get("gpu") or None,
    "driver": machine_kv.get("driver") or None,
    "cuda": machine_kv.get("cuda") or None,
}
if disk_gbs is not None:
    machine["disk_direct_read_gbs"] = disk_gbs

model = {
    "file": model_kv.get("file"),
    "bytes": int(model_kv["bytes"]) if model_kv.get("bytes", "").isdigit() else None,
    "made_by": model_kv.get("made_by"),
    "routing": "skew 0.46" if (model_kv.get("made_by") or "").startswith("sil-mkmodel") else None,
}
if model_kv.get("made") == "0" and (model["made_by"] or "").startswith("sil-mkmodel"):
    model["made_by"] += " (file present before prep; not remade here)"

runs = []
for mp in sorted(glob.glob(os.path.join(outdir, "*.meta"))):
    m = kv(mp)
    m.setdefault("name", os.path.basename(mp)[:-5])
    runs.append(m)
runs.sort(key=lambda m: m.get("started", ""))


def hold_cfg(m):
    h = m.get("hold", "none")
    if h and h != "none":
        return "host_avail=" + h
    a = num(m.get("mem_available_kib"))
    return "host_avail=%.0fG,hold=none" % (a / 1048576) if a else "host_avail=unknown"


def failed(m):
    if m.get("skipped") == "1":
        notes.append("%s: llama-bench not run (no PEER_DIR/llama-bench)" % m["name"])
        return True
    if m.get("timed_out") == "1":
        notes.append("%s timed out (killed after %s s)" % (m["name"], m.get("timeout_s", "?")))
        return True
    if m.get("rc") != "0":
        if m.get("oom_kills", "0") not in ("", "0"):
            notes.append("%s was killed: the kernel logged %s OOM kill(s) during it" % (m["name"], m["oom_kills"]))
            return True
        err = ""
        try:
            with open(os.path.join(outdir, m["name"] + ".err")) as f:
                lines = [l.strip() for l in f if l.strip()]
            err = ": " + lines[-1][:200] if lines else ""
        except OSError:
            pass
        notes.append("%s failed (exit %s)%s" % (m["name"], m.get("rc", "?"), err))
        return True
    return False


# peers: kind -> hold -> (pp tok/s, tg tok/s, description)
peers = {}
peer_seen = set()
for m in runs:
    if not m.get("kind", "").startswith("peer"):
        continue
    peer_seen.add((m["kind"], m.get("hold", "none")))
    if m.get("skipped") == "1":
        failed(m)
        continue
    data, why = load_json(os.path.join(outdir, m["name"] + ".json"))
    if m.get("rc") != "0":
        if m.get("timed_out") == "1" and isinstance(data, list) and data:
            notes.append("%s timed out (killed after %s s); the tests it finished are kept"
                         % (m["name"], m.get("timeout_s", "?")))
        else:
            failed(m)
            continue
    elif why:
        notes.append("%s: %s" % (m["name"], why))
    if not isinstance(data, list):
        continue
    pp = tg = None
    commit_p = None
    for t in data:
        if not isinstance(t, dict):
            continue
        commit_p = t.get("build_commit") or commit_p
        if (t.get("n_prompt") or 0) > 0 and not t.get("n_gen"):
            pp = num(t.get("avg_ts"))
        elif (t.get("n_gen") or 0) > 0 and not t.get("n_prompt"):
            tg = num(t.get("avg_ts"))
    args = m.get("args", "")
    if "-ngl" in args:  # what follows -m FILE: no paths
        args = args[args.find("-ngl"):]
    else:
        args = {"peer": "-ngl 99 -fa 1 -ncmoe %s -p 512 -n 128 -r 1",
                "peer-4k": "-ngl 99 -fa 1 -ncmoe %s -p 4096 -n 0 -r 1",
                "peer-cpu": "-ngl 0 -fa 1 -p 128 -n 32 -r 1"}[m["kind"]].replace("%s", m.get("ncmoe", ncmoe))
    desc = "llama.cpp llama-bench%s %s%s (after its short warm-up), page cache dropped before, same hold" % (
        " " + commit_p if commit_p else "", args.replace(" -o json", ""),
        " with CUDA_VISIBLE_DEVICES empty" if m["kind"] == "peer-cpu" else "")
    # a decode-only run (tg, cputg) fills in what a run at the same hold did not finish
    prev = peers.get(m["kind"], {}).get(m.get("hold", "none"))
    if prev:
        pp, tg = (pp if pp is not None else prev[0]), (tg if tg is not None else prev[1])
        if prev[2] != desc:
            desc = prev[2] + "; " + desc
    peers.setdefault(m["kind"], {})[m.get("hold", "none")] = (pp, tg, desc)

results = []


def add(metric, config, value, unit, **extra):
    if value is None:
        return
    r = {"metric": metric, "config": config, "value": value, "unit": unit, "runs": 1, "min": value, "max": value}
    r.update({k: v for k, v in extra.items() if v is not None})
    results.append(r)


def phase_disk_bytes(p, phase):
    for path in ((phase + "_host_tier", "bytes_read"), ("host_tier", phase, "bytes_read"),
                 (phase, "host_tier", "bytes_read"),
                 (phase, "host_bytes_read"), (phase, "host_tier_bytes_read"), (phase, "disk_bytes")):
        v = num(dig(p, *path))
        if v is not None:
            return v
    return None


peer_kind = {"ours": "peer", "prompt4k": "peer-4k", "cpu": "peer-cpu"}
missing = set()
for m in runs:
    kind = m.get("kind")
    if kind not in peer_kind or failed(m):
        continue
    name = m["name"]
    data, why = load_json(os.path.join(outdir, name + ".json"))
    if not isinstance(data, dict):
        notes.append("%s: %s" % (name, why or "output is not a JSON object"))
        continue
    try:
        with open(os.path.join(outdir, name + ".err")) as f:
            if "is not available, running on" in f.read():
                notes.append("%s: the backend asked for was not available (see %s.err)" % (name, name))
    except OSError:
        pass
    ntok = int(m.get("prompt_tokens", 0) or 0)
    ndec = max(int(m.get("n_predict", 0) or 0) - 1, 0)
    base = hold_cfg(m)
    if kind != "cpu":
        base += ",vram_budget=" + m.get("budget", budget)
    else:
        base += ",backend=cpu"
    if kind == "prompt4k":
        base += ",prompt=%d" % ntok
    if m.get("extra"):
        base += ",extra=" + m["extra"].replace(",", ";")
    if m.get("page_cache") == "warm":
        base += ",page_cache=warm"
    base += ",run=" + name
    if m.get("build") == "base":
        base += ",build=" + os.environ.get("BASE_COMMIT", "BASE")
    dev = data.get("device") if isinstance(data.get("device"), dict) else {}
    ht = data.get("host_tier") if isinstance(data.get("host_tier"), dict) else None
    if ht is None:
        missing.add("host_tier")
    h2d = num(dev.get("h2d_gbs"))
    if kind != "cpu" and not h2d:
        missing.add("device.h2d_gbs")
    passes = data.get("passes")
    if not isinstance(passes, list) or not passes:
        missing.add("passes")
        passes = [{"prefill_tok_s": dig(data, "timings", "prefill_tok_s"),
                   "decode_tok_s": dig(data, "timings", "decode_tok_s")}]
    pr = peers.get(peer_kind[kind], {}).get(m.get("hold", "none"))
    single = len(passes) == 1 and ndec == 0
    for i, p in enumerate(passes):
        label = "cold" if i == 0 else ("warm" if i == 1 else "warm%d" % i)
        cfg = base + ",pass=" + label
        phases = [("prefill", ntok)] + ([("decode", ndec)] if ndec > 0 else [])
        for phase, ntk in phases:
            v = num(p.get(phase + "_tok_s"))
            if v is None or ntk <= 0:
                continue
            # bytes per token: disk (the host tier's reads), and host to device (VRAM misses)
            dbytes = phase_disk_bytes(p, phase)
            dsrc = "host tier's reads in this pass and phase"
            if dbytes is None and single and ht is not None and num(ht.get("bytes_read")) is not None:
                dbytes, dsrc = num(ht.get("bytes_read")), "host tier's reads over the run (one pass, no decode)"
            if dbytes is None and ht is not None:
                missing.add("per-pass host-tier reads")
            hbytes = num(dig(p, phase, "bytes_streamed")) if kind != "cpu" else None
            dbt = dbytes / ntk if dbytes is not None else None
            hbt = hbytes / ntk if hbytes is not None else None
            floor = basis = None
            t_disk = dbt / (disk_gbs * 1e9) if dbt is not None and disk_gbs else None
            t_h2d = hbt / (h2d * 1e9) if hbt is not None and h2d else None
            if t_disk is not None or t_h2d is not None:
                t = (t_disk or 0) + (t_h2d or 0)
                parts = []
                if t_disk is not None:
                    parts.append("disk bytes per token (%s, %.1f MB) / %.2f GB/s (dd iflag=direct%s, prep)"
                                 % (dsrc, dbt / 1e6, disk_gbs,
                                    ", the better of one reader (%s) and four (%s)"
                                    % (prep["disk_gbs_1"], prep["disk_gbs_4"])
                                    if prep.get("disk_gbs_4") else ", one reader"))
                else:
                    parts.append("disk term left out (no per-pass disk reads in sil-eval's JSON)")
                if t_h2d is not None:
                    parts.append("VRAM-miss bytes per token (%.1f MB, misses computed on the CPU included) / "
                                 "H2D %.1f GB/s measured at open" % (hbt / 1e6, h2d))
                elif kind != "cpu":
                    parts.append("H2D term left out (no bytes_streamed or h2d_gbs)")
                if t > 0:
                    floor = r1(1 / t)
                    basis = " + ".join(parts) + ", in series"
                    if t_disk and t_h2d:
                        basis += "; overlapped (the larger term alone): %.1f tok/s" % (1 / max(t_disk, t_h2d))
            pv = None
            if pr:
                pv = pr[0] if phase == "prefill" else pr[1]
            add(phase + "_tok_s", cfg, r1(v), "tok/s", floor=floor, floor_basis=basis,
                peer=pr[2] if pr and pv is not None else None, peer_value=r1(pv) if pv is not None else None,
                peer_ratio=r1(v / pv, 2) if pv else None)
            if dbt is not None:
                add("disk_bytes_per_token", cfg + ",phase=" + phase, round(dbt), "bytes",
                    basis=dsrc)
            hr = num(dig(p, phase, "hit_rate"))
            if kind != "cpu" and hr is not None and (num(dig(p, phase, "hits")) or num(dig(p, phase, "misses"))):
                add("hit_rate", cfg + ",phase=" + phase + ",cache=vram", round(hr, 4), "fraction")
    # the whole run
    dr = num(m.get("disk_read_bytes"))
    dsrc = "/proc/diskstats of %s" % (m.get("disk_devs", "").strip() or "?")
    if not m.get("disk_devs", "").strip():
        fsi = num(time_v(os.path.join(outdir, name + ".time")).get("File system inputs"))
        dr, dsrc = (fsi * 512, "time -v's file system inputs x 512") if fsi is not None else (None, None)
    cfg_run = base + ",pass=all"
    ntot = len(passes) * (ntok + ndec)
    if dr is not None:
        add("disk_read_bytes", cfg_run, int(dr), "bytes",
            basis="read from the model's disk during the whole run (open included), " + dsrc)
        if ntot:
            add("disk_bytes_per_token", cfg_run + ",phase=run", round(dr / ntot), "bytes",
                basis="the run's disk reads (open included) / the %d tokens it evaluated" % ntot)
    if ht is not None:
        hh, hm = num(ht.get("hits")), num(ht.get("misses"))
        if hh is not None and hm is not None and hh + hm > 0:
            add("hit_rate", cfg_run + ",cache=host", round(hh / (hh + hm), 4), "fraction")
        add("host_tier_read_bytes", cfg_run, num(ht.get("bytes_read")), "bytes")
        add("host_tier_wait_s", cfg_run, r1(num(ht.get("wait_s")), 3), "s")
        if ht.get("on") is False:
            notes.append("%s: the host tier was off (budget %s from %s)" % (name, ht.get("budget"), ht.get("budget_from")))
    a0 = num(m.get("mem_available_kib"))
    add("mem_available_mib", cfg_run + ",when=before", r1(a0 / 1024) if a0 else None, "MiB")
    try:
        with open(os.path.join(outdir, name + ".mem")) as f:
            ms = [int(c[1]) for c in (l.split() for l in f) if len(c) >= 2 and c[1].isdigit()]
        if ms:
            add("mem_available_mib", cfg_run + ",when=min_during", r1(min(ms) / 1024), "MiB")
    except OSError:
        pass
    rss = num(time_v(os.path.join(outdir, name + ".time")).get("Maximum resident set size (kbytes)"))
    add("rss_mib", cfg_run + ",peak", r1(rss / 1024) if rss else None, "MiB")
    add("wall_s", cfg_run, num(m.get("wall_s")), "s")
    if not pr and (peer_kind[kind], m.get("hold", "none")) not in peer_seen:
        notes.append("%s: no %s run under hold %s to compare with" % (name, peer_kind[kind], m.get("hold")))

for h in sorted(missing):
    notes.append("sil-eval's JSON had no %s in some runs: the figures that need it are left out" % h)

# llama.cpp's figures that no run of ours in this OUTDIR was compared with: kept in the notes
used = {(peer_kind[m.get("kind")], m.get("hold", "none")) for m in runs
        if m.get("kind") in peer_kind and not failed(m)}
peer_txt = []
for kind in sorted(peers):
    for hold, (pp, tg, desc) in sorted(peers[kind].items()):
        if (kind, hold) in used or (pp is None and tg is None):
            continue
        figs = ", ".join(x for x in ("prefill %.2f tok/s" % pp if pp is not None else None,
                                      "decode %.2f tok/s" % tg if tg is not None else None) if x)
        peer_txt.append("%s at hold %s: %s (%s)" % (kind, hold, figs, desc))

holds = sorted({m.get("hold") for m in runs if m.get("hold") not in (None, "none")})
hold_txt = []
for h in holds:
    try:
        with open(os.path.join(outdir, "hold-%s.txt" % h)) as f:
            fields = dict(x.split("=", 1) for x in f.read().split() if "=" in x)
        hold_txt.append("%s: MemAvailable %.2f GiB reached with %.1f GiB of tmpfs held"
                        % (h, int(fields["mem_available_kib"]) / 1048576, int(fields["held_kib"]) / 1048576))
    except (OSError, KeyError, ValueError):
        pass

phases = []
try:
    with open(os.path.join(outdir, "phases.log")) as f:
        phases = [l.strip() for l in f if l.strip()]
except OSError:
    pass
command = "bench/run-lowmem.sh with B=<build> MODEL=<file> BUDGET=%s NCMOE=%s: %s" % (
    budget, ncmoe, "; ".join(phases) if phases else "(phases not logged)")

head = ("Issue 37: the 35B-A3B file on a host whose MemAvailable is held below its size by a tmpfs of "
        "zeros (host_avail=SIZE: the hold in place; each run's MemAvailable before and its minimum during "
        "are kept as mem_available_mib). The page cache is dropped before every run. sil-eval runs 2 passes "
        "in one engine (pass=cold first, then warm) of a 512-token prompt and 128 greedy tokens (CUDA, "
        "--vram-budget %s), a 4096-token prompt in 1 pass (prompt=4096), and 128 + 32 tokens on the CPU "
        "backend with %s threads. One run per figure. disk_read_bytes counts every read of the model's "
        "disk during a run, the open included. Floors: disk bytes per token / the disk's direct-read GB/s "
        "plus VRAM-miss bytes per token / the H2D GB/s sil-eval measured at open, in series." % (budget, threads))
if hold_txt:
    head += " Holds: " + "; ".join(hold_txt) + "."
if peer_txt:
    head += " llama.cpp with no run of ours at its hold in this call: " + "; ".join(peer_txt) + "."
doc = {
    "benchmark": "lowmem-35b",
    "date": os.environ.get("DATE") or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "commit": commit,
    "command": command,
    "machine": machine,
    "model": model,
    "results": results,
    "notes": head + (" Not measured / failed: " + "; ".join(dict.fromkeys(notes)) + "." if notes else ""),
}
with open(dest, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
print("run-lowmem: wrote %s: %d results, %d notes" % (dest, len(results), len(set(notes))))
PY
}

# --- main ----------------------------------------------------------------------------------
phase=${1:-}
[ -n "$phase" ] || die "usage: bench/run-lowmem.sh prep|hold SIZE|off|ours NAME [args]|prompt4k NAME [args]|cpu NAME [args]|peer NAME [cpu|4k|tg|cputg]|status|report FILE.json"
shift
dry || mkdir -p "$WORK" "$OUTDIR" || die "cannot make $WORK or $OUTDIR"
case $phase in prep | hold | ours | prompt4k | cpu | peer) record_machine ;; esac
case $phase in
prep | hold | ours | prompt4k | cpu | peer)
    dry || echo "$phase $*" | cut -c1-200 >> "$OUTDIR/phases.log"
    ;;
esac
SECONDS=0
EXTRA="" # a run phase's own sil-eval args, named in its configs
case $phase in ours | prompt4k | cpu) [ $# -gt 1 ] && EXTRA="${*:2}" ;; esac
case $phase in
prep) phase_prep ;;
hold) phase_hold "$@" ;;
ours)
    name=${1:?usage: bench/run-lowmem.sh ours NAME [sil-eval args...]}
    shift
    eval_runs ours "$name" 512 128 2 --backend cuda --vram-budget "$BUDGET" --passes 2 --json "$@"
    ;;
prompt4k)
    name=${1:?usage: bench/run-lowmem.sh prompt4k NAME [sil-eval args...]}
    shift
    eval_runs prompt4k "$name" 4096 1 1 --backend cuda --vram-budget "$BUDGET" --ctx 4608 \
        --passes 1 --json "$@"
    ;;
cpu)
    name=${1:?usage: bench/run-lowmem.sh cpu NAME [sil-eval args...]}
    shift
    eval_runs cpu "$name" 128 32 2 --backend cpu --threads "$THREADS" --passes 2 --json "$@"
    ;;
peer) phase_peer "${1:?usage: bench/run-lowmem.sh peer NAME [cpu|4k|tg|cputg]}" "${2:-gpu}" ;;
status) phase_status ;;
report) phase_report "$@" ;;
*) die "unknown phase '$phase'" ;;
esac
rc=$?
say "$phase done in ${SECONDS}s"
exit $rc
