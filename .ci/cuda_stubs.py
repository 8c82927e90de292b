"""Stand-ins for the CUDA libraries that PyPI's Linux torch wheel links, for a CPU-only venv.

PyPI serves torch for Linux x86_64 only as its CUDA build, whose shared objects list the CUDA
libraries (cuBLAS, cuDNN, NCCL, ...: ~2.7 GB of `nvidia-*` wheels, plus 0.7 GB of triton) as
load-time dependencies, so `import torch` fails without them even where no GPU will ever be
used. PyTorch's CPU build for Python 3.12 is served only by PyTorch's own index, which this
machine cannot reach. This script writes, for each CUDA library that torch's shared objects
need and that is missing, a small library of the same name that defines the symbols (with their
symbol versions) that torch refers to: every function returns cudaErrorNoDevice (100), or an
empty string where a name is asked for (`...ErrorString`, ...), so `torch.cuda.is_available()`
is False, as on any machine without a GPU, and the CPU paths run the CUDA build's own CPU code.
Nothing here is used for anything but the tests' CPU processes (gloo).

Usage: python cuda_stubs.py SITE_PACKAGES   (torch installed there with --no-deps; needs gcc,
readelf and nm). Prints the libraries written.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

#: where torch's RPATH ($ORIGIN/../../nvidia/cu13/lib) looks; the stubs go there
STUB_DIR = "nvidia/cu13/lib"
#: system libraries: resolved by the dynamic loader, never stubbed
SYSTEM = re.compile(r"^(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux.*)\.so")
#: the libraries whose symbols carry no version, by the prefix of their API's names
UNVERSIONED = {
    "libnccl.so.2": "nccl",
    "libcurand.so.10": "curand",
    "libcufile.so.0": "cuFile",
    "libcusparseLt.so.0": "cusparseLt",
}


def run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def needed(lib: Path) -> list[str]:
    return re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", run("readelf", "-dW", str(lib)))


def version_needs(lib: Path) -> dict[str, set[str]]:
    """{library file: version names} of the object's .gnu.version_r section."""
    out: dict[str, set[str]] = {}
    current = None
    for line in run("readelf", "-VW", str(lib)).splitlines():
        m = re.search(r"File: (\S+)", line)
        if m:
            current = out.setdefault(m.group(1), set())
            continue
        m = re.search(r"Name: (\S+)", line)
        if m and current is not None and "Version:" in line:
            current.add(m.group(1))
    return out


def undefined(lib: Path) -> list[tuple[str, str | None]]:
    """(symbol, version or None) of the object's strong undefined dynamic symbols."""
    out = []
    for line in run("nm", "-D", "--undefined-only", str(lib)).splitlines():
        kind, _, name = line.strip().partition(" ")
        if kind != "U":  # weak ones ("w", "v") may stay unresolved
            continue
        sym, _, version = name.partition("@")
        out.append((sym, version.lstrip("@") or None))
    return out


def resolvable(name: str, here: Path) -> bool:
    return bool(SYSTEM.match(name)) or (here / name).exists() or name in run("ldconfig", "-p")


def body(sym: str) -> str:
    if re.search(r"(String|Name)$", sym):
        return f'const char *{sym}(void) {{ return ""; }}'
    return f"int {sym}(void) {{ return 100; }}"


def loaded(site: Path) -> list[Path]:
    """torch's extension module and the libraries of torch/lib it loads, by their NEEDED."""
    torch_lib = site / "torch" / "lib"
    todo = sorted((site / "torch").glob("_C*.so"))
    seen: list[Path] = []
    while todo:
        obj = todo.pop()
        if obj not in seen:
            seen.append(obj)
            todo += [torch_lib / n for n in needed(obj) if (torch_lib / n).exists()]
    return seen


def main(site: Path) -> None:
    torch_lib = site / "torch" / "lib"
    versions: dict[str, set[str]] = {}  # missing library -> the versions it must define
    symbols: dict[str, set[str]] = {}  # missing library -> the symbols it must define
    for obj in loaded(site):
        absent = [n for n in needed(obj) if not resolvable(n, torch_lib)]
        wanted = version_needs(obj)
        owner = {v: lib for lib in absent for v in wanted.get(lib, set())}
        for name in absent:
            versions.setdefault(name, set()).update(wanted.get(name, set()))
            symbols.setdefault(name, set())
        for sym, version in undefined(obj) if absent else []:
            if version in owner:
                symbols[owner[version]].add(sym)
            elif version is None:
                for lib, prefix in UNVERSIONED.items():
                    if lib in absent and sym.startswith(prefix):
                        symbols[lib].add(sym)
    out = site / STUB_DIR
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted(versions):
            syms = sorted(symbols[name])
            src = Path(tmp, name + ".c")
            src.write_text("\n".join(body(s) for s in syms) + "\n")
            cmd = ["gcc", "-shared", "-fPIC", "-O0", "-w", f"-Wl,-soname,{name}"]
            if versions[name]:
                # every symbol in the version node that torch asks for by this name
                nodes = sorted(versions[name])
                script = Path(tmp, name + ".map")
                script.write_text(
                    f"{nodes[0]} {{ global: {' '.join(s + ';' for s in syms)} local: *; }};\n"
                    + "".join(f"{v} {{ }};\n" for v in nodes[1:])
                )
                cmd.append(f"-Wl,--version-script,{script}")
            subprocess.run([*cmd, "-o", str(out / name), str(src)], check=True)
            print(f"{name}: {len(syms)} symbols, versions {nodes if versions[name] else '-'}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
