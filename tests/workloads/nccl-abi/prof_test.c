/*
 * nccl_prof_test RANK NRANKS ID_FILE: the library's asynchronous semantics and its
 * profiler-plugin contract, checked from inside a job (launch with run-local.sh --bin
 * nccl_prof_test N). It runs a small workload (all-reduces after simulated compute, an
 * all-gather, a grouped send/recv ring, a broadcast), checks that a call with a late peer
 * returns before the data moved (or, with CUDA_LAUNCH_BLOCKING=1, only after), without a
 * plugin that an asynchronous failure surfaces where NCCL reports it, destroys the
 * communicator and then reads back what the test plugin (test_plugin.c) recorded.
 * ABITEST_EXPECT: 6, 5, 4 (that table must have been used), initfail (init called, failed,
 * no events), none (no plugin loaded) or other (a plugin other than the contract-test one,
 * e.g. Stepwise's with a chained plugin: the workload only). ABITEST_LIB: the plugin's path.
 * Prints "prof_test rank=R ... ok" or FAILED (exit 1) and one line per failed check.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "idfile.h"
#include "nccl.h"
#include "prof_test.h"

int g_rank, g_fail;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Five all-reduces each after 5 ms of simulated compute on the stream, an all-gather, a
 * grouped ring exchange and a broadcast; then one synchronize and the results. */
static void workload(ncclComm_t comm, int n) {
  const size_t c = PT_AR_COUNT;
  float* s = malloc(sizeof(float) * c);
  float* r = malloc(sizeof(float) * c * (size_t)n);
  for (size_t i = 0; i < c; i++) s[i] = (float)(g_rank + 1);
  for (int k = 0; k < PT_AR_CALLS; k++) {
    OK(ncclAbiEnqueueCompute(NULL, PT_COMPUTE_MS));
    OK(ncclAllReduce(s, r, c, ncclFloat32, ncclSum, comm, NULL));
  }
  OK(ncclAbiStreamSynchronize(NULL));
  CHECK(r[0] == (float)(n * (n + 1) / 2) && r[c - 1] == r[0], "allreduce %g", r[0]);
  OK(ncclAllGather(s, r, PT_AG_COUNT, ncclFloat32, comm, NULL));
  int64_t out = g_rank, in = -1;
  OK(ncclGroupStart());
  OK(ncclSend(&out, 1, ncclInt64, (g_rank + 1) % n, comm, NULL));
  OK(ncclRecv(&in, 1, ncclInt64, (g_rank + n - 1) % n, comm, NULL));
  OK(ncclGroupEnd());
  float b = g_rank == 0 ? 42.0f : 0.0f;
  OK(ncclBroadcast(&b, &b, 1, ncclFloat32, 0, comm, NULL));
  OK(ncclAbiStreamSynchronize(NULL));
  CHECK(r[(size_t)(n - 1) * PT_AG_COUNT] == (float)n, "allgather");
  CHECK(in == (g_rank + n - 1) % n, "ring exchange got %lld", (long long)in);
  CHECK(b == 42.0f, "broadcast %g", b);
  free(s);
  free(r);
}

/* The last rank calls PT_LATE_MS late. Rank 0's call must return at once (async) and its
 * synchronize must take the wait, or (CUDA_LAUNCH_BLOCKING=1) the call itself must. */
static void timing(ncclComm_t comm, int n) {
  const char* lb = getenv("CUDA_LAUNCH_BLOCKING");
  int blocking = lb != NULL && strcmp(lb, "1") == 0;
  float x = 1, y = 0;
  if (g_rank == n - 1 && n > 1) usleep(PT_LATE_MS * 1000);
  double t0 = now_ms();
  OK(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, NULL));
  double t1 = now_ms();
  OK(ncclAbiStreamSynchronize(NULL));
  double t2 = now_ms();
  CHECK(y == (float)n, "timing allreduce %g", y);
  if (g_rank != 0 || n == 1) return;
  printf("timing rank=0 blocking=%d call_ms=%.3f sync_ms=%.3f late_ms=%d\n", blocking, t1 - t0,
         t2 - t1, PT_LATE_MS);
  if (blocking)
    CHECK(t1 - t0 >= PT_LATE_MS * 0.8, "blocking call returned after %.1f ms", t1 - t0);
  else
    CHECK(t1 - t0 < PT_LATE_MS * 0.1 && t2 - t0 >= PT_LATE_MS * 0.8,
          "async call %.1f ms, synchronize %.1f ms (late peer %d ms)", t1 - t0, t2 - t1,
          PT_LATE_MS);
}

/* Without a plugin only (a split is a second communicator for the plugin): a queued
 * operation whose peers left fails asynchronously. The call itself succeeds (it only
 * enqueues) unless CUDA_LAUNCH_BLOCKING=1; the failure surfaces at the synchronize, in
 * ncclCommGetAsyncError and at the next call on the communicator. */
static void async_error(ncclComm_t comm) {
  ncclComm_t sub = NULL;
  OK(ncclCommSplit(comm, 0, 0, &sub, NULL));
  if (g_rank != 0) {
    OK(ncclCommDestroy(sub)); /* its connections close under rank 0's all-reduce */
    return;
  }
  const char* lb = getenv("CUDA_LAUNCH_BLOCKING");
  int blocking = lb != NULL && strcmp(lb, "1") == 0;
  static float x[1024];
  ncclResult_t rc = ncclAllReduce(x, x, 1024, ncclFloat32, ncclSum, sub, NULL);
  ncclResult_t sync = ncclAbiStreamSynchronize(NULL), async = ncclSuccess;
  OK(ncclCommGetAsyncError(sub, &async));
  ncclResult_t next = ncclAllReduce(x, x, 1, ncclFloat32, ncclSum, sub, NULL);
  if (blocking)
    CHECK(rc == ncclRemoteError && sync == ncclSuccess, "blocking: call %d, sync %d", rc, sync);
  else
    CHECK(rc == ncclSuccess && sync == ncclRemoteError, "async: call %d, sync %d", rc, sync);
  CHECK(async == ncclRemoteError && next == ncclRemoteError, "async error %d, next call %d",
        async, next);
  printf("async_error rank=0 blocking=%d call=%d sync=%d async=%d next=%d\n", blocking, rc, sync,
         async, next);
  OK(ncclCommDestroy(sub));
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: nccl_prof_test RANK NRANKS ID_FILE\n");
    return 2;
  }
  g_rank = atoi(argv[1]);
  int n = atoi(argv[2]);
  const char* expect = getenv("ABITEST_EXPECT") ? getenv("ABITEST_EXPECT") : "none";
  const char* lib = getenv("ABITEST_LIB");
  ncclUniqueId id;
  if (g_rank == 0) {
    OK(ncclGetUniqueId(&id));
    id_write(argv[3], &id);
  } else {
    id_read(argv[3], &id);
  }
  /* Our own reference keeps the plugin (and what it recorded) mapped after the library
   * drops its reference at the last ncclCommDestroy. */
  int none = strcmp(expect, "none") == 0, other = strcmp(expect, "other") == 0;
  void* h = lib && !none && !other ? dlopen(lib, RTLD_NOW | RTLD_LOCAL) : NULL;
  CHECK(none || other || h != NULL, "cannot open %s", lib ? lib : "(ABITEST_LIB unset)");
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.commName = PT_COMM_NAME;
  ncclComm_t comm;
  if (ncclCommInitRankConfig(&comm, n, id, g_rank, &cfg) != ncclSuccess) {
    fprintf(stderr, "prof_test rank %d: init failed\n", g_rank);
    return 1;
  }
  if (none && lib != NULL)
    CHECK(dlopen(lib, RTLD_NOW | RTLD_NOLOAD) == NULL, "%s is loaded, none was expected", lib);
  workload(comm, n);
  timing(comm, n);
  if (none && n > 1) async_error(comm);
  OK(ncclCommDestroy(comm));
  unsigned long long comm_id = 0;
  if (h != NULL) {
    abitest_query_fn q = (abitest_query_fn)dlsym(h, "abitest_query");
    struct abitest_result res;
    q(&res);
    comm_id = check_events(&res, expect, n);
  }
  printf("prof_test rank=%d nranks=%d expect=%s commid=%llx %s\n", g_rank, n, expect, comm_id,
         g_fail ? "FAILED" : "ok");
  return g_fail ? 1 : 0;
}
