#!/usr/bin/env bash
# The Python 3.12 virtualenv in which tests/integrations/test_megatron_training.py runs
# megatron-core 0.19.2's own megatron.training functions against tokenload's Megatron adapter.
# megatron-core is a test-only dependency (megatron.training needs Python >= 3.12; the main venv
# may be older); tokenload never depends on it.
#
# Usage: bash .ci/megatron-venv.sh [VENV]   (default build/megatron-venv; idempotent, ~3 min)
# Prints, as its last line, the export that the tests read:
#   export TOKENLOAD_MEGATRON_PYTHON=.../bin/python
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-build/megatron-venv}"
PY="${MEGATRON_BASE_PYTHON:-}"
if [ -z "$PY" ]; then
  PY="$(pyenv prefix 3.12.1 2>/dev/null || echo /root/.pyenv/versions/3.12.1)/bin/python3.12"
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
# torch pinned to the CPU wheel by constraints.txt, as in the main venv; tensorboard for
# Megatron's TensorBoard writer (the adapter's metrics are read back from its event files)
"$VPY" -m pip install -q -c constraints.txt "torch==2.13.0" "megatron-core==0.19.2" tensorboard -e .
"$VPY" - <<'PYEOF'
import warnings; warnings.filterwarnings("ignore")
from megatron.core.datasets import helpers_cpp  # noqa: F401  (shipped compiled in the wheel)
from megatron.training.arguments import parse_and_validate_args  # noqa: F401
import tokenload.integrations.megatron  # noqa: F401
PYEOF
echo "export TOKENLOAD_MEGATRON_PYTHON=$(cd "$VENV/bin" && pwd)/python"
