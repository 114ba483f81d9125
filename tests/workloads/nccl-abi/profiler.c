/*
 * Profiler events emitted by the stream worker and the proxy thread, with NCCL's
 * parents and timing (src/transport/profiler.cc, src/transport/net.cc):
 *  - KernelCh, one per channel, child of the Coll/P2p event: the stream worker notes the GPU
 *    timer when the simulated kernel begins and when it ends; the proxy thread, like NCCL's
 *    profiler proxy polling the kernel's counters, starts the events when it sees the begin
 *    (a little later, pTimer = the begin timer) and at the end records KernelChStop with
 *    args.kernelCh.pTimer = the end timer and stops them.
 *  - ProxyOp per transfer, child of the Coll/P2p event; ProxyStep per chunk, child of the
 *    ProxyOp, with the states at the moments the transport passes them.
 * Plugin callbacks are made with no library lock held.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

#define MAX_CH 32

struct kch {
  void* task;
  int mask, nch;
  uint64_t t_begin, t_end;
  void* h[MAX_CH];
};

struct kch* prof_kernel_begin(struct ncclComm* comm, void* task, int mask) {
  if (!prof_loaded() || !(mask & ncclProfileKernelCh)) return NULL;
  struct kch* k = calloc(1, sizeof *k);
  if (k == NULL) return NULL;
  k->task = task;
  k->mask = mask;
  k->nch = abi_env()->nchannels;
  if (k->nch > MAX_CH) k->nch = MAX_CH;
  k->t_begin = abi_gpu_timer_ns();
  proxy_note(comm, k, 0);
  return k;
}

void prof_kernel_end(struct ncclComm* comm, struct kch* k) {
  if (k == NULL) return;
  k->t_end = abi_gpu_timer_ns();
  proxy_note(comm, k, 1);
}

/* Proxy thread: a begin or end the stream worker reported. */
void prof_kernel_note(struct ncclComm* comm, struct knote* n) {
  struct kch* k = n->k;
  if (!n->end) {
    for (int c = 0; c < k->nch; c++) {
      ncclProfilerEventDescr_v6_t d;
      memset(&d, 0, sizeof d);
      d.type = ncclProfileKernelCh;
      d.parentObj = k->task;
      d.kernelCh.channelId = (uint8_t)c;
      d.kernelCh.pTimer = k->t_begin;
      k->h[c] = prof_start(comm->prof_ctx, &d);
    }
    return;
  }
  for (int c = 0; c < k->nch; c++) {
    if (k->h[c] == NULL) continue;
    ncclProfilerEventStateArgs_v6_t a;
    memset(&a, 0, sizeof a);
    a.kernelCh.pTimer = k->t_end;
    prof_record(k->h[c], ncclProfilerKernelChStop, &a);
    prof_stop(k->h[c]);
  }
  free(k);
}

void prof_xfer_start(struct ncclComm* comm, const struct comm_op* op, const struct xfer* x,
                     size_t nchunks, struct xprof* p) {
  p->op = NULL;
  if (!prof_loaded() ||
      !(op->mask & (ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileNetPlugin)))
    return;
  ncclProfilerEventDescr_v6_t d;
  memset(&d, 0, sizeof d);
  d.type = ncclProfileProxyOp;
  d.parentObj = x->task != NULL ? x->task : op->task;
  d.rank = comm->rank;
  d.proxyOp.pid = getpid();
  d.proxyOp.channelId = 0;
  d.proxyOp.peer = x->peer;
  d.proxyOp.nSteps = (int)nchunks;
  d.proxyOp.chunkSize = (int)abi_env()->chunk;
  d.proxyOp.isSend = x->is_send;
  p->op = prof_start(comm->prof_ctx, &d);
}

/* state: PS_START starts step `step`'s event, PS_STOP stops it, otherwise records the
 * state with transSize = size (NCCL gives the size at SendWait and RecvFlushWait). */
void prof_step(struct ncclComm* comm, const struct comm_op* op, struct xprof* p, size_t step,
               size_t window, int state, size_t size) {
  if (!prof_loaded() || p->steps == NULL) return;
  void** slot = &p->steps[step % window];
  if (state == -1) {
    *slot = NULL;
    if (!(op->mask & (ncclProfileProxyStep | ncclProfileNetPlugin))) return;
    ncclProfilerEventDescr_v6_t d;
    memset(&d, 0, sizeof d);
    d.type = ncclProfileProxyStep;
    d.parentObj = p->op;
    d.rank = comm->rank;
    d.proxyStep.step = (int)step;
    *slot = prof_start(comm->prof_ctx, &d);
  } else if (state == -2) {
    prof_stop(*slot);
    *slot = NULL;
  } else if (p->op != NULL && *slot != NULL) {
    ncclProfilerEventStateArgs_v6_t a;
    memset(&a, 0, sizeof a);
    a.proxyStep.transSize = size;
    prof_record(*slot, (ncclProfilerEventState_t)state, &a);
  }
}

void prof_xfer_stop(struct xprof* p) {
  prof_stop(p->op);
  p->op = NULL;
}
