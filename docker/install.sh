#!/bin/sh
# The install steps of Monarch's container image: docker/Dockerfile runs this script as
# its RUN step, and docker/check_build.sh runs it in a fresh venv, to check the steps
# where no container builder runs.
#
#   install.sh WHEEL_DIR
#
# Installs torch (TORCH_SPEC, default "torch", from TORCH_INDEX_URL, default PyTorch's CPU
# wheels; TORCH_SPEC=none skips it), then the one monarch-*.whl of WHEEL_DIR (what
# `make wheel` puts in dist/) and EXTRA_PACKAGES (default "kubernetes": the client library
# KubernetesJob needs, for clients that run in the cluster), with the Python of $PYTHON
# (default: python), then checks that monarch imports and `monarch worker --help` runs.
# pip's own variables (PIP_INDEX_URL, PIP_NO_INDEX, PIP_FIND_LINKS, ...) apply.
set -eu

if [ $# -ne 1 ]; then
    echo "usage: install.sh WHEEL_DIR (the directory of the monarch wheel: make wheel puts it in dist/)" >&2
    exit 2
fi
python=${PYTHON:-python}
torch_spec=${TORCH_SPEC-torch}
torch_index=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
extra=${EXTRA_PACKAGES-kubernetes}

set -- "$1"/monarch-*.whl
if [ $# -ne 1 ] || [ ! -f "$1" ]; then
    echo "install.sh: expected exactly one monarch-*.whl in the wheel directory, found: $*;" \
        "run \`make wheel\` first (it writes dist/monarch-*.whl)" >&2
    exit 1
fi
wheel=$1

pip_install() {
    "$python" -m pip install --no-cache-dir --disable-pip-version-check "$@"
}

if [ "$torch_spec" != none ] && [ -n "$torch_spec" ]; then
    # shellcheck disable=SC2086  # a version spec may be several words
    pip_install --index-url "$torch_index" $torch_spec
fi
# shellcheck disable=SC2086
pip_install "$wheel" $extra

# The image works: monarch imports (without starting anything) and its command runs.
"$python" -c 'import monarch, monarch.actor, monarch.job, monarch.spmd; print("monarch at", monarch.__file__)'
case $python in
*/*) monarch=$(dirname "$python")/monarch ;;
*) monarch=monarch ;;
esac
"$monarch" worker --help >/dev/null
echo "install.sh: monarch installed from $(basename "$wheel")"
