"""`import tokenload` stays cheap: no torch, no NumPy, no logging handlers at import time."""

from __future__ import annotations

import json
import subprocess
import sys


def test_import_is_light():
    code = (
        "import sys, logging, json; import tokenload;"
        "print(json.dumps({'mods': sorted(m for m in ('torch', 'numpy', 'tokenizers') if m in sys.modules),"
        " 'handlers': len(logging.getLogger().handlers)}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == {"mods": [], "handlers": 0}


def test_lazy_attributes_resolve():
    import tokenload

    assert tokenload.TokenFile.__name__ == "TokenFile"
    assert issubclass(tokenload.FormatError, ValueError)
    for name in tokenload.__all__:
        assert getattr(tokenload, name) is not None
