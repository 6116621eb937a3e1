#!/usr/bin/env bash
# Installs what Strata needs from Debian's packages (only what is missing). The CUDA
# toolkit is optional: with nvcc on PATH the CUDA backend is built too. --tests adds what
# the test suite needs beyond that: python3-venv, for the reference tests' PyPI packages,
# librsvg2-bin, whose rsvg-convert renders `strata plot`'s SVG (tests/e2e_plot.sh), and
# iproute2, whose `ip netns` makes the hosts of tests/e2e_hosts.sh.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libyaml-dev liburing-dev libblis-openmp-dev libpcre2-dev libopenmpi-dev openmpi-bin fortunes)
[ "${1:-}" = "--tests" ] && pkgs+=(python3 python3-venv librsvg2-bin iproute2)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
fi
