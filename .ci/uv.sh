# shellcheck shell=bash
# Sourced by .ci/run and .ci/megatron-venv.sh (from the repository root): uv, the installer both
# venvs are made with. It installs the same pins as pip from the same sources, several times
# faster (CONTRIBUTING.md, "Measured here"). Sets and exports:
#   UV                   uv 0.13.9: $UV where set, else build/uv/bin/uv, which pip installs
#                        there (a venv of its own, 63 MB) the first time, in about 10 s
#   UV_CONFIG_FILE       build/uv.toml, written by .ci/uv_config.py: the indexes and find-links
#                        folders that pip's configuration names on this machine (uv reads no
#                        pip.conf), searched as pip does, for the best version in any of them
#   UV_CONSTRAINT        constraints.txt, then the constraint files that pip's configuration
#                        names (torch's version pin, and whatever caps this machine's pip applies)
#   UV_COMPILE_BYTECODE  1: each installed module compiled to bytecode, as pip does (where
#                        PYTHONDONTWRITEBYTECODE is set, as here, nothing writes it later, and
#                        every process the tests start would compile torch's modules again)
# uv's cache is ~/.cache/uv (or UV_CACHE_DIR); the venvs' files are hard links into it where it is
# on the same file system (a copy where not), so a second build takes seconds.
uv_setup() {
  local version=0.13.9
  if [ -z "${UV:-}" ]; then
    UV="$(pwd)/build/uv/bin/uv"
    if ! "$UV" --version 2>/dev/null | grep -q " $version\b"; then
      rm -rf build/uv
      python3 -m venv build/uv
      build/uv/bin/python -m pip install -q "uv==$version" 2>&1 | grep -v '^WARNING: Location' || true
      "$UV" --version >/dev/null # stops here, with pip's error above, if that failed
    fi
  fi
  mkdir -p build
  local machine
  machine="$(python3 .ci/uv_config.py build/uv.toml)"
  export UV UV_CONFIG_FILE="$(pwd)/build/uv.toml"
  export UV_CONSTRAINT="$(pwd)/constraints.txt${machine:+ $machine}" UV_COMPILE_BYTECODE=1
}
uv_setup
