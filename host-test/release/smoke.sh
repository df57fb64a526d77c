#!/usr/bin/env bash
# The release folder as a user meets it: every file matches SHA256SUMS, the
# npm tarball and the wheel install into empty places and run their smokes
# there with only the public import, they carry the component the folder
# holds and no file a user does not need, and the `coord` binary answers
# `--version` and serves a request.
#
#   host-test/release/smoke.sh target/dist
set -euo pipefail

dist="$(cd "${1:?usage: smoke.sh RELEASE_FOLDER}" && pwd)"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d)"
serve_pid=""
cleanup() {
  [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "release smoke: $*" >&2; exit 1; }

version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -n1)"
[ -n "$version" ] || fail "no version in Cargo.toml"

echo "== SHA256SUMS"
(cd "$dist" && sha256sum -c SHA256SUMS)
for file in coord.wasm "coord-sync-$version.wit.wasm" "coord-sync-$version.tgz" \
  "coord_sync-$version-py3-none-any.whl"; do
  grep -q "  $file\$" "$dist/SHA256SUMS" || fail "SHA256SUMS does not list $file"
done

# Files no user needs: tests, dependencies, build output, caches.
unneeded='(^|/)(test|tests|node_modules|target|__pycache__)/|\.pyc$|(^|/)\.'

echo "== the npm tarball"
tar tzf "$dist/coord-sync-$version.tgz" >"$work/npm.list"
if grep -E "$unneeded" "$work/npm.list"; then fail "the npm tarball carries the files above"; fi
grep -qx 'package/index.d.ts' "$work/npm.list" || fail "the npm tarball has no index.d.ts"
mkdir "$work/npm"
cp "$repo/examples/js-host/smoke.mjs" "$work/npm/"
(cd "$work/npm" && npm install --no-audit --no-fund --silent "$dist/coord-sync-$version.tgz" \
  && node smoke.mjs | tee "$work/npm.out")
grep -q 'ok$' "$work/npm.out" || fail "smoke.mjs did not end in ok"
grep -qx 'package/dist/coord.js' "$work/npm.list" || fail "the npm tarball has no transpiled component"

echo "== the wheel"
python3 -m zipfile -l "$dist/coord_sync-$version-py3-none-any.whl" | awk 'NR > 1 {print $1}' >"$work/wheel.list"
if grep -E "$unneeded" "$work/wheel.list"; then fail "the wheel carries the files above"; fi
for file in coord/py.typed coord/_data/coord.wasm coord/_data/redis/redis.lua \
  coord/_data/redis/unwatched.lua coord/_data/redis/meter.lua; do
  grep -qx "$file" "$work/wheel.list" || fail "the wheel has no $file"
done
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  "$dist/coord_sync-$version-py3-none-any.whl"
mkdir "$work/py"
cp "$repo/examples/py-host/smoke.py" "$work/py/"
(cd "$work/py" && "$work/venv/bin/python" smoke.py | tee "$work/py.out")
grep -q 'ok$' "$work/py.out" || fail "smoke.py did not end in ok"
packaged="$(cd "$work/py" && "$work/venv/bin/python" -c 'import coord; print(coord.find_wasm())')"
case "$packaged" in "$work/venv/"*) ;; *) fail "coord found its component at $packaged, not in the venv" ;; esac
cmp "$dist/coord.wasm" "$packaged" || fail "the wheel's coord.wasm is not the folder's"

echo "== the coord binary"
binary="$(ls "$dist"/coord-"$version"-* | head -n1)"
[ -x "$binary" ] || fail "no coord binary in $dist"
"$binary" --version | tee "$work/version.out"
grep -q "$version" "$work/version.out" || fail "coord --version does not say $version"
"$repo/host-test/release/serve-smoke.sh" "$binary"

echo "release smoke: every artifact of $version installed and ran, ok"
