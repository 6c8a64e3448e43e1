#!/usr/bin/env bash
# Sets up, builds and runs moert's main job: a chat turn with the bundled example
# model (examples/models/tiny-moe-shakespeare-q8_0.gguf, a Shakespeare-trained MoE
# base model). Extra arguments go to moert-chat, e.g. `-p "KING HENRY" -n 64`.
#
# With --image FILE and no --mmproj, the turn is about the image, on the MiniCPM-V 2.6
# oracle pair (../shared/mmproj/SPEC.md: random weights, so the reply is noise; it
# shows the path, byte for byte what llama.cpp's minicpmv-cli prints), written once
# into build/release/minicpmv-oracle by moert-synth, e.g.
#   ./scripts/run-example.sh --image ../shared/mmproj/test.png
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOERT_BUILD_TESTS=OFF -DMOERT_BUILD_BENCH=OFF >/dev/null

image=0
mmproj=0
prompt=0
for arg in "$@"; do
  case "$arg" in
    --image) image=1 ;;
    --mmproj) mmproj=1 ;;
    -p|--prompt) prompt=1 ;;
  esac
done

if [[ $image -eq 1 && $mmproj -eq 0 ]]; then
  cmake --build build/release -j "$(nproc)" --target moert-chat moert-synth
  oracle=build/release/minicpmv-oracle
  if [[ ! -f $oracle/llm-minicpmv26-tiny.gguf || ! -f $oracle/mmproj-minicpmv26-tiny-f32.gguf ]]; then
    mkdir -p "$oracle"
    build/release/bin/moert-synth --preset minicpmv26-oracle --out-dir "$oracle"
  fi
  extra=(-m "$oracle/llm-minicpmv26-tiny.gguf" --mmproj "$oracle/mmproj-minicpmv26-tiny-f32.gguf")
  if [[ $prompt -eq 0 ]]; then
    extra+=(-p "Describe the image." -n 16 --temp 0)
  fi
  set -- "${extra[@]}" "$@"
else
  cmake --build build/release -j "$(nproc)" --target moert-chat
  if [[ $# -eq 0 ]]; then
    set -- -m examples/models/tiny-moe-shakespeare-q8_0.gguf -p "ROMEO:" -n 64 --temp 0
  fi
fi
echo "moert-chat $*" >&2
build/release/bin/moert-chat "$@"
echo
