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

PACKAGES=(chromium chromium-driver)

missing=()
for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "install_chromium: all packages installed (${PACKAGES[*]})"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install_chromium: missing ${missing[*]}; run this script as root to install them" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null; then
    echo "install_chromium: missing ${missing[*]} and apt-get is not available;" \
        "install chromium and its chromedriver by hand" >&2
    exit 1
fi

POLICY=/usr/sbin/policy-rc.d
if [ -e "$POLICY" ]; then
    :
else
    printf '#!/bin/sh\n# install_chromium.sh: start no service while installing\nexit 101\n' >"$POLICY"
    chmod 755 "$POLICY"
    trap 'rm -f "$POLICY"' EXIT
fi

export DEBIAN_FRONTEND=noninteractive
echo "install_chromium: installing ${missing[*]}"
if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; then
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "install_chromium: installed $(dpkg-query -W -f='${Package} ${Version}\n' "${PACKAGES[@]}" | tr '\n' ' ')"
