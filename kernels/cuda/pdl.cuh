// Programmatic dependent launch (sm_90 and newer, SASS only). The host launches kernels so that
// the next kernel of a stream may start while this one runs (cuda_backend.c, cu_launch); every
// kernel therefore begins with SIL_PDL_ENTRY() before it touches memory: wait for the previous
// kernel of the stream to finish and its writes to be visible, then let the next one be
// scheduled. The next kernel's launch and block start-up overlap this one's work; what any
// kernel reads or writes is still ordered as without it. A no-op where the launch did not ask
// for it, and compiled out below sm_90 (the compute_75 PTX has neither instruction: the host
// turns the attribute off when the module came through the JIT). tests/pdl-entry.sh checks
// that every kernel starts with it.
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SIL_PDL_ENTRY()                                                                            \
    asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define SIL_PDL_ENTRY()                                                                            \
    do {                                                                                           \
    } while (0)
#endif
