#!/usr/bin/env bash
# benchmarks/gpu.py on an air-gapped GPU server: its Python 3.12 has torch, transformers, peft, accelerate and
# typer; the rest (benchmarks/airgapped-wheels.txt, and hftoolkit itself) travels as wheels.
#
#   benchmarks/gpu-airgapped.sh download [SERVER_FREEZE]   here, with PyPI: the wheels into benchmarks/wheels/;
#                                                           SERVER_FREEZE (`python3 -m pip freeze` run on the
#                                                           server) leaves out what the server already has
#   benchmarks/gpu-airgapped.sh run [gpu.py options]        on the server: install them into
#                                                           benchmarks/.airgapped-site, run the benchmark
#
# Copy the checkout with benchmarks/wheels/ to the server between the two. PYTHON picks the interpreter
# (python3 by default; here it needs pip); WHEELS and SITE move the two folders.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-$ROOT/benchmarks/wheels}
SITE=${SITE:-$ROOT/benchmarks/.airgapped-site}
LIST=$ROOT/benchmarks/airgapped-wheels.txt

canonical() { tr '[:upper:]' '[:lower:]' | sed -E 's/[-_.]+/-/g'; }  # package names as pip compares them (PEP 503)

case "${1:-}" in
download)
  requirements=$(grep -Ev '^\s*(#|$)' "$LIST")
  if [ -n "${2:-}" ]; then
    have=$(sed -nE 's/^([A-Za-z0-9._-]+)( @ |==).*/\1/p' "$2" | canonical)
    kept=""
    for requirement in $requirements; do
      name=$(echo "${requirement%%==*}" | canonical)
      if grep -qx "$name" <<<"$have"; then echo "the server has $name: not downloaded"; else kept+="$requirement "; fi
    done
    requirements=$kept
  fi
  rm -rf "$WHEELS" && mkdir -p "$WHEELS"
  # pip matches each manylinux tag exactly, so every glibc level a wheel of the list is built for is named.
  platforms=""
  for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
    platforms+=" --platform ${tag}_x86_64"
  done
  # shellcheck disable=SC2086  # one word per requirement and option
  [ -z "$requirements" ] || "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp $platforms -d "$WHEELS" $requirements
  "$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$WHEELS" "$ROOT"
  rm -rf "$ROOT/build"  # setuptools' staging folder
  ls -l "$WHEELS" | awk 'NR > 1 { printf "%8.1f MiB  %s\n", $5 / 1048576, $9 }'
  du -cb "$WHEELS"/*.whl | awk 'END { printf "%8.1f MiB  in all, to copy with the checkout\n", $1 / 1048576 }'
  ;;
run)
  shift
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$WHEELS"/*.whl
  PYTHONPATH=$SITE exec "$PYTHON" "$ROOT/benchmarks/gpu.py" "$@"
  ;;
*)
  sed -n '2,13p' "$0" | cut -c3-
  exit 2
  ;;
esac
