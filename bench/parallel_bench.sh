#!/usr/bin/env bash
# Issue 7 on one node with 2 GPUs: `ucudnn bench` (AlexNet, B=256, policy all, --timing quick)
# on GPU 0, then GPUs 0,1, then 2 MPI ranks; wall times, speedup, and the three databases' keys.
#   bash bench/parallel_bench.sh [RESULTS_DIR [bench/parallel_bench.py options]]
# Carry .whl (pulp, sqlite-utils, as wheels) if the machine lacks them. Logs, databases and
# summary.json go to RESULTS_DIR (default /tmp/ucudnn-parallel), packed into RESULTS_DIR.tgz,
# which is copied with summary.json into $OUT where that is set; all within 9 minutes.
set -u
RESULTS=${1:-/tmp/ucudnn-parallel}; shift || true
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="$PWD:/tmp/site"
else
  export PYTHONPATH="$PWD"
fi
if command -v mpirun >/dev/null; then echo "mpirun: $(command -v mpirun)"
else echo "mpirun: not found (command -v mpirun failed); parallel_bench.py looks for mpiexec, else runs the MPI path as a singleton"; fi
timeout $((535 - SECONDS)) python3 bench/parallel_bench.py "$RESULTS" --budget $((525 - SECONDS)) "$@"
status=$?
tar czf "${RESULTS%/}.tgz" -C "$RESULTS" .
if [ -n "${OUT:-}" ]; then cp "${RESULTS%/}.tgz" "$OUT/"; cp "$RESULTS/summary.json" "$OUT/" 2>/dev/null; fi
exit $status
