#!/bin/sh
# Checks the build steps of Monarch's container image (docker/Dockerfile) where no
# container builder runs: the Dockerfile's RUN step, docker/install.sh, in a fresh venv
# instead of the image's Python. It installs the wheel (and torch and the extra packages,
# unless TORCH_SPEC=none and EXTRA_PACKAGES=""), imports monarch, runs
# `monarch worker --help`, and checks that the monarch imported is the wheel's.
#
#   docker/check_build.sh [WHEEL_DIR]      (default: dist, where `make wheel` writes)
#
# Environment: VENV, a venv to use (created when missing, kept); otherwise a temporary
# one, removed at the end. HOST_PYTHON, the Python that makes the venv (default python3).
# TORCH_SPEC, TORCH_INDEX_URL, EXTRA_PACKAGES and pip's variables, as for install.sh.
# tests/packaging/test_image.py runs this offline (PIP_NO_INDEX=1, TORCH_SPEC=none).
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
wheels=$(cd "${1:-$root/dist}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
venv=${VENV:-$work/venv}
if [ ! -x "$venv/bin/python" ]; then
    "${HOST_PYTHON:-python3}" -m venv "$venv"
fi

# The Dockerfile still runs install.sh on the copied wheel, as checked here.
grep -q '^FROM python:\${PYTHON_VERSION}-slim$' "$root/docker/Dockerfile"
grep -q '^COPY dist/monarch-\*.whl /tmp/wheels/$' "$root/docker/Dockerfile"
grep -q 'sh /tmp/install.sh /tmp/wheels' "$root/docker/Dockerfile"

# Outside the checkout, so that only the installed monarch can be imported.
cd "$work"
PATH="$venv/bin:$PATH" PYTHON="$venv/bin/python" sh "$root/docker/install.sh" "$wheels"
"$venv/bin/python" -c '
import sys
import monarch
assert monarch.__file__.startswith(sys.prefix), (monarch.__file__, sys.prefix)
'
echo "check_build.sh: the image's install steps passed (venv $venv)"
