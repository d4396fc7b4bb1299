/* fiber.c - the context switch and the fiber stacks (see fiber.h).
 *
 * The assembly switch saves the registers the System V (x86-64) and AAPCS64
 * (aarch64) calling conventions say a callee must preserve, because the
 * switch is, to the compiler, an ordinary function call:
 *   x86-64   rbx rbp r12-r15;
 *   aarch64  x19-x29, the link register x30, d8-d15.
 * The floating-point control state (MXCSR and the x87 control word, FPCR) is
 * callee-saved too, but left alone: every fiber of a worker shares it, as
 * CUDA threads share one rounding mode, and kernels (smelt_kernel.h's
 * subset) have no way to change it. Saving it cost a third of a switch
 * (ldmxcsr and fldcw stall the pipeline).
 * Everything is pushed on the suspended fiber's own stack; the fiber keeps
 * only its stack pointer. A new fiber's stack is laid out as if it had been
 * suspended inside the switch, with the return address pointing at a small
 * trampoline that calls sim_fiber_start(fiber).
 *
 * Intel CET shadow stacks and arm64 BTI would reject these switches; Debian's
 * toolchain enables neither by default.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */
#include "fiber.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if SIM_FIBER_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

/* A broken invariant of the simulator itself (the runtime has no diag
 * engine and must not include ir/): say where and stop. */
static _Noreturn void sim_fiber_die(int line, const char *what) {
    fprintf(stderr, "%s:%d: smelt host simulator: %s\n", __FILE__, line, what);
    abort();
}
#define SIM_FIBER_DIE(what) sim_fiber_die(__LINE__, (what))

/* The fiber that switched to the one now starting or resuming, so that the
 * resumed side can learn the previous stack's bounds from ASan. */
static _Thread_local sim_fiber *sim_fiber_switching_from;

/* Runs on `self`'s stack right after it gets control. */
static void sim_fiber_arrived(sim_fiber *self) {
#if SIM_FIBER_ASAN
    const void *previous_bottom = NULL;
    size_t previous_size = 0;
    __sanitizer_finish_switch_fiber(self->asan_fake_stack, &previous_bottom, &previous_size);
    sim_fiber *previous = sim_fiber_switching_from;
    if (previous && !previous->stack_bottom) {
        /* An OS thread's own stack: ASan knows its bounds, we did not. */
        previous->stack_bottom = previous_bottom;
        previous->stack_size = previous_size;
    }
#else
    (void)self;
#endif
}

/* Where every prepared fiber begins, on its own stack. */
static _Noreturn void sim_fiber_start(sim_fiber *self) {
    self->asan_fake_stack = NULL;
    sim_fiber_arrived(self);
    self->entry(self->entry_argument);
    SIM_FIBER_DIE("a fiber's entry function returned instead of calling sim_fiber_exit");
}

#if SIM_FIBER_ASSEMBLY

/* void sim_fiber_switch_raw(void **save_stack_pointer, void *load_stack_pointer);
 * declared in fiber.h */
/* Entered by `ret` from the switch into a new fiber; calls
 * sim_fiber_start(fiber) with both taken from callee-saved registers. */
__attribute__((visibility("hidden"))) void sim_fiber_trampoline(void);

#if defined(__x86_64__)
__asm__(".text\n"
        ".globl sim_fiber_switch_raw\n"
        ".hidden sim_fiber_switch_raw\n"
        ".type sim_fiber_switch_raw, @function\n"
        ".p2align 4\n"
        "sim_fiber_switch_raw:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size sim_fiber_switch_raw, .-sim_fiber_switch_raw\n"
        "\n"
        ".globl sim_fiber_trampoline\n"
        ".hidden sim_fiber_trampoline\n"
        ".type sim_fiber_trampoline, @function\n"
        ".p2align 4\n"
        "sim_fiber_trampoline:\n"
        "    movq %r13, %rdi\n"
        "    callq *%r12\n"
        "    ud2\n"
        ".size sim_fiber_trampoline, .-sim_fiber_trampoline\n");

/* Slots of a suspended x86-64 fiber, from its saved stack pointer up. */
enum {
    SIM_X86_R15,
    SIM_X86_R14,
    SIM_X86_R13,
    SIM_X86_R12,
    SIM_X86_RBX,
    SIM_X86_RBP,
    SIM_X86_RETURN_ADDRESS,
    SIM_X86_SLOTS
};

static void sim_fiber_initial_frame(sim_fiber *fiber, uintptr_t stack_top) {
    /* After `ret` pops the return address, rsp must be 16-byte aligned so
     * that the trampoline's call enters sim_fiber_start with rsp % 16 == 8,
     * as the ABI wants. stack_top is 16-aligned; the two slots above the
     * return address stay zero (a null return address ends backtraces). */
    uint64_t *frame = (uint64_t *)(stack_top - 16) - SIM_X86_SLOTS;
    memset(frame, 0, (SIM_X86_SLOTS + 2) * sizeof *frame);
    frame[SIM_X86_R12] = (uint64_t)(uintptr_t)sim_fiber_start;
    frame[SIM_X86_R13] = (uint64_t)(uintptr_t)fiber;
    frame[SIM_X86_RETURN_ADDRESS] = (uint64_t)(uintptr_t)sim_fiber_trampoline;
    fiber->stack_pointer = frame;
}

#elif defined(__aarch64__)
__asm__(".text\n"
        ".globl sim_fiber_switch_raw\n"
        ".hidden sim_fiber_switch_raw\n"
        ".type sim_fiber_switch_raw, %function\n"
        ".p2align 4\n"
        "sim_fiber_switch_raw:\n"
        "    sub sp, sp, #160\n"
        "    stp x19, x20, [sp, #0]\n"
        "    stp x21, x22, [sp, #16]\n"
        "    stp x23, x24, [sp, #32]\n"
        "    stp x25, x26, [sp, #48]\n"
        "    stp x27, x28, [sp, #64]\n"
        "    stp x29, x30, [sp, #80]\n"
        "    stp d8, d9, [sp, #96]\n"
        "    stp d10, d11, [sp, #112]\n"
        "    stp d12, d13, [sp, #128]\n"
        "    stp d14, d15, [sp, #144]\n"
        "    mov x9, sp\n"
        "    str x9, [x0]\n"
        "    mov sp, x1\n"
        "    ldp x19, x20, [sp, #0]\n"
        "    ldp x21, x22, [sp, #16]\n"
        "    ldp x23, x24, [sp, #32]\n"
        "    ldp x25, x26, [sp, #48]\n"
        "    ldp x27, x28, [sp, #64]\n"
        "    ldp x29, x30, [sp, #80]\n"
        "    ldp d8, d9, [sp, #96]\n"
        "    ldp d10, d11, [sp, #112]\n"
        "    ldp d12, d13, [sp, #128]\n"
        "    ldp d14, d15, [sp, #144]\n"
        "    add sp, sp, #160\n"
        "    ret\n"
        ".size sim_fiber_switch_raw, .-sim_fiber_switch_raw\n"
        "\n"
        ".globl sim_fiber_trampoline\n"
        ".hidden sim_fiber_trampoline\n"
        ".type sim_fiber_trampoline, %function\n"
        ".p2align 4\n"
        "sim_fiber_trampoline:\n"
        "    mov x0, x20\n"
        "    blr x19\n"
        "    brk #0\n"
        ".size sim_fiber_trampoline, .-sim_fiber_trampoline\n");

/* Slots of a suspended aarch64 fiber (8 bytes each), from its saved sp up. */
enum { SIM_ARM_X19 = 0, SIM_ARM_X20 = 1, SIM_ARM_X29 = 10, SIM_ARM_X30 = 11, SIM_ARM_SLOTS = 20 };

static void sim_fiber_initial_frame(sim_fiber *fiber, uintptr_t stack_top) {
    uint64_t *frame = (uint64_t *)stack_top - SIM_ARM_SLOTS; /* sp stays 16-aligned */
    memset(frame, 0, SIM_ARM_SLOTS * sizeof *frame);
    frame[SIM_ARM_X19] = (uint64_t)(uintptr_t)sim_fiber_start;
    frame[SIM_ARM_X20] = (uint64_t)(uintptr_t)fiber;
    frame[SIM_ARM_X29] = 0; /* frame chain ends here */
    frame[SIM_ARM_X30] = (uint64_t)(uintptr_t)sim_fiber_trampoline;
    fiber->stack_pointer = frame;
}
#endif

void sim_fiber_prepare(sim_fiber *fiber, void *stack_bottom, size_t stack_size, sim_fiber_entry entry,
                       void *argument) {
    fiber->entry = entry;
    fiber->entry_argument = argument;
    fiber->stack_bottom = stack_bottom;
    fiber->stack_size = stack_size;
    fiber->asan_fake_stack = NULL;
    sim_fiber_initial_frame(fiber, ((uintptr_t)stack_bottom + stack_size) & ~(uintptr_t)15);
}

static inline void sim_fiber_switch_machine(sim_fiber *from, sim_fiber *to) {
    sim_fiber_switch_raw(&from->stack_pointer, to->stack_pointer);
}

#else /* ucontext fallback */

/* makecontext passes only ints, so the starting fiber travels here. */
static _Thread_local sim_fiber *sim_fiber_switching_to;

static void sim_fiber_start_ucontext(void) { sim_fiber_start(sim_fiber_switching_to); }

void sim_fiber_prepare(sim_fiber *fiber, void *stack_bottom, size_t stack_size, sim_fiber_entry entry,
                       void *argument) {
    fiber->entry = entry;
    fiber->entry_argument = argument;
    fiber->stack_bottom = stack_bottom;
    fiber->stack_size = stack_size;
    fiber->asan_fake_stack = NULL;
    if (getcontext(&fiber->context) != 0) SIM_FIBER_DIE("getcontext failed");
    fiber->context.uc_stack.ss_sp = stack_bottom;
    fiber->context.uc_stack.ss_size = stack_size;
    fiber->context.uc_link = NULL;
    makecontext(&fiber->context, sim_fiber_start_ucontext, 0);
}

static inline void sim_fiber_switch_machine(sim_fiber *from, sim_fiber *to) {
    sim_fiber_switching_to = to;
    if (swapcontext(&from->context, &to->context) != 0) SIM_FIBER_DIE("swapcontext failed");
}
#endif

void sim_fiber_init_thread(sim_fiber *fiber) {
    memset(fiber, 0, sizeof *fiber); /* stack bounds unknown until ASan reports them */
}

#if !SIM_FIBER_ASSEMBLY || SIM_FIBER_ASAN /* else inline in fiber.h */
void sim_fiber_switch(sim_fiber *from, sim_fiber *to) {
    sim_fiber_switching_from = from;
#if SIM_FIBER_ASAN
    __sanitizer_start_switch_fiber(&from->asan_fake_stack, to->stack_bottom, to->stack_size);
#endif
    sim_fiber_switch_machine(from, to);
    sim_fiber_arrived(from);
}
#endif

_Noreturn void sim_fiber_exit(sim_fiber *from, sim_fiber *to) {
    sim_fiber_switching_from = from;
#if SIM_FIBER_ASAN
    __sanitizer_start_switch_fiber(NULL, to->stack_bottom, to->stack_size);
#endif
    sim_fiber_switch_machine(from, to);
    SIM_FIBER_DIE("a fiber that exited was resumed without being prepared again");
}

/* ---- stacks ---- */

static size_t sim_page_size(void) {
    long page = sysconf(_SC_PAGESIZE);
    return page > 0 ? (size_t)page : 4096;
}

bool sim_stack_region_reserve(sim_stack_region *region, unsigned count, size_t stack_size) {
    size_t page = sim_page_size();
    if (stack_size > SIZE_MAX - page) return false;
    size_t rounded = (stack_size + page - 1) / page * page;
    if (region->base && region->count >= count && region->stack_size >= rounded) return true;
    if (region->base && region->stack_size > rounded) rounded = region->stack_size;
    if (region->count > count) count = region->count;

    size_t stride = rounded + page, total;
    if (__builtin_mul_overflow(stride, (size_t)count, &total)) return false;
    void *base =
        mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return false;
    /* The guard sits below each stack, where an overflow runs into it. When
     * the process runs out of mappings, the remaining stacks go unguarded. */
    unsigned guarded = 0;
    while (guarded < count &&
           mprotect((unsigned char *)base + (size_t)guarded * stride, page, PROT_NONE) == 0)
        guarded++;
    sim_stack_region_free(region);
    region->base = base;
    region->mapped_bytes = total;
    region->stride = stride;
    region->stack_size = rounded;
    region->count = count;
    region->guarded_count = guarded;
    return true;
}

/* Written at the lowest address of an unguarded stack. */
static const uint64_t sim_stack_canary = 0x5a17c0de5a17c0deull;

void sim_stack_region_set_canary(sim_stack_region *region, unsigned index) {
    memcpy(sim_stack_region_stack(region, index), &sim_stack_canary, sizeof sim_stack_canary);
}

bool sim_stack_region_canary_intact(const sim_stack_region *region, unsigned index) {
    return memcmp(sim_stack_region_stack(region, index), &sim_stack_canary, sizeof sim_stack_canary) == 0;
}

void *sim_stack_region_stack(const sim_stack_region *region, unsigned index) {
    return region->base + (size_t)index * region->stride + (region->stride - region->stack_size);
}

void sim_stack_region_forget_frames(sim_stack_region *region) {
#if SIM_FIBER_ASAN
    for (unsigned i = 0; i < region->count; i++)
        __asan_unpoison_memory_region(sim_stack_region_stack(region, i), region->stack_size);
#else
    (void)region;
#endif
}

void sim_stack_region_free(sim_stack_region *region) {
    /* ASan keeps the shadow of unmapped memory: frames that never returned
     * (every fiber's first two) would poison whatever is mapped here next. */
    sim_stack_region_forget_frames(region);
    if (region->base) munmap(region->base, region->mapped_bytes);
    memset(region, 0, sizeof *region);
}
