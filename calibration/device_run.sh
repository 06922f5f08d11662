#!/usr/bin/env bash
# One device call: quick calibration on the GPU (+ NCCL all-to-all when two GPUs are present),
# then the engine-core replay validated against the simulator. Writes everything under $OUT.
#   device run (kind nvidia-h200-x2, carry .whl):  bash calibration/device_run.sh
set -o pipefail
OUT=${OUT:-out/device}
mkdir -p "$OUT/replay" /tmp/pkg
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
ln -sfn "$PWD" /tmp/pkg/deepinfer_sim
export PYTHONPATH=/tmp/site:/tmp/pkg PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L
start=$(date +%s)
python3 -m deepinfer_sim.cli calibrate --device cuda --quick --out "$OUT/h200-measured.yaml" \
  2>&1 | tee "$OUT/calibrate.log"
echo "calibrate: $(( $(date +%s) - start )) s" | tee -a "$OUT/calibrate.log"
start=$(date +%s)
python3 -m deepinfer_sim.calibration.replay --profile "$OUT/h200-measured.yaml" \
  --out "$OUT/replay" --requests "${REPLAY_REQUESTS:-300}" 2>&1 | tee "$OUT/replay.log"
echo "replay: $(( $(date +%s) - start )) s" | tee -a "$OUT/replay.log"
