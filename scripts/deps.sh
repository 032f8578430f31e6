#!/usr/bin/env bash
# Install what loom needs to build and test, only what is missing.
# Debian packages through apt-get; PyPI packages for the test oracles.
set -eu
pkgs=(build-essential libopenblas-dev libcjson-dev bible-kjv python3-torch python3-numpy python3-pip libopenmpi-dev openmpi-bin slurmctld slurmd slurm-client munge)
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
# Hugging Face `tokenizers`, the oracle of the tokenizer tests and the
# baseline of bench/tokenize.sh, for Debian's python3 (which the tests call as
# /usr/bin/python3). Debian marks that Python "externally managed", so pip
# needs --break-system-packages; it only adds this one package.
if ! /usr/bin/python3 -c 'import tokenizers' 2>/dev/null; then
    echo "deps: installing the tokenizers Python package"
    /usr/bin/python3 -m pip install -q --break-system-packages tokenizers
fi
