#!/usr/bin/env bash
# Install what loom needs to build and test, only what is missing.
# Debian packages through apt-get; PyPI packages for the test oracles.
set -eu
pkgs=(build-essential libopenblas-dev libcjson-dev bible-kjv python3-torch python3-numpy)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "deps: installing ${missing[*]}"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
else
    echo "deps: all Debian packages present"
fi
