#!/usr/bin/env bash
# The first README command: install, build, prepare a real corpus (Debian's fortunes,
# 2.8 MB of English) and train configs/quickstart.yaml, ending with a text sample.
# Extra arguments go to `strata train` (e.g. --set train.steps=100).
set -euo pipefail
cd "$(dirname "$0")/.."
launcher/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j"$(nproc)" > /dev/null
echo "[setup] built ./build/strata"
corpus=()
for f in /usr/share/games/fortunes/*; do
  case "$f" in *.dat|*.u8) continue ;; esac
  [ -f "$f" ] && corpus+=("$f")
done
./build/strata prepare --text "${corpus[@]}" --out data/quickstart --val-fraction 0.05
exec ./build/strata train configs/quickstart.yaml "$@"
