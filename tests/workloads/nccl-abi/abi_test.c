/*
 * nccl_abi_test: checks every collective of the NCCL-ABI library for exact results across
 * ranks in separate processes (dtypes, ops, uneven counts, in-place, roots, grouped
 * send/recv, split) and the error codes. Usage: nccl_abi_test RANK NRANKS ID_FILE
 * (launch with run-local.sh --bin nccl_abi_test N).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "idfile.h"
#include "nccl.h"

static int g_rank, g_fail;

#define CHECK(cond, ...)                                    \
  do {                                                      \
    if (!(cond)) {                                          \
      fprintf(stderr, "abi_test rank %d FAIL: ", g_rank);   \
      fprintf(stderr, __VA_ARGS__);                         \
      fprintf(stderr, "\n");                                \
      g_fail++;                                             \
    }                                                       \
  } while (0)
#define OK(call) CHECK((call) == ncclSuccess, "%s", #call)
/* A call, then waiting for the stream (calls only enqueue unless CUDA_LAUNCH_BLOCKING=1). */
#define OKS(call)                                                   \
  do {                                                              \
    OK(call);                                                       \
    CHECK(ncclAbiStreamSynchronize(NULL) == ncclSuccess, "sync after %s", #call); \
  } while (0)

/* Input of rank r at element i: small integers, exact in every type including fp16/bf16. */
static double in_val(int r, size_t i) { return (double)((r + 1) * ((i % 5) + 1) % 7); }

static void put(void* b, ncclDataType_t dt, size_t i, double v) {
  switch (dt) {
    case ncclInt8: ((int8_t*)b)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t*)b)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t*)b)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t*)b)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t*)b)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t*)b)[i] = (uint64_t)v; break;
    case ncclFloat16: ((_Float16*)b)[i] = (_Float16)v; break;
    case ncclFloat32: ((float*)b)[i] = (float)v; break;
    case ncclFloat64: ((double*)b)[i] = v; break;
    case ncclBfloat16: {
      float f = (float)v;
      uint32_t u;
      memcpy(&u, &f, 4);
      ((uint16_t*)b)[i] = (uint16_t)(u >> 16); /* small integers: exact */
      break;
    }
    default: break;
  }
}

static double get(const void* b, ncclDataType_t dt, size_t i) {
  switch (dt) {
    case ncclInt8: return ((const int8_t*)b)[i];
    case ncclUint8: return ((const uint8_t*)b)[i];
    case ncclInt32: return ((const int32_t*)b)[i];
    case ncclUint32: return ((const uint32_t*)b)[i];
    case ncclInt64: return (double)((const int64_t*)b)[i];
    case ncclUint64: return (double)((const uint64_t*)b)[i];
    case ncclFloat16: return (double)((const _Float16*)b)[i];
    case ncclFloat32: return ((const float*)b)[i];
    case ncclFloat64: return ((const double*)b)[i];
    case ncclBfloat16: {
      uint32_t u = (uint32_t)((const uint16_t*)b)[i] << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    default: return 0;
  }
}

static size_t tsize(ncclDataType_t dt) {
  return dt == ncclFloat16 || dt == ncclBfloat16 ? 2
         : dt == ncclInt8 || dt == ncclUint8     ? 1
         : dt == ncclInt64 || dt == ncclUint64 || dt == ncclFloat64 ? 8 : 4;
}

static double expect(ncclRedOp_t op, int n, size_t i) {
  double acc = in_val(0, i);
  for (int r = 1; r < n; r++) {
    double v = in_val(r, i);
    acc = op == ncclProd ? acc * v : op == ncclMax ? (v > acc ? v : acc)
        : op == ncclMin ? (v < acc ? v : acc) : acc + v;
  }
  return op == ncclAvg ? acc / n : acc;
}

static void test_allreduce(ncclComm_t comm, int n, ncclDataType_t dt, ncclRedOp_t op,
                           size_t count, int inplace) {
  size_t es = tsize(dt);
  char* s = calloc(count + 1, es);
  char* r = inplace ? s : calloc(count + 1, es);
  for (size_t i = 0; i < count; i++) put(s, dt, i, in_val(g_rank, i));
  OKS(ncclAllReduce(s, r, count, dt, op, comm, NULL));
  size_t bad = 0;
  for (size_t i = 0; i < count; i++) {
    double e = expect(op, n, i);
    double got = get(r, dt, i);
    if (op == ncclAvg) { /* a sum divided by n in the type: compare with a tolerance */
      if (dt != ncclFloat32 && dt != ncclFloat64) continue;
      if (got > e * (1 - 1e-6) && got < e * (1 + 1e-6)) continue;
    }
    if (got != e && bad++ == 0)
      CHECK(0, "allreduce dt=%d op=%d count=%zu inplace=%d: [%zu]=%g want %g", dt, op, count,
            inplace, i, get(r, dt, i), e);
  }
  free(s);
  if (!inplace) free(r);
}

static void test_others(ncclComm_t comm, int n) {
  const size_t c = 10007;
  float* s = malloc(sizeof(float) * c * (size_t)n);
  float* r = malloc(sizeof(float) * c * (size_t)n);
  for (size_t i = 0; i < c * (size_t)n; i++) s[i] = (float)in_val(g_rank, i);
  OKS(ncclReduceScatter(s, r, c, ncclFloat32, ncclSum, comm, NULL));
  for (size_t i = 0; i < c; i++)
    if (r[i] != (float)expect(ncclSum, n, (size_t)g_rank * c + i)) {
      CHECK(0, "reducescatter [%zu]", i);
      break;
    }
  for (size_t i = 0; i < c; i++) s[i] = (float)(g_rank * 100000 + (int)i);
  OKS(ncclAllGather(s, r, c, ncclFloat32, comm, NULL));
  for (size_t i = 0; i < c * (size_t)n; i++)
    if (r[i] != (float)((int)(i / c) * 100000 + (int)(i % c))) {
      CHECK(0, "allgather [%zu]=%g", i, r[i]);
      break;
    }
  int root = n - 1;
  size_t bc = (3u << 20) / 4 + 3; /* several 1 MiB broadcast pieces */
  float* b = malloc(sizeof(float) * bc);
  for (size_t i = 0; i < bc; i++) b[i] = g_rank == root ? (float)(i % 1000) : -1.0f;
  OKS(ncclBroadcast(b, b, bc, ncclFloat32, root, comm, NULL));
  for (size_t i = 0; i < bc; i++)
    if (b[i] != (float)(i % 1000)) {
      CHECK(0, "broadcast [%zu]=%g", i, b[i]);
      break;
    }
  free(b);
  root = 1 % n;
  for (size_t i = 0; i < c; i++) s[i] = (float)in_val(g_rank, i);
  OKS(ncclReduce(s, r, c, ncclFloat32, ncclMax, root, comm, NULL));
  for (size_t i = 0; g_rank == root && i < c; i++)
    if (r[i] != (float)expect(ncclMax, n, i)) {
      CHECK(0, "reduce [%zu]", i);
      break;
    }
  /* Grouped ring exchange plus a send to self. */
  int next = (g_rank + 1) % n, prev = (g_rank + n - 1) % n;
  int64_t out[3] = {g_rank, g_rank * 2, 7}, in[3] = {-1, -1, -1}, self = -1;
  OK(ncclGroupStart());
  OK(ncclSend(out, 3, ncclInt64, next, comm, NULL));
  OK(ncclRecv(in, 3, ncclInt64, prev, comm, NULL));
  OK(ncclSend(&out[2], 1, ncclInt64, g_rank, comm, NULL));
  OK(ncclRecv(&self, 1, ncclInt64, g_rank, comm, NULL));
  OKS(ncclGroupEnd());
  CHECK(in[0] == prev && in[1] == prev * 2 && in[2] == 7 && self == 7, "group send/recv");
  free(s);
  free(r);
}

static void test_split(ncclComm_t comm, int n) {
  ncclComm_t sub = NULL;
  int color = g_rank % 2, key = -g_rank; /* reversed order inside each color */
  OK(ncclCommSplit(comm, color, key, &sub, NULL));
  int sn = 0, sr = -1;
  OK(ncclCommCount(sub, &sn));
  OK(ncclCommUserRank(sub, &sr));
  int members = (n - color + 1) / 2;
  CHECK(sn == members, "split count %d want %d", sn, members);
  CHECK(sr == members - 1 - g_rank / 2, "split rank %d", sr);
  int32_t v = g_rank, sum = 0;
  OKS(ncclAllReduce(&v, &sum, 1, ncclInt32, ncclSum, sub, NULL));
  int want = 0;
  for (int r = color; r < n; r += 2) want += r;
  CHECK(sum == want, "split allreduce %d want %d", sum, want);
  OK(ncclCommDestroy(sub));
  ncclComm_t none = (ncclComm_t)1;
  OK(ncclCommSplit(comm, NCCL_SPLIT_NOCOLOR, 0, &none, NULL));
  CHECK(none == NULL, "NOCOLOR split gives NULL");
}

static void* abort_later(void* comm) {
  usleep(200000);
  CHECK(ncclCommAbort((ncclComm_t)comm) == ncclSuccess, "abort");
  return NULL;
}

/* A collective that cannot finish (only rank 0 calls it) is failed by ncclCommAbort from
 * another thread, as a watchdog would do; the call returns an error code. */
static void test_abort_from_thread(ncclComm_t comm) {
  ncclComm_t sub = NULL;
  OK(ncclCommSplit(comm, 0, 0, &sub, NULL));
  if (g_rank != 0) {
    usleep(500000);
    OK(ncclCommDestroy(sub));
    return;
  }
  size_t count = 4 << 20;
  float* buf = calloc(count, sizeof(float));
  pthread_t t;
  pthread_create(&t, NULL, abort_later, sub);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ncclResult_t rc = ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, sub, NULL);
  if (rc == ncclSuccess) rc = ncclAbiStreamSynchronize(NULL); /* the async failure */
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
  CHECK(rc == ncclRemoteError && ms < 2000, "aborted allreduce returned %d after %.0f ms", rc,
        ms);
  pthread_join(t, NULL);
  free(buf);
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: nccl_abi_test RANK NRANKS ID_FILE\n");
    return 2;
  }
  g_rank = atoi(argv[1]);
  int n = atoi(argv[2]);
  ncclUniqueId id;
  if (g_rank == 0) {
    OK(ncclGetUniqueId(&id));
    id_write(argv[3], &id);
  } else {
    id_read(argv[3], &id);
  }
  int version = 0;
  OK(ncclGetVersion(&version));
  CHECK(version == NCCL_VERSION_CODE, "version %d", version);
  ncclComm_t comm;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, n, id, g_rank, &cfg);
  if (rc != ncclSuccess) {
    fprintf(stderr, "abi_test rank %d: init failed: %s\n", g_rank, ncclGetErrorString(rc));
    return 1;
  }
  int cnt = 0, me = -1;
  OK(ncclCommCount(comm, &cnt));
  OK(ncclCommUserRank(comm, &me));
  CHECK(cnt == n && me == g_rank, "count/rank %d/%d", cnt, me);

  static const ncclDataType_t dts[] = {ncclInt8,  ncclUint8,  ncclInt32,   ncclUint32,
                                       ncclInt64, ncclUint64, ncclFloat16, ncclFloat32,
                                       ncclFloat64, ncclBfloat16};
  for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
    test_allreduce(comm, n, dts[d], ncclSum, 1000, 0);
  for (int op = ncclSum; op <= ncclAvg; op++) {
    test_allreduce(comm, n, ncclFloat32, (ncclRedOp_t)op, 3, 0);
    test_allreduce(comm, n, ncclInt32, (ncclRedOp_t)op, 777, 1);
  }
  test_allreduce(comm, n, ncclFloat32, ncclSum, 0, 0);
  test_allreduce(comm, n, ncclFloat32, ncclSum, 1, 0);
  test_allreduce(comm, n, ncclFloat32, ncclSum, 1000003, 0); /* uneven, many chunks */
  test_others(comm, n);
  test_split(comm, n);
  if (n > 1) test_abort_from_thread(comm);

  /* Error codes, never an abort. */
  float x = 0;
  CHECK(ncclAllReduce(&x, &x, 1, (ncclDataType_t)99, ncclSum, comm, NULL) ==
            ncclInvalidArgument, "bad dtype");
  CHECK(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, NULL, NULL) == ncclInvalidArgument,
        "NULL comm");
  CHECK(ncclGroupEnd() == ncclInvalidUsage, "unbalanced group end");
  CHECK(ncclSend(&x, 1, ncclFloat32, n, comm, NULL) == ncclInvalidArgument, "bad peer");
  CHECK(strcmp(ncclGetErrorString(ncclRemoteError), "") != 0, "error string");

  OK(ncclCommDestroy(comm));
  printf("abi_test rank=%d nranks=%d %s\n", g_rank, n, g_fail ? "FAILED" : "ok");
  return g_fail ? 1 : 0;
}
