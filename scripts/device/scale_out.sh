#!/usr/bin/env bash
# Issue 44's scale-out as users meet it, one device call: a first server (A) under load while a second one (B)
# starts from one of the cache states a new worker can have, and B's first bursts sent the moment /ready says 200:
#   dir     B on the kernel cache directory A runs on (a second worker on the same host, a restart)
#   blob    B on an empty directory holding only the kernel-cache blob `warm` wrote (SageMaker's model.tar.gz,
#           `deploy --cache-blob`; the codec cache is not in the blob, so B converts the codec again)
#   volume  B on a copy of A's whole cache directory made elsewhere (RunPod's network volume, filled by another
#           worker; here on local disk: the copy's read is not a network volume's)
#   empty   B on an empty directory (nothing shipped: compiles)
# A runs on cuda:0 (A_DEV); B on cuda:1 where the machine has two GPUs, else beside A on cuda:0 (both then with
# TTS_GPU_MEMORY_UTILIZATION=0.45: two workers sharing one GPU, a busier start than a new machine's own).
# Per case: A's open-loop load (Poisson $RATE/s) runs through B's start and bursts; B's process start -> /ready
# (settled), then bursts of $BURSTS requests at once (pcm, $FRAMES frames) the moment it is ready, then the same
# bursts again ("once warm", the issue's baseline). Before the cases, `ttsengine warm` fills the cache directory and
# writes the blob (skipped if an earlier call on this machine left them: FRESH=0).
# A case may name a feature B runs with: CASES="dir dir:codec_own_convs" (TTS_FEATURES=+codec_own_convs; the second
# such case finds its Triton kernels in the cache the first compiled), or one it runs without: "dir:-gc_freeze"; a
# case named again is measured again (CASES="dir dir:-gc_freeze dir dir:-gc_freeze": A/B twice). B logs at INFO:
# after its ready line, where its start went (first engine ready, each kind's graph captures). Prints one table last.
# Usage: CASES="dir blob" scripts/device/scale_out.sh, then FRESH=0 CASES="volume empty" LOAD_S=150 on the same
#   machine (env: CASES="dir blob volume empty",
#   BURSTS="64 256", FRAMES=192, MAX=256, RATE=24, LOAD_S=90 (A's load per case, s: it should outlast B's start and
#   bursts, ~90 s from a warm directory, longer from empty), PROCS=4, FRESH=1, CKPT, WORK). Two cases fit a call.
#   TRACE=1 (any value): B's prefill budget traced (scripts/device/budget_trace) and printed per half second after its bursts.
set -uo pipefail
. scripts/device/lib.sh
device_setup "${WORK:-/tmp/scale-out}" 6000
CASES=${CASES:-dir blob volume empty} BURSTS=${BURSTS:-64 256} FRAMES=${FRAMES:-192} MAX=${MAX:-256}
RATE=${RATE:-24} LOAD_S=${LOAD_S:-90} PROCS=${PROCS:-4} CKPT=${CKPT:-/tmp/s1-random}
A_PORT=8080 B_PORT=8081 CACHE=$W/cache
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, uvicorn; print('torch', torch.__version__, '| uvicorn', uvicorn.__version__)"
if (( $(nvidia-smi -L | wc -l) >= 2 )); then B_DEV=cuda:1 SHARE=; else B_DEV=cuda:0 SHARE=0.45; fi
A_DEV=${A_DEV:-cuda:0} B_DEV=${B_DEV_OVERRIDE:-$B_DEV}  # overrides: a dry run on CPUs (A_DEV=cpu B_DEV_OVERRIDE=cpu)
random_checkpoint "$CKPT" "$W/write.log" || exit 1
if [ "${FRESH:-1}" = 1 ] || ! compgen -G "$CACHE/artifacts-*.bin" > /dev/null; then
  rm -rf "$CACHE"; t0=$(date +%s)
  env ${SHARE:+TTS_GPU_MEMORY_UTILIZATION=$SHARE} TTS_CACHE_DIR="$CACHE" TTS_MAX_BATCH="$MAX" \
    python3 -m ttsengine warm --model "$CKPT" > "$W/warm.log" 2>&1 || { tail -20 "$W/warm.log"; exit 1; }
  echo "warm: cache directory and blob written in $(( $(date +%s) - t0 )) s"
fi

serve() {  # serve NAME PORT DEVICE CACHE_DIR: a server in the background, ready (settled); sets SPID and READY
  local name=$1 port=$2 device=$3 cache=$4 t0; t0=$(date +%s.%N)
  env ${SHARE:+TTS_GPU_MEMORY_UTILIZATION=$SHARE} TTS_MODEL_DIR="$CKPT" TTS_CACHE_DIR="$cache" \
    TTS_DATA_DIR="$W/data-$name" TTS_PORT="$port" TTS_DEVICES="$device" TTS_MAX_BATCH="$MAX" \
    TTS_LOG_LEVEL="${LOG:-WARNING}" TTS_FEATURES="${FEATS:-auto}" \
    ${TRACE:+PYTHONPATH=$PWD/scripts/device/budget_trace:$PYTHONPATH BUDGET_TRACE=$W/budget-$name} \
    python3 -m handlers http > "$W/server-$name.log" 2>&1 &
  SPID=$!
  python3 scripts/device/wait_ready.py "$port" "$SPID" 400 kernel_cache max_streams > "$W/ready-$name.txt" 2>&1 \
    || { cat "$W/ready-$name.txt"; tail -30 "$W/server-$name.log"; kill "$SPID"; return 1; }
  READY=$(python3 -c "import time; print(round(time.time() - $t0, 1))")
  echo "server $name ($device): ready after $READY s from process start ($(cat "$W/ready-$name.txt"))"
}
lt() {  # lt NAME PORT [loadtest args]
  local name=$1 port=$2; shift 2
  timeout 400 python3 -m ttsengine loadtest "http://127.0.0.1:$port" --max-new-tokens "$FRAMES" \
    --processes "$PROCS" --out "$W/$name" "$@" > "$W/$name.log" 2>&1
  echo "loadtest $name exit $?"
}
captures() {  # where B's start went from its INFO log: first engine ready, then each kind's captures before /ready
  python3 - "$1" <<'PY'
import re, sys
from datetime import datetime

lines = open(sys.argv[1], errors="replace").read().splitlines()
stamp = lambda line: datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")  # noqa: E731
t0 = next((stamp(x) for x in lines if x[:2] == "20"), None)
ready = next((stamp(x) for x in lines if "engine ready" in x), None)
kinds: dict = {}
for x in lines:
    m = re.search(r"captured (?:(\d+) (\S+) graph\(s\)|the (\S+) graph .*at first use) .*in ([\d.]+) s"
                  r"(?: \(first runs ([\d.]+) s, recording ([\d.]+) s\))?", x)
    if m:
        kind = m.group(2) or m.group(3)
        n, s, f, r = kinds.get(kind, (0, 0.0, 0.0, 0.0))
        kinds[kind] = (n + int(m.group(1) or 1), s + float(m.group(4)), f + float(m.group(5) or 0),
                       r + float(m.group(6) or 0))
since = f"{(ready - t0).total_seconds():.1f} s after its first log line" if ready and t0 else "?"
print(f"  B's start: engine ready {since}; captures " + ", ".join(
    f"{k} {n} in {s:.1f} s (first runs {f:.1f}, recording {r:.1f})" for k, (n, s, f, r) in sorted(kinds.items())))
PY
}
stop() { kill -TERM "$1"; wait "$1"; echo "server exit $?: $(grep -c Traceback "$W/server-$2.log") tracebacks"; }

serve a "$A_PORT" "$A_DEV" "$CACHE" || exit 1
A_PID=$SPID
ROWS=()
declare -A SEEN=()
for entry in $CASES; do  # STATE or STATE:FEATURE (B with TTS_FEATURES=+FEATURE) or STATE:-FEATURE (that one off)
  case=${entry%%:*} feats=auto label=${entry%%:*}
  if [[ $entry == *:* ]]; then
    feats=${entry#*:}; [[ $feats == [-+]* ]] || feats=+$feats
    label=$case$feats
  fi
  SEEN[$label]=$(( ${SEEN[$label]:-0} + 1 ))
  (( SEEN[$label] > 1 )) && label=$label.${SEEN[$label]}  # a case repeated (A/B pairs): its own files and row
  dir=$W/cache-$label; rm -rf "$dir"
  case $case in
    dir) dir=$CACHE ;;
    blob) mkdir -p "$dir"; cp "$CACHE"/artifacts-*.bin "$dir"/ ;;
    volume) cp -a "$CACHE" "$dir" ;;
    empty) mkdir -p "$dir" ;;
    *) echo "unknown case $case (dir, blob, volume, empty)"; continue ;;
  esac
  lt "a-$label" "$A_PORT" --arrivals "poisson:$RATE" --concurrency "$MAX" --requests $((RATE * LOAD_S)) &
  LOAD_PID=$!
  sleep 5  # A's load under way before B starts
  if LOG=INFO FEATS=$feats serve "b-$label" "$B_PORT" "$B_DEV" "$dir"; then
    captures "$W/server-b-$label.log"
    for n in $BURSTS; do lt "b-$label-first-$n" "$B_PORT" --concurrency "$n" --requests "$n"; done
    for n in $BURSTS; do lt "b-$label-warm-$n" "$B_PORT" --concurrency "$n" --requests "$n"; done
    stop "$SPID" "b-$label"
    if [ -n "${TRACE:-}" ]; then  # the prefill budget in B's engine process, per half second, bursts included
      for f in "$W/budget-b-$label".*; do
        [ -f "$f" ] || { echo "## no budget trace of B"; continue; }
        echo "## B's prefill budget ($f)"; python3 scripts/device/budget_table.py "$f"
      done
    fi
    ROWS+=("$label:$READY")
  fi
  wait "$LOAD_PID"
done
stop "$A_PID" a
python3 - "$W" "$BURSTS" "${ROWS[@]}" <<'PY' | tee "$OUT/table.txt"
import json, sys
from pathlib import Path

work, bursts, rows = Path(sys.argv[1]), sys.argv[2].split(), [r.split(":") for r in sys.argv[3:]]


def fa(name: str) -> str:
    f = work / name / "loadtest.json"
    if not f.exists():
        return "-"
    lv = json.loads(f.read_text())["levels"][0]
    errors = f", {lv['errors']} errors" if lv["errors"] else ""
    return f"{lv['first_audio_p50_ms']:.0f} / {lv['first_audio_p95_ms']:.0f}{errors}"


head = " | ".join(f"B burst {n}: at ready ; once warm" for n in bursts)
print(f"| case | B ready after s | {head} | A's load meanwhile |")
print("|---|---|" + "---|" * len(bursts) + "---|")
for case, ready in rows:
    cells = " | ".join(f"{fa(f'b-{case}-first-{n}')} ; {fa(f'b-{case}-warm-{n}')}" for n in bursts)
    print(f"| {case} | {ready} | {cells} | {fa(f'a-{case}')} |")
print("first audio p50 / p95 ms (client side)")
PY
