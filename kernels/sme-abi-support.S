// The SME ABI support routines that clang's SME code calls (AAPCS64, "SME support
// routines"): __arm_tpidr2_save, __arm_tpidr2_restore, __arm_za_disable,
// __arm_sme_state and __arm_get_current_vg. Newer compiler runtimes (compiler-rt,
// GCC 14's libgcc) have them; Debian 12's libgcc does not, so moert carries its own,
// written from the AAPCS64 text. Built with clang 19 into the SME2 kernels' objects
// (cmake/MoertKernels.cmake), hidden, so they never interpose on a runtime's copy.
//
// These must be correct on a real SME CPU, and nothing in CI executes them: the cross
// build's qemu 7.2 cannot run SME2, so the kernels that call them are skipped. They
// were checked by hand under newer qemu-aarch64 (10.0 and 11.1, SVL 128 to 2048):
// lazy save and restore of ZA through a TPIDR2 block, __arm_za_disable, the state
// and VG queries in and out of streaming mode, the registers each must preserve, and
// doing nothing without SME; kernels_test's SME2 cases call them on every kernel
// call under qemu 11 (see the SME2 block in cmake/MoertKernels.cmake).
//
// Each routine has the AAPCS64's special, register-preserving interface: it may
// change only the registers listed below (and NZCV) and must keep every other one,
// Z/P registers included, so it uses no libc call and touches no vector register.
// `.variant_pcs` marks the symbols so no lazy-binding stub ever stands in between.
//
// "Does the thread have SME/SVE" is a byte set before any C++ constructor runs
// (init_array priority 90) from getauxval: a routine cannot call getauxval itself.

// getauxval keys and bits (Linux uapi asm/hwcap.h).
#define AT_HWCAP 16
#define AT_HWCAP2 26
#define HWCAP_SVE_BIT 22
#define HWCAP2_SME_BIT 23
// Bits of moert_sme_abi_features.
#define HAS_SME_BIT 0
#define HAS_SVE_BIT 1

        .arch armv9-a+sme

        .bss
        .p2align 3
        .hidden moert_sme_abi_features
        .type moert_sme_abi_features, %object
moert_sme_abi_features:
        .byte 0
        .size moert_sme_abi_features, 1

        .text

// Reads HWCAP and HWCAP2 once, before C++ constructors (an ordinary function).
        .p2align 2
        .type moert_sme_abi_init, %function
moert_sme_abi_init:
        .cfi_startproc
        stp x29, x30, [sp, #-32]!
        .cfi_def_cfa_offset 32
        .cfi_offset w30, -24
        .cfi_offset w29, -32
        mov x29, sp
        str x19, [sp, #16]
        .cfi_offset w19, -16
        mov x0, #AT_HWCAP
        bl getauxval
        ubfx x19, x0, #HWCAP_SVE_BIT, #1
        mov x0, #AT_HWCAP2
        bl getauxval
        ubfx x0, x0, #HWCAP2_SME_BIT, #1
        orr w0, w0, w19, lsl #HAS_SVE_BIT
        adrp x1, moert_sme_abi_features
        strb w0, [x1, :lo12:moert_sme_abi_features]
        ldr x19, [sp, #16]
        ldp x29, x30, [sp], #32
        .cfi_def_cfa_offset 0
        .cfi_restore w19
        .cfi_restore w30
        .cfi_restore w29
        ret
        .cfi_endproc
        .size moert_sme_abi_init, . - moert_sme_abi_init

        .section .init_array.00090, "aw", %init_array
        .p2align 3
        .xword moert_sme_abi_init
        .text

// Leaves streaming mode if needed (abort is a non-streaming function) and aborts;
// for a TPIDR2 block the ABI forbids. Reached only with SME present.
        .p2align 2
        .type moert_sme_abi_abort, %function
moert_sme_abi_abort:
        .cfi_startproc
        stp x29, x30, [sp, #-16]!
        .cfi_def_cfa_offset 16
        .cfi_offset w30, -8
        .cfi_offset w29, -16
        mov x29, sp
        mrs x16, SVCR
        tbz x16, #0, 1f
        smstop sm
1:      bl abort
        .cfi_endproc
        .size moert_sme_abi_abort, . - moert_sme_abi_abort

// uint64_t x0, x1 = __arm_sme_state(void). May change X0, X1, X16, X17.
// X0: bit 63 "the thread has SME", bit 62 "TPIDR2_EL0 is accessible" (both or
// neither on Linux), bits 0 and 1 PSTATE.SM and PSTATE.ZA, the rest zero.
// X1: TPIDR2_EL0 when accessible, else zero.
        .globl __arm_sme_state
        .hidden __arm_sme_state
        .variant_pcs __arm_sme_state
        .p2align 2
        .type __arm_sme_state, %function
__arm_sme_state:
        .cfi_startproc
        mov x0, xzr
        mov x1, xzr
        adrp x16, moert_sme_abi_features
        ldrb w16, [x16, :lo12:moert_sme_abi_features]
        tbz w16, #HAS_SME_BIT, 1f
        mov x0, #0xc000000000000000
        mrs x16, SVCR
        bfxil x0, x16, #0, #2
        mrs x1, TPIDR2_EL0
1:      ret
        .cfi_endproc
        .size __arm_sme_state, . - __arm_sme_state

// void __arm_tpidr2_save(void). May change X14-X17. Called with PSTATE.SM 0 or 1.
// Commits a pending lazy save: when TPIDR2_EL0 points at a TPIDR2 block
//   { void* za_save_buffer; uint16_t num_za_save_slices; uint8_t reserved[6]; }
// it stores ZA's first num_za_save_slices horizontal slices (SVL bytes each) to
// za_save_buffer. It does nothing without SME, with a null TPIDR2_EL0, a null
// buffer or zero slices, and aborts if a reserved byte is nonzero. It leaves
// TPIDR2_EL0 and PSTATE.ZA as they are (the caller clears them).
        .globl __arm_tpidr2_save
        .hidden __arm_tpidr2_save
        .variant_pcs __arm_tpidr2_save
        .p2align 2
        .type __arm_tpidr2_save, %function
__arm_tpidr2_save:
        .cfi_startproc
        adrp x16, moert_sme_abi_features
        ldrb w16, [x16, :lo12:moert_sme_abi_features]
        tbz w16, #HAS_SME_BIT, 1f
        mrs x16, TPIDR2_EL0
        cbz x16, 1f
        ldrh w14, [x16, #10]
        cbnz w14, 2f
        ldr w14, [x16, #12]
        cbnz w14, 2f
        ldrh w14, [x16, #8]
        cbz w14, 1f
        ldr x16, [x16]
        cbz x16, 1f
        mov w15, wzr
0:      str za[w15, 0], [x16]
        addsvl x16, x16, #1
        add w15, w15, #1
        cmp w15, w14
        b.ne 0b
1:      ret
2:      b moert_sme_abi_abort
        .cfi_endproc
        .size __arm_tpidr2_save, . - __arm_tpidr2_save

// void __arm_tpidr2_restore(const TPIDR2 block* x0). May change X14-X17 (X0 is kept).
// Called with PSTATE.ZA = 1 (so SME is present) and TPIDR2_EL0 null: loads the
// block's num_za_save_slices slices of ZA back from za_save_buffer. Aborts if
// TPIDR2_EL0 is not null or a reserved byte is nonzero; does nothing for a null
// buffer or zero slices.
        .globl __arm_tpidr2_restore
        .hidden __arm_tpidr2_restore
        .variant_pcs __arm_tpidr2_restore
        .p2align 2
        .type __arm_tpidr2_restore, %function
__arm_tpidr2_restore:
        .cfi_startproc
        mrs x14, TPIDR2_EL0
        cbnz x14, 2f
        ldrh w14, [x0, #10]
        cbnz w14, 2f
        ldr w14, [x0, #12]
        cbnz w14, 2f
        ldrh w14, [x0, #8]
        cbz w14, 1f
        ldr x16, [x0]
        cbz x16, 1f
        mov w15, wzr
0:      ldr za[w15, 0], [x16]
        addsvl x16, x16, #1
        add w15, w15, #1
        cmp w15, w14
        b.ne 0b
1:      ret
2:      b moert_sme_abi_abort
        .cfi_endproc
        .size __arm_tpidr2_restore, . - __arm_tpidr2_restore

// void __arm_za_disable(void). May change X14-X17. Without SME it does nothing;
// otherwise it commits any pending lazy save (__arm_tpidr2_save), then sets
// TPIDR2_EL0 to null and PSTATE.ZA to 0.
        .globl __arm_za_disable
        .hidden __arm_za_disable
        .variant_pcs __arm_za_disable
        .p2align 2
        .type __arm_za_disable, %function
__arm_za_disable:
        .cfi_startproc
        adrp x16, moert_sme_abi_features
        ldrb w16, [x16, :lo12:moert_sme_abi_features]
        tbz w16, #HAS_SME_BIT, 1f
        stp x29, x30, [sp, #-16]!
        .cfi_def_cfa_offset 16
        .cfi_offset w30, -8
        .cfi_offset w29, -16
        mov x29, sp
        bl __arm_tpidr2_save
        msr TPIDR2_EL0, xzr
        smstop za
        ldp x29, x30, [sp], #16
        .cfi_def_cfa_offset 0
        .cfi_restore w30
        .cfi_restore w29
1:      ret
        .cfi_endproc
        .size __arm_za_disable, . - __arm_za_disable

// uint64_t __arm_get_current_vg(void). May change X0, X16, X17. The current VG
// (vector length in 64-bit granules): the streaming one in streaming mode, else the
// SVE one, else 0 (no SVE registers outside streaming mode, e.g. SME without SVE).
// clang calls it to describe VG in the unwind info of streaming-mode changes when
// the code is built without SVE (our kernels are: -march=...+nosve+sme2).
        .globl __arm_get_current_vg
        .hidden __arm_get_current_vg
        .variant_pcs __arm_get_current_vg
        .p2align 2
        .type __arm_get_current_vg, %function
__arm_get_current_vg:
        .cfi_startproc
        adrp x16, moert_sme_abi_features
        ldrb w16, [x16, :lo12:moert_sme_abi_features]
        tbz w16, #HAS_SME_BIT, 1f
        mrs x17, SVCR
        tbz x17, #0, 1f
        rdsvl x0, #1
        lsr x0, x0, #3
        ret
1:      tbz w16, #HAS_SVE_BIT, 2f
        cntd x0
        ret
2:      mov x0, xzr
        ret
        .cfi_endproc
        .size __arm_get_current_vg, . - __arm_get_current_vg

        .section .note.GNU-stack, "", %progbits
