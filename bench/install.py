"""The install footprint: a host+worker-only virtual environment (the base package, no extras) built fresh.

    .venv/bin/python bench/install.py [--keep DIR]

Creates a venv in a temporary folder, installs this checkout's base package into it the ordinary way (pip
resolves every dependency; no `--no-deps`), and prints its size beside the size of the environment running
this script (which has the `model` extra: torch, transformers, xgrammar, ...). Then it checks, in the new
venv, that no torch-stack package was installed, that `sa host`/`sa worker`/`sa send` parse, and that
`sa model serve` says how to install the extra. The aim is ≤ 250 MB.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "xgrammar", "triton", "gguf", "safetensors", "nvidia")


def size_mb(path: Path) -> float:
    return sum(f.lstat().st_size for f in path.rglob("*") if f.is_file() or f.is_symlink()) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="build the venv here and keep it (default: a temporary folder)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(ROOT / name, src / name)
        shutil.copytree(ROOT / "runtime", src / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
        venv = args.keep or Path(tmp) / "venv"
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(src)], capture_output=True,
                             text=True)
        if pip.returncode:
            sys.exit(f"pip install failed:\n{pip.stderr}")
        took = time.perf_counter() - t0
        listed = subprocess.run([str(venv / "bin" / "pip"), "list", "--format=freeze"], capture_output=True,
                                text=True, check=True).stdout.lower()
        heavy = sorted({line.split("==")[0] for line in listed.splitlines()
                        if line.split("==")[0].startswith(HEAVY)})
        sa = [str(venv / "bin" / "sa")]
        helps = {cmd: subprocess.run([*sa, cmd, "--help"], capture_output=True, text=True).returncode
                 for cmd in ("host", "worker", "send")}
        serve = subprocess.run([*sa, "model", "serve"], capture_output=True, text=True)
        lean, full = size_mb(venv), size_mb(Path(sys.prefix))
        print(f"{'host+worker venv (base package, pip install .)':<52}{lean:>8.0f} MB   aim <= 250 MB: "
              f"{'met' if lean <= 250 else 'missed'}   ({took:.0f} s to build)")
        print(f"{'this venv (with the model, dev and bench extras)':<52}{full:>8.0f} MB   lean / full = "
              f"{lean / full:.2f}")
        print(f"torch-stack packages in the lean venv: {', '.join(heavy) or 'none'}")
        print(f"sa host / worker / send --help exit codes: {helps}")
        print(f"sa model serve in the lean venv: exit {serve.returncode}: {serve.stderr.strip()[:200]}")


if __name__ == "__main__":
    main()
