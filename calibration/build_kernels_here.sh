#!/usr/bin/env bash
# Build DeepSeek's kernels (FlashMLA, DeepGEMM) on the development machine for the GPU machine's
# Python 3.12 + torch 2.11.0+cu130, and pack them as .kbuild/site.tar.xz for calibration/
# device_run.sh to carry (saves the ~4-minute build on every fresh GPU machine; DeepGEMM built
# this way runs there, built on the GPU image it crashed at its first kernel call).
#   bash calibration/build_kernels_here.sh [VENDOR_DIR]     (default ../shared/vendor)
# Needs: CUDA 13 nvcc at /usr/local/cuda, python3.12 (pyenv), ~4 GB for the torch venv, and
# about 15 minutes on 2 cores.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
vendor=${1:-$repo/../shared/vendor}
work=${KBUILD_DIR:-/tmp/kbuild}
py=${PYTHON312:-$(ls -d /root/.pyenv/versions/3.12*/bin/python3 2>/dev/null | head -1)}
[ -x "$py" ] || { echo "error: no python3.12 found (set PYTHON312)" >&2; exit 2; }
mkdir -p "$work/src" "$work/site" "$work/libs"
[ -x "$work/venv/bin/python" ] || "$py" -m venv "$work/venv"
"$work/venv/bin/pip" install -q torch==2.11.0 numpy setuptools wheel packaging ninja
site=$("$work/venv/bin/python" -c "import site; print(site.getsitepackages()[0])")
# CUDA 13 keeps libcu++ under include/cccl; cusparse/cublas headers and nvrtc come from the wheels
export CPLUS_INCLUDE_PATH=/usr/local/cuda/include/cccl:/usr/local/cuda/include:$site/nvidia/cu13/include
export CUDA_HOME=/usr/local/cuda TORCH_CUDA_ARCH_LIST=9.0a
ln -sf "$site/nvidia/cu13/lib/libnvrtc.so.13" "$work/libs/libnvrtc.so"
export LIBRARY_PATH=$work/libs PATH=$work/venv/bin:$PATH
for a in "$vendor"/flashmla-*.tar.xz "$vendor"/deepgemm-*.tar.xz; do tar -xJf "$a" -C "$work/src"; done
(cd "$work/src/flashmla" && FLASH_MLA_DISABLE_SM100=1 NVCC_THREADS=2 MAX_JOBS=2 \
  python3 -m pip install -q --no-build-isolation --no-deps --no-index --target "$work/site" .)
(cd "$work/src/deepgemm" && MAX_JOBS=2 \
  python3 -m pip install -q --no-build-isolation --no-deps --no-index --target "$work/site" .)
mkdir -p "$repo/.kbuild"
tar -cJf "$repo/.kbuild/site.tar.xz" -C "$work" site
echo "wrote $repo/.kbuild/site.tar.xz (add /.kbuild/ to .git/info/exclude; carry it with .whl)"
