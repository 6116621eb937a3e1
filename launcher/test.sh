#!/usr/bin/env bash
# The second README command: build, then run the unit tests and the fuzz targets
# (tests/fuzz) under AddressSanitizer + UndefinedBehaviorSanitizer, the stream/collective
# tests under ThreadSanitizer, and the whole test suite on the Release build.
set -euo pipefail
cd "$(dirname "$0")/.."
launcher/install-deps.sh --tests   # nothing to do when the packages are already there
# torch, transformers and tokenizers for the reference tests: from PyPI into .dev/venv,
# once (5.6 GB); when PyPI cannot be reached those tests skip and say so. The download runs
# while the three builds, the sanitizer suites and every Release test that needs no Python
# do; only the tests labelled "python" (tests/CMakeLists.txt) wait for it.
# A suite that fails first still waits for it (a pip killed mid-install leaves a broken venv).
mkdir -p .dev
launcher/python-env.sh --install > .dev/python-path 2> .dev/python-env.log &
python_job=$!
trap 'kill -0 $python_job 2> /dev/null && echo "[test] waiting for the reference Python install (.dev/pip.log)" &&
      wait $python_job' EXIT
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j"$jobs"
echo "[test] at ${SECONDS} s: AddressSanitizer + UndefinedBehaviorSanitizer build: unit tests (leaks checked), then the fuzz targets"
# One build for both sanitizers, at RelWithDebInfo (-O2): at -O0 the kernel and engine
# tests under both take several minutes each; at -O2 the unit and fuzz tests together
# take about 90 s on two cores
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_SANITIZE=address,undefined -DSTRATA_CUDA=OFF > /dev/null
cmake --build build-asan -j"$jobs" > /dev/null
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j"$jobs" -L "unit|fuzz" --timeout 900)
echo "[test] at ${SECONDS} s: ThreadSanitizer build: streams, events, collectives, engine"
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_SANITIZE=thread -DSTRATA_CUDA=OFF > /dev/null
cmake --build build-tsan -j"$jobs" > /dev/null
(cd build-tsan && TSAN_OPTIONS="halt_on_error=1" ctest --output-on-failure -j"$jobs" -L tsan --timeout 900)
echo "[test] at ${SECONDS} s: Release build, every test but the reference-Python ones (the install may still be downloading)"
(cd build && ctest --output-on-failure -j"$jobs" --timeout 900 -LE python)
waited=$SECONDS
wait "$python_job"
cat .dev/python-env.log >&2
STRATA_PYTHON=$(cat .dev/python-path)
export STRATA_PYTHON
echo "[test] at ${SECONDS} s ($((SECONDS - waited)) s of them waiting for the Python install): Release build, the tests against the reference Python: ${STRATA_PYTHON:-none (the transformers/tokenizers comparisons will skip)}"
(cd build && ctest --output-on-failure -j"$jobs" --timeout 900 -L python)
echo "[test] all passed in ${SECONDS} s"
