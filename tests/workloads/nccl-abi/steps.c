/*
 * nccl_steps: a training loop over the NCCL API. Each step is compute (a busy-wait, so
 * real CPU time) followed by one ncclAllReduce of --bytes (float32 sum), bracketed by
 * step markers. Rank 0 makes the unique id and publishes it in --id-file (hex, written
 * atomically); the other ranks wait for that file. The launcher removes a stale file.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "idfile.h"
#include "nccl.h"
#include "stepcommon.h"

static const char usage[] =
    "usage: nccl_steps --rank R --nranks N --id-file F [--steps S] [--bytes B]\n"
    "                  [--compute-us C] [--marker-socket PATH] [--delay-rank R --delay-us D\n"
    "                  [--delay-every K]] [--no-verify]\n"
    "  Steps of C us busy-wait + one ncclAllReduce of B bytes (float32 sum).\n"
    "  --delay-*: rank R computes D us longer on every K-th step (a late arrival).\n"
    "  Library knobs (NCCL_ABI_*) are described in nccl-abi/README.md.\n";

#define NCCLCHECK(call, what)                                                         \
  do {                                                                                \
    ncclResult_t r_ = (call);                                                         \
    if (r_ != ncclSuccess) {                                                          \
      fprintf(stderr, "nccl_steps rank %d: %s failed: %s (%d)\n", o.rank, what,       \
              ncclGetErrorString(r_), (int)r_);                                       \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

int main(int argc, char** argv) {
  struct step_opts o;
  step_parse(argc, argv, &o, 1, usage);
  setvbuf(stdout, NULL, _IOLBF, 0);
  ncclUniqueId id;
  if (o.rank == 0) {
    NCCLCHECK(ncclGetUniqueId(&id), "ncclGetUniqueId");
    id_write(o.id_file, &id);
  } else {
    id_read(o.id_file, &id);
  }
  ncclComm_t comm;
  double t_init = now_us();
  NCCLCHECK(ncclCommInitRank(&comm, o.nranks, id, o.rank), "ncclCommInitRank");
  printf("init rank=%d nranks=%d pid=%d init_us=%.0f\n", o.rank, o.nranks, (int)getpid(),
         now_us() - t_init);

  size_t count = o.bytes / sizeof(float);
  float* send = malloc(o.bytes);
  float* recv = malloc(o.bytes);
  if (send == NULL || recv == NULL) {
    perror("malloc");
    return 1;
  }
  struct markers m;
  markers_open(&m, o.marker_socket);
  struct step_stats st;
  stats_init(&st, o.steps);
  size_t errors = 0;
  for (long k = 0; k < o.steps; k++) {
    fill_input(send, count, o.rank, k);
    long delay = step_delay_us(&o, o.rank, k);
    marker_send(&m, o.rank, k, "begin");
    double t0 = now_us();
    busy_wait_us(o.compute_us + delay);
    step_stop_point(&o, o.rank, k);
    double t1 = now_us();
    ncclResult_t rc = ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm, NULL);
    double t2 = now_us();
    marker_send(&m, o.rank, k, "end");
    if (rc != ncclSuccess) {
      fprintf(stderr, "nccl_steps rank %d step %ld: ncclAllReduce failed: %s (%d)\n", o.rank,
              k, ncclGetErrorString(rc), (int)rc);
      ncclCommAbort(comm);
      return 1;
    }
    size_t bad = o.verify ? check_sum(recv, count, o.nranks, k) : 0;
    errors += bad;
    st.comm_us[st.n] = t2 - t1;
    st.step_us[st.n++] = t2 - t0;
    printf("step rank=%d step=%ld compute_us=%.0f allreduce_us=%.0f step_us=%.0f delayed=%d "
           "bad=%zu arrive_us=%.1f\n",
           o.rank, k, t1 - t0, t2 - t1, t2 - t0, delay > 0, bad, t1);
  }
  uint64_t csum = o.steps ? checksum64(recv, o.bytes) : 0;
  NCCLCHECK(ncclCommDestroy(comm), "ncclCommDestroy");
  stats_print_summary(&st, "nccl_steps", o.rank, o.nranks, o.bytes, csum, errors);
  return errors ? 3 : 0;
}
