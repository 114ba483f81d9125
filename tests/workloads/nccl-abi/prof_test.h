/* Shared by prof_test.c and prof_check.c (nccl_prof_test). Test code only. */
#ifndef NCCL_ABI_PROF_TEST_H_
#define NCCL_ABI_PROF_TEST_H_

#include <stdio.h>

#include "profiler.h"
#include "test_plugin.h"

#define PT_COMM_NAME "abitest-comm"
#define PT_AR_COUNT (256 * 1024) /* floats per all-reduce */
#define PT_AR_CALLS 5            /* all-reduces after compute (+1 in the timing check) */
#define PT_COMPUTE_MS 5.0        /* simulated compute before each of them */
#define PT_AG_COUNT 1000         /* floats per rank in the all-gather */
#define PT_LATE_MS 300           /* the late rank in the timing check */

extern int g_rank, g_fail;

#define CHECK(cond, ...)                                    \
  do {                                                      \
    if (!(cond)) {                                          \
      fprintf(stderr, "prof_test rank %d FAIL: ", g_rank);  \
      fprintf(stderr, __VA_ARGS__);                         \
      fprintf(stderr, "\n");                                \
      g_fail++;                                             \
    }                                                       \
  } while (0)
#define OK(call) CHECK((call) == ncclSuccess, "%s", #call)

/* Checks what the plugin recorded; returns the commId its init received. */
unsigned long long check_events(const struct abitest_result* r, const char* expect, int nranks);

#endif
