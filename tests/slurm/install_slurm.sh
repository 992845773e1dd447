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

exec "$(dirname "${BASH_SOURCE[0]}")/../install_debian_packages.sh" install_slurm \
    "install Slurm (slurmd, slurmctld, client commands) and munge by hand" \
    slurmd slurmctld slurm-client slurm-wlm-basic-plugins munge libhwloc15 liblua5.1-0
