#!/usr/bin/env bash
# Install Debian packages that some tests need, the way the test harness wants it:
#   tests/install_debian_packages.sh NAME HINT PACKAGE...
# NAME prefixes the messages; HINT says what to install by hand without apt-get.
#
# - Idempotent and fast: when every package is installed already it only checks (dpkg)
#   and exits, without touching the network.
# - Starts no daemon: a temporary /usr/sbin/policy-rc.d that exits 101 keeps package
#   scripts from starting system services; it is removed again on exit unless one was
#   there.
# - Needs root and apt-get (Debian or Ubuntu). Elsewhere it says so and exits 1.
set -euo pipefail

name=${1:?usage: install_debian_packages.sh NAME HINT PACKAGE...}
hint=${2:?usage: install_debian_packages.sh NAME HINT PACKAGE...}
shift 2
PACKAGES=("$@")

missing=()
for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "$name: all packages installed (${PACKAGES[*]})"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "$name: missing ${missing[*]}; run this script as root to install them" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null; then
    echo "$name: missing ${missing[*]} and apt-get is not available; $hint" >&2
    exit 1
fi

POLICY=/usr/sbin/policy-rc.d
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\n# %s: start no service while installing\nexit 101\n' "$name" >"$POLICY"
    chmod 755 "$POLICY"
    trap 'rm -f "$POLICY"' EXIT
fi

export DEBIAN_FRONTEND=noninteractive
echo "$name: installing ${missing[*]}"
if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; then
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "$name: installed $(dpkg-query -W -f='${Package} ${Version}\n' "${PACKAGES[@]}" | tr '\n' ' ')"
