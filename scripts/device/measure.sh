#!/usr/bin/env bash
# GPU measurements for the issue notes, in one command on the device machine (H100/H200), in priority
# order under a global deadline (BUDGET seconds): kernel-cache cold / warm directory / blob into an
# empty directory, the concurrency sweep, the bf16/int8/int4 table, and two GPU equality tests.
# Results land in $OUT (the device tool's output folder) or ./device-out.
export PYTHONPATH=$PWD/container:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-device-out}
mkdir -p "$OUT"
END=$(( $(date +%s) + ${BUDGET:-560} ))
left() { echo $(( END - $(date +%s) )); }
run() {
  local t=$1 l
  shift
  l=$(left)
  [ "$l" -gt 15 ] || { echo "SKIPPED (no time): $*"; return; }
  [ "$t" -lt "$l" ] || t=$((l - 5))
  timeout "$t" "$@"
}
clean() { grep -v "it/s\|stream/s\|Warning\|warn\|^[WEI][0-9]\{4\}\|Failed to load" "$1" | grep -v "^\s*$" | tail -"${2:-3}"; }

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
# The image compiles every module's bytecode at build time (Dockerfile); a bare machine that sets
# PYTHONDONTWRITEBYTECODE would compile ~1,400 torch modules from source at every start (~5 s).
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pyc}
python3 -m compileall -q -j 0 "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
  container > /dev/null 2>&1
rm -rf /tmp/kc /tmp/kc2
echo "## cold (empty cache dir)"
run 240 python3 -m ttsengine warm --random-weights s1-mini --cache-dir /tmp/kc > "$OUT/warm_cold.log" 2>&1
clean "$OUT/warm_cold.log" 1
for i in 1 2 3; do
  echo "## warm cache dir, run $i"
  run 60 python3 -m ttsengine warm --random-weights s1-mini --cache-dir /tmp/kc --no-blob > "$OUT/warm_dir$i.log" 2>&1
  clean "$OUT/warm_dir$i.log" 1
done
for i in 1 2 3; do
  rm -rf /tmp/kc2 && mkdir -p /tmp/kc2 && cp /tmp/kc/artifacts-*.bin /tmp/kc2/ 2>/dev/null
  echo "## blob into an empty dir, run $i"
  run 60 python3 -m ttsengine warm --random-weights s1-mini --cache-dir /tmp/kc2 --no-blob > "$OUT/warm_blob$i.log" 2>&1
  clean "$OUT/warm_blob$i.log" 1
done
echo "## GPU equality tests"
run 200 python3 -m pytest -q -m gpu tests/engine/test_gpu.py -p no:cacheprovider > "$OUT/gpu.log" 2>&1
tail -2 "$OUT/gpu.log"
echo "## sweep (warm cache)"
TTS_CACHE_DIR=/tmp/kc run 110 python3 -m ttsengine bench --random-weights s1-mini --concurrency 1,8,64,256 \
  --frames 192 --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
clean "$OUT/sweep.log" 8
echo "## quantization"
TORCHINDUCTOR_CACHE_DIR=/tmp/kc/inductor TRITON_CACHE_DIR=/tmp/kc/triton run 240 \
  python3 scripts/device/quant_eval.py > "$OUT/quant.log" 2>&1
grep '^{' "$OUT/quant.log"
echo "left $(left) s"
