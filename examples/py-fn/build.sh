#!/usr/bin/env bash
# Build the Python edge function into target/py-fn.wasm (or $1).
#
# Needs python3 (3.10+) with pip and venv, and PyPI. Installs componentize-py
# (requirements.txt) into examples/py-fn/.venv and unpacks the wasi:http WIT
# into wit/deps/wasi-* the first time; both are ignored by git.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/target/py-fn.wasm}"
python="${PYTHON:-python3}"
cd "$here"

if [ ! -x .venv/bin/componentize-py ]; then
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.txt

if [ ! -f wit/deps/wasi-http/types.wit ]; then
    download="$(mktemp -d)"
    trap 'rm -rf "$download"' EXIT
    .venv/bin/python -m pip download --quiet --disable-pip-version-check \
        --no-deps --only-binary=:all: --require-hashes -r wasi-wit.txt -d "$download"
    .venv/bin/python - "$download"/*.whl <<'PY'
import pathlib, sys, zipfile

# Each wasi-* folder is a package of its own; write only into them (the
# coord-* entries beside them are symlinks to the repository's wit/).
wanted = {
    "wasi-http": ("http@0.2.6", ["types.wit", "handler.wit"]),
    "wasi-io": ("io@0.2.6", ["error.wit", "poll.wit", "streams.wit"]),
    "wasi-clocks": ("clocks@0.2.6", ["monotonic-clock.wit", "wall-clock.wit"]),
}
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for folder, (package, files) in wanted.items():
        target = pathlib.Path("wit/deps") / folder
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            text = wheel.read(f"spin_sdk/wit/deps/{package}/{name}")
            (target / name).write_bytes(text)
    # The http files name their package in proxy.wit, which is left out (its
    # worlds pull in wasi:cli and wasi:random): name it here instead.
    pathlib.Path("wit/deps/wasi-http/package.wit").write_text("package wasi:http@0.2.6;\n")
PY
fi

mkdir -p "$(dirname "$out")"
.venv/bin/componentize-py --quiet -d wit -w function componentize app -o "$out"
echo "built $out ($(wc -c <"$out") bytes)"
