/*
 * nccl_prof_test's checks of the events the test plugin recorded, against NCCL's contract
 * (src/plugin/profiler.cc, src/transport/profiler.cc, src/transport/net.cc).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "prof_test.h"

#define TASK_BITS (ncclProfileColl | ncclProfileProxyOp | ncclProfileProxyStep | \
                   ncclProfileKernelCh | ncclProfileNetPlugin)

/* The mask bits that make NCCL call startEvent for an event type at all. */
static int enable_bits(uint64_t type) {
  switch (type) {
    case ncclProfileGroupApi: return 0x7fff & ~ncclProfileProxyCtrl;
    case ncclProfileCollApi: return ncclProfileCollApi | TASK_BITS | 0x7000;
    case ncclProfileP2pApi: return ncclProfileP2pApi | (TASK_BITS & ~ncclProfileColl) | ncclProfileP2p;
    case ncclProfileGroup: return TASK_BITS | ncclProfileGroup | ncclProfileP2p;
    case ncclProfileColl: return TASK_BITS;
    case ncclProfileP2p: return (TASK_BITS & ~ncclProfileColl) | ncclProfileP2p;
    case ncclProfileProxyOp: return ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileNetPlugin;
    case ncclProfileProxyStep: return ncclProfileProxyStep | ncclProfileNetPlugin;
    case ncclProfileKernelCh: return ncclProfileKernelCh;
    default: return 0;
  }
}

static const struct abitest_ev* ev(const struct abitest_result* r, int id) {
  return id >= 0 && id < r->nev ? r->ev[id] : NULL;
}

static int count_children(const struct abitest_result* r, int parent, uint64_t type) {
  int k = 0;
  for (int i = 0; i < r->nev; i++) k += r->ev[i]->parent == parent && r->ev[i]->type == type;
  return k;
}

static unsigned long long check_init(const struct abitest_result* r, const char* expect,
                                     int nranks) {
  CHECK(r->ninit == 1, "%d init calls, want 1 (one communicator)", r->ninit);
  if (r->ninit < 1) return 0;
  const struct abitest_init* in = &r->inits[0];
  if (strcmp(expect, "initfail") == 0) {
    CHECK(in->failed && in->finalized == 0 && r->nev == 0,
          "failed init: finalized %d, %d events (want 0, 0)", in->finalized, r->nev);
    return in->comm_id;
  }
  CHECK(in->version == atoi(expect), "table v%d used, want v%s", in->version, expect);
  CHECK(in->nranks == nranks && in->rank == g_rank && in->nnodes == 1,
        "init nranks %d rank %d nNodes %d", in->nranks, in->rank, in->nnodes);
  CHECK(strcmp(in->comm_name, PT_COMM_NAME) == 0, "init commName '%s'", in->comm_name);
  CHECK(in->comm_id != 0 && in->has_logfn && in->mask_in == 0,
        "init commId %llx logfn %d mask in %d", (unsigned long long)in->comm_id,
        in->has_logfn, in->mask_in);
  CHECK(in->finalized == 1, "finalize called %d times, want 1", in->finalized);
  return in->comm_id;
}

/* Every event allowed by the mask, stopped exactly once, after it started. */
static void check_all(const struct abitest_result* r, int mask, int version) {
  for (int i = 0; i < r->nev; i++) {
    const struct abitest_ev* e = r->ev[i];
    CHECK(e->version == version, "event %d via v%d", i, e->version);
    CHECK(enable_bits(e->type) & mask, "event %d type 0x%llx started with mask 0x%x", i,
          (unsigned long long)e->type, mask);
    CHECK(e->stopped == 1 && e->host_stop >= e->host_start, "event %d type 0x%llx stopped %d",
          i, (unsigned long long)e->type, e->stopped);
    CHECK(e->parent != -2, "event %d has a parent that is not a handle of this plugin", i);
    if (version == 4)
      CHECK(!(e->type & (ncclProfileGroupApi | ncclProfileCollApi | ncclProfileP2pApi)),
            "v4 got an API event");
  }
}

static void check_kernel_ch(const struct abitest_result* r, const struct abitest_ev* t,
                            int nch, int after_compute) {
  int seen = 0;
  int64_t off = (int64_t)(t->gpu_start - t->host_start); /* GPU timer - host clock */
  for (int i = 0; i < r->nev; i++) {
    const struct abitest_ev* k = r->ev[i];
    if (k->type != ncclProfileKernelCh || k->parent != t->id) continue;
    seen |= 1 << k->channel;
    CHECK(k->ptimer >= t->gpu_start, "%s #%llu: kernel began before its enqueue (GPU time)",
          t->func, (unsigned long long)t->seq);
    CHECK(!after_compute || k->ptimer >= t->gpu_start + (uint64_t)(PT_COMPUTE_MS * 0.9e6),
          "%s #%llu: kernel began %.3f ms after enqueue, before the compute ahead of it",
          t->func, (unsigned long long)t->seq, (double)(k->ptimer - t->gpu_start) / 1e6);
    CHECK(k->gpu_start >= k->ptimer, "KernelCh started before the kernel began");
    CHECK(k->ptimer_stop >= k->ptimer && k->nstates == 1 &&
              k->states[0] == ncclProfilerKernelChStop && k->state_ns[0] <= k->host_stop,
          "KernelCh stop: %d states, end %llu begin %llu", k->nstates,
          (unsigned long long)k->ptimer_stop, (unsigned long long)k->ptimer);
    CHECK(k->tid_start != gettid() && k->tid_stop == k->tid_start,
          "KernelCh not on the proxy thread");
    /* "stopped" means enqueued: behind the compute, the Coll stopped before its kernel
     * ended (a kernel with nothing ahead of it may finish before the host stops it). */
    CHECK(!after_compute || (int64_t)t->host_stop + off < (int64_t)k->ptimer_stop,
          "task stopped after its kernel ended");
  }
  CHECK(seen == (1 << nch) - 1, "%s #%llu: KernelCh channels 0x%x, want %d", t->func,
        (unsigned long long)t->seq, seen, nch);
}

static void check_steps(const struct abitest_result* r, const struct abitest_ev* op, int mask) {
  static const int send[] = {ncclProfilerProxyStepSendGPUWait,
                             ncclProfilerProxyStepSendPeerWait_v4, ncclProfilerProxyStepSendWait};
  static const int recv[] = {ncclProfilerProxyStepRecvWait, ncclProfilerProxyStepRecvFlushWait,
                             ncclProfilerProxyStepRecvGPUWait};
  const int* want = op->is_send ? send : recv;
  int sized = op->is_send ? 2 : 1, steps = 0;
  for (int i = 0; i < r->nev; i++) {
    const struct abitest_ev* s = r->ev[i];
    if (s->type != ncclProfileProxyStep || s->parent != op->id) continue;
    CHECK(s->step == steps, "ProxyStep %d, want %d", s->step, steps);
    steps++;
    int ok = s->nstates == 3 && s->tid_start == op->tid_start && s->host_stop >= s->state_ns[2];
    for (int j = 0; ok && j < 3; j++) ok = s->states[j] == want[j];
    CHECK(ok && s->state_size[sized] > 0, "ProxyStep states (%d: %d %d %d, size %zu)",
          s->nstates, s->states[0], s->states[1], s->states[2], s->state_size[sized]);
  }
  if (mask & ncclProfileProxyStep)
    CHECK(steps == op->nsteps, "ProxyOp nSteps %d, %d ProxyStep children", op->nsteps, steps);
  CHECK(op->tid_start != gettid(), "ProxyOp on the calling thread");
}

/* Coll and P2p events: per function seqNumbers 0,1,..., fields, parents, children. */
static void check_tasks(const struct abitest_result* r, int mask, int version, int nranks) {
  static const char* const funcs[] = {"AllReduce", "AllGather", "Broadcast"};
  static const int calls[] = {PT_AR_CALLS + 1, 1, 1};
  const char* nc = getenv("NCCL_ABI_NCHANNELS");
  int nch = nc ? atoi(nc) : 2;
  const char* lb = getenv("CUDA_LAUNCH_BLOCKING");
  int blocking = lb != NULL && strcmp(lb, "1") == 0;
  int next[3] = {0, 0, 0}, p2p = 0;
  for (int i = 0; i < r->nev; i++) {
    const struct abitest_ev* t = r->ev[i];
    if (t->type != ncclProfileColl && t->type != ncclProfileP2p) continue;
    const struct abitest_ev* group = ev(r, version == 4 ? t->parent : t->parent_group);
    CHECK(group && group->type == ncclProfileGroup, "task %d: no Group parent", i);
    const struct abitest_ev* api = version == 4 ? NULL : ev(r, t->parent);
    if (version != 4 && (mask & (ncclProfileCollApi | ncclProfileP2pApi)))
      CHECK(api && (api->type & (ncclProfileCollApi | ncclProfileP2pApi)) &&
                strcmp(api->func, t->func) == 0, "task %d (%s): no API parent", i, t->func);
    /* NCCL's v4 adapter does not pass p2p.nChannels on. */
    int want_nch = version == 4 && t->type == ncclProfileP2p ? 0 : nch;
    CHECK(t->tid_start == gettid() && t->tid_stop == gettid() && t->rank == g_rank &&
              t->nch == want_nch, "task %d: thread, rank %d or nChannels %d", i, t->rank, t->nch);
    /* Behind the compute, only when launches are asynchronous (CUDA_LAUNCH_BLOCKING=1
     * makes the compute launch itself wait). */
    if (mask & ncclProfileKernelCh) check_kernel_ch(r, t, nch, !blocking && t->type == ncclProfileColl &&
                                                    strcmp(t->func, "AllReduce") == 0 &&
                                                    t->seq < PT_AR_CALLS);
    if (t->type == ncclProfileP2p) {
      p2p++;
      continue;
    }
    int f = 0;
    while (f < 3 && strcmp(funcs[f], t->func) != 0) f++;
    if (f == 3) {
      CHECK(0, "unexpected Coll %s", t->func);
      continue;
    }
    CHECK(t->seq == (uint64_t)next[f]++, "%s seqNumber %llu", t->func, (unsigned long long)t->seq);
    CHECK(strcmp(t->algo, "RING") == 0 && strcmp(t->proto, "SIMPLE") == 0, "algo/proto");
    if (f == 0)
      CHECK((t->seq == PT_AR_CALLS ? t->count == 1 : t->count == PT_AR_COUNT) &&
                strcmp(t->dtype, "ncclFloat32") == 0, "AllReduce count %zu %s", t->count, t->dtype);
    if (f == 1)
      CHECK(t->count == PT_AG_COUNT * 4 && strcmp(t->dtype, "ncclInt8") == 0,
            "AllGather count %zu %s (bytes of ncclInt8)", t->count, t->dtype);
    if (nranks > 1 && (mask & (ncclProfileProxyOp | ncclProfileProxyStep)) && f == 0)
      CHECK(count_children(r, t->id, ncclProfileProxyOp) > 0, "AllReduce without ProxyOp");
  }
  if (mask & TASK_BITS)
    for (int f = 0; f < 3; f++)
      CHECK(next[f] == calls[f], "%d %s events, want %d", next[f], funcs[f], calls[f]);
  if (mask & ((TASK_BITS & ~ncclProfileColl) | ncclProfileP2p))
    CHECK(p2p == (nranks > 1 ? 2 : 0), "%d P2p events, want 2", p2p);
}

/* GroupApi: one per outermost group, depth 1 for a bare call, 2 inside ncclGroupStart; its
 * states GroupStartApiStop then GroupEndApiStart. */
static void check_api(const struct abitest_result* r) {
  int groups = 0;
  for (int i = 0; i < r->nev; i++) {
    const struct abitest_ev* g = r->ev[i];
    if (g->type != ncclProfileGroupApi) continue;
    groups++;
    int kids = count_children(r, g->id, ncclProfileCollApi) +
               count_children(r, g->id, ncclProfileP2pApi);
    int want_depth = count_children(r, g->id, ncclProfileP2pApi) ? 2 : 1;
    CHECK(g->group_depth == want_depth && kids == want_depth,
          "GroupApi depth %d with %d API children", g->group_depth, kids);
    CHECK(g->nstates == 2 && g->states[0] == ncclProfilerGroupStartApiStop &&
              g->states[1] == ncclProfilerGroupEndApiStart, "GroupApi states");
  }
  CHECK(groups == PT_AR_CALLS + 4, "%d GroupApi events, want %d", groups, PT_AR_CALLS + 4);
}

unsigned long long check_events(const struct abitest_result* r, const char* expect, int n) {
  unsigned long long id = check_init(r, expect, n);
  if (strcmp(expect, "initfail") == 0 || r->ninit < 1) return id;
  int mask = r->inits[0].mask_out, version = r->inits[0].version;
  check_all(r, mask, version);
  check_tasks(r, mask, version, n);
  for (int i = 0; i < r->nev; i++)
    if (r->ev[i]->type == ncclProfileProxyOp) check_steps(r, r->ev[i], mask);
  if (version != 4 && (mask & enable_bits(ncclProfileGroupApi))) check_api(r);
  printf("prof_test rank=%d events=%d mask=0x%x version=%d\n", g_rank, r->nev, mask, version);
  return id;
}
