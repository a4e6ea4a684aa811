#!/usr/bin/env bash
# A soak longer than one device call (600 s at most): `start` launches scripts/device/soak.sh in its own process
# session (setsid: it outlives the call that started it, until the machine goes back) with its output in $DIR;
# `wait` (the next call, issued within the machine's idle release) waits for it to end, up to $LIMIT s, and prints
# what it printed. `start` returns at once; the caller may use the call's remaining time for other work (another
# GPU: the soak takes CUDA_VISIBLE_DEVICES=$GPU).
# Usage: scripts/device/long_soak.sh start|wait   (env: DIR=/tmp/long-soak, GPU=0, LIMIT=560; soak.sh's env:
#   MINUTES, CLIENTS, PROCS, FORMAT_SETS, CKPT, CACHE)
set -uo pipefail
DIR=${DIR:-/tmp/long-soak}
case ${1:-} in
  start)
    mkdir -p "$DIR"
    rm -rf "$DIR/done" "$DIR"/soak-*  # an earlier soak's reports are not this one's
    CUDA_VISIBLE_DEVICES=${GPU:-0} OUT=$DIR setsid bash -c 'bash scripts/device/soak.sh; echo "soak.sh exit $?" > "$0/done"' \
      "$DIR" > "$DIR/run.log" 2>&1 < /dev/null &
    echo "soak started in its own session (pid $!), output in $DIR" ;;
  wait)
    t0=$(date +%s)
    until [ -f "$DIR/done" ]; do
      [ $(( $(date +%s) - t0 )) -ge "${LIMIT:-560}" ] && { echo "still running after ${LIMIT:-560} s"; break; }
      sleep 5
    done
    cat "$DIR/run.log" "$DIR/done" 2>/dev/null
    tail -5 "$DIR/soak.err" 2>/dev/null
    mkdir -p "${OUT:-device-out}" && cp "$DIR"/soak-*/soak.json "${OUT:-device-out}/" 2>/dev/null ;;
  *) echo "usage: long_soak.sh start|wait" >&2; exit 2 ;;
esac
