#!/usr/bin/env bash
# Every GPU test and benchmark of ucudnn in one call on the device machine; results under $OUT.
#   bash bench/gpu_suite.sh [stage ...]    stages: env tests record record-new record-direct
#                                          layers-alexnet layers-alexnet64 layers-resnet50 layers-fp16
#                                          layers-direct paper paper-bench coldstart zerocost zerocost-ddp tables
#                                          trainab coldmodels ndlayers streams pressure largest
#                                          (default: env tests)
# Carry .whl (pulp, sqlite-utils and their needs, as wheels) with the call.
set -u
# Everything lands in $OUT/results/ and is packed into $OUT/results.tgz at the end (the device
# tool brings back at most 8 files). STAGE_TIMEOUT bounds each stage and
# DEADLINE the whole run (seconds), so the archive is always written.
FINAL=${OUT:-out}; OUT="$FINAL/results"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 UCUDNN_RESULTS_DIR="$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then  # once per machine: suites started side by side (one a GPU) share it
  [ -f /tmp/site/.installed ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site .whl/*.whl && touch /tmp/site/.installed; }
  export PYTHONPATH="$PWD:/tmp/site"
else
  export PYTHONPATH="$PWD"
fi
status=0
run() {  # run NAME CMD...: log to $OUT/NAME.log, remember failures, go on
  local name=$1; shift
  echo "=== $name: $*"
  local start=$SECONDS
  local limit=$(( ${DEADLINE:-3600} - SECONDS - 20 )); [ "$limit" -gt "${STAGE_TIMEOUT:-3600}" ] && limit=${STAGE_TIMEOUT:-3600}
  [ "$limit" -lt 5 ] && { echo "!!! $name skipped: no time left before DEADLINE"; status=1; return; }
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1 || { echo "!!! $name failed (exit $?)"; status=1; }
  echo "=== $name done in $((SECONDS - start)) s"; tail -n 25 "$OUT/$name.log"
}
gpus() { python3 -c "import torch; print(torch.cuda.device_count())"; }  # GPUs of the machine
budget() {  # budget SECONDS: that many, or less where DEADLINE leaves less (a script's own --deadline)
  local left=$(( ${DEADLINE:-3600} - SECONDS - 40 )); echo $(( left < $1 ? left : $1 ))
}
# A copy of the shipped recording outside $OUT (too large to bring back), with what record-new
# measured earlier in the call and the databases named in TRAIN_SEEDS added
seed_train() {
  [ -f /tmp/train-cache.db ] || cp "$(ls cache/*.db | tail -n 1)" /tmp/train-cache.db
  local extra; extra=$(ls "$OUT"/recorded/*.db ${TRAIN_SEEDS:-} 2>/dev/null)
  [ -n "$extra" ] && python3 -m ucudnn cache merge $extra --into /tmp/train-cache.db
}
seed_layers() { [ -f "$OUT/layers.db" ] || cp "$(ls cache/*.db | tail -n 1)" "$OUT/layers.db"; }
stages=("$@"); [ ${#stages[@]} -eq 0 ] && stages=(env tests)
for stage in "${stages[@]}"; do
  case $stage in
    env) run env python3 bench/env_report.py ;;
    tests) UCUDNN_TEST_TIMES="$OUT/test-times.tsv" run tests python3 -m pytest -m gpu -v -s -rs --durations=25 ${GPU_TESTS:-tests} ;;
    # layers start from the shipped recording (cache/), so they measure only what it lacks;
    # graph execution (the default) unless the stage says direct
    layers-alexnet) seed_layers; run layers-alexnet python3 bench/layers.py --out "$OUT" --nets alexnet:256 --cache "$OUT/layers.db" ;;
    layers-resnet50) seed_layers; run layers-resnet50 python3 bench/layers.py --out "$OUT" --nets resnet50:64 --policies ${RESNET_POLICIES:-powerOfTwo,all} --cache "$OUT/layers.db" ;;
    # the 64 MiB row of docs/results.md's AlexNet figures alone (fp32, WR powerOfTwo, graph execution)
    layers-alexnet64) seed_layers; run layers-alexnet64 python3 bench/layers.py --out "$OUT" --nets alexnet:256 --limits 64MiB --policies powerOfTwo --no-overhead --cache "$OUT/layers.db" ;;
    layers-fp16) seed_layers; run layers-fp16 python3 bench/layers.py --out "$OUT" --nets alexnet:256 --limits 8MiB,64MiB --policies powerOfTwo --dtype float16 --layout nhwc --no-overhead --cache "$OUT/layers.db" ;;
    # independent nodes on several streams in one CUDA graph, and the concurrent backward (STREAMS_ARGS)
    streams) run streams python3 bench/streams.py --out "$OUT" --deadline "$(budget ${STREAMS_S:-400})" ${STREAMS_ARGS:-} ;;
    # whole models under a blocker leaving their need + L: torch vs ucudnn.torch, a fresh process per variant (PRESSURE_ARGS)
    pressure) run pressure python3 bench/pressure.py --out "$OUT" --deadline "$(budget ${PRESSURE_S:-540})" ${PRESSURE_ARGS:-} ;;
    # how much more fits: the largest batch torch and ucudnn.torch train at under one budget, fresh processes (LARGEST_ARGS)
    largest) run largest python3 bench/largest_batch.py --out "$OUT" --deadline "$(budget ${LARGEST_S:-540})" ${LARGEST_ARGS:-} ;;
    # 1-D, 3-D and transposed layers: torch under pressure vs their ucudnn.torch twins (ND_ARGS)
    ndlayers) run ndlayers python3 bench/nd_layers.py --out "$OUT" --deadline "$(budget ${ND_S:-540})" ${ND_ARGS:-} ;;
    layers-direct) seed_layers; run layers-direct python3 bench/layers.py --out "$OUT" --nets alexnet:256 --policies powerOfTwo --execution direct --cache "$OUT/layers.db" ;;
    # the shipped recording: adds the measurements for graph (record) or direct execution to cache/
    record) run record python3 bench/record.py --out cache ${RECORD_SPECS:+--specs "$RECORD_SPECS"} ${RECORD_BACKEND:+--backend "$RECORD_BACKEND"}; cp cache/*.db "$OUT/" ;;
    # the same into an empty folder, for a part too large to bring back inside the whole file
    # (RECORD_SEED: a database to continue, e.g. one an earlier call brought back)
    record-new) mkdir -p "$OUT/recorded"; [ -n "${RECORD_SEED:-}" ] && cp "$RECORD_SEED" "$OUT/recorded/"
                run record-new python3 bench/record.py --out "$OUT/recorded" ${RECORD_SPECS:+--specs "$RECORD_SPECS"} ${RECORD_BACKEND:+--backend "$RECORD_BACKEND"} ;;
    record-direct) run record-direct python3 bench/record.py --out cache --execution direct; cp cache/*.db "$OUT/" ;;
    # the paper's timed figures executed here (`ucudnn paper FIG --execute`) into $OUT/paper/figFIG-executed.*,
    # one run a figure (PAPER_FIGURES: which; 8 and 14 are plans, as in the paper), measuring only what the
    # database lacks: PAPER_SEED (one an earlier call brought back, carried), else a copy of the shipped
    # recording. It comes back as paper-measured.db: each measurement is committed as it is taken, so a call
    # cut off by its timeout leaves the next one less to measure
    # (PAPER_NO_MEASURE=1: nothing measured, the figures plan from what paper-bench put in the database)
    paper) [ -f /tmp/paper-cache.db ] || cp "${PAPER_SEED:-$(ls cache/*.db | tail -n 1)}" /tmp/paper-cache.db
           for figure in ${PAPER_FIGURES:-1 9 10 11 12 13}; do
             run "paper-$figure" python3 -m ucudnn paper "$figure" --execute ${PAPER_NO_MEASURE:+--no-measure} \
               --out "$OUT/paper" --cache /tmp/paper-cache.db
           done
           [ -n "${PAPER_NO_MEASURE:-}" ] || cp /tmp/paper-cache.db "$OUT/paper-measured.db" ;;
    # what the figures plan from, measured on every GPU at once (`ucudnn bench --devices`) into the database
    # above (PAPER_SEED, else empty), brought back; PAPER_BENCH: NET:BATCH:POLICY ... (default: Figs. 10-13's)
    paper-bench) [ -f /tmp/paper-cache.db ] || [ -z "${PAPER_SEED:-}" ] || cp "$PAPER_SEED" /tmp/paper-cache.db
           devices=$(seq -s, 0 $(( $(gpus) - 1 )))
           for spec in ${PAPER_BENCH:-alexnet:256:all resnet18:128:powerOfTwo resnet50:32:all resnet50:64:powerOfTwo densenet40:256:powerOfTwo}; do
             IFS=: read -r net batch policy <<< "$spec"
             run "paper-bench-$net-$batch-$policy" python3 -m ucudnn bench --net "$net" --batch "$batch" --policy "$policy" \
               --devices "$devices" --timing "${PAPER_TIMING:-default}" --cache /tmp/paper-cache.db
           done
           cp /tmp/paper-cache.db "$OUT/paper-measured.db" ;;
    # torch and ucudnn.torch trained in turns in one process, memory free, with an A/A control (TRAINAB_ARGS);
    # ucudnn's copies start from a copy of the shipped recording (see seed_train)
    trainab) seed_train; run trainab python3 bench/train_ab.py --out "$OUT" --cache /tmp/train-cache.db --deadline "$(budget 400)" ${TRAINAB_ARGS:-} ;;
    # where ucudnn cannot gain: compiled, exported, host us per call (ZERO_ARGS); and under DistributedDataParallel
    # on every GPU of the machine (torchrun)
    zerocost) run zerocost python3 bench/zero_cost.py --out "$OUT" ${ZERO_ARGS:-} ;;
    zerocost-ddp) run zerocost-ddp torchrun --standalone --nproc_per_node "$(gpus)" bench/zero_cost.py \
                    --out "$OUT" --sections ddp ;;
    # AlexNet fp32 B=256 at 64 MiB: its first iteration from an empty database, then a fresh process on
    # the filled one, against torch's own (cold_models.py, each in a fresh process)
    coldstart) run coldstart python3 bench/cold_models.py --out "$OUT/coldstart" --deadline "$(budget 300)" --models alexnet \
                 --limits 64MiB --no-full ;;
    # timm and torchvision models from an empty database: first iterations vs torch's, warm, steady, full sweep (COLD_ARGS)
    coldmodels) run coldmodels python3 bench/cold_models.py --out "$OUT" --deadline "$(budget ${COLD_S:-560})" ${COLD_ARGS:-} ;;
    # the shipped torchvision conv tables traced here (torchvision is installed) into the tree, checked, and to $OUT
    tables) run tables python3 -m ucudnn.core.nets.torchvision; cp ucudnn/core/nets/torchvision.json "$OUT/"
            run tables-test python3 -m pytest -q -p no:cacheprovider tests/test_nets.py ;;
    *) echo "unknown stage $stage"; status=2 ;;
  esac
done
tar czf "$FINAL/results.tgz" -C "$OUT" . && rm -rf "$OUT"
exit $status
