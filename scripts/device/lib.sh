# Sourced by the device scripts (bash): what each of them began with.
#   device_setup WORKDIR TAIL_BYTES: OUT (default device-out) and W=WORKDIR made; on exit each $W/*.log's last
#     TAIL_BYTES go to $OUT/logs.txt (what comes back from the device); this checkout on PYTHONPATH, unbuffered.
#   random_checkpoint DIR LOG: a checkpoint of S1-mini's real shapes with random weights in DIR, once (~20 s on a
#     GPU); its output to LOG, the tail of which is printed if it fails (the caller exits).
#   evict_pages DIR...: every file under the DIRs dropped from the page cache (fsync first: clean pages only), so a
#     start reads them from disk.
#   server_down PID NAME: SIGTERM to the server PID, waits for it; prints its exit status and the tracebacks counted
#     in $W/server-NAME.log.

device_setup() {
  OUT=${OUT:-device-out}
  W=$1
  mkdir -p "$OUT" "$W"
  # shellcheck disable=SC2064 # W, OUT and the size are fixed now; f is expanded at exit
  trap "for f in \"$W\"/*.log; do echo \"==== \$f\"; tail -c $2 \"\$f\"; done > \"$OUT/logs.txt\"" EXIT
  export PYTHONPATH=$PWD/container:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
}

random_checkpoint() {
  [ -f "$1/model.pth" ] && return 0
  local t
  t=$(date +%s)
  python3 -c "import sys; from ttsengine.model.loading.checkpoint_writer import write_random_checkpoint as w; \
w('s1-mini', sys.argv[1], 'cuda')" "$1" > "$2" 2>&1 || { tail -20 "$2"; return 1; }
  echo "wrote $1 in $(( $(date +%s) - t )) s: $(du -sh "$1" | cut -f1)"
}

server_down() {
  kill -TERM "$1"; wait "$1"; echo "server exit $?: $(grep -c Traceback "$W/server-$2.log") tracebacks"
}

evict_pages() {
  python3 - "$@" <<'PY'
import os, sys
for root in sys.argv[1:]:
    for d, _, names in os.walk(root):
        for n in names:
            try:
                fd = os.open(os.path.join(d, n), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass
            finally:
                os.close(fd)
PY
}
