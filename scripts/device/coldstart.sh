#!/usr/bin/env bash
# Issue 21 on one GPU machine, one device call (< 9 minutes): process start -> first audio of
# `python -m ttsengine warm`, loading a real-size random S1-mini checkpoint from local disk (model.pth 1.72 GB
# bf16, codec.pth 1.87 GB fp32, written once by --write-checkpoint's writer), for
#   empty   an empty cache directory (kernel cache and codec cache both empty: compile + codec conversion)
#   dir     the cache directory the first `empty` run left (kernels and the bf16 codec entry found)
#   blob    only the kernel-cache blob copied into an empty directory (the codec cache is not in the blob, so the
#           codec is converted again)
#   package the blob and the codec cache's entry copied into an empty directory: what SageMaker's model.tar.gz
#           unpacks into kernel-cache/ when packaged with --cache-blob and --codec-cache (docs/deploy-sagemaker.md)
# each with TTS_QUANT=bf16 and int8, RUNS runs each, in rounds (every case once, then again), so the deadline
# cuts the last rounds, never a whole case. Before every run the weight files and the cache directory are
# evicted from the page cache (posix_fadvise DONTNEED, EVICT=0 keeps them): the disk read is measured.
# Prints a table of medians; logs and the JSON lines in $OUT.
#   usage: scripts/device/coldstart.sh      env: BUDGET (s, default 530) RUNS (3) QUANTS ("bf16 int8")
#                                                CASES ("empty dir blob") WORK (/tmp/coldstart) EVICT (1)
#                                                COMPILEALL (1: byte-compile site-packages first, as the image)
#                                                VARIANTS ("-": TTS_FEATURES values the dir and blob cases run
#                                                under, each in every round, e.g. "- -early_readahead"; the empty
#                                                case runs under the first only)
#                                                FRESH (1: start from empty caches; 0 keeps an earlier
#                                                invocation's, e.g. CASES=empty RUNS=1, then FRESH=0 CASES=dir)
set -uo pipefail
. scripts/device/lib.sh
export PYTHONPATH=$PWD/container:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-device-out}
WORK=${WORK:-/tmp/coldstart}
RUNS=${RUNS:-3}
QUANTS=${QUANTS:-bf16 int8}
CASES=${CASES:-empty dir blob}
EVICT=${EVICT:-1}
VARIANTS=${VARIANTS:--}
CK=$WORK/s1-mini
END=$(( $(date +%s) + ${BUDGET:-530} ))
mkdir -p "$OUT" "$WORK"
left() { echo $(( END - $(date +%s) )); }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch, sys; print("torch", torch.__version__, "| python", sys.version.split()[0])'
df -h "$WORK" | tail -1
# the image compiles every module's bytecode at build time, the standard library's too; a bare machine would compile
# torch's at every start (and, with the prefix, the standard library's: stop 67's py-spy found ~0.4 s of it)
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pyc}
[ "${COMPILEALL:-1}" = 0 ] || python3 -m compileall -q -j 0 \
  "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
  "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')" container > /dev/null 2>&1

if [ ! -f "$CK/codec.pth" ]; then  # the writer renames a complete directory into place: present = complete
  rm -rf "$CK"
  echo "## writing the real-size random checkpoint to $CK"
  timeout 240 python3 -c "
import sys, time
from ttsengine.model.loading.checkpoint_writer import write_random_checkpoint
t = time.perf_counter()
d = write_random_checkpoint('s1-mini', sys.argv[1], 'cuda')
print(f'wrote {d} in {time.perf_counter() - t:.1f} s:', ', '.join(f'{p.name} {p.stat().st_size / 1e9:.3f} GB'
      for p in sorted(d.iterdir()) if p.suffix == '.pth'))" "$CK" 2>&1 | tail -1
  [ -f "$CK/codec.pth" ] || { echo "could not write the checkpoint"; exit 1; }
fi


declare -A LAST  # seconds the last run of each case took (the estimate for the next one)
run_case() {  # run_case QUANT CASE ROUND [FEATURES]
  local q=$1 c=$2 r=$3 f=${4:--} kc="$WORK/kc-$1" dir log est t0 status tag
  tag=$c; [ "$f" = - ] || { tag=${f//-/no}; tag="$c.${tag//+/with}"; }  # the variant in the log's name: dir.noearly_readahead
  log="$OUT/coldstart-$q-$tag-$r.log"
  local args=(--model "$CK" --until-first-audio --no-blob)
  case $c in
    empty)
      dir="$kc-new"; rm -rf "$dir"
      # the first empty run of a quant also writes the blob; its directory is the one the dir and blob cases use
      [ -d "$kc" ] || args=(--model "$CK" --until-first-audio) ;;
    dir)
      [ -d "$kc" ] || { echo "skipped $q $c $r: no cache directory yet"; return; }
      dir=$kc ;;
    blob|package)
      compgen -G "$kc/artifacts-*.bin" > /dev/null || { echo "skipped $q $c $r: no blob"; return; }
      [ "$c" = blob ] || compgen -G "$kc/weights/codec-*.pt" > /dev/null \
        || { echo "skipped $q $c $r: no codec entry"; return; }
      dir="$WORK/kc-$q-$c"; rm -rf "$dir"; mkdir -p "$dir"; cp "$kc"/artifacts-*.bin "$dir"/
      if [ "$c" = package ]; then mkdir -p "$dir/weights"; cp "$kc"/weights/codec-*.pt "$dir/weights/"; fi ;;
  esac
  est=${LAST[$q-$tag]:-$([ "$c" = empty ] && echo 75 || echo 30)}
  if [ "$(left)" -lt $(( est + 10 )) ]; then
    echo "skipped $q $c run $r: $(left) s left, it takes ~$est s"
    return
  fi
  [ "$EVICT" = 1 ] && evict_pages "$CK" "$dir"
  t0=$(date +%s)
  # the same paths in the environment too: `warm` starts reading $TTS_MODEL_DIR's weights before its imports
  TTS_FEATURES=$([ "$f" = - ] && echo auto || echo "$f") \
  TTS_MODEL_DIR="$CK" TTS_CACHE_DIR="$dir" TTS_QUANT=$q timeout $(( $(left) - 5 )) python3 -m ttsengine warm "${args[@]}" \
    --cache-dir "$dir" > "$log" 2>&1
  status=$?
  LAST[$q-$tag]=$(( $(date +%s) - t0 ))
  if [ "$c" = empty ] && [ $status = 0 ]; then  # this run's cache is the newest complete one
    [ -d "$kc" ] || mv "$dir" "$kc"
  fi
  echo "$q $tag run $r: exit $status, ${LAST[$q-$tag]} s wall | $(grep '^{' "$log" | tail -1 | cut -c1-160)"
  [ $status = 0 ] || grep -v "^\s*$" "$log" | tail -3
}

[ "${FRESH:-1}" = 0 ] || rm -rf "$WORK"/kc-*  # an invocation starts from empty caches (the checkpoint is kept)
for r in $(seq 1 "$RUNS"); do
  for q in $QUANTS; do
    for c in $CASES; do
      if [ "$c" = empty ]; then run_case "$q" "$c" "$r" "${VARIANTS%% *}"; continue; fi
      for f in $VARIANTS; do run_case "$q" "$c" "$r" "$f"; done
    done
  done
done

echo
python3 - "$OUT" <<'PY'
import glob, json, os, statistics, sys
rows = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "coldstart-*-*-*.log"))):
    q, c, _ = os.path.basename(path)[len("coldstart-"):-len(".log")].split("-", 2)
    lines = [line for line in open(path, errors="replace") if line.startswith("{")]
    if lines:
        rows.setdefault((q, c), []).append(json.loads(lines[-1]))
names = {"empty": "empty cache", "dir": "warm cache directory", "blob": "blob into an empty directory",
         "package": "blob + codec entry (SageMaker package)"}
print("| case | quant | runs | start -> first audio, median (all) | imports s | load s (files/compiler/model/codec) | warm-up s |"
      " codec cache | kernel cache |")
print("|---|---|---|---|---|---|---|---|---|")
def med(runs, key):  # "-" where a run's JSON lacks the key (an older warm)
    values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
    return f"{statistics.median(values):.2f}" if len(values) == len(runs) else "-"
def phases(runs):  # the load's parts, medians: " (0.31/1.20/0.90)"
    parts = [r.get("load_phases") or {} for r in runs]
    if not all(parts):
        return ""
    return " (" + "/".join(f"{statistics.median(p.get(k, 0.0) for p in parts):.2f}" for k in ("files", "compiler", "model", "codec")) + ")"
for q in ("bf16", "int8", "int4"):
    for c in sorted((c for qq, c in rows if qq == q), key=lambda c: (list(names).index(c.split(".")[0]), c)):
        runs = rows[(q, c)]
        first = [r["process_to_first_audio_s"] for r in runs]
        case, _, variant = c.partition(".")
        print(f"| {names[case]}{' (' + variant + ')' if variant else ''} | {q} | {len(runs)} | {statistics.median(first):.1f} s "
              f"({', '.join(f'{x:.1f}' for x in first)}) | {med(runs, 'imports_s')} | {med(runs, 'load_s')}{phases(runs)} | "
              f"{med(runs, 'warmup_s')} | "
              f"{'/'.join(sorted({r['codec_cache'] for r in runs}))} | "
              f"{'/'.join(sorted({r['kernel_cache'] for r in runs}))} |")
any_run = next(iter(rows.values()), [{}])[0]
print(f"torch {any_run.get('torch')}, precompiled {any_run.get('precompiled')}, compiled {any_run.get('compiled')}, "
      f"checkpoint {any_run.get('model')}")
PY
echo "left $(left) s"
