// The host emulator's scheduler: a launch runs its blocks one after another, each block's
// threads as fibers on the calling thread. A fiber runs until it reaches a barrier
// (__syncthreads, __syncwarp, a shuffle) or ends; a barrier opens when every live thread of
// its scope (the block, or the warp) waits at it. Shuffles exchange through a slot per thread,
// double-buffered by the warp barrier's parity. A barrier that can never open (threads of a
// warp at different barriers) is reported as an error, not a hang. x86-64 only (the fiber
// switch is a few instructions of assembly).
#include "emu.h"

#include <stdio.h>
#include <stdlib.h>

extern "C" {
emu_dim3 threadIdx, blockIdx, blockDim, gridDim;
}

namespace {

enum State { READY, WAIT_WARP, WAIT_BLOCK, DONE };

struct Fiber {
    void *sp;
    int state;
    unsigned warp_gen;
};

const unsigned MAX_THREADS = 1024;
const size_t STACK = 64 * 1024;
// Each fiber's stack top is offset by a cache line per thread index (its colour): tops a
// power-of-two apart share one L1 and L2 set, and a block's fibers, switching in turn, evict
// each other's frames (about an eighth of cuda_emu_engine's time on an AMD EPYC).
const size_t COLOURS = 1024;
const size_t SLOT = STACK + COLOURS * 64;

Fiber fibers[MAX_THREADS];
char *stacks = nullptr;
void *sched_sp = nullptr;
unsigned cur = 0;
uint32_t slots[2][MAX_THREADS];

typedef void (*Kernel16)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                         uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, float, float, float, float,
                         float, float, float, float);
void *kernel = nullptr;
uint64_t ints[16];
float floats[8];

}  // namespace

extern "C" void emu_switch(void **save, void *to);
asm(R"(
    .text
    .p2align 4
    .hidden emu_switch
    .globl emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
)");

namespace {

void wait(int kind) {
    fibers[cur].state = kind;
    emu_switch(&fibers[cur].sp, sched_sp);
}

// Every CUDA thread starts here (entered by emu_switch's `ret`).
void fiber_main() {
    ((Kernel16)kernel)(ints[0], ints[1], ints[2], ints[3], ints[4], ints[5], ints[6], ints[7], ints[8], ints[9], ints[10],
                       ints[11], ints[12], ints[13], ints[14], ints[15], floats[0], floats[1], floats[2], floats[3],
                       floats[4], floats[5], floats[6], floats[7]);
    fibers[cur].state = DONE;
    emu_switch(&fibers[cur].sp, sched_sp);
    abort();  // a finished fiber is never resumed
}

void start(unsigned i) {
    char *top = stacks + (size_t)i * SLOT + STACK + (i % COLOURS) * 64;
    uint64_t *sp = (uint64_t *)((uintptr_t)top & ~(uintptr_t)15);
    *--sp = 0;                            // alignment: fiber_main is entered as if called
    *--sp = (uint64_t)(uintptr_t)&fiber_main;
    for (int r = 0; r < 6; ++r) *--sp = 0;  // rbp rbx r12 r13 r14 r15
    fibers[i].sp = sp;
    fibers[i].state = READY;
    fibers[i].warp_gen = 0;
}

}  // namespace

extern "C" void emu_syncthreads(void) { wait(WAIT_BLOCK); }

extern "C" void emu_syncwarp(void) {
    fibers[cur].warp_gen++;
    wait(WAIT_WARP);
}

static uint32_t exchange(uint32_t bits, unsigned src) {
    const unsigned p = fibers[cur].warp_gen & 1;
    slots[p][cur] = bits;
    fibers[cur].warp_gen++;
    wait(WAIT_WARP);
    const unsigned base = cur & ~31u;
    const unsigned from = base + (src & 31u);
    return from < blockDim.x ? slots[p][from] : bits;
}

extern "C" uint32_t emu_shfl_xor(uint32_t bits, int lane_mask) { return exchange(bits, (cur & 31u) ^ (unsigned)lane_mask); }
extern "C" uint32_t emu_shfl(uint32_t bits, int src_lane) { return exchange(bits, (unsigned)src_lane); }

// Runs kernel `fn` over `grid` blocks of `block` threads with its integer-class arguments
// `in` (pointers, ints: each in a 64-bit slot, in order) and its float arguments `fl`, in order
// (the SysV x86-64 ABI passes the two classes independently). 0 on success; otherwise `err`
// holds the reason.
extern "C" int emu_launch(void *fn, unsigned grid, unsigned block, const uint64_t *in, int n_in, const float *fl, int n_fl,
                          char *err, int err_len) {
    if (block == 0 || block > MAX_THREADS || n_in > 16 || n_fl > 8) {
        snprintf(err, err_len, "unsupported launch: block %u, %d integer and %d float arguments", block, n_in, n_fl);
        return 1;
    }
    if (!stacks && !(stacks = (char *)malloc(MAX_THREADS * SLOT))) {
        snprintf(err, err_len, "no memory for the fiber stacks");
        return 1;
    }
    kernel = fn;
    for (int i = 0; i < 16; ++i) ints[i] = i < n_in ? in[i] : 0;
    for (int i = 0; i < 8; ++i) floats[i] = i < n_fl ? fl[i] : 0.0f;
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    const unsigned n_warps = (block + 31) / 32;
    for (unsigned b = 0; b < grid; ++b) {
        blockIdx = {b, 0, 0};
        for (unsigned i = 0; i < block; ++i) start(i);
        for (;;) {
            bool progress = false;
            for (unsigned i = 0; i < block; ++i) {
                if (fibers[i].state != READY) continue;
                cur = i;
                threadIdx = {i, 0, 0};
                emu_switch(&sched_sp, fibers[i].sp);
                progress = true;
            }
            unsigned live = 0, at_block = 0;
            for (unsigned w = 0; w < n_warps; ++w) {
                const unsigned lo = 32 * w, hi = lo + 32 < block ? lo + 32 : block;
                unsigned wl = 0, ww = 0;
                for (unsigned i = lo; i < hi; ++i) {
                    if (fibers[i].state == DONE) continue;
                    ++wl;
                    ww += fibers[i].state == WAIT_WARP;
                    at_block += fibers[i].state == WAIT_BLOCK;
                }
                live += wl;
                if (wl > 0 && ww == wl) {
                    for (unsigned i = lo; i < hi; ++i)
                        if (fibers[i].state == WAIT_WARP) fibers[i].state = READY;
                    progress = true;
                }
            }
            if (live == 0) break;
            if (at_block == live) {
                for (unsigned i = 0; i < block; ++i)
                    if (fibers[i].state == WAIT_BLOCK) fibers[i].state = READY;
                progress = true;
            }
            if (!progress) {
                snprintf(err, err_len, "block %u deadlocks: %u live threads, %u at __syncthreads, the rest at warp barriers", b, live, at_block);
                return 2;
            }
        }
    }
    return 0;
}
