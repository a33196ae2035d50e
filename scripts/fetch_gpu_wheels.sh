#!/usr/bin/env bash
# Download, on a machine with network access, the wheels an offline GPU machine lacks (Python 3.12,
# manylinux x86_64) into .whl/ (git-ignored); scripts/gpu_check.sh installs them from there.
#
#   scripts/fetch_gpu_wheels.sh [PYTHON_VERSION]     (default 3.12)
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-3.12}
mkdir -p .whl
# Only this download's wheels: two versions of one package there make gpu_check's one pip call
# fail (ResolutionImpossible), which would leave the run without them.
rm -f .whl/*.whl
# platformdirs: the cache folder. (spio reads its performance models without xgboost.)
python3 -m pip download --quiet --only-binary=:all: --no-deps --dest .whl \
    --python-version "$version" --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    platformdirs
ls -l .whl
