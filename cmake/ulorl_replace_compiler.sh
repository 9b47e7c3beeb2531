#!/usr/bin/env bash
# A compiler launcher (CXX_COMPILER_LAUNCHER / CXX_LINKER_LAUNCHER) that runs another compiler in
# place of the target's: `ulorl_replace_compiler.sh WORD... --- <compiler CMake chose> ARGS...` runs
# `WORD... ARGS...` (WORD...: an optional outer launcher such as ccache, then the compiler to use).
set -euo pipefail
words=()
while [ "$#" -gt 0 ] && [ "$1" != "---" ]; do
  words+=("$1")
  shift
done
if [ "$#" -lt 2 ] || [ "${#words[@]}" -eq 0 ]; then
  echo "ulorl_replace_compiler.sh: usage: WORD... --- COMPILER ARGS..." >&2
  exit 2
fi
shift 2  # the marker and the compiler CMake chose
exec "${words[@]}" "$@"
