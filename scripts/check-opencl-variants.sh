#!/usr/bin/env bash
# Compiles every kernels/opencl/*.cl for each kernel variant the host can select
# (backend/opencl/device.cc, KernelVariant::BuildOptions) with clang's OpenCL front
# end, warnings as errors (but unused functions: common.cl is a header every program
# gets whole). The extension paths (cl_khr_integer_dot_product, Arm's
# cl_arm_integer_dot_product_accumulate_int8, cl_khr_fp16, subgroups) cannot run on
# PoCL, so this is where they are at least compiled: a
# typo or a wrong builtin in them fails here instead of on a phone.
#
# Each program is common.cl, a newline, then the file, as ProgramCache::Kernel builds
# it. The matrix kernels get MOERT_WFMT=4 and 8, gemv.cl both GEMV splits. For the
# variants that must take the integer dot product path, the generated code (-O2, so
# the inline helpers are folded in) must call the packed builtins (or arm_dot_acc for
# the Arm variant); for the others it
# must not (the guards in common.cl select what they say); likewise the split-K GEMV
# must call sub_group_reduce_add exactly in the sub-group variants.
#
# Usage: scripts/check-opencl-variants.sh [CLANG]   (CLANG: default `clang`; 14+)
set -euo pipefail
cd "$(dirname "$0")/.."
clang=${1:-clang}
src=kernels/opencl
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

int_dot_ext=+cl_khr_integer_dot_product,+__opencl_c_integer_dot_product_input_4x8bit,+__opencl_c_integer_dot_product_input_4x8bit_packed
# The CL1.2 variants without extensions pass -cl-ext=-all: clang's SPIR target
# otherwise claims some (cl_intel_subgroups), which PoCL and the baseline do not have.
# name | -cl-std | -cl-ext | defines | integer dot builtins expected (0, khr: the
# packed dot_acc_sat builtins, arm: arm_dot_acc) | sub-group reduction expected in the
# split-K GEMV (1/0)
arm_dot_ext=-all,+cl_arm_integer_dot_product_accumulate_int8
variants=(
  "baseline|CL1.2|-all||0|0"
  "int-dot-polyfill|CL1.2|-all|-DMOERT_CL_INT_DOT_POLYFILL=1|0|0"
  "subgroups-polyfill|CL1.2|-all|-DMOERT_CL_SUBGROUPS_POLYFILL=1|0|0"
  "int-dot-without-compiler-support|CL1.2|-all|-DMOERT_CL_INT_DOT=1|0|0"
  "subgroups-without-compiler-support|CL1.2|-all|-DMOERT_CL_SUBGROUPS=1|0|0"
  "int-dot-cl2.0|CL2.0|${int_dot_ext}|-DMOERT_CL_INT_DOT=1|khr|0"
  "int-dot-cl3.0|CL3.0|${int_dot_ext}|-DMOERT_CL_INT_DOT=1|khr|0"
  "arm-dot|CL1.2|${arm_dot_ext}|-DMOERT_CL_ARM_DOT=1|arm|0"
  "arm-dot-polyfill|CL1.2|-all|-DMOERT_CL_ARM_DOT_POLYFILL=1|0|0"
  "arm-dot-without-compiler-support|CL1.2|-all|-DMOERT_CL_ARM_DOT=1|0|0"
  "fp16|CL1.2|+cl_khr_fp16|-DMOERT_CL_FP16=1|0|0"
  "subgroups-cl2.0|CL2.0|+cl_khr_subgroups|-DMOERT_CL_SUBGROUPS=1|0|1"
  "subgroups-cl3.0|CL3.0|+cl_khr_subgroups,+__opencl_c_subgroups|-DMOERT_CL_SUBGROUPS=1|0|1"
  "adreno-cl3.0|CL3.0|+cl_khr_fp16,+cl_khr_subgroups,+__opencl_c_subgroups|-DMOERT_CL_FP16=1 -DMOERT_CL_SUBGROUPS=1 -DMOERT_CL_QCOM_SUBGROUP_SIZE=1|0|1"
  "all-cl3.0|CL3.0|+cl_khr_fp16,+cl_khr_subgroups,+__opencl_c_subgroups,${int_dot_ext}|-DMOERT_CL_FP16=1 -DMOERT_CL_SUBGROUPS=1 -DMOERT_CL_QCOM_SUBGROUP_SIZE=1 -DMOERT_CL_INT_DOT=1|khr|1"
)

for f in "$src"/*.cl; do
  name=$(basename "$f" .cl)
  [ "$name" = common ] && continue
  { cat "$src/common.cl"; echo; cat "$f"; } >"$work/$name.cl"
done

failures=0
compiles=0
for v in "${variants[@]}"; do
  IFS='|' read -r vname std ext defines expect_dot expect_sg <<<"$v"
  ext_flag=()
  [ -n "$ext" ] && ext_flag=("-cl-ext=$ext")
  for prog in "$work"/*.cl; do
    name=$(basename "$prog" .cl)
    wfmts=("")
    splits=(1)
    if grep -q "MOERT_WFMT" "$src/$name.cl" || grep -q "w_row_dot\|w_isum" "$src/$name.cl"; then
      wfmts=(4 8)
    fi
    [ "$name" = gemv ] && splits=(1 8)
    for wfmt in "${wfmts[@]}"; do
      for split in "${splits[@]}"; do
        # shellcheck disable=SC2206  # the defines are separate words on purpose
        opts=(-DMOERT_GEMV_KSPLIT="$split" -DMOERT_GEMM_MR=4 $defines)
        [ -n "$wfmt" ] && opts+=(-DMOERT_WFMT="$wfmt")
        what="$vname: $name.cl ${opts[*]}"
        ir="$work/out.ll"
        compiles=$((compiles + 1))
        if ! "$clang" -cc1 -triple spir64-unknown-unknown -cl-std="$std" -finclude-default-header \
            "${ext_flag[@]}" -Wall -Wno-unused-function -Werror -O2 -emit-llvm -o "$ir" "${opts[@]}" "$prog" \
            2>"$work/log"; then
          echo "FAIL $what (-cl-std=$std ${ext_flag[*]})"
          sed 's/^/    /' "$work/log"
          failures=$((failures + 1))
          continue
        fi
        if [ -n "$wfmt" ]; then
          has_dot=0
          grep -q "4x8packed" "$ir" && has_dot=khr
          grep -q "arm_dot_acc" "$ir" && has_dot=arm
          if [ "$has_dot" != "$expect_dot" ]; then
            echo "FAIL $what: integer dot product builtins called: $has_dot, expected $expect_dot"
            failures=$((failures + 1))
          fi
        fi
        if [ "$name" = gemv ] && [ "$split" -gt 1 ]; then
          has_sg=0
          grep -q "sub_group_reduce_add" "$ir" && has_sg=1
          if [ "$has_sg" != "$expect_sg" ]; then
            echo "FAIL $what: sub-group reduction called: $has_sg, expected $expect_sg"
            failures=$((failures + 1))
          fi
        fi
      done
    done
  done
done
echo "check-opencl-variants: $compiles compiles, ${#variants[@]} variants, $failures failures ($("$clang" --version | head -1))"
[ "$failures" -eq 0 ]
