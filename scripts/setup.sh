#!/usr/bin/env bash
# Sets up memprobe in ./.venv on a fresh machine: finds Python 3.12 (JAX 0.12 needs it),
# creates the virtual environment and installs memprobe with its dependencies (libtpu
# included on Linux x86-64). --gpu adds the deviceless GPU targets (the JAX CUDA plugin and
# CUDA compiler tools, about 700 MB installed); --test installs the test tools and the GPU
# extra, so the GPU tests run too.
# Safe to run again: an existing .venv is reused and only brought up to date.
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
for arg in "$@"; do
  case "$arg" in
    --test) extras="[test,gpu]" ;;
    --gpu) [[ -z "$extras" ]] && extras="[gpu]" ;;
    *) echo "setup: unknown option $arg (use --test or --gpu)" >&2; exit 2 ;;
  esac
done

find_python() {
  local candidates=(python3.12)
  if command -v pyenv >/dev/null 2>&1; then
    candidates+=("$(pyenv root)"/versions/3.12*/bin/python3.12)
  fi
  candidates+=("$HOME"/.pyenv/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12 /usr/bin/python3.12)
  for c in "${candidates[@]}"; do
    if "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1; then
      echo "$c"
      return 0
    fi
  done
  return 1
}

if [[ ! -x .venv/bin/python ]]; then
  py=$(find_python) || { echo "setup: Python 3.12 not found (JAX 0.12 needs it); install python3.12 and retry" >&2; exit 1; }
  echo "setup: creating .venv with $py" >&2
  "$py" -m venv .venv
fi
echo "setup: installing memprobe${extras} (first time: a few minutes, about 1 GB)" >&2
log=$(mktemp)
if ! .venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".${extras}" >"$log" 2>&1; then
  grep -v "^WARNING: Location '" "$log" | tail -20 >&2
  echo "setup: pip install failed (log above)" >&2
  exit 1
fi
rm -f "$log"
echo "setup: ready; run .venv/bin/memprobe --help" >&2
