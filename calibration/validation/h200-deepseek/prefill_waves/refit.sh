#!/usr/bin/env bash
# 2026-12-07 (no device call): the prefill fits of V3, its TP2/4/8 slices and V4-Pro re-fitted
# from the H200 profile's own raw points with the prefill forms that count the prefix
# attention's n in whole waves of query tiles and charge a chunk with a prefix per new token
# (calibration/fit.py fit_prefill; docs/validation.md, "The prefill attention's waves"), starting
# from the profile as it was before (commit c537e4b), so this script reproduces the shipped
# profiles whenever it is run; then the derived profiles re-derived. Cross-validation on each
# model's grid chose the new terms for these five models only: every other model's prefill
# fit is kept as it was, and V4-Pro's engine-core model re-fitted against its new prefill fits.
# Run from the repository root:
#   bash calibration/validation/h200-deepseek/prefill_waves/refit.sh
set -euo pipefail
P="python -m deepinfer_sim.calibration.moe_split"
T=$(mktemp -d)
prof=calibration/profiles/h200-deepseek.yaml
git show c537e4b:$prof > "$T/before.yaml"
MODELS=deepseek-v3,deepseek-v3@tp2,deepseek-v3@tp4,deepseek-v3@tp8,deepseek-v4-pro
$P export "$T/before.yaml" --models "$MODELS" --parts prefill --out "$T/prefill_raw.json"
$P merge "$T/prefill_raw.json" "$T/before.yaml" "$prof"
# V4-Pro's engine-core model is fitted against its kernel fits: re-fitted against the new ones
# (V3's stays fitted against the kernels its engine steps ran: tests/unit/test_calibration_tools.py)
python - "$prof" <<'PY'
import sys
from pathlib import Path
from deepinfer_sim.calibration.refit import refit_engine
from deepinfer_sim.models.profile import load_profile, write_profile
prof = load_profile(sys.argv[1])
name = "deepseek-v4-pro"
models = {**prof.models, name: refit_engine(prof).models[name]}
note = prof.provenance.note + f"; {name}'s engine-core model re-fitted from raw.engine (refit.py)"
prov = prof.provenance.model_copy(update={"note": note})
write_profile(prof.model_copy(update={"models": models, "provenance": prov}), Path(sys.argv[1]))
PY
note="; re-derived 2026-12-07 after the prefill fits of V3, its TP slices and V4-Pro were \
re-fitted with the prefix attention's waves and the per-token merge (prefill_waves/refit.sh)"
bash calibration/validation/h200-deepseek/rederive.sh c537e4b "$note"
rm -rf "$T"
