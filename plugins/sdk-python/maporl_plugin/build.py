"""`python -m maporl_plugin build APP.py --world WORLD -o OUT.wasm`: builds a Python plugin
into a WebAssembly component with componentize-py, against the contract this package ships
(`wit/maporl.wit`) or `--wit DIR`."""

import argparse
import os
import shutil
import subprocess
import sys

WORLDS = {"protocol": "Collaboration", "verifier": "Verification", "reward-shaper": "RewardShaping"}
HERE = os.path.dirname(os.path.abspath(__file__))


def build(app: str, world: str, out: str, wit: str = None) -> None:
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
    cmd = [
        tool,
        "-d", wit,
        "-w", world,
        "componentize", module[: -len(".py")],
        "-p", app_dir,
        "-p", os.path.dirname(HERE),
        "-o", out,
    ]
    done = subprocess.run(cmd)
    if done.returncode != 0:
        raise SystemExit(f"maporl-plugin build: componentize-py failed ({done.returncode}): {' '.join(cmd)}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="maporl-plugin")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build a Python plugin into a component")
    b.add_argument("app", help="the plugin's module, e.g. app.py")
    b.add_argument("--world", required=True, choices=sorted(WORLDS))
    b.add_argument("-o", "--out", required=True, help="the component to write (.wasm)")
    b.add_argument("--wit", help="the contract's directory (default: the one this package ships)")
    args = parser.parse_args(argv)
    build(args.app, args.world, args.out, args.wit)
    print(f"built {args.out} ({args.world})")


if __name__ == "__main__":
    main(sys.argv[1:])
