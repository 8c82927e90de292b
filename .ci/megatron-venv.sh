#!/usr/bin/env bash
# The Python 3.12 virtualenv in which tests/integrations/test_megatron_training.py runs
# megatron-core 0.19.2's own megatron.training functions against tokenload's Megatron adapter.
# megatron-core is a test-only dependency (megatron.training and its compiled helpers_cpp need
# Python >= 3.12; the main venv may be older); tokenload never depends on it.
#
# Usage: bash .ci/megatron-venv.sh [VENV]          build it now (default build/megatron-venv;
#                                                  idempotent; see CONTRIBUTING.md for its time
#                                                  and size)
#        bash .ci/megatron-venv.sh --check         find the Python >= 3.12 and the tools the build
#                                                  needs, or say what to install (exit 3)
#        bash .ci/megatron-venv.sh --start [VENV]  --check, then build it in the background
#                                                  (output in VENV.log) and return at once
#        bash .ci/megatron-venv.sh --wait [VENV]   wait for the build --start began (build it now
#                                                  if none was started); fail with its log if it
#                                                  failed
# Prints (except --start and --check), as its last line, the export that the tests read:
#   export TOKENLOAD_MEGATRON_PYTHON=.../bin/python
# MEGATRON_BASE_PYTHON=/path/to/python3.12 chooses the Python the venv is made from.
#
# torch without CUDA: PyPI serves torch for Linux x86_64 only as its CUDA build, which depends on
# 2.7 GB of nvidia-* wheels; PyTorch's CPU build for 3.12 is not on PyPI (and this machine's
# local wheels are for 3.11). So torch==2.13.0 (the version constraints.txt pins, that of the
# main venv's CPU wheel), megatron-core and their dependencies are installed by uv (.ci/uv.sh)
# less CUDA's libraries (nvidia-*, cuda-*; triton stays: `import megatron.core` imports it), and
# .ci/cuda_stubs.py writes small stand-ins for the CUDA libraries that torch's shared objects
# link (every function answers "no device"): torch.cuda.is_available() is False, as on any
# machine without a GPU, and the CPU code is the CUDA build's own.
#
# The venv imports tokenload from this checkout's src/ through a .pth file rather than a
# `pip install -e .`: an editable install writes src/tokenload.egg-info, which the main venv's own
# editable install writes at the same time when the build runs in the background.
set -euo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")/.."
MODE=build
case "${1:-}" in
  --start) MODE=start; shift ;;
  --wait) MODE=wait; shift ;;
  --check) MODE=check; shift ;;
esac
VENV="${1:-build/megatron-venv}"
LOG="$VENV.log"
STATUS="$VENV.status"
PIDFILE="$VENV.pid"

# The Python >= 3.12 to build from (in PY), or what to install (exit 3): in the first seconds of
# .ci/run, not after its suite. Also the tools that .ci/cuda_stubs.py runs.
find_python() {
  local c v candidates=()
  if [ -n "${MEGATRON_BASE_PYTHON:-}" ]; then
    candidates=("$MEGATRON_BASE_PYTHON")
  else
    # 3.12 first (the version megatron-core's tests were run on here), then newer ones
    if command -v pyenv >/dev/null 2>&1; then
      for v in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.12\.[0-9]+$' | sort -rV) \
        $(pyenv versions --bare 2>/dev/null | grep -E '^3\.1[3-9]\.[0-9]+$' | sort -V); do
        candidates+=("$(pyenv root)/versions/$v/bin/python${v%.*}")
      done
    fi
    candidates+=(python3.12 python3.13 python3)
  fi
  for c in "${candidates[@]}"; do
    if "$c" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 12))' \
      >/dev/null 2>&1; then
      PY="$(command -v "$c")"
      break
    fi
  done
  if [ -z "$PY" ]; then
    cat >&2 <<EOF
megatron-venv: no Python >= 3.12 with venv and ensurepip found${MEGATRON_BASE_PYTHON:+ (MEGATRON_BASE_PYTHON=$MEGATRON_BASE_PYTHON)}.
  The Megatron-LM adapter's tests run megatron-core 0.19.2, whose megatron.training needs 3.12.
  HINT: install one (pyenv install 3.12, or apt-get install python3.12 python3.12-venv), or point
  MEGATRON_BASE_PYTHON at one; then run .ci/run again.
EOF
    exit 3
  fi
  local tool missing=()
  for tool in gcc readelf nm; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "megatron-venv: ${missing[*]} not found (.ci/cuda_stubs.py compiles the CUDA" \
      "stand-ins with them). HINT: apt-get install gcc binutils" >&2
    exit 3
  fi
}

if [ "$MODE" = start ] || [ "$MODE" = check ]; then
  PY=""
  find_python
  if [ "$MODE" = check ]; then
    echo "megatron-venv: $PY ($("$PY" --version 2>&1))"
    exit 0
  fi
fi

if [ "$MODE" = start ]; then
  # a build still running from an earlier --start (whose --wait never came) is the one to wait for
  if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    exit 0
  fi
  mkdir -p "$(dirname "$VENV")"
  rm -f "$STATUS" "$STATUS.tmp"
  # uv, fetched now if missing (not by the build and .ci/run at the same time)
  source .ci/uv.sh
  # lowest CPU and disk priority: the build takes what the steps and tests running meanwhile
  # leave, so their timings are not disturbed
  LOW=(nice -n 19)
  if command -v ionice >/dev/null 2>&1 && ionice -c 3 true 2>/dev/null; then
    LOW+=(ionice -c 3)
  fi
  # the status file appears only once the build has ended, with its exit code
  ( rc=0; "${LOW[@]}" bash "$SELF" "$VENV" >"$LOG" 2>&1 </dev/null || rc=$?
    echo "$rc" >"$STATUS.tmp" && mv "$STATUS.tmp" "$STATUS" ) >/dev/null 2>&1 </dev/null &
  echo $! >"$PIDFILE"
  exit 0
fi

if [ "$MODE" = wait ] && [ -f "$PIDFILE" ]; then
  pid="$(cat "$PIDFILE")"
  while [ ! -f "$STATUS" ]; do
    if ! kill -0 "$pid" 2>/dev/null && [ ! -f "$STATUS" ]; then
      echo "megatron-venv: the background build (pid $pid) ended without a status; its log:" >&2
      grep -v '^WARNING: Location' "$LOG" | tail -50 >&2 || true
      rm -f "$PIDFILE"
      exit 1
    fi
    sleep 2
  done
  rc="$(cat "$STATUS")"
  rm -f "$PIDFILE" "$STATUS"
  if [ "$rc" != 0 ]; then
    echo "megatron-venv: the background build failed (exit $rc); its log ($LOG):" >&2
    grep -v '^WARNING: Location' "$LOG" | tail -50 >&2 || true
    exit "$rc"
  fi
  tail -1 "$LOG"
  exit 0
fi

# the build itself
PY=""
find_python
source .ci/uv.sh # $UV, and the sources and constraints pip would use (UV_CONFIG_FILE, ...)
VPY="$VENV/bin/python"
SITE="$VENV/lib/python$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')/site-packages"
# a venv made by an earlier version of this script holds CUDA's wheels: start again without them
if [ -n "$(ls -d "$SITE"/nvidia_* 2>/dev/null)" ]; then
  rm -rf "$VENV"
fi
[ -x "$VPY" ] || "$UV" venv -q --python "$PY" "$VENV"
# 1. torch (the version constraints.txt pins; that of the main venv's CPU build), megatron-core,
#    tensorboard (Megatron's TensorBoard writer: the adapter's metrics are read back from its
#    event files) and tokenload's own dependencies (pyproject.toml), resolved together; then
#    installed less CUDA's libraries (nvidia-*, cuda-*), which the resolution lists and
#    --excludes drops. triton stays: megatron-core imports it unguarded
#    (megatron.core.transformer.moe.ops.paged_stash, reached from `import megatron.core`).
printf '%s\n' "torch==2.13.0" "megatron-core==0.19.2" tensorboard >"$VENV/requirements.in"
"$UV" pip compile -q --python "$VPY" --no-header --no-annotate "$VENV/requirements.in" \
  pyproject.toml | sed -n -E 's/^((nvidia|cuda)-[^=]*)==.*/\1/p' >"$VENV/cuda-excluded.txt"
"$UV" pip install -q --python "$VPY" --excludes "$VENV/cuda-excluded.txt" \
  -r "$VENV/requirements.in" -r pyproject.toml
# 2. the stand-ins for CUDA's libraries (nvidia/cu13/lib, where torch's RPATH looks)
"$VPY" .ci/cuda_stubs.py "$SITE"
echo "$(pwd)/src" >"$SITE/tokenload-src.pth"
"$VPY" - <<'PYEOF'
import warnings; warnings.filterwarnings("ignore")
import torch
assert not torch.cuda.is_available()
from megatron.core.datasets import helpers_cpp  # noqa: F401  (shipped compiled in the wheel)
from megatron.training.arguments import parse_and_validate_args  # noqa: F401
import tokenload.integrations.megatron  # noqa: F401
PYEOF
echo "export TOKENLOAD_MEGATRON_PYTHON=$(cd "$VENV/bin" && pwd)/python"
