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

enum { SOP_COMPUTE, SOP_OPS };

struct sop {
  int kind;
  double ms;            /* SOP_COMPUTE */
  struct gop* ops;      /* SOP_OPS: a collective or a p2p batch on one comm */
  int n;
  int waited;           /* a blocking caller frees it */
  int done;
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

static void finish(struct abi_stream* s, struct sop* op) {
  if (op->kind == SOP_OPS) {
    struct ncclComm* comm = op->ops[0].comm;
    pthread_mutex_lock(&comm->mu);
    comm->inflight--;
    pthread_cond_broadcast(&comm->cv);
    pthread_mutex_unlock(&comm->mu);
  }
  pthread_mutex_lock(&s->mu);
  if (op->rc != ncclSuccess && s->err == ncclSuccess) s->err = op->rc;
  s->completed++;
  int waited = op->waited;
  op->done = 1;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  if (!waited) {
    free(op->ops);
    free(op);
  }
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
    if (op->kind == SOP_COMPUTE) {
      sleep_ms(op->ms);
      op->rc = ncclSuccess;
    } else {
      op->rc = exec_ops(op->ops, op->n);
    }
    finish(s, op);
  }
  return NULL;
}

static struct abi_stream* stream_get(cudaStream_t key) {
  pthread_mutex_lock(&g_mu);
  struct abi_stream* s = g_streams;
  while (s != NULL && s->key != key) s = s->next;
  if (s == NULL && (s = calloc(1, sizeof *s)) != NULL) {
    s->key = key;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->th, NULL, worker, s) != 0) {
      free(s);
      s = NULL;
    } else {
      pthread_setname_np(s->th, "nccl-abi stream");
      s->next = g_streams;
      g_streams = s;
    }
  }
  pthread_mutex_unlock(&g_mu);
  return s;
}

/* Queues op (owned by the stream from here); blocking: waits and returns its result. */
static ncclResult_t submit(cudaStream_t key, struct sop* op, int blocking) {
  struct abi_stream* s = stream_get(key);
  if (s == NULL) {
    free(op->ops);
    free(op);
    return ncclSystemError;
  }
  if (op->kind == SOP_OPS) {
    struct ncclComm* comm = op->ops[0].comm;
    pthread_mutex_lock(&comm->mu);
    comm->inflight++;
    pthread_mutex_unlock(&comm->mu);
  }
  op->waited = blocking;
  pthread_mutex_lock(&s->mu);
  if (s->tail) s->tail->next = op;
  else s->head = op;
  s->tail = op;
  s->submitted++;
  pthread_cond_broadcast(&s->cv);
  ncclResult_t rc = ncclSuccess;
  if (blocking) {
    while (!op->done) pthread_cond_wait(&s->cv, &s->mu);
    rc = op->rc;
  }
  pthread_mutex_unlock(&s->mu);
  if (blocking) {
    free(op->ops);
    free(op);
  }
  return rc;
}

ncclResult_t stream_submit_ops(cudaStream_t stream, const struct gop* ops, int n) {
  struct sop* op = calloc(1, sizeof *op);
  struct gop* copy = malloc(sizeof *copy * (size_t)n);
  if (op == NULL || copy == NULL) {
    free(op);
    free(copy);
    return ncclSystemError;
  }
  memcpy(copy, ops, sizeof *copy * (size_t)n);
  op->kind = SOP_OPS;
  op->ops = copy;
  op->n = n;
  return submit(stream, op, abi_env()->launch_blocking);
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
    if (pthread_timedjoin_np(s->th, NULL, &until) != 0) pthread_detach(s->th);
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
  struct abi_stream* s = stream_get(stream);
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
