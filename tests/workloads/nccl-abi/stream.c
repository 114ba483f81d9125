/*
 * Simulated CUDA streams. A cudaStream_t is an opaque key (NULL = the default stream); each
 * distinct key gets one worker thread ("nccl-abi stream") that runs the stream's operations
 * in order: simulated compute kernels (a sleep that occupies the stream) and the library's
 * collectives and Send/Recv batches. NCCL calls only enqueue here and return, as real NCCL
 * only launches a kernel; with CUDA_LAUNCH_BLOCKING=1 every call waits for its operation.
 *
 * Test-library extensions (not NCCL API, prefix ncclAbi, declared in nccl.h):
 * ncclAbiEnqueueCompute, ncclAbiStreamSynchronize, ncclAbiGpuTimer.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

enum { SOP_COMPUTE, SOP_OPS, SOP_REPLAY };

struct sop {
  int kind;
  double ms;            /* SOP_COMPUTE */
  struct gop* ops;      /* SOP_OPS: a collective or a p2p batch on one comm */
  int n;
  ncclResult_t rc;
  struct sop* next;
};

struct abi_stream {
  cudaStream_t key;
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct sop *head, *tail;
  uint64_t submitted, completed;
  ncclResult_t err;     /* first failure since the last synchronize */
  int stop;             /* the library is being unloaded */
  int has_worker;
  struct abi_stream* next;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct abi_stream* g_streams;

uint64_t abi_gpu_timer_ns(void) {
  return abi_now_ns() + (uint64_t)abi_env()->gpu_offset_ns;
}

static void sleep_ms(double ms) {
  if (ms <= 0) return;
  uint64_t ns = (uint64_t)(ms * 1e6);
  struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static ncclResult_t run_sop(struct sop* op) {
  if (op->kind == SOP_COMPUTE) {
    sleep_ms(op->ms);
    return ncclSuccess;
  }
  if (op->kind == SOP_REPLAY) return graph_replay_run(op->ops, op->n);
  return exec_ops(op->ops, op->n);
}

static void finish(struct abi_stream* s, struct sop* op) {
  if (op->kind != SOP_COMPUTE) {
    struct ncclComm* comm = op->ops[0].comm;
    pthread_mutex_lock(&comm->mu);
    comm->inflight--;
    pthread_cond_broadcast(&comm->cv);
    pthread_mutex_unlock(&comm->mu);
  }
  pthread_mutex_lock(&s->mu);
  if (op->rc != ncclSuccess && s->err == ncclSuccess) s->err = op->rc;
  s->completed++;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  free(op->ops);
  free(op);
}

static void* worker(void* arg) {
  struct abi_stream* s = arg;
  for (;;) {
    pthread_mutex_lock(&s->mu);
    while (s->head == NULL && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
    if (s->head == NULL) {
      pthread_mutex_unlock(&s->mu);
      return NULL;
    }
    struct sop* op = s->head;
    s->head = op->next;
    if (s->head == NULL) s->tail = NULL;
    pthread_mutex_unlock(&s->mu);
    op->rc = run_sop(op);
    finish(s, op);
  }
  return NULL;
}

/* The stream of `key`; its worker thread is started at the first asynchronous use. */
static struct abi_stream* stream_get(cudaStream_t key, int need_worker) {
  pthread_mutex_lock(&g_mu);
  struct abi_stream* s = g_streams;
  while (s != NULL && s->key != key) s = s->next;
  if (s == NULL && (s = calloc(1, sizeof *s)) != NULL) {
    s->key = key;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->next = g_streams;
    g_streams = s;
  }
  if (s != NULL && need_worker && !s->has_worker) {
    if (pthread_create(&s->th, NULL, worker, s) == 0) {
      pthread_setname_np(s->th, "nccl-abi stream");
      s->has_worker = 1;
    } else {
      s = NULL;
    }
  }
  pthread_mutex_unlock(&g_mu);
  return s;
}

/* CUDA_LAUNCH_BLOCKING=1: after the stream's earlier work, the operation runs on the calling
 * thread, as the library did before it was asynchronous (the caller sleeps, reduces and
 * waits for the proxy itself; no stream thread exists). */
static ncclResult_t run_blocking(struct abi_stream* s, struct sop* op) {
  pthread_mutex_lock(&s->mu);
  while (s->completed < s->submitted) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  ncclResult_t rc = run_sop(op);
  free(op->ops);
  free(op);
  return rc;
}

/* Queues op (owned by the stream from here); blocking: runs it and returns its result. */
static ncclResult_t submit(cudaStream_t key, struct sop* op, int blocking) {
  struct abi_stream* s = stream_get(key, !blocking);
  if (s == NULL) {
    free(op->ops);
    free(op);
    return ncclSystemError;
  }
  if (blocking) return run_blocking(s, op);
  if (op->kind != SOP_COMPUTE) {
    struct ncclComm* comm = op->ops[0].comm;
    pthread_mutex_lock(&comm->mu);
    comm->inflight++;
    pthread_mutex_unlock(&comm->mu);
  }
  pthread_mutex_lock(&s->mu);
  if (s->tail) s->tail->next = op;
  else s->head = op;
  s->tail = op;
  s->submitted++;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return ncclSuccess;
}

static ncclResult_t submit_ops(cudaStream_t stream, const struct gop* ops, int n, int kind) {
  struct sop* op = calloc(1, sizeof *op);
  struct gop* copy = malloc(sizeof *copy * (size_t)n);
  if (op == NULL || copy == NULL) {
    free(op);
    free(copy);
    return ncclSystemError;
  }
  memcpy(copy, ops, sizeof *copy * (size_t)n);
  op->kind = kind;
  op->ops = copy;
  op->n = n;
  return submit(stream, op, abi_env()->launch_blocking);
}

ncclResult_t stream_submit_ops(cudaStream_t stream, const struct gop* ops, int n) {
  return submit_ops(stream, ops, n, SOP_OPS);
}

/* A graph's recorded operation (graph.c), run by the worker as NCCL's replay runs it. */
ncclResult_t stream_submit_replay(cudaStream_t stream, const struct gop* ops, int n) {
  return submit_ops(stream, ops, n, SOP_REPLAY);
}

/* dlclose (or exit): idle workers must not outlive the code they run. Each is asked to stop
 * and joined for up to 1 s; one still busy (a communicator never destroyed) is left. */
__attribute__((destructor)) static void streams_stop(void) {
  pthread_mutex_lock(&g_mu);
  struct abi_stream* list = g_streams;
  g_streams = NULL;
  pthread_mutex_unlock(&g_mu);
  for (struct abi_stream* s = list; s != NULL; s = s->next) {
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
  }
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 1;
  for (struct abi_stream* s = list; s != NULL; s = s->next)
    if (s->has_worker && pthread_timedjoin_np(s->th, NULL, &until) != 0) pthread_detach(s->th);
}

void comm_drain(struct ncclComm* comm) {
  pthread_mutex_lock(&comm->mu);
  while (comm->inflight > 0) pthread_cond_wait(&comm->cv, &comm->mu);
  pthread_mutex_unlock(&comm->mu);
}

/* A simulated compute kernel of `ms` milliseconds on `stream` (it sleeps on the stream's
 * worker, so it occupies the stream, not a CPU). */
NCCL_API(ncclResult_t, ncclAbiEnqueueCompute, cudaStream_t stream, double ms) {
  abi_trace(__func__);
  if (!(ms >= 0) || ms > 3.6e6) return ncclInvalidArgument;
  struct sop* op = calloc(1, sizeof *op);
  if (op == NULL) return ncclSystemError;
  op->kind = SOP_COMPUTE;
  op->ms = ms;
  return submit(stream, op, abi_env()->launch_blocking);
}

/* Waits until everything queued on `stream` so far has finished (cudaStreamSynchronize);
 * returns the first failure of those operations since the previous synchronize. */
NCCL_API(ncclResult_t, ncclAbiStreamSynchronize, cudaStream_t stream) {
  abi_trace(__func__);
  struct abi_stream* s = stream_get(stream, 0);
  if (s == NULL) return ncclSystemError;
  pthread_mutex_lock(&s->mu);
  uint64_t target = s->submitted;
  while (s->completed < target) pthread_cond_wait(&s->cv, &s->mu);
  ncclResult_t rc = s->err;
  s->err = ncclSuccess;
  pthread_mutex_unlock(&s->mu);
  return rc;
}

/* The simulated GPU global timer (ns): CLOCK_MONOTONIC + NCCL_ABI_GPU_TIMER_OFFSET_NS. */
NCCL_API(ncclResult_t, ncclAbiGpuTimer, uint64_t* ns) {
  abi_trace(__func__);
  if (ns == NULL) return ncclInvalidArgument;
  *ns = abi_gpu_timer_ns();
  return ncclSuccess;
}
