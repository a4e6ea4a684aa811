#!/usr/bin/env bash
# Issue 22's soak on one GPU, one device call: the HTTP server on a real-format random S1-mini checkpoint (written
# once by the checkpoint writer of `warm --write-checkpoint`, kept in $CKPT between calls on a warm machine), `python -m ttsengine soak`
# with 256 clients for 8 minutes (streams in every format, a stored voice, hang-ups, SSE, bad requests), then
# SIGTERM and the drain. Prints the per-minute table and the server's errors.
# Usage: scripts/device/soak.sh   (env: CKPT, CACHE, CLIENTS=256, MINUTES=8, INTERVAL=60, PROCS=4 client processes,
#   FORMAT_SETS)
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/container:$PWD${PYTHONPATH:+:$PYTHONPATH}
CKPT=${CKPT:-/tmp/s1-random} CACHE=${CACHE:-/tmp/tts-cache} PORT=${PORT:-8080}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"
. scripts/device/lib.sh
random_checkpoint "$CKPT" "$OUT/write.log" || exit 1
TTS_MODEL_DIR=$CKPT TTS_CACHE_DIR=$CACHE TTS_DATA_DIR=/tmp/tts-data TTS_PORT=$PORT TTS_LOG_LEVEL=WARNING \
  python3 -m handlers http > "$OUT/server.log" 2>&1 &
PID=$!
python3 scripts/device/wait_ready.py "$PORT" "$PID" 400 kernel_cache max_streams memory_preset || { tail -30 "$OUT/server.log"; kill $PID; exit 1; }
rc=0  # the script's exit: the first soak that failed (its status), else 0
for formats in ${FORMAT_SETS:-pcm,wav,mp3,opus,flac}; do  # one soak per set, against the same server
  echo "## formats $formats"
  python3 -m ttsengine soak "http://127.0.0.1:$PORT" --clients "${CLIENTS:-256}" --processes "${PROCS:-4}" --minutes "${MINUTES:-8}" \
    --interval "${INTERVAL:-60}" --formats "$formats" --server-pid $PID --out "$OUT/soak-${formats//,/-}" \
    2> "$OUT/soak.err"
  s=$?; echo "soak exit $s"; [ "$rc" = 0 ] && rc=$s
done
t=$(date +%s)
kill -TERM $PID
wait $PID
echo "server exit $? after $(( $(date +%s) - t )) s of drain"
echo "server log: $(grep -c Traceback "$OUT/server.log") tracebacks, $(grep -c ' ERROR ' "$OUT/server.log") errors"
grep -E " ERROR |Traceback" "$OUT/server.log" | head -10
exit "$rc"  # not grep's: it answers 1 when the log is clean (long_soak.sh read that as the soak failing)
