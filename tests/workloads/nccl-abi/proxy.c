/*
 * The per-communicator proxy thread (NCCL's "progress" thread): it turns each transfer
 * handed over by the stream worker into chunks, keeps at most NCCL_ABI_WINDOW of them
 * outstanding per transfer through ncclIbIsend/ncclIbIrecv, and polls ncclIbTest until
 * each completes. The stream worker sleeps meanwhile. Between transfers it also reports
 * the kernel begin/end notes of the stream worker to the profiler plugin (KernelCh), and
 * it emits the ProxyOp/ProxyStep events of its transfers.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

HIDDEN uint64_t transport_moved(void);
HIDDEN uint64_t transport_take_next_due(void);

struct xstate {
  struct xfer* x;
  struct conn* c;
  size_t nchunks, posted, completed;
  int after;     /* index of the previous transfer on the same connection, or -1 */
  void** ring;   /* outstanding requests, [window] */
  struct xprof prof;
};

enum { PS_START = -1, PS_STOP = -2 };

/* Posts one chunk; the ProxyStep states are those of NCCL's net.cc: a send step is posted
 * (SendGPUWait), its data is ready at once in host memory (SendPeerWait), then isend
 * (SendWait, transSize); a receive step waits in RecvWait once irecv is posted. */
static ncclResult_t post_chunk(struct ncclComm* comm, const struct comm_op* op, struct xstate* s,
                               size_t window, size_t chunk, void** req) {
  size_t off = s->posted * chunk;
  size_t len = s->x->bytes - off < chunk ? s->x->bytes - off : chunk;
  void* buf = s->x->buf + off;
  int tag = (int)s->posted;
  prof_step(comm, op, &s->prof, s->posted, window, PS_START, 0);
  int r;
  if (s->x->is_send) {
    prof_step(comm, op, &s->prof, s->posted, window, ncclProfilerProxyStepSendGPUWait, 0);
    prof_step(comm, op, &s->prof, s->posted, window, ncclProfilerProxyStepSendPeerWait_v4, 0);
    r = ncclIbIsend(s->c, buf, len, tag, NULL, NULL, req);
    if (r == ncclSuccess && *req != NULL)
      prof_step(comm, op, &s->prof, s->posted, window, ncclProfilerProxyStepSendWait, len);
  } else {
    r = ncclIbIrecv(s->c, 1, &buf, &len, &tag, NULL, NULL, req);
    if (r == ncclSuccess && *req != NULL)
      prof_step(comm, op, &s->prof, s->posted, window, ncclProfilerProxyStepRecvWait, 0);
  }
  if (r != ncclSuccess || *req == NULL) prof_step(comm, op, &s->prof, s->posted, window, PS_STOP, 0);
  return (ncclResult_t)r;
}

/* A chunk completed: a send step ends; a received one is "flushed" and handed to the GPU
 * (RecvFlushWait with its size, RecvGPUWait) and ends. */
static void chunk_done(struct ncclComm* comm, const struct comm_op* op, struct xstate* s,
                       size_t window, int size) {
  size_t k = s->completed;
  if (!s->x->is_send) {
    prof_step(comm, op, &s->prof, k, window, ncclProfilerProxyStepRecvFlushWait, (size_t)size);
    prof_step(comm, op, &s->prof, k, window, ncclProfilerProxyStepRecvGPUWait, (size_t)size);
  }
  prof_step(comm, op, &s->prof, k, window, PS_STOP, 0);
  if (k + 1 == s->nchunks) prof_xfer_stop(&s->prof);
}

static void states_init(struct ncclComm* comm, const struct comm_op* op, struct xstate* st,
                        void** rings, size_t window, size_t chunk) {
  int n = op->n;
  for (int i = 0; i < n; i++) {
    struct xfer* x = &op->x[i];
    st[i].x = x;
    st[i].c = x->is_send ? comm->send[x->peer] : comm->recv[x->peer];
    st[i].nchunks = (x->bytes + chunk - 1) / chunk;
    st[i].ring = rings + (size_t)i * window;
    st[i].prof.steps = rings + (size_t)(n + i) * window;
    if (st[i].nchunks > 0) prof_xfer_start(comm, op, x, st[i].nchunks, &st[i].prof);
    st[i].after = -1;
    /* Both sides issue transfers on a connection in call order; chunks of a later
     * transfer must not overtake an earlier one's, or they land in the wrong buffer. */
    for (int j = i - 1; j >= 0 && st[i].after < 0; j--)
      if (st[j].c == st[i].c) st[i].after = j;
  }
}

/* Posts what the window allows of transfer i and completes what ncclIbTest says is done. */
static ncclResult_t advance(struct ncclComm* comm, const struct comm_op* op, struct xstate* st,
                            int i, size_t window, size_t chunk, int* progressed) {
  struct xstate* s = &st[i];
  int blocked = s->after >= 0 && st[s->after].posted < st[s->after].nchunks;
  while (!blocked && s->posted < s->nchunks && s->posted - s->completed < window) {
    void* req = NULL;
    ncclResult_t r = post_chunk(comm, op, s, window, chunk, &req);
    if (r != ncclSuccess) return r;
    if (req == NULL) break;
    s->ring[s->posted % window] = req;
    s->posted++;
    *progressed = 1;
  }
  while (s->completed < s->posted) {
    int done = 0, size = 0;
    int r = ncclIbTest(s->ring[s->completed % window], &done, &size);
    if (r != ncclSuccess) return (ncclResult_t)r;
    if (!done) break;
    chunk_done(comm, op, s, window, size);
    s->completed++;
    *progressed = 1;
  }
  return ncclSuccess;
}

/* Frees what already completed; the rest stays queued on its connection. Events still open
 * are stopped (the operation failed). */
static void states_fail(struct ncclComm* comm, const struct comm_op* op, struct xstate* st,
                        size_t window) {
  for (int i = 0; i < op->n; i++) {
    for (size_t k = st[i].completed; k < st[i].posted; k++) {
      int done = 0;
      if (ncclIbTest(st[i].ring[k % window], &done, NULL) != ncclSuccess || !done) break;
    }
    for (size_t k = st[i].completed; k < st[i].posted; k++)
      prof_step(comm, op, &st[i].prof, k, window, PS_STOP, 0);
    prof_xfer_stop(&st[i].prof);
  }
}

static ncclResult_t run_op(struct ncclComm* comm, const struct comm_op* op) {
  int n = op->n;
  const struct abi_env* e = abi_env();
  size_t window = (size_t)e->window, chunk = e->chunk;
  struct xstate* st = calloc((size_t)n, sizeof *st);
  void** rings = calloc((size_t)n * window * 2, sizeof(void*));
  struct pollfd* pfd = calloc((size_t)n, sizeof *pfd);
  ncclResult_t rc = ncclSuccess;
  if (!st || !rings || !pfd) {
    rc = ncclSystemError;
    goto out;
  }
  states_init(comm, op, st, rings, window, chunk);
  uint64_t last = abi_now_ns();
  uint64_t timeout_ns = (uint64_t)e->timeout_ms * 1000000ull;
  for (;;) {
    uint64_t moved = transport_moved();
    transport_take_next_due();
    int progressed = 0, all_done = 1;
    for (int i = 0; i < n; i++) {
      rc = advance(comm, op, st, i, window, chunk, &progressed);
      if (rc != ncclSuccess) goto out;
      if (st[i].completed < st[i].nchunks) all_done = 0;
    }
    if (all_done) break;
    uint64_t now = abi_now_ns();
    if (progressed || transport_moved() != moved) {
      last = now;
      continue;
    }
    if (now - last > timeout_ns) {
      abi_warn("rank %d: no progress for NCCL_ABI_TIMEOUT_MS=%ld, failing the operation",
               comm->rank, e->timeout_ms);
      rc = ncclRemoteError;
      goto out;
    }
    int np = 0;
    for (int i = 0; i < n; i++)
      if (st[i].completed < st[i].nchunks)
        pfd[np++] = (struct pollfd){.fd = conn_fd(st[i].c), .events = conn_poll_events(st[i].c)};
    uint64_t wait_ns = timeout_ns - (now - last) + 1000000ull;
    if (wait_ns > 100000000ull) wait_ns = 100000000ull;
    uint64_t due = transport_take_next_due();
    if (due != 0) wait_ns = due > now ? due - now : 0;
    struct timespec ts = {(time_t)(wait_ns / 1000000000ull), (long)(wait_ns % 1000000000ull)};
    if (ppoll(pfd, (nfds_t)np, &ts, NULL) < 0 && errno != EINTR) {
      rc = ncclSystemError;
      goto out;
    }
  }
out:
  if (rc != ncclSuccess && st) states_fail(comm, op, st, window);
  free(st);
  free(rings);
  free(pfd);
  return rc;
}

/* Takes the queued kernel notes (under mu) and reports them unlocked. */
static void drain_notes_locked(struct ncclComm* comm) {
  while (comm->notes != NULL) {
    struct knote* n = comm->notes;
    comm->notes = comm->notes_tail = NULL;
    pthread_mutex_unlock(&comm->mu);
    while (n != NULL) {
      struct knote* next = n->next;
      prof_kernel_note(comm, n);
      free(n);
      n = next;
    }
    pthread_mutex_lock(&comm->mu);
  }
}

static void* proxy_main(void* arg) {
  struct ncclComm* comm = arg;
  pthread_mutex_lock(&comm->mu);
  for (;;) {
    while (!comm->stop && comm->notes == NULL && (comm->pending == NULL || comm->pending_done))
      pthread_cond_wait(&comm->cv, &comm->mu);
    drain_notes_locked(comm);
    if (comm->stop) break;
    if (comm->pending == NULL || comm->pending_done) continue;
    struct comm_op* op = comm->pending;
    pthread_mutex_unlock(&comm->mu);
    ncclResult_t rc = run_op(comm, op);
    pthread_mutex_lock(&comm->mu);
    comm->pending_rc = rc;
    comm->pending_done = 1;
    pthread_cond_broadcast(&comm->cv);
  }
  drain_notes_locked(comm);
  pthread_mutex_unlock(&comm->mu);
  return NULL;
}

/* Stream worker: a kernel began or ended; the proxy thread reports it. If the proxy is
 * not running (comm failed to start), the note is reported on this thread. */
void proxy_note(struct ncclComm* comm, struct kch* k, int end) {
  struct knote* n = calloc(1, sizeof *n);
  if (n == NULL) return;
  n->k = k;
  n->end = end;
  pthread_mutex_lock(&comm->mu);
  if (!comm->proxy_started) {
    pthread_mutex_unlock(&comm->mu);
    prof_kernel_note(comm, n);
    free(n);
    return;
  }
  if (comm->notes_tail) comm->notes_tail->next = n;
  else comm->notes = n;
  comm->notes_tail = n;
  pthread_cond_broadcast(&comm->cv);
  pthread_mutex_unlock(&comm->mu);
}

ncclResult_t proxy_start(struct ncclComm* comm) {
  if (pthread_create(&comm->proxy, NULL, proxy_main, comm) != 0) return ncclSystemError;
  pthread_setname_np(comm->proxy, "NCCL Progress");
  comm->proxy_started = 1;
  return ncclSuccess;
}

int comm_enter(struct ncclComm* comm) {
  pthread_mutex_lock(&comm->mu);
  int ok = !comm->aborting;
  comm->busy += ok;
  pthread_mutex_unlock(&comm->mu);
  return ok;
}

void comm_leave(struct ncclComm* comm) {
  pthread_mutex_lock(&comm->mu);
  comm->busy--;
  pthread_cond_broadcast(&comm->cv);
  pthread_mutex_unlock(&comm->mu);
}

/* Fails whatever is running on comm (its sockets are shut down, so the proxy errors out at
 * once) and waits until no thread is inside an operation. */
void comm_abort_wait(struct ncclComm* comm) {
  pthread_mutex_lock(&comm->mu);
  comm->aborting = 1;
  pthread_mutex_unlock(&comm->mu);
  for (int p = 0; p < comm->nranks; p++) {
    if (comm->send) conn_abort(comm->send[p]);
    if (comm->recv) conn_abort(comm->recv[p]);
  }
  pthread_mutex_lock(&comm->mu);
  while (comm->busy > 0) pthread_cond_wait(&comm->cv, &comm->mu);
  pthread_mutex_unlock(&comm->mu);
}

void proxy_stop(struct ncclComm* comm) {
  if (!comm->proxy_started) return;
  pthread_mutex_lock(&comm->mu);
  comm->stop = 1;
  pthread_cond_broadcast(&comm->cv);
  pthread_mutex_unlock(&comm->mu);
  pthread_join(comm->proxy, NULL);
  comm->proxy_started = 0;
}

/* Runs the transfers concurrently on the proxy thread and waits. The first failure
 * aborts the communicator: its sockets are shut down so that peers blocked on this rank
 * fail at once instead of each waiting for its own timeout. */
ncclResult_t comm_run(struct ncclComm* comm, struct xfer* x, int n) {
  if (comm->error != ncclSuccess) return comm->error;
  if (n == 0) return ncclSuccess;
  struct comm_op op = {.x = x, .n = n, .task = comm->cur_task, .mask = comm->cur_mask};
  pthread_mutex_lock(&comm->mu);
  if (comm->aborting) {
    pthread_mutex_unlock(&comm->mu);
    comm->error = ncclRemoteError;
    return comm->error;
  }
  comm->pending = &op;
  comm->pending_done = 0;
  pthread_cond_broadcast(&comm->cv);
  while (!comm->pending_done) pthread_cond_wait(&comm->cv, &comm->mu);
  ncclResult_t rc = comm->pending_rc;
  comm->pending = NULL;
  pthread_mutex_unlock(&comm->mu);
  if (rc != ncclSuccess) {
    comm->error = rc;
    for (int p = 0; p < comm->nranks; p++) {
      conn_abort(comm->send[p]);
      conn_abort(comm->recv[p]);
    }
  }
  return rc;
}
