#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian machine (root): Debian packages, a virtual
# environment in .venv, the pinned pip packages, and vit-keras itself (editable).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(dataset-fashion-mnist chromium libtcmalloc-minimal4)
# Debian's own python3 makes virtual environments only with python3-venv (it brings ensurepip).
python3 -c "import ensurepip" 2>/dev/null || APT_PACKAGES+=(python3-venv)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
stamp=.venv/.requirements-stamp
if [ ! -f "$stamp" ] || ! cmp -s requirements.txt "$stamp" || ! .venv/bin/python -c "import vit_keras, apps" 2>/dev/null; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -r requirements.txt
  # foolbox ships 20 ImageNet and 20 CIFAR-10 photos; its own dependencies are not needed.
  .venv/bin/pip install -q --no-deps foolbox==3.3.4
  .venv/bin/pip install -q --no-deps -e .
  cp requirements.txt "$stamp"
fi
