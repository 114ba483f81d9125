/*
 * What the contract-test profiler plugin (test_plugin.c, libnccl-profiler-abitest*.so)
 * records, and how nccl_prof_test reads it back (dlopen(RTLD_NOLOAD) of the same library,
 * then abitest_query). Test code only.
 */
#ifndef NCCL_ABI_TEST_PLUGIN_H_
#define NCCL_ABI_TEST_PLUGIN_H_

#include <stdint.h>
#include <sys/types.h>

#define ABITEST_MAX_STATES 8

struct abitest_init {
  int version;       /* table that was called: 7, 6, 5 or 4 */
  uint64_t comm_id;
  int mask_in, mask_out;
  char comm_name[64]; /* "" for NULL */
  int nnodes, nranks, rank;
  int has_logfn;
  int failed;        /* ABITEST_INIT_FAIL=1: init returned an error */
  int finalized;
};

struct abitest_ev {
  int id;
  int version;
  uint64_t type;
  int parent;        /* id of the parent event, -1 NULL, -2 not one of ours */
  int parent_group;  /* Coll/P2p v5+: coll.parentGroup / p2p.parentGroup as an id */
  int rank;
  pid_t tid_start, tid_stop;
  uint64_t host_start, host_stop; /* CLOCK_MONOTONIC ns at the callbacks */
  uint64_t gpu_start;  /* ncclAbiGpuTimer at the start callback */
  int stopped;
  /* descriptor fields */
  uint64_t seq;
  char func[24], dtype[24], algo[16], proto[16];
  size_t count;
  int root, peer, nch, group_depth;
  int channel, nsteps, chunk, is_send, step;
  uint64_t ptimer, ptimer_stop; /* KernelCh: start descriptor / KernelChStop args */
  int nstates;
  int states[ABITEST_MAX_STATES];
  size_t state_size[ABITEST_MAX_STATES];
  uint64_t state_ns[ABITEST_MAX_STATES];
};

struct abitest_result {
  int ninit;
  const struct abitest_init* inits;
  int nev;
  struct abitest_ev* const* ev;
};

typedef void (*abitest_query_fn)(struct abitest_result* out);

#endif
