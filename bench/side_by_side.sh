#!/usr/bin/env bash
# Several gpu_suite.sh runs side by side, one GPU each, on a machine with several GPUs:
#   bash bench/side_by_side.sh "ENV=... stage ..." "ENV=... stage ..." ...
# The Nth argument runs on GPU N-1 (CUDA_VISIBLE_DEVICES), into $OUT/gN-1/ (its results.tgz and
# suite.log), each with DEADLINE (default 570 s); then AFTER (the same form) on every GPU at once,
# into $OUT/all/, within AFTER_DEADLINE (default 120 s). Wheels are installed once, first.
# Each job runs on the CPUs of its GPU's NUMA node (taskset, logged in its cpus.log), so that its
# processes meet one host (on the H200x4 machines the node is every CPU: docs/gpu.md).
set -u
FINAL=${OUT:-out}
OUT=/tmp/side-by-side-env bash "$(dirname "$0")/gpu_suite.sh" env > /dev/null 2>&1
near() {  # near GPU: the CPUs of its NUMA node (its PCI device's local_cpulist); nothing where unknown
  local bus; bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i "$1" 2>/dev/null) || return 0
  bus=${bus,,}; cat "${SYSFS:-/sys}/bus/pci/devices/${bus: -12}/local_cpulist" 2>/dev/null || true  # domain: 4 digits
}
suite() {  # suite OUT_DIR DEADLINE "VAR=value ... stage ..." [CPUS]: one gpu_suite.sh run, logged to OUT_DIR/suite.log
  mkdir -p "$1"
  [ -z "${4:-}" ] || taskset -cp "$4" $BASHPID > "$1/cpus.log" 2>&1
  (export OUT=$1 DEADLINE=$2
   eval "set -- $3"; settings=()
   while [ $# -gt 0 ] && [[ $1 == *=* ]]; do settings+=("$1"); shift; done  # VAR=value words, then stages
   env "${settings[@]}" bash "$(dirname "$0")/gpu_suite.sh" "$@" > "$OUT/suite.log" 2>&1)
}
gpu=0
for job in "$@"; do
  CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=$gpu suite "$FINAL/g$gpu" "${DEADLINE:-570}" "$job" "$(near $gpu)" &
  gpu=$((gpu + 1))
done
wait
[ -n "${AFTER:-}" ] && suite "$FINAL/all" "${AFTER_DEADLINE:-120}" "$AFTER"  # then one run on every GPU
tail -n 40 "$FINAL"/g*/suite.log "$FINAL"/all/suite.log 2>/dev/null
