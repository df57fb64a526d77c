#!/usr/bin/env bash
# Build the JavaScript edge function into target/js-fn.wasm (or $1).
#
# Needs Node 18+ and npm. Installs the pinned componentize-js and jco
# (package-lock.json) into node_modules, and writes the WASI WIT into
# wit/deps/wasi-* the first time; both are ignored by git.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/target/js-fn.wasm}"
cd "$here"

if [ ! -d node_modules/@bytecodealliance/componentize-js ]; then
    npm ci --no-audit --no-fund
fi

# StarlingMonkey, the JS engine inside componentize-js 0.23, is built against
# WASI 0.2.10 and answers wasi:http/incoming-handler@0.2.10 only: a world that
# exports another version fails with "failed to find export of interface".
# jco ships the WASI 0.2.12 WIT; 0.2.x releases are compatible, so its files
# are written here labelled 0.2.10. Only into the wasi-* folders: the coord-*
# entries beside them are symlinks to the repository's wit/.
wasi=0.2.10
builtin=node_modules/@bytecodealliance/jco/lib/wit/builtin/0.2.12
if [ ! -f "wit/deps/wasi-http/package.wit" ] || ! grep -q "wasi:http@$wasi;" wit/deps/wasi-http/package.wit; then
    for package in "$builtin"/wasi-*; do
        name="$(basename "$package")"
        mkdir -p "wit/deps/$name"
        sed "s/@0\.2\.12/@$wasi/g" "$package/package.wit" >"wit/deps/$name/package.wit"
    done
fi

mkdir -p "$(dirname "$out")"
npx componentize-js --wit wit --world-name function -o "$out" src/app.js
echo "built $out ($(wc -c <"$out") bytes)"
