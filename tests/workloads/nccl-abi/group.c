/*
 * Groups and launch. As in NCCL every call is its own implicit group (ncclEnqueueCheck
 * opens one): calls are queued per thread and the outermost group end launches them onto
 * their streams. Consecutive Send/Recv on one communicator become one batch of concurrent
 * transfers (a send to oneself is matched with a receive from oneself); collectives run in
 * call order.
 *
 * Profiler events on the calling thread, with NCCL's state machine (src/enqueue.cc,
 * src/group.cc, src/plugin/profiler.cc): GroupApi (outermost group only, groupDepth = the
 * depth at the first call), its GroupStartApiStop / GroupEndApiStart states, CollApi /
 * P2pApi around each call; at launch, per communicator, a Group event and the Coll/P2p
 * events (seqNumber per communicator and function), started before the operations are
 * queued on their streams and stopped once they are queued ("enqueued", not "done").
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static __thread int g_depth;
static __thread struct gop* g_ops;
static __thread int g_n, g_cap;
static __thread ncclResult_t g_err;

/* ncclProfilerApiState */
static __thread struct {
  int depth; /* profilerGroupDepth */
  int mask;
  int state; /* 0 reset, 1 started, 2 start-API stopped */
  void* group_api;
  void* p2p_api;
  void* coll_api;
} ps;

#define GROUP_API_MASK                                                                      \
  (ncclProfileGroupApi | ncclProfileP2pApi | ncclProfileCollApi | ncclProfileKernelLaunch |  \
   ncclProfileGroup | ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp |                \
   ncclProfileProxyStep | ncclProfileKernelCh | ncclProfileNetPlugin | ncclProfileCeColl |   \
   ncclProfileCeSync | ncclProfileCeBatch)
#define TASK_MASK                                                                          \
  (ncclProfileColl | ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh |      \
   ncclProfileNetPlugin)

static int is_p2p(const struct gop* o) { return o->kind == K_SEND || o->kind == K_RECV; }

static const char* dt_name(ncclDataType_t dt) {
  static const char* const n[] = {"ncclInt8",    "ncclUint8",      "ncclInt32",
                                  "ncclUint32",  "ncclInt64",      "ncclUint64",
                                  "ncclFloat16", "ncclFloat32",    "ncclFloat64",
                                  "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
  return (unsigned)dt < sizeof n / sizeof n[0] ? n[dt] : "Unknown";
}

static void api_start(const struct gop* o, struct gop* q) {
  ps.mask = prof_mask();
  if (prof_loaded() && (ps.mask & GROUP_API_MASK) && ps.depth == 0) {
    ncclProfilerEventDescr_v6_t d;
    memset(&d, 0, sizeof d);
    d.type = ncclProfileGroupApi;
    d.groupApi.groupDepth = g_depth;
    d.groupApi.graphCaptured = graph_capturing(o->stream);
    ps.group_api = prof_start(o->comm->prof_ctx, &d);
    ps.depth = g_depth;
    ps.state = 1;
  }
  if (ps.state == 1) {
    ps.state = 2;
    prof_record(ps.group_api, ncclProfilerGroupStartApiStop, NULL);
  }
  int p2p = is_p2p(o);
  int want = p2p ? (ncclProfileP2pApi | ncclProfileP2p | ncclProfileProxyOp |
                    ncclProfileProxyStep | ncclProfileKernelCh | ncclProfileNetPlugin)
                 : (GROUP_API_MASK & ~(ncclProfileGroupApi | ncclProfileP2pApi |
                                       ncclProfileKernelLaunch | ncclProfileGroup |
                                       ncclProfileP2p));
  ncclProfilerEventDescr_v6_t d;
  memset(&d, 0, sizeof d);
  d.type = p2p ? ncclProfileP2pApi : ncclProfileCollApi;
  d.parentObj = ps.group_api;
  if (p2p) {
    d.p2pApi.func = op_name(o->kind);
    d.p2pApi.count = o->count;
    d.p2pApi.datatype = dt_name(o->dt);
    d.p2pApi.stream = o->stream;
    d.p2pApi.graphCaptured = graph_capturing(o->stream);
  } else {
    d.collApi.func = op_name(o->kind);
    d.collApi.count = o->count;
    d.collApi.datatype = dt_name(o->dt);
    d.collApi.root = o->root;
    d.collApi.stream = o->stream;
    d.collApi.graphCaptured = graph_capturing(o->stream);
  }
  if (prof_loaded() && (ps.mask & want)) {
    void* h = prof_start(o->comm->prof_ctx, &d);
    if (p2p) ps.p2p_api = h;
    else ps.coll_api = h;
  }
  q->mask = ps.mask;
  q->api = p2p ? ps.p2p_api : ps.coll_api;
}

static void api_stop(const struct gop* o) {
  if (is_p2p(o)) {
    prof_stop(ps.p2p_api);
    ps.p2p_api = NULL;
  } else {
    prof_stop(ps.coll_api); /* NCCL keeps the handle (a later task may still name it) */
  }
}

void group_start(void) { g_depth++; }

static ncclResult_t push(const struct gop* o) {
  if (g_n == g_cap) {
    int cap = g_cap ? g_cap * 2 : 16;
    struct gop* n = realloc(g_ops, sizeof *n * (size_t)cap);
    if (n == NULL) return ncclSystemError;
    g_ops = n;
    g_cap = cap;
  }
  g_ops[g_n++] = *o;
  return ncclSuccess;
}

/* One API call: an implicit group around queueing it (ncclEnqueueCheck). */
ncclResult_t group_call(const struct gop* o) {
  if (ps.depth > 0) ps.depth++;
  g_depth++;
  struct gop q = *o;
  api_start(o, &q);
  ncclResult_t rc = push(&q);
  if (rc != ncclSuccess) g_err = rc;
  api_stop(o);
  ncclResult_t end = group_end();
  return rc != ncclSuccess ? rc : end;
}

/* A send to oneself must have a matching receive from oneself in the same batch. */
static ncclResult_t check_self(struct gop* ops, int n) {
  int me = ops[0].comm->rank, sends = 0, recvs = 0;
  for (int i = 0; i < n; i++) {
    if (ops[i].root != me) continue;
    if (ops[i].kind == K_SEND) sends++;
    else recvs++;
  }
  return sends == recvs ? ncclSuccess : ncclInvalidUsage;
}

/* replay: a graph's persistent plan, whose seqNumber advances only when the plugin gave a
 * Group or CollApi handle and KernelCh events are on (graph.c). */
static void task_start(struct ncclComm* comm, struct gop* o, void* group, int replay) {
  o->task = NULL;
  int p2p = is_p2p(o);
  int enable = o->mask & (p2p ? (TASK_MASK & ~ncclProfileColl) | ncclProfileP2p : TASK_MASK);
  int count = !replay || (prof_loaded() && (group != NULL || o->api != NULL) &&
                          (o->mask & ncclProfileKernelCh));
  uint64_t seq = p2p ? 0 : __atomic_load_n(&comm->seq[o->kind], __ATOMIC_RELAXED);
  if (!p2p && count) seq = __atomic_fetch_add(&comm->seq[o->kind], 1, __ATOMIC_RELAXED);
  if (!prof_loaded() || !enable) return;
  ncclProfilerEventDescr_v6_t d;
  memset(&d, 0, sizeof d);
  d.type = p2p ? ncclProfileP2p : ncclProfileColl;
  d.parentObj = o->api;
  d.rank = comm->rank;
  uint8_t nch = (uint8_t)abi_env()->nchannels;
  if (p2p) {
    d.p2p.parentGroup = group;
    d.p2p.func = op_name(o->kind);
    d.p2p.buff = o->kind == K_SEND ? (void*)o->sbuf : o->rbuf;
    d.p2p.datatype = dt_name(o->dt);
    d.p2p.count = o->count;
    d.p2p.peer = o->root;
    d.p2p.nChannels = nch;
  } else {
    /* AllGather and Broadcast are counted in bytes of ncclInt8, as NCCL's tasks are. */
    int bytes = o->kind == K_ALLGATHER || o->kind == K_BROADCAST;
    d.coll.parentGroup = group;
    d.coll.seqNumber = seq;
    d.coll.func = op_name(o->kind);
    d.coll.sendBuff = o->sbuf;
    d.coll.recvBuff = o->rbuf;
    d.coll.count = bytes ? o->count * abi_type_size(o->dt) : o->count;
    d.coll.root = o->root;
    d.coll.datatype = bytes ? "ncclInt8" : dt_name(o->dt);
    d.coll.nChannels = nch;
    d.coll.nWarps = 16;
    d.coll.algo = "RING";
    d.coll.proto = "SIMPLE";
  }
  o->task = prof_start(comm->prof_ctx, &d);
}

/* The Group event and the Coll/P2p events of ops[0..n) (one communicator), started;
 * returns the Group event. */
void* tasks_start(struct ncclComm* comm, struct gop* ops, int n, int replay) {
  int mask = 0;
  for (int i = 0; i < n && mask == 0; i++) mask = ops[i].mask;
  void* group = NULL;
  if (prof_loaded() && (mask & (TASK_MASK | ncclProfileGroup | ncclProfileP2p))) {
    ncclProfilerEventDescr_v6_t d;
    memset(&d, 0, sizeof d);
    d.type = ncclProfileGroup;
    group = prof_start(comm->prof_ctx, &d);
  }
  for (int i = 0; i < n; i++)
    if (!is_p2p(&ops[i])) task_start(comm, &ops[i], group, replay);
  for (int i = 0; i < n; i++)
    if (is_p2p(&ops[i])) task_start(comm, &ops[i], group, replay);
  return group;
}

void tasks_stop(struct gop* ops, int n, void* group) {
  for (int i = 0; i < n; i++) prof_stop(ops[i].task);
  prof_stop(group);
}

/* Launches the queued operations of one communicator (ops[0..n), all on comm). Under graph
 * capture they are recorded and no Group/Coll/P2p event starts (graph.c). */
static ncclResult_t launch_comm(struct gop* ops, int n) {
  int capturing = graph_capturing(ops[0].stream);
  void* group = capturing ? NULL : tasks_start(ops[0].comm, ops, n, 0);
  ncclResult_t rc = ncclSuccess;
  for (int i = 0; i < n && rc == ncclSuccess;) {
    int j = i + 1;
    if (is_p2p(&ops[i])) {
      while (j < n && is_p2p(&ops[j])) j++;
      rc = check_self(&ops[i], j - i);
    }
    if (rc == ncclSuccess)
      rc = capturing ? graph_record(ops[i].stream, &ops[i], j - i)
                     : stream_submit_ops(ops[i].stream, &ops[i], j - i);
    i = j;
  }
  if (!capturing) tasks_stop(ops, n, group);
  return rc;
}

/* Launch: per communicator in order of first use, its operations in call order. */
static ncclResult_t launch(void) {
  ncclResult_t rc = ncclSuccess;
  struct gop* tmp = malloc(sizeof *tmp * (size_t)(g_n ? g_n : 1));
  char* used = calloc((size_t)(g_n ? g_n : 1), 1);
  if (tmp == NULL || used == NULL) rc = ncclSystemError;
  for (int i = 0; i < g_n && rc == ncclSuccess; i++) {
    if (used[i]) continue;
    int k = 0;
    for (int j = i; j < g_n; j++)
      if (!used[j] && g_ops[j].comm == g_ops[i].comm) {
        tmp[k++] = g_ops[j];
        used[j] = 1;
      }
    rc = launch_comm(tmp, k);
  }
  free(tmp);
  free(used);
  return rc;
}

ncclResult_t group_end(void) {
  if (g_depth == 0) return ncclInvalidUsage;
  ncclResult_t rc = ncclSuccess;
  if (ps.depth > 0) ps.depth--;
  if (ps.depth == 0 && ps.state == 2) {
    ps.state = 0;
    prof_record(ps.group_api, ncclProfilerGroupEndApiStart, NULL);
  }
  if (--g_depth == 0) {
    rc = g_err != ncclSuccess ? g_err : g_n > 0 ? launch() : ncclSuccess;
    g_n = 0;
    g_err = ncclSuccess;
  }
  if (ps.group_api != NULL && ps.depth == 0) {
    prof_stop(ps.group_api);
    ps.group_api = NULL;
  }
  return rc;
}
