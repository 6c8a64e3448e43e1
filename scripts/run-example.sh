#!/usr/bin/env bash
# Sets up, builds and runs moert's main job: a chat turn with the bundled example
# model (examples/models/tiny-moe-shakespeare-q8_0.gguf, a Shakespeare-trained MoE
# base model). Extra arguments go to moert-chat, e.g. `-p "KING HENRY" -n 64`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOERT_BUILD_TESTS=OFF -DMOERT_BUILD_BENCH=OFF >/dev/null
cmake --build build/release -j "$(nproc)" --target moert-chat
if [[ $# -eq 0 ]]; then
  set -- -m examples/models/tiny-moe-shakespeare-q8_0.gguf -p "ROMEO:" -n 64 --temp 0
fi
echo "moert-chat $*" >&2
build/release/bin/moert-chat "$@"
echo
