#!/usr/bin/env bash
# Sets up, builds and runs moert's main job on the bundled example model
# (examples/models/tiny-moe-shakespeare-q8_0.gguf). Until generation lands, the main
# job describes the model (moert-inspect) and tokenizes a prompt (moert-tokenize).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-examples/models/tiny-moe-shakespeare-q8_0.gguf}
prompt=${2:-ROMEO:}
scripts/setup-deps.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOERT_BUILD_TESTS=OFF -DMOERT_BUILD_BENCH=OFF >/dev/null
cmake --build build/release -j "$(nproc)" --target moert-inspect moert-tokenize
build/release/bin/moert-inspect "$model"
echo
echo "prompt '$prompt' -> ids:"
build/release/bin/moert-tokenize -m "$model" -p "$prompt"
