"""Puts into the wheel and the sdist what the package carries from the
repository's one source of each, never a copy kept here: coord.wasm as
released (host-test/host/prebuilt/, the bytes the crates and the npm package
carry) and the Redis store's scripts (host-test/redis/). The license texts
are written beside this file from the repository's (LICENSE-*, ignored by
git) before hatchling packages them as `license-files`.

From an sdist (no repository around it) the files are already in the tree,
where the sdist put them, and are packaged as any other file.
"""

from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface
from hatchling.metadata.plugin.interface import MetadataHookInterface

REPOSITORY = Path(__file__).resolve().parents[2]

#: Source in the repository -> where it goes in the package.
CARRIED = {
    "host-test/host/prebuilt/coord.wasm": "coord/_data/coord.wasm",
    "host-test/redis/redis.lua": "coord/_data/redis/redis.lua",
    "host-test/redis/unwatched.lua": "coord/_data/redis/unwatched.lua",
    "host-test/redis/meter.lua": "coord/_data/redis/meter.lua",
}

#: The license texts, written beside this file for `license-files`.
LICENSES = ["LICENSE-MIT", "LICENSE-APACHE"]


class CarriedFiles(BuildHookInterface):
    """Adds the carried files when building from the repository."""

    def initialize(self, version, build_data):
        here = Path(self.root)
        for source, target in CARRIED.items():
            path = REPOSITORY / source
            if path.is_file():
                build_data["force_include"][str(path)] = target
            elif not (here / target).is_file():
                raise FileNotFoundError(f"coord-sync carries {source}, which is not at {path}")


class LicenseTexts(MetadataHookInterface):
    """Writes the license texts beside this file when building from the
    repository, and names them as `license-files` (dynamic in
    pyproject.toml): hatchling reads that field with the metadata, before
    any build hook runs."""

    def update(self, metadata):
        for name in LICENSES:
            if (REPOSITORY / name).is_file():
                (Path(self.root) / name).write_bytes((REPOSITORY / name).read_bytes())
        metadata["license-files"] = LICENSES
