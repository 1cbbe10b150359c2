#!/bin/sh
# Tokenizer encode speed (MB/s of English text, one thread). Args: GGUF files (optional).
set -e
cd "$(dirname "$0")/.."
exec cargo run --release -q -p kiln --example tokenizer_bench -- "$@"
