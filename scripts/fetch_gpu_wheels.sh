#!/usr/bin/env bash
# Download, on a machine with network access, the wheels an offline GPU machine lacks (Python 3.12,
# manylinux x86_64) into .whl/ (git-ignored); scripts/gpu_check.sh installs them from there.
#
#   scripts/fetch_gpu_wheels.sh [PYTHON_VERSION]     (default 3.12)
set -euo pipefail
case "${1:-}" in
-h | --help)
    sed -n '2,5s/^# \{0,1\}//p' "$0"
    exit 0
    ;;
esac
version=${1:-3.12}
if [[ ! "$version" =~ ^3\.[0-9]+$ ]] || (($# > 1)); then
    echo "fetch_gpu_wheels: PYTHON_VERSION must be one version such as 3.12, got '$*'" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
# Into a folder of its own first: a download that fails leaves the wheels already in .whl/.
fresh=$(mktemp -d .whl-fetch.XXXXXX)
trap 'rm -rf "$fresh"' EXIT
# platformdirs: the cache folder. (spio reads its performance models without xgboost.)
python3 -m pip download --quiet --only-binary=:all: --no-deps --dest "$fresh" \
    --python-version "$version" --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    platformdirs
mkdir -p .whl
# Only this download's wheels: two versions of one package there make gpu_check's one pip call
# fail (ResolutionImpossible), which would leave the run without them.
rm -f .whl/*.whl
mv "$fresh"/*.whl .whl/
ls -l .whl
