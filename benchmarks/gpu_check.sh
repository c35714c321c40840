#!/usr/bin/env bash
# The one prepared run for a GPU machine: the CUDA tests (every preset end to end on the GPU, the fused
# MLP against the CPU), then benchmarks/update_speed.py and benchmarks/policy_latency.py on the GPU.
#
#   OUT=/some/dir bash benchmarks/gpu_check.sh     # JSON results and gpu_check.log go to $OUT
#
# It uses the machine's python3 and torch. Packages that python lacks can sit as wheels in .whl/ (the
# README's "On a GPU" section lists them); they are installed to /tmp/site first. Exit status: 0 when
# every step passed. A dry run of the same steps on a CPU, in seconds:
#   DEVICE=cpu EMBODIED_TEST_DEVICE=cpu QUICK=1 WHEELS=none PYTHON=.venv/bin/python bash benchmarks/gpu_check.sh
set -uo pipefail
OUT=${OUT:-benchmarks/results}
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
QUICK=${QUICK:+--quick}
mkdir -p "$OUT"
log="$OUT/gpu_check.log"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl || exit 1
  export PYTHONPATH="/tmp/site:$PWD"
fi
export WANDB_MODE=disabled PYTHONUNBUFFERED=1 MUJOCO_GL="${MUJOCO_GL:-disable}" EMBODIED_CACHE="${EMBODIED_CACHE:-/tmp/embodied_cache}"
status=0
step() {  # step NAME CMD...: run, log, remember a failure, go on
  echo "== $1 ($(date -u +%H:%M:%S))" | tee -a "$log"
  shift
  "$@" 2>&1 | grep --line-buffered -v "^round [0-9]" | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || { echo "== failed with exit status $rc" | tee -a "$log"; status=1; }
}
step machine bash -c "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null; \
  $PY -c 'import torch; print(\"torch\", torch.__version__, \"cuda\", torch.cuda.is_available())'"
step "cuda tests" "$PY" -m pytest -q -p no:cacheprovider tests/policies/test_mlp.py tests/test_train.py tests/agents/test_agents_sac.py -k cuda
step "update speed" "$PY" benchmarks/update_speed.py --device "$DEVICE" --rounds 3 --seconds 1 --compile --out "$OUT" $QUICK
step "policy latency" "$PY" benchmarks/policy_latency.py --device "$DEVICE" --rounds 3 --compile --out "$OUT" $QUICK
echo "== done, exit status $status" | tee -a "$log"
exit $status
