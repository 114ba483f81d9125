/*
 * CUDA-graph capture and replay of NCCL operations, as NCCL 2.30.7 does it (src/enqueue.cc,
 * src/plugin/profiler.cc):
 *
 *  - Under capture (ncclAbiStreamBeginCapture .. ncclAbiStreamEndCapture on a stream) an
 *    NCCL call runs its API path as usual: the GroupApi and CollApi/P2pApi profiler events
 *    are emitted with graphCaptured = true (ncclProfilerStartCollApiEvent(info,
 *    isGraphCaptured)), and the uprobe on ncclAllReduce fires. The plan is "persistent":
 *    nothing runs and no Group/Coll/P2p event is started at capture; the operation is
 *    recorded into the graph. (NCCL: a persistent plan with proxy work -- network peers, or
 *    the profiler's KernelCh proxy op -- captures a cudaLaunchHostFunc node,
 *    hostStreamPlanCallback, and ncclLaunchKernelAfter_NoCuda skips hostStreamPlanTask. This
 *    library's ranks always talk over its network transport, so every plan has proxy work.)
 *  - ncclAbiGraphLaunch (cudaGraphLaunch) replays the recorded operations on a stream, with
 *    no NCCL API call on the host. At each replay the stream worker, standing in for CUDA's
 *    host-callback thread running hostStreamPlanTask, starts a Group event and the Coll/P2p
 *    events (parentObj = the CollApi/P2pApi handle returned at capture, which NCCL keeps in
 *    the task), stops them, and then the operation's kernel runs with its KernelCh,
 *    ProxyOp and ProxyStep events as for an ordinary launch.
 *  - seqNumber at replay: NCCL advances comm->seqNumber[func] for a persistent plan only when
 *    the plugin returned a Group or CollApi handle and KernelCh events are enabled
 *    (ncclProfilerStartTaskEvents: "we choose not to include graph-captured collectives in
 *    our counts ... An exception is made if ncclProfileKernelCh profiler events are active").
 *    Otherwise every replay reports the same seqNumber; so does this library.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct batch {               /* one launch recorded under capture: ops of one comm */
  struct gop* ops;
  int n;
  struct batch* next;
};

struct ncclAbiGraph {
  struct batch *head, *tail;
};

struct capture {
  cudaStream_t key;
  struct ncclAbiGraph* g;
  struct capture* next;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct capture* captures;

static struct capture** find(cudaStream_t key) {
  struct capture** p = &captures;
  while (*p != NULL && (*p)->key != key) p = &(*p)->next;
  return p;
}

int graph_capturing(cudaStream_t stream) {
  pthread_mutex_lock(&mu);
  int yes = *find(stream) != NULL;
  pthread_mutex_unlock(&mu);
  return yes;
}

ncclResult_t graph_record(cudaStream_t stream, const struct gop* ops, int n) {
  struct batch* b = calloc(1, sizeof *b);
  struct gop* copy = malloc(sizeof *copy * (size_t)n);
  if (b == NULL || copy == NULL) {
    free(b);
    free(copy);
    return ncclSystemError;
  }
  memcpy(copy, ops, sizeof *copy * (size_t)n);
  for (int i = 0; i < n; i++) copy[i].task = NULL;
  b->ops = copy;
  b->n = n;
  pthread_mutex_lock(&mu);
  struct capture* c = *find(stream);
  if (c == NULL) {
    pthread_mutex_unlock(&mu);
    free(copy);
    free(b);
    return ncclInvalidUsage;
  }
  if (c->g->tail) c->g->tail->next = b;
  else c->g->head = b;
  c->g->tail = b;
  pthread_mutex_unlock(&mu);
  return ncclSuccess;
}

static void graph_free(struct ncclAbiGraph* g) {
  if (g == NULL) return;
  for (struct batch* b = g->head; b != NULL;) {
    struct batch* next = b->next;
    free(b->ops);
    free(b);
    b = next;
  }
  free(g);
}

/* Test-library extension (cudaStreamBeginCapture): NCCL calls on `stream` are recorded. */
NCCL_API(ncclResult_t, ncclAbiStreamBeginCapture, cudaStream_t stream) {
  abi_trace(__func__);
  struct capture* c = calloc(1, sizeof *c);
  struct ncclAbiGraph* g = calloc(1, sizeof *g);
  if (c == NULL || g == NULL) {
    free(c);
    free(g);
    return ncclSystemError;
  }
  c->key = stream;
  c->g = g;
  pthread_mutex_lock(&mu);
  if (*find(stream) != NULL) {
    pthread_mutex_unlock(&mu);
    free(c);
    free(g);
    return ncclInvalidUsage;
  }
  c->next = captures;
  captures = c;
  pthread_mutex_unlock(&mu);
  return ncclSuccess;
}

/* Test-library extension (cudaStreamEndCapture + cudaGraphInstantiate): the recorded graph. */
NCCL_API(ncclResult_t, ncclAbiStreamEndCapture, cudaStream_t stream, ncclAbiGraph_t* graph) {
  abi_trace(__func__);
  if (graph == NULL) return ncclInvalidArgument;
  pthread_mutex_lock(&mu);
  struct capture** p = find(stream);
  struct capture* c = *p;
  if (c != NULL) *p = c->next;
  pthread_mutex_unlock(&mu);
  if (c == NULL) return ncclInvalidUsage;
  *graph = c->g;
  free(c);
  return ncclSuccess;
}

/* Test-library extension (cudaGraphLaunch): queues the graph's operations on `stream`; no
 * NCCL API call runs on the host, the profiler events are those of NCCL's replay. */
NCCL_API(ncclResult_t, ncclAbiGraphLaunch, ncclAbiGraph_t graph, cudaStream_t stream) {
  abi_trace(__func__);
  if (graph == NULL) return ncclInvalidArgument;
  if (graph_capturing(stream)) return ncclInvalidUsage;
  for (struct batch* b = graph->head; b != NULL; b = b->next) {
    ncclResult_t rc = stream_submit_replay(stream, b->ops, b->n);
    if (rc != ncclSuccess) return rc;
  }
  return ncclSuccess;
}

/* Test-library extension (cudaGraphExecDestroy): the caller synchronized its launches. */
NCCL_API(ncclResult_t, ncclAbiGraphDestroy, ncclAbiGraph_t graph) {
  abi_trace(__func__);
  graph_free(graph);
  return ncclSuccess;
}

/* Stream worker, at a replayed operation: NCCL's hostStreamPlanTask (Group and Coll/P2p
 * events, started and stopped), then the kernel. */
ncclResult_t graph_replay_run(struct gop* ops, int n) {
  void* group = tasks_start(ops[0].comm, ops, n, 1);
  tasks_stop(ops, n, group);
  return exec_ops(ops, n);
}
