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
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# A venv cut short (interrupted, or made without ensurepip) has a python but no pip: make it again.
.venv/bin/python -m pip --version >/dev/null 2>&1 || python3 -m venv --clear .venv
stamp=.venv/.setup-stamp
wanted=$(cat requirements.txt constraints.txt pyproject.toml scripts/setup.sh | sha256sum)
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ] || [ ! -x .venv/bin/vit-keras ] \
    || ! .venv/bin/python -P -c "import vit_keras.apps.cli, vit_keras.convert.metadata" 2>/dev/null; then
  .venv/bin/python -m pip install -q pip==26.3
  .venv/bin/python -m pip install -q -r requirements.txt -c constraints.txt
  # foolbox ships 20 ImageNet and 20 CIFAR-10 photos; its own dependencies are not needed.
  .venv/bin/python -m pip install -q --no-deps foolbox==3.3.4
  .venv/bin/python -m pip install -q --no-deps -e .
  echo "$wanted" > "$stamp"
fi

# Older TFLite runtimes that tests/test_runtimes.py runs exported files under (vit_keras/constants.py's
# COMPAT_RUNTIMES): one environment each in .venv-compat/ (ignored by git), with NumPy < 2 as they were built. A
# package with no wheel for this Python is skipped with a warning; its test then skips and says so.
while IFS=" " read -r package release; do
  env_dir=".venv-compat/${package}-${release}"
  compat_stamp="$env_dir/.setup-stamp"
  [ "$(cat "$compat_stamp" 2>/dev/null)" = "$package==$release" ] && continue
  rm -rf "$env_dir"
  if python3 -m venv "$env_dir" && "$env_dir/bin/python" -m pip install -q "numpy<2" "$package==$release"; then
    echo "$package==$release" > "$compat_stamp"
  else
    echo "setup.sh: could not install $package $release in $env_dir; the tests under it will skip" >&2
    rm -rf "$env_dir"
  fi
done < <(python3 -c 'import runpy; [print(p, r) for p, r, *_ in runpy.run_path("vit_keras/constants.py")["COMPAT_RUNTIMES"]]')

# The in-browser runtime that `vit-keras export-web` copies into its site: from the npm registry, pinned with its
# integrity hash in package-lock.json, into node_modules/ (ignored by git). It needs npm (Node 20 here).
npm_stamp=node_modules/.setup-stamp
npm_wanted=$(cat package.json package-lock.json | sha256sum)
if [ "$(cat "$npm_stamp" 2>/dev/null)" != "$npm_wanted" ] \
    || [ ! -f node_modules/@mediapipe/tasks-vision/wasm/vision_wasm_internal.wasm ]; then
  command -v npm >/dev/null || { echo "setup.sh: npm is needed for the in-browser runtime (Debian: apt-get install npm)" >&2; exit 1; }
  npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
  echo "$npm_wanted" > "$npm_stamp"
fi
