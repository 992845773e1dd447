#!/usr/bin/env bash
# Install the headless browser that the dashboard tests (tests/browser) drive: Debian's
# chromium and chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver). CI runs it
# before `make test`; the tests skip without it (unless MONARCH_REQUIRE_BROWSER=1).
#
# - Idempotent and fast: when both packages are installed already it only checks (dpkg)
#   and exits, without touching the network.
# - Starts no daemon: a temporary /usr/sbin/policy-rc.d that exits 101 keeps package
#   scripts from starting system services (the dependencies pull in dbus and friends);
#   it is removed again on exit unless one was there.
# - Needs root and apt-get (Debian or Ubuntu). Elsewhere it says so and exits 1.
set -euo pipefail

exec "$(dirname "${BASH_SOURCE[0]}")/../install_debian_packages.sh" install_chromium \
    "install chromium and its chromedriver by hand" \
    chromium chromium-driver
