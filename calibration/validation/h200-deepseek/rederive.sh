#!/usr/bin/env bash
# Re-derive every derived profile from the shipped h200-deepseek (calibration/derive.py), each
# keeping the provenance note it had at commit BASE with NOTE appended. The device calls'
# rescale and refit scripts end with it. From the repository root:
#   bash calibration/validation/h200-deepseek/rederive.sh BASE NOTE
set -euo pipefail
base=$1 note=$2
prof=calibration/profiles/h200-deepseek.yaml
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
for spec in "sm100-derived b200,gb200,b300,gb300" "hopper-derived h800,h100" \
  "ascend910c-derived ascend910c" "ascend950-derived ascend950dt,ascend950pr"; do
  set -- $spec
  out=calibration/profiles/$1.yaml
  git show "$base:$out" > "$T/old.yaml"
  deepinfer-sim derive-profile "$prof" --targets "$2" --name "$1" --out "$T/new.yaml"
  python - "$T/old.yaml" "$T/new.yaml" "$out" "$note" <<'PY'
import sys
from pathlib import Path
from deepinfer_sim.models.profile import load_profile, write_profile
old, new, out, note = sys.argv[1:]
prev, fresh = load_profile(old), load_profile(new)
prov = fresh.provenance.model_copy(update={"note": prev.provenance.note + note})
write_profile(fresh.model_copy(update={"provenance": prov}), Path(out))
PY
done
