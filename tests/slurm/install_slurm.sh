#!/usr/bin/env bash
# Install the Slurm and munge packages that the real-Slurm tests (tests/slurm) run:
# Debian's slurmd, slurmctld, slurm-client, slurm-wlm-basic-plugins and munge (with
# libhwloc15 and liblua5.1-0, which the image lacks). `make slurm-deps` runs it; CI runs
# that before `make test`.
#
# - Idempotent and fast: when every package is installed already it only checks (dpkg)
#   and exits, without touching the network.
# - Starts no daemon: package scripts would start munge and slurm system services; a
#   temporary /usr/sbin/policy-rc.d that exits 101 forbids that (the tests start their
#   own daemons with private files), and is removed again on exit unless one was there.
# - Needs root and apt-get (Debian or Ubuntu). Elsewhere it says so and exits 1; the
#   tests then skip with that reason (unless MONARCH_REQUIRE_SLURM=1).
set -euo pipefail

PACKAGES=(slurmd slurmctld slurm-client slurm-wlm-basic-plugins munge libhwloc15 liblua5.1-0)

missing=()
for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "install_slurm: all packages installed (${PACKAGES[*]})"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install_slurm: missing ${missing[*]}; run this script as root to install them" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null; then
    echo "install_slurm: missing ${missing[*]} and apt-get is not available;" \
        "install Slurm (slurmd, slurmctld, client commands) and munge by hand" >&2
    exit 1
fi

POLICY=/usr/sbin/policy-rc.d
if [ -e "$POLICY" ]; then
    own_policy=0
else
    own_policy=1
    printf '#!/bin/sh\n# install_slurm.sh: start no service while installing\nexit 101\n' >"$POLICY"
    chmod 755 "$POLICY"
    trap 'rm -f "$POLICY"' EXIT
fi

export DEBIAN_FRONTEND=noninteractive
echo "install_slurm: installing ${missing[*]}"
if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; then
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "install_slurm: installed $(dpkg-query -W -f='${Package} ${Version}\n' slurmd munge | tr '\n' ' ')"
