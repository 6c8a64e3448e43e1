#!/usr/bin/env bash
# usage: check-isa-symbols.sh NM ARCHIVE
# Fails when a weak symbol (an inline function or template instantiation) is defined
# both in a kernel object built for an ISA (…-avx2.cc.o, …-avx512vnni.cc.o, …) and in any
# object built for another ISA or for the baseline. The linker keeps one definition of
# such a symbol for all callers, so code compiled for one ISA could run where only
# another's (or the baseline's) was checked for: a SIGILL on a CPU without it. Example:
# the AVX-VNNI and AVX512-VNNI W8 kernels once shared QGemv<vnni::W8>, and Zen 4 (no
# AVX-VNNI) faulted on the VEX vpdpbusd the AVX512-VNNI kernel ran.
set -euo pipefail
nm_tool=$1
archive=$2
clashes=$("$nm_tool" -A -C --defined-only "$archive" | awk '
  {
    n = split($1, where, ":"); obj = where[n - 1]; type = $2
    if (type != "W" && type != "V") next
    sym = $3; for (i = 4; i <= NF; ++i) sym = sym " " $i
    if (sym ~ /^DW\.ref\./) next  # data: the address of the C++ personality routine
    isa = "baseline"
    if (match(obj, /-(avx2|avxvnni|avx512vnni|avx512vbmi|amx|neondot|neoni8mm|sme2)\.cc\.o$/))
      isa = substr(obj, RSTART + 1, RLENGTH - 6)
    if ((sym, isa) in seen) next
    seen[sym, isa] = 1; count[sym]++; isas[sym] = isas[sym] " " isa
    if (isa != "baseline") flagged[sym] = 1
  }
  END { for (s in flagged) if (count[s] > 1) print s ":" isas[s] }')
if [[ -n $clashes ]]; then
  echo "weak symbols defined for more than one ISA in $archive:" >&2
  echo "$clashes" >&2
  exit 1
fi
echo "no weak symbol of an ISA kernel object is defined for another ISA"
