/* fiber.h - user-space threads for the host simulator: stacks and the switch.
 *
 * A fiber is a stack and a saved stack pointer. Switching saves the
 * callee-saved registers on the current stack, stores the stack pointer,
 * loads the other fiber's and pops its registers: a few instructions of
 * assembly on x86-64 and aarch64 (ELF), ucontext's swapcontext elsewhere
 * (correct but a system call per switch, for the signal mask).
 *
 * Switching is cooperative and never crosses OS threads: a fiber runs only
 * on the thread that prepared it. Under AddressSanitizer every switch is
 * announced to it (__sanitizer_start/finish_switch_fiber), so ASan checks
 * accesses against the right stack.
 *
 * Stacks come from sim_stack_region: one mmap per worker, each stack with a
 * PROT_NONE guard page below it, so a kernel that overflows its stack dies
 * with SIGSEGV instead of writing into its neighbour's.
 */
#ifndef SMELT_FIBER_H
#define SMELT_FIBER_H

#include <stdbool.h>
#include <stddef.h>

#if !defined(SIM_FIBER_FORCE_UCONTEXT) && defined(__ELF__) && (defined(__x86_64__) || defined(__aarch64__))
#define SIM_FIBER_ASSEMBLY 1
#else
#define SIM_FIBER_ASSEMBLY 0
#include <ucontext.h>
#endif

typedef void (*sim_fiber_entry)(void *arg);

typedef struct sim_fiber {
#if SIM_FIBER_ASSEMBLY
    void *stack_pointer; /* saved while the fiber is switched out */
#else
    ucontext_t context;
#endif
    sim_fiber_entry entry; /* what a prepared fiber runs first; must not return */
    void *entry_argument;
    const void *stack_bottom; /* lowest address; NULL for an OS thread's own stack until ASan reports it */
    size_t stack_size;        /* bytes */
    void *asan_fake_stack;    /* ASan's bookkeeping across a switch */
} sim_fiber;

/* The calling OS thread's own context, to switch away from and back to. */
void sim_fiber_init_thread(sim_fiber *fiber);

/* Makes `fiber` start `entry(argument)` on the given stack at its first
 * switch-in. The entry must never return: it ends with sim_fiber_exit. */
void sim_fiber_prepare(sim_fiber *fiber, void *stack_bottom, size_t stack_size, sim_fiber_entry entry,
                       void *argument);

#if defined(__SANITIZE_ADDRESS__)
#define SIM_FIBER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SIM_FIBER_ASAN 1
#endif
#endif
#ifndef SIM_FIBER_ASAN
#define SIM_FIBER_ASAN 0
#endif

/* Suspends `from` (the running fiber) and resumes `to`; returns when some
 * fiber switches back to `from`. Without ASan and ucontext, nothing but the
 * assembly: inline, one call. */
#if SIM_FIBER_ASSEMBLY
__attribute__((visibility("hidden"))) void sim_fiber_switch_raw(void **save_stack_pointer,
                                                                void *load_stack_pointer);
#endif
#if SIM_FIBER_ASSEMBLY && !SIM_FIBER_ASAN
static inline void sim_fiber_switch(sim_fiber *from, sim_fiber *to) {
    sim_fiber_switch_raw(&from->stack_pointer, to->stack_pointer);
}
#else
void sim_fiber_switch(sim_fiber *from, sim_fiber *to);
#endif

/* Like sim_fiber_switch for a `from` that will not be resumed again (until
 * it is prepared anew); lets ASan drop its state for that stack. */
_Noreturn void sim_fiber_exit(sim_fiber *from, sim_fiber *to);

/* `count` stacks of `stack_size` bytes each, each with a guard page below.
 * Every guard page splits the mapping, and Linux caps a process's mappings
 * (vm.max_map_count, 65530 by default): a many-core machine running blocks
 * of 1024 threads on every core can reach it. Stacks past that point go
 * without a guard and get a canary word at their lowest address instead,
 * checked after each block (sim_stack_region_canary_intact). */
typedef struct sim_stack_region {
    unsigned char *base; /* the mapping, NULL when empty */
    size_t mapped_bytes;
    size_t stride;     /* guard page + stack */
    size_t stack_size; /* usable bytes per stack, a multiple of the page size */
    unsigned count;
    unsigned guarded_count; /* stacks [0, guarded_count) have their guard page */
} sim_stack_region;

/* Ensures room for `count` stacks of at least `stack_size` bytes; a region
 * that is too small is replaced (stacks in use must not be running).
 * Returns false when the memory cannot be mapped. */
bool sim_stack_region_reserve(sim_stack_region *region, unsigned count, size_t stack_size);
void *sim_stack_region_stack(const sim_stack_region *region, unsigned index); /* its lowest address */
/* The canary of an unguarded stack: set before a fiber runs on it, checked
 * after. A guarded stack needs none (an overflow faults at once). */
void sim_stack_region_set_canary(sim_stack_region *region, unsigned index);
bool sim_stack_region_canary_intact(const sim_stack_region *region, unsigned index);
/* Forgets the frames of fibers that were abandoned mid-run (a failed
 * block): under ASan their stale redzones would poison the next user. */
void sim_stack_region_forget_frames(sim_stack_region *region);
void sim_stack_region_free(sim_stack_region *region);

#endif
