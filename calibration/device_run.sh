#!/usr/bin/env bash
# One device call on an H200: DeepSeek's kernels (prebuilt and carried, else built here), then
# the stages named on the command line, each under its own time limit, a failure never stopping
# the next. Everything lands under $OUT (at most 8 files come back: keep it so).
#
#   device run (kind nvidia-h200, carry .whl .kbuild):
#     bash calibration/device_run.sh check table v41          # first call
#     bash calibration/device_run.sh v3 replay                # second call
#
# Stages: check (deepseek_check + DeepGEMM probe), graphprefill (its graphed-prefill check
# alone), table (kernel table), deepgemm (DeepGEMM's
# masked grouped MoE GEMM against torch._scaled_grouped_mm), gemmsms (DeepGEMM's FP8 GEMMs on
# V3's prefill shapes with SMs held back for the exchange: kernels/deepgemm_sms_bench.py), moesplit (every model's routed
# experts timed whole and alone: calibration/moe_split.py; NO_KERNELS=1 skips the kernel build
# it does not need), moeslices (the same for expert-TP slices, $MOE_SLICES; each routed GEMM on
# the faster of torch's and the Triton grouped GEMM), moeslicestorch (the same on torch's alone:
# the old kernel's baseline on the same GPU), v41 / v3 / v4flash /
# v4pro (calibrate --kernels deepseek --quick for that model), v41kernels (V4.1-Flash's kernel
# fits alone: no engine steps, no vision), prefillcheck (MLA prefill attention's split form on
# cuDNN against the float32 softmax, and tp_kernel_bench's attention and combine cases),
# mergev3 (the split attention's Triton merge checked and timed, then V3 and its TP slices'
# prefill timed with it and with the reference merge, DEEPINFER_MERGE=torch: the rescale's
# NEW and BASE), prefillv3 (V3 and its TP slices' prefill attention alone: moe_split --parts prefill,
# $PREFILL_MODELS, into $PREFILL_OUT.json), moev3 (V3's routed experts whole and alone),
# moewhole (the whole routed call alone of $MOE_WHOLE_MODELS, default the expert-TP slices,
# into $MOE_WHOLE_OUT.json), slices (kernel fits of one GPU's slice under tensor
# parallelism, one calibrate per name in $SLICES, default V3 and V4.1-Flash at TP 2, 4, 8;
# $OUT/slices.tar.gz holds a profile per slice), v41mixed (V4.1-Flash with decode
# batches of mixed context lengths, --decode-spread $DECODE_SPREAD, default 0.5), mixed
# (calibration/mixed_contexts.py: uniform vs mixed lengths), sustained (V3's prefill layer,
# attention, experts and decode timed the calibration's way and back to back for 45 s or
# 12 s, the GPU's clocks sampled: calibration/sustained.py, $SUSTAINED_LONG / $SUSTAINED_SHORT,
# the long run's windows $SUSTAINED_WINDOW seconds),
# sustainedmodels (the 8K-token prefill layer of each of $SUSTAINED_MODELS back to back, default V3
# and V4.1-Flash), sustainedduty (the prefill layer busy 25 / 50 / 75 % of the time, $SUSTAINED_DUTIES, in bursts
# of $SUSTAINED_GROUP calls, $SUSTAINED_DUTY_S seconds each),
# mlafused (V3's decode step as engines run it against the unfused block on the GPU, then the
# decode grids of $DECODE_MODELS both ways: DEEPINFER_MLA_FUSED=0 is the unfused block),
# launchgap (graphed decode, routed-expert and small prefill calls timed one replay after a sync,
# as the calibration does, and back to back: calibration/launch_gap.py, $LAUNCH_GAP_MODELS), layerkernels (the kernels of one
# decode step of an attention block, calibration/layer_kernels.py, for each model in
# $LAYER_KERNELS_MODELS, default V3 and its TP8 slice, at $LAYER_KERNELS_BATCH), layersched
# (the same for V3 and its TP8 slice, FlashMLA's scheduler metadata once per step and, with
# DEEPINFER_MLA_SCHED=layer, in every layer), decodev3 (the decode attention alone of V3 and
# its TP slices, $DECODE_MODELS, on the quick grid: moe_split --parts decode with the metadata
# once per step into $OUT/decode_v3.json, then with DEEPINFER_MLA_SCHED=layer, in every layer,
# into $OUT/decode_v3_layer.json, the baseline of a moe_split rescale; ~240 s each at most),
# sizes (calibration/prefill_sizes.py:
# prefill per chunk size in fine steps, kernels profiled), waves (V3's TP8 and TP4 slices'
# prefill on both sides of each wave edge: prefill_waves/check.py), reference (calibrate V4.1-Flash
# with the reference kernels), replay (engine-core replays vs the simulator, using $OUT/v41.yaml
# or $REPLAY_PROFILE or the shipped h200-deepseek profile). ENGINE_DEPTH=N (default 1) times and
# replays the engine core on N layers per layer group (calibrate --engine-depth, replay --depth);
# NO_ENGINE=1 times no engine steps in v3 / v4flash / v4pro (their kernel fits only).
# Replay: REPLAY_NAME (the folder and $OUT/<name>.tar.gz, default replay), REPLAY_TRACES,
# REPLAY_PHASES, REPLAY_REQUESTS, REPLAY_LIMIT (seconds, default 330); the GPU's clocks, power
# and temperature are sampled every 250 ms into <name>/gpu_clocks.csv while it runs.
#
# .whl: simpy, pydantic and their dependencies as Python 3.12 wheels (the image lacks them).
# .kbuild/site.tar.xz: flash_mla (and deep_gemm) built by vendor/build-on-gpu.sh for torch
# 2.11 + CUDA 13 (a folder site/ inside); without it the kernels are built here (~4 min).
set -o pipefail
OUT=${OUT:-out/device}
REPO=$PWD
mkdir -p "$OUT" /tmp/pkg
T0=$(date +%s)
log() { echo "== [$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/log.txt"; }
DEADLINE=${DEADLINE:-570}  # seconds after start by which every stage has ended (call limit 600)
run() {  # run LIMIT_S NAME CMD...: one stage, its output appended to the log
  local limit=$1 name=$2; shift 2
  local left=$(( DEADLINE - ($(date +%s) - T0) ))
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -le 10 ]; then log "stage $name skipped: no time left"; return; fi
  log "stage $name (limit ${limit}s): $*"
  timeout "$limit" "$@" 2>&1 | tee -a "$OUT/log.txt"
  log "stage $name exit ${PIPESTATUS[0]}"
}

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$REPO"/.whl/*.whl || exit 1
ln -sfn "$REPO" /tmp/pkg/deepinfer_sim
KB=${KB:-$REPO/.kb}  # inside the checkout (git-ignored): a warm machine keeps the build
mkdir -p "$KB"
[ -f "$REPO/.kbuild/site.tar.xz" ] && tar -xJf "$REPO/.kbuild/site.tar.xz" -C "$KB"
export PYTHONPATH=$KB/site:/tmp/site:/tmp/pkg PYTHONUNBUFFERED=1
export HOME=${HOME:-/root} CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export DG_JIT_CACHE_DIR=/tmp/deep_gemm_cache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd /tmp  # import the kernels from site/, never from extracted sources
nvidia-smi -L | tee -a "$OUT/log.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
  | tee -a "$OUT/log.txt"
# NO_KERNELS=1: the stages need none of DeepSeek's built kernels (moesplit): no build
if [ "${NO_KERNELS:-0}" != 1 ] && ! python3 -c "import flash_mla" >>"$OUT/log.txt" 2>&1; then
  rm -rf "$KB/site"
  log "flash_mla does not import: building the vendored kernels"
  bash "$REPO/vendor/build-on-gpu.sh" "$KB" 2>&1 | tail -5 | tee -a "$OUT/log.txt"
  (cd "$KB" && tar -cJf "$OUT/site.tar.xz" site)
fi

P="python3 -m deepinfer_sim"
ALL_TRACES=mooncake_conversation,azure_conv
CAL="$P.cli calibrate --device cuda --kernels deepseek --quick --name h200-deepseek"
SLICE_MODELS=${MOE_SLICES:-deepseek-v3@tp1-moetp2,deepseek-v3@tp1-moetp4,deepseek-v3@tp1-moetp8,deepseek-v4.1-flash@tp1-moetp2,deepseek-v4.1-flash@tp1-moetp4,deepseek-v4.1-flash@tp1-moetp8}
NOENG=; [ "${NO_ENGINE:-0}" = 1 ] && NOENG=--no-engine  # v3 / v4flash / v4pro: kernel fits only
for stage in "$@"; do
  case $stage in
    check) dg=--deepgemm; [ "${DEEPGEMM_PROBE:-1}" = 0 ] && dg=
      run 150 check $P.kernels.deepseek_check --out "$OUT/check" $dg ;;
    table) run 150 table $P.calibration.kernel_table --out "$OUT/table.json" ;;
    graphprefill) run 120 graphprefill python3 -c "import json; from deepinfer_sim.kernels \
import deepseek_check as d; from deepinfer_sim.kernels._util import as_device; \
print(json.dumps(d.check_graph_prefill(d.Checker(as_device('cuda'), False))))" ;;
    deepgemm) run 240 deepgemm $P.kernels.deepgemm_moe_bench --out "$OUT" ;;
    gemmsms) run 240 gemmsms $P.kernels.deepgemm_sms_bench --out "$OUT" ;;
    moesplit) run 540 moesplit $P.calibration.moe_split measure --out "$OUT/moe_split.json" ;;
    moeslices) run 540 moeslices $P.calibration.moe_split measure --out "$OUT/moe_slices.json" \
        --models "$SLICE_MODELS" ;;
    prefillcheck) run 120 prefillcheck python3 -c "import json; from deepinfer_sim.kernels \
import deepseek_check as d; from deepinfer_sim.kernels._util import as_device; \
print(json.dumps(d.check_causal_attention(d.Checker(as_device('cuda'), False))))"
      run 150 tpbench $P.kernels.tp_kernel_bench --skip moe --out "$OUT/tp_bench.json" ;;
    mergev3) run 60 mergecheck python3 -c "import json; from deepinfer_sim.kernels \
import deepseek_check as d; from deepinfer_sim.kernels._util import as_device; \
print(json.dumps(d.check_causal_attention(d.Checker(as_device('cuda'), False))))"
      run 90 mergebench $P.kernels.tp_kernel_bench --skip moe --skip attention --skip combine \
        --out "$OUT/merge_bench.json"
      pm=${PREFILL_MODELS:-deepseek-v3,deepseek-v3@tp8,deepseek-v3@tp4,deepseek-v3@tp2}
      run 230 "prefillv3 triton merge" $P.calibration.moe_split measure --parts prefill \
        --out "$OUT/prefill_v3_merge.json" --models "$pm"
      DEEPINFER_MERGE=torch run 230 "prefillv3 torch merge" $P.calibration.moe_split measure \
        --parts prefill --out "$OUT/prefill_v3_torchmerge.json" --models "$pm" ;;
    prefillv3) run 400 prefillv3 $P.calibration.moe_split measure --parts prefill \
        --out "$OUT/${PREFILL_OUT:-prefill_v3}.json" \
        --models "${PREFILL_MODELS:-deepseek-v3,deepseek-v3@tp8,deepseek-v3@tp4,deepseek-v3@tp2}" ;;
    layerkernels) for m in ${LAYER_KERNELS_MODELS:-deepseek-v3 deepseek-v3@tp8}; do
        run 120 "layerkernels $m" $P.calibration.layer_kernels --model "$m" \
          --batch "${LAYER_KERNELS_BATCH:-1,8,64}" --context 4096 \
          --out "$OUT/layer_kernels_${m//@/_}.json"; done ;;
    layersched) for m in deepseek-v3 deepseek-v3@tp8; do  # V3's decode layer with FlashMLA's
        # scheduler metadata per step (shared) and per layer (DEEPINFER_MLA_SCHED=layer)
        run 120 "layersched $m" $P.calibration.layer_kernels --model "$m" --batch 1,8,64 \
          --context 4096 --out "$OUT/sched_step_${m//@/_}.json"
        DEEPINFER_MLA_SCHED=layer run 120 "layersched $m per layer" $P.calibration.layer_kernels \
          --model "$m" --batch 1,8,64 --context 4096 --out "$OUT/sched_layer_${m//@/_}.json"; done ;;
    decodev3) dm=${DECODE_MODELS:-deepseek-v3,deepseek-v3@tp2,deepseek-v3@tp4,deepseek-v3@tp8}
      run 240 decodev3 $P.calibration.moe_split measure --parts decode \
        --out "$OUT/decode_v3.json" --models "$dm"
      DEEPINFER_MLA_SCHED=layer run 240 "decodev3 per layer" $P.calibration.moe_split measure \
        --parts decode --out "$OUT/decode_v3_layer.json" --models "$dm" ;;
    mlafused) run 150 mlafusedcheck python3 -c "import json; from deepinfer_sim.kernels \
import deepseek_check as d; from deepinfer_sim.kernels._util import as_device; \
c = d.Checker(as_device('cuda'), False); print(json.dumps({'fused': d.check_mla_fused(c), \
'graph': d.check_graph_decode(c, 'mla')}, default=str))"
      dm=${DECODE_MODELS:-deepseek-v3,deepseek-v3@tp2,deepseek-v3@tp4,deepseek-v3@tp8}
      run 240 "decodev3 fused" $P.calibration.moe_split measure --parts decode \
        --out "$OUT/decode_v3.json" --models "$dm"
      DEEPINFER_MLA_FUSED=0 run 240 "decodev3 unfused" $P.calibration.moe_split measure \
        --parts decode --out "$OUT/decode_v3_unfused.json" --models "$dm" ;;
    moewhole) run 400 moewhole $P.calibration.moe_split measure --parts moe_whole \
        --out "$OUT/${MOE_WHOLE_OUT:-moe_whole}.json" --models "${MOE_WHOLE_MODELS:-$SLICE_MODELS}" ;;
    launchgap) run 300 launchgap $P.calibration.launch_gap \
        --models "${LAUNCH_GAP_MODELS:-deepseek-v3,deepseek-v3@tp8,deepseek-v4.1-flash}" \
        --out "$OUT/launch_gap.json" ;;
    sustained) run 200 "sustained layer" $P.calibration.sustained --model deepseek-v3 \
        --window "${SUSTAINED_WINDOW:-0.5}" \
        --workloads "${SUSTAINED_LONG:-layer:8192}" --seconds "${SUSTAINED_LONG_S:-45}" \
        --out "$OUT/sustained_long.json"
      run 200 sustained $P.calibration.sustained --model deepseek-v3 --seconds 12 \
        --workloads "${SUSTAINED_SHORT:-prefill:8192,experts:9x8192,decode:128x4096,layer:2048}" \
        --out "$OUT/sustained.json" ;;
    sustainedmodels) for m in ${SUSTAINED_MODELS:-deepseek-v3 deepseek-v4.1-flash}; do  # does the
        # slowdown depend on the model's layer (its power draw), back to back on one GPU
        run 120 "sustained $m" $P.calibration.sustained --model "$m" --window 0.1 \
          --workloads layer:8192 --seconds "${SUSTAINED_LONG_S:-30}" \
          --out "$OUT/sustained_${m//@/_}.json"; done ;;
    sustainedduty) for d in ${SUSTAINED_DUTIES:-0.25 0.5 0.75}; do  # the slowdown at partial load
        run 120 "sustained duty $d" $P.calibration.sustained --model deepseek-v3 \
          --seconds "${SUSTAINED_DUTY_S:-12}" \
          --workloads layer:8192 --duty "$d" --group "${SUSTAINED_GROUP:-1}" \
          --out "$OUT/sustained_duty_$d.json"; done ;;
    moev3) run 300 moev3 $P.calibration.moe_split measure --out "$OUT/moe_v3.json" \
        --models deepseek-v3 ;;
    moeslicestorch) run 540 moeslicestorch env DEEPINFER_ROUTED_GEMM=torch \
        $P.calibration.moe_split measure --out "$OUT/moe_slices_torch.json" --models "$SLICE_MODELS" ;;
    v41) run 330 v41 $CAL --model deepseek-v4.1-flash --engine-depth "${ENGINE_DEPTH:-1}" \
        --out "$OUT/v41.yaml" ;;
    v41kernels) run 330 v41kernels $CAL --model deepseek-v4.1-flash --no-engine --no-vision \
        --out "$OUT/v41k.yaml" ;;
    v41mixed) run 330 v41mixed $CAL --model deepseek-v4.1-flash \
        --decode-spread "${DECODE_SPREAD:-0.5}" --out "$OUT/v41.yaml" ;;
    mixed) run 200 mixed $P.calibration.mixed_contexts --out "$OUT/mixed.json" ;;
    sizes) run 150 sizes $P.calibration.prefill_sizes --out "$OUT/prefill_sizes.json" ;;
    waves) sz=448,512,513,768,1024,1025,1536,1537,2048,2049,2560,2561,3072,3073,4224,4225
      for m in deepseek-v3@tp8 deepseek-v3@tp4; do  # prefill_waves/check.py predicted these
        run 150 "waves $m" $P.calibration.prefill_sizes --model "$m" --sizes "$sz" \
          --prefixes 16384,65536 --profile-sizes 1024,1025 --profile-prefix 65536 \
          --out "$OUT/waves_${m//@/_}.json"; done ;;
    v3) run 300 v3 $CAL --model deepseek-v3 --no-vision $NOENG --out "$OUT/v3.yaml" ;;
    v4flash) run 300 v4flash $CAL --model deepseek-v4-flash --no-vision $NOENG --out "$OUT/v4flash.yaml" ;;
    v4pro) run 300 v4pro $CAL --model deepseek-v4-pro --no-vision $NOENG --out "$OUT/v4pro.yaml" ;;
    slices)
      mkdir -p /tmp/slices
      for s in ${SLICES:-deepseek-v3@tp2 deepseek-v3@tp4 deepseek-v3@tp8 deepseek-v4.1-flash@tp2 deepseek-v4.1-flash@tp4 deepseek-v4.1-flash@tp8}; do
        run 200 "slice $s" $CAL --model "$s" --no-engine --no-vision --out "/tmp/slices/$s.yaml"
        tar -czf "$OUT/slices.tar.gz" -C /tmp slices
      done ;;
    reference) run 300 reference $P.cli calibrate --device cuda --kernels reference --quick \
        --model deepseek-v4.1-flash --no-vision --out "$OUT/reference.yaml" ;;
    replay)
      prof=${REPLAY_PROFILE:-$OUT/v41.yaml}; [ -f "$prof" ] || prof=h200-deepseek
      depth=(); [ "${ENGINE_DEPTH:-1}" != 1 ] && depth=(--depth "$ENGINE_DEPTH")
      name=${REPLAY_NAME:-replay}
      mkdir -p "/tmp/$name"
      nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
        --format=csv -lms 250 > "/tmp/$name/gpu_clocks.csv" 2>/dev/null &
      smi=$!
      run "${REPLAY_LIMIT:-330}" replay $P.calibration.replay --profile "$prof" --out "/tmp/$name" \
        --requests "${REPLAY_REQUESTS:-150}" --repeats 3 "${depth[@]}" \
        --phases "${REPLAY_PHASES:-prefill,decode}" --traces "${REPLAY_TRACES:-$ALL_TRACES}"
      kill "$smi" 2>/dev/null
      tar -czf "$OUT/$name.tar.gz" -C /tmp "$name" ;;
    *) log "unknown stage $stage" ;;
  esac
done
log "done"
