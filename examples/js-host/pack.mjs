// `npm pack`'s steps (package.json's prepack and postpack): what the
// package carries that is made from the repository's one source of each,
// never kept as a copy here.
//
//   node pack.mjs prepare   dist/ transpiled from the released coord.wasm
//                           (host-test/host/prebuilt/, the bytes the crates
//                           and the wheel carry), the Redis scripts from
//                           host-test/redis/, the license texts
//   node pack.mjs clean     remove the copies again (dist/ stays: npm test
//                           rebuilds it from target/coord.wasm)

import { copyFileSync, mkdirSync, rmSync } from 'node:fs';
import { execFileSync } from 'node:child_process';

const here = (path) => new URL(path, import.meta.url);
const repo = (path) => new URL(`../../${path}`, import.meta.url);
const SCRIPTS = ['redis.lua', 'unwatched.lua', 'meter.lua'];
const LICENSES = ['LICENSE-MIT', 'LICENSE-APACHE'];

function prepare() {
  rmSync(here('dist'), { recursive: true, force: true });
  execFileSync(
    here('node_modules/.bin/jco').pathname,
    ['transpile', repo('host-test/host/prebuilt/coord.wasm').pathname, '-o', here('dist').pathname,
      '--name', 'coord', '--instantiation', 'sync', '--no-typescript', '--quiet'],
    { stdio: 'inherit' },
  );
  mkdirSync(here('scripts'), { recursive: true });
  for (const name of SCRIPTS) copyFileSync(repo(`host-test/redis/${name}`), here(`scripts/${name}`));
  for (const name of LICENSES) copyFileSync(repo(name), here(name));
}

function clean() {
  rmSync(here('scripts'), { recursive: true, force: true });
  for (const name of LICENSES) rmSync(here(name), { force: true });
}

const steps = { prepare, clean };
const step = steps[process.argv[2]];
if (!step) {
  console.error(`usage: node pack.mjs ${Object.keys(steps).join('|')}`);
  process.exit(2);
}
step();
