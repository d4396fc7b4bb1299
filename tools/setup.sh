#!/bin/sh
# Installs the Debian packages smelt needs (when missing), then configures and
# builds smelt in build/ (Debug). Run from anywhere; safe to run again.
# SMELT_BUILD_DIR, SMELT_BUILD_TYPE and SMELT_CMAKE_ARGS override the folder
# and the build type and add options.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=${SMELT_BUILD_DIR:-$root/build}

packages="build-essential cmake pkg-config flex bison libjansson-dev libcmocka-dev libxxhash-dev libopenblas-dev llvm-14-tools clang-format python3 jq"
missing=""
for p in $packages; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "smelt: installing Debian packages:$missing"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing
fi

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=${SMELT_BUILD_TYPE:-Debug} ${SMELT_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "$(nproc)"
