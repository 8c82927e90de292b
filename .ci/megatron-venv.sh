#!/usr/bin/env bash
# The Python 3.12 virtualenv in which tests/integrations/test_megatron_training.py runs
# megatron-core 0.19.2's own megatron.training functions against tokenload's Megatron adapter.
# megatron-core is a test-only dependency (megatron.training needs Python >= 3.12; the main venv
# may be older); tokenload never depends on it.
#
# Usage: bash .ci/megatron-venv.sh [VENV]          build it now (default build/megatron-venv;
#                                                  idempotent, ~3 min: PyPI's CUDA torch for 3.12)
#        bash .ci/megatron-venv.sh --start [VENV]  build it in the background (output in
#                                                  VENV.log) and return at once
#        bash .ci/megatron-venv.sh --wait [VENV]   wait for the build --start began (build it now
#                                                  if none was started); fail with its log if it
#                                                  failed
# Prints (except --start), as its last line, the export that the tests read:
#   export TOKENLOAD_MEGATRON_PYTHON=.../bin/python
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
esac
VENV="${1:-build/megatron-venv}"
LOG="$VENV.log"
STATUS="$VENV.status"
PIDFILE="$VENV.pid"

if [ "$MODE" = start ]; then
  # a build still running from an earlier --start (whose --wait never came) is the one to wait for
  if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    exit 0
  fi
  mkdir -p "$(dirname "$VENV")"
  rm -f "$STATUS" "$STATUS.tmp"
  # lowest CPU and disk priority: the build (mostly a download) takes what the steps and tests
  # running meanwhile leave, so their timings are not disturbed
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

PY="${MEGATRON_BASE_PYTHON:-}"
if [ -z "$PY" ]; then
  PY="$(pyenv prefix 3.12.1 2>/dev/null || echo /root/.pyenv/versions/3.12.1)/bin/python3.12"
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
# tokenload's own dependencies, as pyproject.toml lists them
mapfile -t DEPS < <("$VPY" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
# torch pinned to the CPU wheel by constraints.txt, as in the main venv; tensorboard for
# Megatron's TensorBoard writer (the adapter's metrics are read back from its event files)
"$VPY" -m pip install -q -c constraints.txt "torch==2.13.0" "megatron-core==0.19.2" tensorboard "${DEPS[@]}"
SITE="$("$VPY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
echo "$(pwd)/src" >"$SITE/tokenload-src.pth"
"$VPY" - <<'PYEOF'
import warnings; warnings.filterwarnings("ignore")
from megatron.core.datasets import helpers_cpp  # noqa: F401  (shipped compiled in the wheel)
from megatron.training.arguments import parse_and_validate_args  # noqa: F401
import tokenload.integrations.megatron  # noqa: F401
PYEOF
echo "export TOKENLOAD_MEGATRON_PYTHON=$(cd "$VENV/bin" && pwd)/python"
