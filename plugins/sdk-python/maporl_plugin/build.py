"""`python -m maporl_plugin build APP.py --world WORLD -o OUT.wasm`: builds a Python plugin
into a WebAssembly component with componentize-py, against the contract this package ships
(`wit/maporl.wit`) or `--wit DIR`.

componentize-py does not build the same bytes twice (it snapshots a CPython heap laid out
anew each time), so the build also records the sha256 of what it was built from in the
component, as a custom section `maporl:source`: the app's directory (its `.py` files), this
package, the contract, the world and componentize-py's version. maporl seeds the plugin from
that hash and resumes a run whose plugin was rebuilt from the same source. Packages given
with `--path DIR` are bundled and counted; packages componentize-py finds elsewhere (its
own site-packages) are bundled but not counted."""

import argparse
import hashlib
import os
import shutil
import subprocess
import sys

SOURCE_SECTION = "maporl:source"

WORLDS = {"protocol": "Collaboration", "verifier": "Verification", "reward-shaper": "RewardShaping"}
HERE = os.path.dirname(os.path.abspath(__file__))


def build(app: str, world: str, out: str, wit: str = None, paths=()) -> str:
    """Builds `app` into `out`, with the packages under each of `paths` importable (pure
    Python, e.g. a `pip install --target DIR`); returns the source sha256 recorded in it."""
    if world not in WORLDS:
        raise SystemExit(f"maporl-plugin build: unknown world `{world}`; the worlds are {', '.join(WORLDS)}")
    if not os.path.isfile(app) or not app.endswith(".py"):
        raise SystemExit(f"maporl-plugin build: {app} is not a Python file")
    tool = shutil.which("componentize-py")
    if tool is None:
        raise SystemExit(
            "maporl-plugin build: componentize-py is not installed: "
            "`python3 -m pip install componentize-py==0.25.1`"
        )
    with open(app, encoding="utf-8") as f:
        source = f.read()
    name = WORLDS[world]
    if f"{name} =" not in source and f"class {name}" not in source:
        raise SystemExit(
            f"maporl-plugin build: {app} defines no `{name}`: a {world} plugin ends with "
            f"`{name} = export(YourPlugin)`"
        )
    wit = wit or os.path.join(HERE, "wit")
    app_dir, module = os.path.split(os.path.abspath(app))
    os.makedirs(os.path.dirname(os.path.abspath(out)) or ".", exist_ok=True)
    for path in paths:
        if not os.path.isdir(path):
            raise SystemExit(f"maporl-plugin build: --path {path} is not a directory")
    cmd = [
        tool,
        "-d", wit,
        "-w", world,
        "componentize", module[: -len(".py")],
        "-p", app_dir,
        "-p", os.path.dirname(HERE),
    ]
    for path in paths:
        cmd += ["-p", path]
    cmd += ["-o", out]
    done = subprocess.run(cmd)
    if done.returncode != 0:
        raise SystemExit(f"maporl-plugin build: componentize-py failed ({done.returncode}): {' '.join(cmd)}")
    source = source_sha256(app_dir, world, wit, tool_version(tool), paths)
    with open(out, "rb") as f:
        component = f.read()
    with open(out, "wb") as f:
        f.write(with_section(component, SOURCE_SECTION, source.encode()))
    return source


def tool_version(tool: str) -> str:
    done = subprocess.run([tool, "--version"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"maporl-plugin build: `{tool} --version` failed: {done.stderr.strip()}")
    return done.stdout.strip()


def _files(root: str, suffixes):
    """The files under `root` ending in one of `suffixes`, as sorted relative paths
    (`/`-separated), leaving out caches and hidden directories."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        for name in filenames:
            if name.endswith(suffixes):
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                found.append(rel.replace(os.sep, "/"))
    return sorted(found)


def source_sha256(app_dir: str, world: str, wit: str, tool: str, paths=()) -> str:
    """The sha256 of what a build reads: the app directory's `.py` files, this package's
    `.py` files, the contract's `.wit` files, the `.py` files under each of `paths`, the
    world and the componentize-py version; each file as its label, relative path, length
    and bytes, in sorted order."""
    h = hashlib.sha256()
    h.update(f"maporl-plugin source 1\0world {world}\0tool {tool}\0".encode())
    for label, root, suffixes in [
        ("app", app_dir, (".py",)),
        ("sdk", HERE, (".py",)),
        ("wit", wit, (".wit",)),
    ] + [(f"path{i}", p, (".py",)) for i, p in enumerate(paths)]:
        for rel in _files(root, suffixes):
            with open(os.path.join(root, rel), "rb") as f:
                data = f.read()
            h.update(f"{label}/{rel}\0{len(data)}\0".encode())
            h.update(data)
    return h.hexdigest()


def _leb128(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def with_section(component: bytes, name: str, contents: bytes) -> bytes:
    """`component` with a custom section appended at its top level."""
    if component[:4] != b"\0asm":
        raise SystemExit("maporl-plugin build: the output is not a WebAssembly file")
    payload = _leb128(len(name.encode())) + name.encode() + contents
    return component + b"\0" + _leb128(len(payload)) + payload


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="maporl-plugin")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build a Python plugin into a component")
    b.add_argument("app", help="the plugin's module, e.g. app.py")
    b.add_argument("--world", required=True, choices=sorted(WORLDS))
    b.add_argument("-o", "--out", required=True, help="the component to write (.wasm)")
    b.add_argument("--wit", help="the contract's directory (default: the one this package ships)")
    b.add_argument(
        "--path",
        action="append",
        default=[],
        help="a directory of pure-Python packages to bundle (e.g. from `pip install --target DIR`); repeatable",
    )
    args = parser.parse_args(argv)
    source = build(args.app, args.world, args.out, args.wit, args.path)
    print(f"built {args.out} ({args.world}), from source sha256 {source}")


if __name__ == "__main__":
    main(sys.argv[1:])
