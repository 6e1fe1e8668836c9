#!/usr/bin/env bash
# Several gpu_suite.sh runs side by side, one GPU each, on a machine with several GPUs:
#   bash bench/side_by_side.sh "ENV=... stage ..." "ENV=... stage ..." ...
# The Nth argument runs on GPU N-1 (CUDA_VISIBLE_DEVICES), into $OUT/gN-1/ (its results.tgz and
# suite.log), each with DEADLINE (default 570 s); then AFTER (the same form) on every GPU at once,
# into $OUT/all/, within AFTER_DEADLINE (default 120 s). Wheels are installed once, first.
set -u
FINAL=${OUT:-out}
OUT=/tmp/side-by-side-env bash "$(dirname "$0")/gpu_suite.sh" env > /dev/null 2>&1
gpu=0
for job in "$@"; do
  mkdir -p "$FINAL/g$gpu"
  (export CUDA_VISIBLE_DEVICES=$gpu OUT="$FINAL/g$gpu" DEADLINE=${DEADLINE:-570}
   eval "set -- $job"; settings=()
   while [ $# -gt 0 ] && [[ $1 == *=* ]]; do settings+=("$1"); shift; done  # VAR=value words, then stages
   env "${settings[@]}" bash "$(dirname "$0")/gpu_suite.sh" "$@" > "$FINAL/g$gpu/suite.log" 2>&1) &
  gpu=$((gpu + 1))
done
wait
if [ -n "${AFTER:-}" ]; then  # then one run on every GPU (e.g. zerocost-ddp), into $OUT/all/
  mkdir -p "$FINAL/all"
  (eval "set -- $AFTER"; settings=()
   while [ $# -gt 0 ] && [[ $1 == *=* ]]; do settings+=("$1"); shift; done
   OUT="$FINAL/all" DEADLINE=${AFTER_DEADLINE:-120} env "${settings[@]}" bash "$(dirname "$0")/gpu_suite.sh" "$@" \
     > "$FINAL/all/suite.log" 2>&1)
fi
tail -n 40 "$FINAL"/g*/suite.log "$FINAL"/all/suite.log 2>/dev/null
