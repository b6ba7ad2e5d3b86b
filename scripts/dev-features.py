#!/usr/bin/env python3
"""Whether `make run` after `make bench` rebuilds anything (issue 21 item 5).

`make bench` builds the gateway with the examples, which get the dev-dependencies;
`make run` builds the gateway alone. Cargo resolves features per build, so a crate the
dev-dependencies give more features is a different crate to each build — and so is every
crate above it, the gateway included: fastrand (std from tempfile, none through redis →
backon) made `make run` rebuild redis and the whole binary. This runs both builds (in the
dev profile; the release one resolves features the same way) and prints every crate the
gateway alone needs that the build with the examples did not make, by its artifact's
hashed file name. Exit status 1 when there is one. Both builds are fresh after
`cargo test` (which builds the examples too), so in `make test` this compiles nothing.

Usage: scripts/dev-features.py
"""

import json
import subprocess
import sys


def artifacts(*args):
    """`{file name: crate}` of every dependency artifact `cargo build args` makes (the
    gateway's own files carry no hash: they are equal when their dependencies are)."""
    out = subprocess.run(
        ["cargo", "build", "--locked", "--message-format=json", *args],
        check=True, capture_output=True, text=True,
    ).stdout
    found = {}
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact":
            continue
        crate = msg["package_id"].rsplit("#", 1)[-1]
        if msg["package_id"].startswith("path+"):
            continue
        for name in msg["filenames"]:
            found[name.rsplit("/", 1)[-1]] = crate
    return found


def main():
    bench = artifacts("--bins", "--examples")
    run = artifacts()
    rebuilt = sorted({crate for name, crate in run.items() if name not in bench})
    for crate in rebuilt:
        print(f"{crate}: built again for `make run` (its features differ without the examples)")
    if not rebuilt:
        print("`make run` after `make bench` reuses every crate")
    return 1 if rebuilt else 0


if __name__ == "__main__":
    sys.exit(main())
