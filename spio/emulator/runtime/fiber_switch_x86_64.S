/// Fiber context switch for x86-64 System V: saves the callee-saved registers, the x87 control
/// word and MXCSR on the current stack, stores the stack pointer, and resumes another stack.
/// No system call (glibc's swapcontext saves the signal mask with one per switch).
///
/// void spio_emu_switch(void **save_sp, void *resume_sp);
/// spio_emu_fiber_start: first "return address" of a new fiber; calls r13(r12) and never returns.

    .text
    .globl spio_emu_switch
    .hidden spio_emu_switch
    .type spio_emu_switch, @function
spio_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $16, %rsp
    stmxcsr 8(%rsp)
    fnstcw (%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    fldcw (%rsp)
    ldmxcsr 8(%rsp)
    addq $16, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size spio_emu_switch, .-spio_emu_switch

    .globl spio_emu_fiber_start
    .hidden spio_emu_fiber_start
    .type spio_emu_fiber_start, @function
spio_emu_fiber_start:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size spio_emu_fiber_start, .-spio_emu_fiber_start

    .section .note.GNU-stack,"",@progbits
